"""The mechanism testbed (experiments/testbed.py, tier `abstain-stream`): its runs go through submit, the store, the
tables and the report like any grid, and its declared decisions do not depend on the CPU kernel set."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from ablate.analysis.hypotheses import Declared, declared_table, fixed_decision
from ablate.analysis.load import load_runs
from ablate.analysis.tables import is_pipeline_check
from ablate.cli import main
from ablate.data.synthetic import SyntheticTask
from ablate.experiment import load_experiment
from ablate.tiers import TASKS, TIERS

REPO = Path(__file__).resolve().parents[1]
TESTBED = REPO / "experiments" / "testbed.py"


def test_the_task_tier_has_its_tasks_sizes_and_counts_as_evidence():
    task = SyntheticTask(**TASKS["abstain"])
    tier = TIERS["synthetic"]
    assert (tier.vocab_size, tier.seq_len, tier.task) == (task.vocab_size, task.seq_len, "abstain")
    assert asdict(task) == TASKS["abstain"]
    assert not is_pipeline_check("synthetic") and is_pipeline_check("smoke")


def small_testbed(folder: Path, steps: int) -> Path:
    """The testbed with fewer seeds and steps: the same arms, tier and declared comparisons."""
    text = re.sub(r"seeds=(\d+|\{[^}]*\}),", f'seeds=2, overrides={{"steps": {steps}, "val_interval": 10}},',
                  TESTBED.read_text().replace('name="testbed"', 'name="tb_small"'))
    path = folder / "tb_small.py"
    path.write_text(text)
    return path


def test_testbed_runs_through_submit_tables_and_report(tmp_path, capsys):
    experiment = small_testbed(tmp_path, steps=30)
    results = tmp_path / "results"
    argv = [str(experiment), "--results", str(results)]
    assert main(["submit", *argv, "--arms", "baseline", "sink-logit", "--executor", "local", "--parallel", "1"]) == 0
    run = results / "tb_small" / "abstain-stream" / "sink-logit" / "seed1"
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"] == "completed" and summary["steps"] == 30
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
    assert main(["submit", *argv, "--arms", "baseline", "sink-logit", "--executor", "local", "--parallel", "1"]) == 0
    assert (run / "summary.json").read_bytes() == before


def decisions(folder: Path, tiers=("abstain-stream",)) -> dict[str, str]:
    """The declared decisions at `tiers` (a comparison at another tier of the testbed is "not run" there)."""
    experiment = load_experiment(TESTBED)
    table = declared_table(load_runs(folder), Declared.of(experiment.hypotheses))
    return {row["comparison"]: fixed_decision(row) for row in table.frame.iter_rows(named=True) if row["tier"] in tiers}


SUBSET = {"abstain-stream": ("baseline", "sink-token", "sink-logit"),
          "value-junk-direction": ("baseline", "oracle-gate", "proj-gate")}


def decisions_under(capability: str | None, results: Path) -> tuple[str, dict[str, str]]:
    """A subset of the testbed at the default budget under one kernel set (None: the machine's own): the demo's
    arms, the positive control's and the headline prediction's, every seed; and value-junk-direction's control and
    proj-gate. Returns the kernel set every run recorded and the declared decisions at those tiers."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability.lower()
    arms = dict.fromkeys(arm for tier_arms in SUBSET.values() for arm in tier_arms)  # a tier runs the arms it has
    subprocess.run([sys.executable, "-m", "ablate.cli", "submit", str(TESTBED), "--tier", *SUBSET, "--arms", *arms,
                    "--executor", "local", "--parallel", "2", "--results", str(results)],
                   env=env, check=True, capture_output=True)
    folder = results / "testbed"
    summaries = [json.loads(p.read_text()) for p in folder.glob("*/*/seed*/summary.json")]
    testbed = load_experiment(TESTBED)
    assert len(summaries) == sum(len(arms) * testbed.seed_count(tier) for tier, arms in SUBSET.items())
    assert all(s["status"] == "completed" for s in summaries)
    kernels = {s["versions"]["numerics"]["cpu_capability"] for s in summaries}
    assert len(kernels) == 1 and (capability is None or kernels == {capability})
    return kernels.pop(), decisions(folder, tiers=tuple(SUBSET))


@pytest.mark.slow
def test_declared_decisions_are_the_same_under_avx2_and_native_kernels(tmp_path):
    """The declared decisions are the same under the machine's own kernels and AVX2; where the machine's own are
    AVX2 (no AVX-512), under AVX2 and the scalar DEFAULT set, so two kernel sets are always compared. The kernel
    set is what each run recorded. The demo's subset (the control and the headline prediction) and value-junk's;
    `benchmarks/testbed_kernels.py` compares every prediction over the whole grid. (Whether every seed learned is
    reported by the report's testbed section, not asserted here; see docs/method.md.)"""
    native, native_decisions = decisions_under(None, tmp_path / "native")
    other = "DEFAULT" if native == "AVX2" else "AVX2"
    kernels, other_decisions = decisions_under(other, tmp_path / other)
    assert kernels != native, f"both runs used the same kernel set: {native}"
    assert native_decisions == other_decisions
    ran = {name for name, decision in native_decisions.items() if decision != "not run"}
    assert ran == {"control_park_position", "stream_sink_logit", "control_junk_oracle", "junk_direction_proj_gate"}
    not_run = {name for name in native_decisions if name not in ran}  # each counts in m, "not run"
    assert not_run == {"stream_off_by_one", "junk_direction_proj_over_norm"}


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
