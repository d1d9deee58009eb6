"""The testbed's Filter task (ablate.data.filter, tiers filter-norm and filter-direction): its batches, its marks,
its tiers, and its runs' signature."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from ablate.cli import main
from ablate.data.filter import MARKS, FilterTask, filter_batch, task_batch, task_from_fields
from ablate.data.synthetic import IGNORE
from ablate.errors import AblateError
from ablate.experiment import Comparison, Experiment, load_experiment
from ablate.tiers import TASKS, TIERS

FILTER_TIERS = ("filter-norm", "filter-direction")


@pytest.mark.unit
@pytest.mark.parametrize("mark", MARKS)
def test_batches_are_a_pure_function_of_the_seed(mark):
    task = FilterTask(mark=mark)
    first, again, other = filter_batch(task, 32, 5), filter_batch(task, 32, 5), filter_batch(task, 32, 6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert first[0].shape == first[1].shape == (32, task.seq_len)
    assert int(first[0].max()) < task.vocab_size


def stored_values(task: FilterTask, inputs: torch.Tensor, where: torch.Tensor) -> dict[int, int]:
    pairs = inputs[where] - task.first_pair
    return dict(zip((pairs // task.n_values).tolist(), (pairs % task.n_values).tolist()))


@pytest.mark.unit
@pytest.mark.parametrize("mark", MARKS)
def test_every_junk_read_is_a_marked_decoy_of_a_queried_key(mark):
    task = FilterTask(mark=mark)
    inputs, targets = filter_batch(task, 64, 1)
    junk, clean = task.junk_reads(inputs), task.clean_reads(inputs)
    assert (junk.sum(1) == task.n_junk).all() and (clean.sum(1) == task.n_pairs).all()
    markers = inputs[:, :-1][junk[:, 1:]]  # the token in front of each junk read
    if mark == "direction":
        assert (markers == task.MARK).all()
    else:  # noise tokens, drawn anew: many distinct ones, never MARK
        assert ((markers >= task.first_noise) & (markers < task.first_value)).all() and markers.unique().numel() > 4
    for b in range(inputs.shape[0]):
        right, decoy = stored_values(task, inputs[b], clean[b]), stored_values(task, inputs[b], junk[b])
        asked = (inputs[b][targets[b] != IGNORE] - task.first_query).tolist()
        answers = (targets[b][targets[b] != IGNORE] - task.first_value).tolist()
        assert answers == [right[key] for key in asked]  # the answer is the clean pair's value
        assert all(key in asked and value != right[key] for key, value in decoy.items())  # a wrong value, asked


@pytest.mark.unit
def test_the_two_marks_differ_in_the_marker_only():
    norm, direction = (filter_batch(FilterTask(mark=mark), 16, 3) for mark in MARKS)
    task = FilterTask()
    marker = (norm[0] >= task.MARK) & (norm[0] < task.first_value)
    assert torch.equal(marker, direction[0] == task.MARK)
    assert torch.equal(norm[0][~marker], direction[0][~marker]) and torch.equal(norm[1], direction[1])


@pytest.mark.unit
def test_filter_tiers_carry_their_task_s_sizes():
    for name in FILTER_TIERS:
        task = task_from_fields(TASKS[name])
        assert isinstance(task, FilterTask) and asdict(task) == TASKS[name]
        tier = TIERS[name]
        assert (tier.vocab_size, tier.seq_len, tier.task) == (task.vocab_size, task.seq_len, name)
    assert TASKS["filter-norm"]["mark"] == "norm" and TASKS["filter-direction"]["mark"] == "direction"
    assert torch.equal(task_batch(FilterTask(), 4, 2)[0], filter_batch(FilterTask(), 4, 2)[0])


@pytest.mark.unit
def test_a_bad_mark_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="mark='parity'.*norm, direction"):
        replace(FilterTask(), mark="parity")


REPO = Path(__file__).resolve().parents[1]
TESTBED = REPO / "experiments" / "testbed_v1.py"  # the first testbed, whose tiers these are


def per_tier(**changes) -> Experiment:
    fields = dict(name="pt", tiers=("synthetic", "filter-norm"), seeds=2,
                  arms={"synthetic": ("baseline", "sink-logit"), "filter-norm": ("baseline", "norm-gate")},
                  hypotheses=(Comparison("sink", "baseline", "sink-logit", tiers=("synthetic",)),
                              Comparison("gate", "baseline", "norm-gate", tiers=("filter-norm",))))
    return Experiment(**{**fields, **changes})


@pytest.mark.unit
def test_per_tier_arms_enumerate_each_tier_s_own_runs():
    experiment = per_tier()
    keys = {(s.tier, s.arm) for s in experiment.runs()}
    assert keys == {("synthetic", "baseline"), ("synthetic", "sink-logit"), ("filter-norm", "baseline"),
                    ("filter-norm", "norm-gate")} and len(experiment.runs()) == 8
    assert {(s.tier, s.arm) for s in experiment.runs(arms=["norm-gate"])} == {("filter-norm", "norm-gate")}
    assert experiment.arm_names() == ["baseline", "sink-logit", "norm-gate"]
    assert experiment.arm_names("filter-norm") == ["baseline", "norm-gate"]
    with pytest.raises(AblateError, match="arm 'proj-gate' is not in experiment 'pt'"):
        experiment.runs(arms=["proj-gate"])


@pytest.mark.unit
def test_a_comparison_restricted_to_tiers_is_declared_there_only():
    experiment = per_tier()
    assert {tier: [c.name for c in cs] for tier, cs in experiment.comparisons().items()} == {
        "synthetic": ["sink"], "filter-norm": ["gate"]}
    assert experiment.family_size() == 1 and replace(experiment, family="experiment").family_size() == 2
    with pytest.raises(AblateError, match="names arm 'norm-gate', which the experiment does not run at tier "
                                          "'synthetic'"):
        per_tier(hypotheses=(Comparison("gate", "baseline", "norm-gate"),))
    with pytest.raises(AblateError, match="names tier 'smoke', which the experiment does not run"):
        per_tier(hypotheses=(Comparison("gate", "baseline", "norm-gate", tiers=("smoke",)),))
    with pytest.raises(AblateError, match="names tier 'smoke'; it must name each of its tiers once"):
        per_tier(arms={"synthetic": ("baseline",), "filter-norm": ("baseline",), "smoke": ("baseline",)})
    with pytest.raises(AblateError, match="names tier 'filter-norm'; it must name each"):
        per_tier(arms={"synthetic": ("baseline", "sink-logit", "norm-gate")}, hypotheses=())


@pytest.mark.unit
def test_the_testbed_runs_each_task_s_arms():
    experiment = load_experiment(TESTBED)
    runs = experiment.runs()
    arms = {tier: {s.arm for s in runs if s.tier == tier} for tier in experiment.tiers}
    assert arms == {"synthetic": {"baseline", "sink-logit", "off-by-one", "renorm"},
                    "filter-norm": {"baseline", "norm-gate", "proj-gate"},
                    "filter-direction": {"baseline", "norm-gate", "proj-gate"}} and len(runs) == 50
    declared = {tier: {c.name for c in cs} for tier, cs in experiment.comparisons().items()}
    assert declared["filter-norm"] == {"filter_norm_norm_gate", "filter_norm_norm_over_proj"}
    assert "abstain_sink_logit" in declared["synthetic"] and not declared["synthetic"] & declared["filter-norm"]


STEPS = 10


@pytest.fixture(scope="module")
def filter_grid(tmp_path_factory) -> tuple[Path, Path]:
    """(experiment file, results folder) of the first testbed's filter-norm grid, every arm there (baseline, norm-gate,
    proj-gate) × 2 seeds at STEPS steps, submitted once (`--executor local`, one worker) for the tests below."""
    folder = tmp_path_factory.mktemp("tb_filter")
    text = TESTBED.read_text().replace('name="testbed_v1"', 'name="tb_filter"').replace(
        "seeds=5,", f'seeds=2, overrides={{"steps": {STEPS}, "val_interval": 5}},')
    (folder / "tb_filter.py").write_text(text)
    results = folder / "r"
    assert main(["submit", str(folder / "tb_filter.py"), "--results", str(results), "--tier", "filter-norm",
                 "--executor", "local", "--parallel", "1"]) == 0
    return folder / "tb_filter.py", results


@pytest.mark.system
def test_a_filter_run_records_its_signature(filter_grid, capsys):
    experiment, results = filter_grid
    runs = results / "tb_filter" / "filter-norm"
    base, gated = (json.loads((runs / arm / "seed0" / "summary.json").read_text()) for arm in ("baseline", "norm-gate"))
    assert base["steps"] == STEPS and base["absent_accuracy"] is None
    assert base["signature"]["gate_junk"] is None and base["signature"]["junk_weight"] == base["signature"]["junk_mass"]
    assert 0 < gated["signature"]["gate_junk"] < 1 and 0 < gated["signature"]["gate_clean"] < 1
    assert gated["signature"]["junk_weight"] < gated["signature"]["junk_mass"]  # the gate takes its share
    assert all(0 < s["signature"]["junk_mass"] < 1 and s["signature"]["output_norm"] > 0 for s in (base, gated))
    evaluated = json.loads((runs / "baseline" / "seed0" / "eval.json").read_text())["tasks"]["filter"]["metrics"]
    assert "junk_mass" in evaluated and "gate_junk" not in evaluated  # an arm without a gate has none to pair
    capsys.readouterr()
    assert main(["table", str(experiment), "--results", str(results), "--metric", "filter/junk_weight"]) == 0
    assert "| filter-norm | norm-gate | 2 |" in capsys.readouterr().out


@pytest.mark.system
def test_a_filter_tier_trains_end_to_end_through_the_testbed(filter_grid, capsys):
    experiment, results = filter_grid
    argv = [str(experiment), "--results", str(results)]
    summaries = sorted((results / "tb_filter").glob("*/*/seed*/summary.json"))
    assert [p.relative_to(results / "tb_filter").parts[:2] for p in summaries[::2]] == [
        ("filter-norm", arm) for arm in ("baseline", "norm-gate", "proj-gate")] and len(summaries) == 6
    capsys.readouterr()
    assert main(["table", *argv, "--kind", "declared"]) == 0
    declared = capsys.readouterr().out
    assert "| filter-norm | filter_norm_norm_gate (baseline − norm-gate) | 2 |" in declared
    assert "| filter-norm | abstain_sink_logit" not in declared  # sink-logit does not run at filter-norm
    assert main(["table", *argv, "--metric", "filter/gate_junk", "--reference", "norm-gate"]) == 0
    assert "| filter-norm | proj-gate | 2 |" in capsys.readouterr().out  # the gates pair with each other
    assert main(["report", *argv]) == 0
    text = (results / "tb_filter" / "report" / "summary.md").read_text().split("## Mechanism testbed")[1]
    assert "Task filter-norm" in text and "| proj-gate | " in text and "gate_junk" in text
    assert (results / "tb_filter" / "report" / "testbed_filter-norm.png").stat().st_size > 10_000


@pytest.mark.unit
def test_the_probes_validation_batches_of_a_filter_run_are_the_task_s():
    from ablate.data.filter import filter_validation
    from ablate.modelio import validation_batches_for_run
    from ablate.runconfig import RunConfig

    batches = validation_batches_for_run(RunConfig(synthetic_task=TASKS["filter-direction"]), 2, 4)
    expected = filter_validation(FilterTask(**TASKS["filter-direction"]), 4, 2)
    assert len(batches) == 2 and all(torch.equal(a, b) for got, want in zip(batches, expected)
                                     for a, b in zip(got, want))


@pytest.mark.run
def test_a_task_run_that_is_training_is_running_in_status_never_damaged(tmp_path, monkeypatch):
    """A task run writes its summary.json as "running" before its first step, as a corpus run does, so
    `ablate status` of a run still training says running (metrics without a summary would read as damaged)."""
    import ablate.taskrun as taskrun
    from ablate.experiment import Experiment
    from ablate.status import SlurmView, run_status
    from ablate.store import Ledger
    from ablate.train import run

    experiment = Experiment(name="busy", tiers=("filter-norm",), arms=("baseline",), seeds=1,
                            overrides={"steps": 3, "val_interval": 1})
    spec = experiment.runs()[0]
    seen, real = [], taskrun._evaluate  # after the last step: metrics.jsonl holds every step's row

    def watching(*args, **kwargs):
        seen.append(run_status(tmp_path, spec, Ledger({}, ()), SlurmView()).state)
        return real(*args, **kwargs)

    monkeypatch.setattr(taskrun, "_evaluate", watching)
    run(spec, results=tmp_path, progress=False)
    assert seen and set(seen) == {"running"}  # at every evaluation, the last after the last step
    assert run_status(tmp_path, spec, Ledger({}, ()), SlurmView()).state == "completed"
