"""A sequential design cannot be bent, and a damaged ledger is one line.

* the design recorded at the first `submit --sequential` is the one every later submit and table follows:
  an experiment file that now declares other comparisons, another family or m is refused, naming both;
* no spread (equal differences, or equal up to float rounding) is no t: never "effect" from |t| = ∞;
* the boundaries in ledger.json are recomputed from (α, m, looks, max seeds): an edited one is refused;
* runs finished before the design existed (a pilot) are never adopted as its first look;
* at an interim look every table states the look and the design's decision, not a fixed-sample verdict;
* a ledger entry that is not an object, or a sequential record without its design: one line, no traceback.

Stores are hand-written (tests/analysis_fixtures.py, no training); the commands run as a user types them.
"""

from __future__ import annotations

import json

import pytest

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared
from ablate.analysis.load import load_runs
from ablate.analysis.render import render
from ablate.cli import main
from ablate.errors import AblateError
from ablate.power import sequential_decision, sequential_design
from ablate.sequential import SequentialDesign, recorded_design
from ablate.store import LEDGER, record_ledger
from analysis_fixtures import write_run

pytestmark = pytest.mark.unit

ZERO = ("zero_option", "baseline", "sink-logit")
EXPERIMENT = '''
from ablate.experiment import Comparison, Experiment

EXPERIMENT = Experiment(name="seq", tiers=("smoke",), arms=("baseline", "sink-logit", "combo"), seeds=2,
                        overrides={{"max_steps": 2, "data_dir": {data!r}}}, family={family!r},
                        hypotheses=({comparisons}))
'''
ONE = 'Comparison("zero_option", "baseline", "sink-logit"),'
TWO = ONE + ' Comparison("filtering_norm", "sink-logit", "combo"),'


def experiment_file(tmp_path, data, comparisons=ONE, family="tier"):
    file = tmp_path / "seq.py"
    file.write_text(EXPERIMENT.format(data=str(data), comparisons=comparisons, family=family))
    return file


def write_seeds(results, differences, arms=("baseline", "sink-logit"), base=3.5):
    for seed, diff in enumerate(differences):
        loss = base + 0.01 * seed
        write_run(results, "seq", "smoke", arms[0], seed, loss, curve_points=2)
        write_run(results, "seq", "smoke", arms[1], seed, loss - diff, curve_points=2)
    return results / "seq"


def record(folder, looks=2, max_seeds=4, comparisons=(ZERO,), family="tier"):
    design = SequentialDesign.new(comparisons, family, len(comparisons), 0.05, looks, max_seeds)
    folder.mkdir(parents=True, exist_ok=True)
    record_ledger(folder, {}, design.to_record())
    return design


def cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ablate: error:") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------------ a changed design
def test_a_comparison_added_after_the_first_look_is_refused_by_submit_and_tables(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.004, -0.003])
    record(folder)
    file = experiment_file(tmp_path, sample_data, TWO)  # the file now declares two comparisons: m = 2
    code, _, err = cli(capsys, "submit", file, "--sequential", "--executor", "local", "--dry-run", "--results", results)
    line = one_line(err)
    assert code == 2 and "now declares [zero_option (baseline − sink-logit), filtering_norm" in line
    assert ("m = 2]" in line and "records the sequential design [zero_option (baseline − sink-logit); "
                                 "family tier, m = 1]" in line)
    code, _, err = cli(capsys, "table", file, "--kind", "declared", "--results", results)
    assert code == 2 and "a design cannot change once its seeds are queued" in one_line(err)
    code, _, err = cli(capsys, "table", file, "--results", results)  # the default paired table too
    assert code == 2 and "now declares" in one_line(err)


def test_a_family_changed_after_the_first_look_is_refused(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    record(write_seeds(results, [0.004, -0.003]))
    file = experiment_file(tmp_path, sample_data, ONE, family="experiment")
    code, _, err = cli(capsys, "submit", file, "--sequential", "--executor", "local", "--dry-run", "--results", results)
    assert code == 2 and "family experiment" in one_line(err) and "family tier" in err
    # the unchanged file still follows its design
    file = experiment_file(tmp_path, sample_data, ONE)
    code, out, _ = cli(capsys, "submit", file, "--sequential", "--executor", "local", "--dry-run", "--results", results)
    assert code == 0 and "sequential design (recorded)" in out


# ------------------------------------------------------------------------------------ no spread, no t
def test_equal_differences_are_no_spread_and_never_an_effect():
    design = sequential_design(0.05, 1, looks=2, max_seeds=6)
    for differences in ([0.01, 0.01, 0.01], [0.01, 0.01, 0.01 + 2e-17]):
        decision = sequential_decision(differences, design)
        assert decision["decision"] == "continue" and decision["t"] is None and decision["sign"] is None
        assert decision["ci_low"] is None  # no spread, no interval (not a zero-width one that excludes 0)
    # differences equal up to the rounding of the losses (|t| ≈ 4e14 without the rule), given their scale
    rounded = [3.9 - 3.8, 4.3 - 4.2, 4.1 - 4.0]
    assert len(set(rounded)) > 1
    assert sequential_decision(rounded, design, scale=4.3)["decision"] == "continue"
    assert sequential_decision([0.010, 0.011, 0.009], design)["decision"] == "effect"  # a real spread still decides


def test_the_declared_table_never_reads_effect_from_rounding(tmp_path):
    folder = tmp_path / "seq"
    for seed, (base, arm) in enumerate([(3.9, 3.8), (4.3, 4.2), (4.1, 4.0)]):  # Δ = 0.1 up to rounding
        write_run(tmp_path, "seq", "smoke", "baseline", seed, base, curve_points=2)
        write_run(tmp_path, "seq", "smoke", "sink-logit", seed, arm, curve_points=2)
    declared = Declared.of((ZERO,), design=sequential_design(0.05, 1, looks=2, max_seeds=6))
    row = build_table(load_runs(folder), "declared", declared=declared).frame.row(0, named=True)
    assert row["decision"] == "continue" and row["sd"] == 0.0 and row["p"] is None


# ------------------------------------------------------------------------------------ edited boundaries
def test_a_lowered_boundary_in_the_ledger_is_refused(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.004, 0.0041])
    design = record(folder)
    assert recorded_design(folder) == design
    ledger = json.loads((folder / LEDGER).read_text())
    assert ledger["submissions"][0]["design"]["looks"][0]["t_boundary"] > 7
    ledger["submissions"][0]["design"]["looks"][0]["t_boundary"] = 2.0  # "continue" would become "effect"
    (folder / LEDGER).write_text(json.dumps(ledger))
    with pytest.raises(AblateError, match=r"submissions\[0\], the sequential design\) is damaged: look 1 records 2 "
                                          r"seeds at \|t\| boundary 2.0, but the design .* gives 2 seeds at 114\.197"):
        recorded_design(folder)
    file = experiment_file(tmp_path, sample_data)
    for command in (["table", file, "--kind", "declared"], ["submit", file, "--sequential", "--executor", "local",
                                                            "--dry-run"]):
        code, _, err = cli(capsys, *command, "--results", results)
        assert code == 2 and "look 1 records 2 seeds at |t| boundary 2.0" in one_line(err)


# ------------------------------------------------------------------------------------ a pilot
def test_runs_finished_before_the_design_are_not_adopted_as_its_first_look(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.0100, 0.0101])  # a pilot: two seeds, seen before any design
    file = experiment_file(tmp_path, sample_data)
    code, out, err = cli(capsys, "submit", file, "--sequential", "--looks", "2", "--max-seeds", "4",
                         "--executor", "local", "--dry-run", "--results", results)
    line = one_line(err)
    assert code == 2 and out == "" and "4 finished run(s) of the declared arms" in line
    assert "smoke/baseline/seed0" in line and "cannot be its first look" in line
    assert not (folder / LEDGER).exists()  # nothing recorded
    code, out, _ = cli(capsys, "submit", file, "--sequential", "--looks", "2", "--max-seeds", "4",
                       "--executor", "local", "--dry-run", "--results", tmp_path / "fresh")
    assert code == 0 and "sequential design (new)" in out  # a fresh folder starts the design


# ------------------------------------------------------------------------------------ interim looks
def test_every_table_at_an_interim_look_states_the_look_and_the_decision(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.010, 0.002, 0.012, 0.004, 0.009, -0.001])  # p ≈ 0.034, |t| ≈ 2.9
    record(folder, looks=2, max_seeds=12)  # look 1 at 6 seeds: its boundary is 4.65
    file = experiment_file(tmp_path, sample_data)
    code, out, _ = cli(capsys, "table", file, "--results", results)
    assert code == 0
    assert "continue (to 12 seeds)" in out and "1 (6 seeds)" in out and "look" in out
    assert "supported only if p_holm < 0.05" not in out and "decides nothing here" in out
    runs = load_runs(folder)
    declared = Declared.of((ZERO,), design=recorded_design(folder).boundaries)
    paired = build_table(runs, "paired", declared=declared)
    row = paired.frame.filter(paired.frame["arm"] == "sink-logit").row(0, named=True)
    assert row["p_holm"] < 0.05 and row["decision"] == "continue" and row["look"] == 1
    for fmt in ("csv", "latex", "json"):
        assert "continue" in render(paired, fmt)
    code, out, _ = cli(capsys, "report", file, "--results", results)
    summary = (folder / "report" / "summary.md").read_text()
    assert code == 0 and "has decided effect for no declared comparison yet" in summary
    assert "none has p_holm < 0.05" not in summary


# ------------------------------------------------------------------------------------ a damaged ledger
def test_a_run_entry_that_is_not_an_object_is_one_line(tmp_path, sample_data, capsys):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.004, -0.003])
    record(folder)
    ledger = json.loads((folder / LEDGER).read_text())
    ledger["runs"]["smoke/baseline/seed0"] = "queued"
    (folder / LEDGER).write_text(json.dumps(ledger))
    file = experiment_file(tmp_path, sample_data)
    for command in (["status", file], ["table", file, "--kind", "declared"],
                    ["submit", file, "--sequential", "--executor", "local", "--dry-run"]):
        code, _, err = cli(capsys, *command, "--results", results)
        line = one_line(err)
        assert code == 2 and str(folder / LEDGER) in line and "runs['smoke/baseline/seed0'] is a str" in line


@pytest.mark.parametrize("damage", ["no design", "not an object", "design a list"])
def test_a_sequential_record_without_its_design_is_one_line(tmp_path, sample_data, capsys, damage):
    results = tmp_path / "results"
    folder = write_seeds(results, [0.004, -0.003])
    record(folder)
    ledger = json.loads((folder / LEDGER).read_text())
    entry = ledger["submissions"][0]
    if damage == "no design":
        del entry["design"]
    elif damage == "design a list":
        entry["design"] = [1, 2]
    else:
        ledger["submissions"].append({"kind": "sequential-design", "looks": "two"})
    (folder / LEDGER).write_text(json.dumps(ledger))
    file = experiment_file(tmp_path, sample_data)
    for command in (["status", file], ["table", file, "--kind", "declared"],
                    ["submit", file, "--sequential", "--executor", "local", "--dry-run"]):
        code, _, err = cli(capsys, *command, "--results", results)
        if command[0] == "status":  # status does not follow the design: it still shows the runs
            assert code in (0, 1) and "Traceback" not in err
            continue
        line = one_line(err)
        assert code == 2 and str(folder / LEDGER) in line and "the sequential design) is damaged" in line
