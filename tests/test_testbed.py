"""The mechanism testbed (experiments/testbed.py, tier `abstain-stream`): its runs go through submit, the store, the
tables and the report like any grid, and its declared decisions do not depend on the CPU kernel set."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from ablate.analysis.tables import is_pipeline_check
from ablate.cli import main
from ablate.data.synthetic import SyntheticTask
from ablate.tiers import TASKS, TIERS
from kernel_replay import machine_kind
from testbed_figures import recorded_loss

REPO = Path(__file__).resolve().parents[1]
TESTBED = REPO / "experiments" / "testbed.py"


@pytest.mark.unit
def test_the_task_tier_has_its_tasks_sizes_and_counts_as_evidence():
    task = SyntheticTask(**TASKS["abstain"])
    tier = TIERS["synthetic"]
    assert (tier.vocab_size, tier.seq_len, tier.task) == (task.vocab_size, task.seq_len, "abstain")
    assert asdict(task) == TASKS["abstain"]
    assert not is_pipeline_check("synthetic") and is_pipeline_check("smoke")


def small_testbed(folder: Path, steps: int | None) -> Path:
    """The testbed with 2 seeds and `steps` (None: its default budget): the same arms, tiers and declared
    comparisons."""
    budget = "" if steps is None else f' overrides={{"steps": {steps}, "val_interval": 10}},'
    text = re.sub(r"seeds=(\d+|\{[^}]*\}),", f"seeds=2,{budget}",
                  TESTBED.read_text().replace('name="testbed"', 'name="tb_small"'))
    path = folder / "tb_small.py"
    path.write_text(text)
    return path


ARMS = ("baseline", "sink-logit")  # stream_sink_logit's arms: one declared prediction


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, Path]:
    """(experiment file, results folder) of the small testbed's stream_sink_logit grid: baseline and sink-logit at
    abstain-stream, 2 seeds, the default budget, submitted once (`ablate submit --executor local`, one worker
    process) under this machine's own kernels (no ATEN_CPU_CAPABILITY, as benchmarks/testbed_kernels.py's
    `native`). The submit test reads it, the record test compares it with tests/testbed_figures.json, and the
    kernel-set test with the same grid under another kernel set."""
    folder = tmp_path_factory.mktemp("testbed")
    experiment, results = small_testbed(folder, steps=None), folder / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        assert main(["submit", str(experiment), "--results", str(results), "--tier", "abstain-stream", "--arms", *ARMS,
                     "--executor", "local", "--parallel", "1"]) == 0
    return experiment, results


@pytest.mark.system
def test_testbed_runs_through_submit_tables_and_report(grid, capsys):
    experiment, results = grid
    argv = [str(experiment), "--results", str(results)]
    run = results / "tb_small" / "abstain-stream" / "sink-logit" / "seed1"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"] == "completed" and summary["steps"] == TIERS["abstain-stream"].steps
            and 0 < summary["signature"]["phantom_absent"] < 1)
    assert json.loads((run / "config.json").read_text())["data_dir"] is None
    capsys.readouterr()
    assert main(["table", *argv, "--kind", "declared"]) == 0
    declared = capsys.readouterr().out
    assert "| abstain-stream | stream_sink_logit (baseline − sink-logit) | 2 |" in declared  # paired over both seeds
    assert "stream_off_by_one skipped" in declared  # named as skipped: its arm did not run
    assert main(["table", *argv, "--metric", "abstain/phantom_absent"]) == 0
    assert "| abstain-stream | sink-logit | 2 |" in capsys.readouterr().out  # the signature pairs like a loss
    assert main(["report", *argv]) == 0
    report = results / "tb_small" / "report"
    text = (report / "summary.md").read_text()
    assert "## Mechanism testbed" in text and "| sink-logit | " in text.split("## Mechanism testbed")[1]
    assert "stream_sink_logit (baseline − sink-logit)" in text and "decision " in text
    assert (report / "testbed_abstain-stream.png").stat().st_size > 10_000
    # A second submit finds every run done: nothing is trained twice or overwritten.
    before = (run / "summary.json").read_bytes()
    assert main(["submit", *argv, "--tier", "abstain-stream", "--arms", *ARMS, "--executor", "local",
                 "--parallel", "1"]) == 0
    assert (run / "summary.json").read_bytes() == before


@pytest.mark.system
def test_the_testbed_record_is_what_the_current_code_computes(grid):
    """tests/testbed_figures.json (the docs' testbed figures) is what the current code computes: each run of the grid,
    trained now under this machine's own kernels, gives its recorded loss bit for bit (where the record holds this
    machine kind and kernel set; elsewhere the kernel-set tests bound). test_testbed_figures.py replays a run of the
    graded testbed's record the same way, and the other recorded kernel sets."""
    kernel_set = torch.backends.cpu.get_cpu_capability()
    runs = {(tier, arm, seed): json.loads((grid[1] / "tb_small" / tier / arm / f"seed{seed}" / "summary.json")
                                          .read_text())["val_loss"]
            for tier, arm, seed in itertools.product(["abstain-stream"], ARMS, (0, 1))}
    recorded = {key: recorded_loss("testbed", kernel_set, *key) for key in runs}
    if None in recorded.values():
        pytest.skip(f"no record of testbed for {kernel_set} on {machine_kind()}")
    assert runs == recorded


def kernels_benchmark():
    """benchmarks/testbed_kernels.py, the whole grid's comparison under kernel sets, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("testbed_kernels", REPO / "benchmarks" / "testbed_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.system
@pytest.mark.slow
@pytest.mark.benchmark
def test_a_declared_decision_is_the_same_under_two_kernel_sets(grid, tmp_path):
    """docs/method.md ("Numerics"): across kernel sets a run's last bits differ, its declared decision does not.
    stream_sink_logit (baseline − sink-logit at abstain-stream), 2 seeds of each at the default budget, under the
    machine's own kernels (the module's grid) and AVX2 (AVX2 and the scalar DEFAULT set where the machine's own
    are AVX2; through benchmarks/testbed_kernels.py's `_grid`, in a process of its own): the kernel set each run
    recorded differs, each seed learns under both or under neither, and the decision is the same. Read through
    benchmarks/testbed_kernels.py, which compares every prediction over the whole grid."""
    bench, (experiment, results) = kernels_benchmark(), grid
    native, learned, rows = bench._read(results / "tb_small", str(experiment))  # kernel sets, seeds learned, rows
    other = "DEFAULT" if native == {"AVX2"} else "AVX2"
    bench._grid(other, tmp_path / other, 1, ["abstain-stream"], str(experiment), list(ARMS))
    recorded, other_learned, other_rows = bench._read(tmp_path / other / "tb_small", str(experiment))
    assert len(native) == 1 and recorded == {other} != native  # each grid ran under one kernel set, not the same
    assert learned == other_learned and set(learned) == {("abstain-stream", arm) for arm in ARMS}
    decided = {row["comparison"]: row["decision"] for row in rows if row["tier"] == "abstain-stream"}
    assert decided == {row["comparison"]: row["decision"] for row in other_rows if row["tier"] == "abstain-stream"}
    assert decided["stream_sink_logit"] not in ("not run", "not final")  # both seeds paired, decided
    assert {name for name, decision in decided.items() if decision == "not run"} == {
        "control_park_position", "stream_off_by_one"}  # their arms did not run


@pytest.mark.system
def test_the_testbed_page_s_own_arm_recipe_runs_as_written(tmp_path, capsys):
    """docs/testbed.md's recipe: an experiment file of one's own, the testbed with one's arm (the README's) beside
    the baseline."""
    text = (REPO / "docs" / "testbed.md").read_text()
    recipe = re.search(r"<!-- example: testbed-arm .*?-->\s*```python\n(.*?)```", text, re.S).group(1)
    arm_module = re.search(r"<!-- example: custom-arm.*?-->\s*```python\n(.*?)```", (REPO / "README.md").read_text(),
                           re.S).group(1)
    (tmp_path / "learned_alibi.py").write_text(arm_module.split('if __name__ == "__main__":')[0])
    fewer = 'EXPERIMENT = dataclasses.replace(EXPERIMENT, seeds=2, overrides={"steps": 20})\n'  # the test's budget
    (tmp_path / "my_testbed.py").write_text(recipe + fewer)
    argv = [str(tmp_path / "my_testbed.py"), "--results", str(tmp_path / "results")]
    assert main(["submit", *argv, "--executor", "local", "--parallel", "1"]) == 0
    capsys.readouterr()
    assert main(["table", *argv, "--metric", "abstain/first_key_absent"]) == 0
    assert "| abstain-stream | learned-alibi | 2 |" in capsys.readouterr().out


ARM_FILE = '''from ablate.arms import register_arm
from ablate.arms.builtin import SinkLogit


@register_arm("my-sink")
class MySink(SinkLogit):
    """The sink-logit arm under a name of one's own, registered by a file outside experiments/."""
'''


@pytest.mark.system
def test_the_testbed_command_runs_an_arm_from_a_file_of_ones_own(tmp_path, capsys, monkeypatch):
    """`ablate testbed --arm NAME --arm-file FILE.py`: the arm file is loaded like an experiment file, here and in
    each worker process, so its arm trains beside the baseline; then the tables and the testbed's section. Its runs,
    the baseline's included, go to a results folder of its own (testbed-arms/), never the shared testbed's."""
    (tmp_path / "my_arms.py").write_text(ARM_FILE)
    monkeypatch.setenv("ABLATE_RESULTS", str(tmp_path / "shared"))
    results = tmp_path / "shared" / "testbed-arms"
    argv = ["testbed", "--arm", "my-sink", "--arm-file", str(tmp_path / "my_arms.py"), "--tier", "abstain-stream",
            "--steps", "20", "--seed-count", "2", "--parallel", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "shared" / "testbed_steps20").exists() and out.startswith(
        f"runs in {results / 'testbed_steps20'} (the baseline's too")
    assert (results / "testbed_steps20" / "abstain-stream" / "baseline" / "seed0" / "summary.json").is_file()
    for seed in (0, 1):
        summary = json.loads((results / "testbed_steps20" / "abstain-stream" / "my-sink" / f"seed{seed}"
                              / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 20 and summary["arm"] == "my-sink"
    assert "| abstain-stream | my-sink | 2 |" in out  # the paired table: baseline − my-sink over both seeds
    assert re.search(r"\| my-sink \| [012]/2 \|", out)  # the testbed section: seeds learned
    # No declared comparison names my-sink: one line says so, no empty declared table, no "Holm's m per tier = ;"
    assert "no declared comparison of the testbed names my-sink at tier(s) abstain-stream" in out
    assert "Holm's m per tier = ;" not in out and "| comparison |" not in out
    assert "a quick look at 20 steps: the testbed's predictions are declared at its budget of" in out  # exploratory


@pytest.mark.unit
def test_the_testbed_command_refuses_a_bad_arm_file_or_arm(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("")
    assert main(["testbed", "--arm", "x", "--arm-file", str(tmp_path / "notes.txt")]) == 2
    assert "is not a Python file" in capsys.readouterr().err
    assert main(["testbed", "--arm", "no-such-arm", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no-such-arm" in err and "sink-logit" in err and len(err.strip().splitlines()) == 1
    assert main(["testbed", "--arm", "sink-logit", "--tier", "synthetic", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err  # the first testbed's tier is not this testbed's: one line, the valid tiers
    assert "--tier 'synthetic'" in err and "abstain-stream" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before anything ran


@pytest.mark.unit
@pytest.mark.benchmark
def test_the_design_benchmark_trains_the_tier_it_names_with_the_fields_it_sets(monkeypatch):
    """benchmarks/testbed_design.py builds each task tier's baseline configs with the design's fields replaced
    (a task field changes the vocabulary, steps the budget), so a design tried on Filter is Filter's."""
    import importlib.util

    from ablate import tiers

    spec = importlib.util.spec_from_file_location("testbed_design", REPO / "benchmarks" / "testbed_design.py")
    design = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(design)
    for name in ("filter-norm", "synthetic"):
        monkeypatch.setitem(tiers.TIERS, name, tiers.TIERS[name])  # put back after the test
        monkeypatch.setitem(tiers.TASKS, tiers.TIERS[name].task, tiers.TASKS[tiers.TIERS[name].task])
    vocab = TIERS["filter-norm"].vocab_size
    configs = design._configs("filter-norm", 2, 3, {"steps": 40, "n_noise": 8, "lr": 1e-3})
    fields = {**TASKS["filter-norm"], "n_noise": 8}
    assert [c.seed for c in configs] == [3, 4] and all(c.arm == "baseline" for c in configs)
    assert configs[0].synthetic_task == fields and configs[0].steps == 40 and configs[0].lr == 1e-3
    assert configs[0].model.vocab_size == tiers.filter_vocab_size(fields) == vocab - 8
    assert design._configs("synthetic", 1, 0, {})[0].synthetic_task == TASKS["abstain"]
