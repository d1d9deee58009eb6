"""Sequential seeds: which seeds a submit queues, decided from a store's completed runs (real files written by
tests/analysis_fixtures.py, no training); the tables' look, decision and design interval; one CLI dry run."""

from __future__ import annotations

import pytest

from ablate.analysis.hypotheses import Declared, seeds_to_queue
from ablate.analysis.load import load_runs
from ablate.analysis.render import render
from ablate.analysis.build import build_table
from ablate.cli import main
from ablate.errors import AblateError
from ablate.power import sequential_design
from ablate.sequential import SEQUENTIAL, recorded_design
from ablate.store import read_ledger, record_ledger
from analysis_fixtures import write_run

pytestmark = pytest.mark.unit

ZERO = (("zero_option", "baseline", "sink-logit"),)
DESIGN = sequential_design(0.05, 1, looks=2, max_seeds=6)  # looks at 3 and 6 seeds


def write_tier(results, tier, differences, experiment="seq"):
    """baseline and sink-logit runs of `tier`, seed k differing by differences[k] (baseline − sink-logit)."""
    for seed, diff in enumerate(differences):
        base = 3.5 + 0.01 * seed
        write_run(results, experiment, tier, "baseline", seed, base)
        write_run(results, experiment, tier, "sink-logit", seed, base - diff)
    return results / experiment


def test_a_tier_decided_at_the_first_look_gets_no_more_seeds_and_the_other_gets_the_next_look(tmp_path):
    write_tier(tmp_path, "10M", [0.0100, 0.0101, 0.0099])  # |t| ≈ 170: beyond the first boundary
    folder = write_tier(tmp_path, "50M", [0.004, -0.003, 0.001])  # undecided
    declared = Declared.of(ZERO, design=DESIGN)
    assert DESIGN["looks"][0]["t_boundary"] < 170
    assert seeds_to_queue(load_runs(folder), declared, ["10M", "50M"]) == {"10M": 0, "50M": 6}


def test_nothing_run_yet_or_a_look_not_all_in_asks_for_the_first_look_again(tmp_path):
    declared = Declared.of(ZERO, design=DESIGN)
    assert seeds_to_queue(None, declared, ["10M", "50M"]) == {"10M": 3, "50M": 3}
    folder = write_tier(tmp_path, "10M", [0.0100, 0.0101])  # two of the first look's three seeds are in
    assert seeds_to_queue(load_runs(folder), declared, ["10M"]) == {"10M": 3}


def test_the_last_look_passed_is_max_seeds_reached_and_asks_for_nothing(tmp_path):
    folder = write_tier(tmp_path, "10M", [0.004, -0.003, 0.001, 0.002, -0.004, 0.0])
    declared = Declared.of(ZERO, design=DESIGN)
    assert seeds_to_queue(load_runs(folder), declared, ["10M"]) == {"10M": 0}
    row = build_table(load_runs(folder), "declared", declared=declared).frame.row(0, named=True)
    assert row["decision"] == "max seeds reached" and row["look"] == 2 and row["seq_ci_low"] < 0 < row["seq_ci_high"]


def test_the_declared_table_shows_the_look_the_decision_and_the_design_interval(tmp_path):
    write_tier(tmp_path, "10M", [0.0100, 0.0101, 0.0099])
    folder = write_tier(tmp_path, "50M", [0.004, -0.003, 0.001])
    table = build_table(load_runs(folder), "declared", declared=Declared.of(ZERO, design=DESIGN))
    rows = {r["tier"]: r for r in table.frame.iter_rows(named=True)}
    assert rows["10M"]["decision"] == "effect" and rows["10M"]["sign"] == 1 and rows["10M"]["seq_ci_low"] > 0
    assert rows["50M"]["decision"] == "continue" and rows["50M"]["next_seeds"] == 6
    # the design's interval is wider than the fixed 95% one: it pays for the looks
    assert rows["10M"]["seq_ci_high"] - rows["10M"]["seq_ci_low"] > rows["10M"]["ci_high"] - rows["10M"]["ci_low"]
    text = render(table, "md")
    assert "effect (Δ > 0)" in text and "continue (to 6 seeds)" in text and "design interval" in text


EXPERIMENT = '''
from ablate.experiment import Comparison, Experiment

EXPERIMENT = Experiment(name="seq", tiers=("smoke",), arms=("baseline", "sink-logit"), seeds=2,
                        overrides={{"max_steps": 2, "data_dir": {data!r}}},
                        hypotheses=(Comparison("zero_option", "baseline", "sink-logit"),))
'''


def submit(capsys, *args):
    code = main(["submit", *map(str, args), "--executor", "local", "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_submit_sequential_dry_run_queues_look_by_look(tmp_path, sample_data, capsys):
    file = tmp_path / "seq.py"
    file.write_text(EXPERIMENT.format(data=str(sample_data)))
    results = tmp_path / "results"
    code, out, _ = submit(capsys, file, "--sequential", "--looks", "2", "--max-seeds", "4", "--results", results)
    assert code == 0 and "sequential design (new)" in out and "smoke: seeds 0–1" in out
    assert "smoke/baseline/seed1" in out and "seed2" not in out and not results.exists()  # a dry run records nothing

    record = {"kind": SEQUENTIAL, "design": sequential_design(0.05, 1, 2, 4), "looks": 2, "max_seeds": 4,
              "alpha": 0.05, "family": "tier", "comparisons": [list(ZERO[0])]}
    folder = write_tier(results, "smoke", [0.004, -0.003])  # look 1 in, undecided: look 2 needs seeds 2 and 3
    record_ledger(folder, {}, record)
    code, out, _ = submit(capsys, file, "--sequential", "--results", results)
    assert code == 0 and "(recorded)" in out and "smoke: seeds 0–3" in out
    assert "smoke/sink-logit/seed3" in out and "seed0" not in out  # 0 and 1 are completed
    assert recorded_design(folder).looks == 2 and len(read_ledger(folder).submissions) == 1

    assert main(["submit", str(file), "--sequential", "--looks", "3", "--results", str(results), "--dry-run"]) == 2
    assert "--looks 3 (recorded: 2)" in capsys.readouterr().err


def test_the_first_sequential_submit_needs_its_looks(tmp_path, sample_data, capsys):
    file = tmp_path / "seq.py"
    file.write_text(EXPERIMENT.format(data=str(sample_data)))
    assert main(["submit", str(file), "--sequential", "--results", str(tmp_path / "r"), "--dry-run"]) == 2
    assert "needs --looks K and --max-seeds N" in capsys.readouterr().err
    with pytest.raises(AblateError, match=r"seed\(s\) at the first look"):
        sequential_design(0.05, 1, looks=3, max_seeds=3)
