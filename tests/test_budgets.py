"""Loss at several budgets (issue 57 item 5): each declared and paired comparison at 25/50/75/100% of the budget and
as AUC, read from the logged curve (the last logged evaluation at or before each fraction, the in-training
evaluation windows only, never the final larger validation), exploratory, for corpus and task tiers."""

import json
import math

import numpy as np
import polars as pl
import pytest

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared
from ablate.analysis.load import load_runs
from ablate.analysis.render import render
from ablate.cli import main
from ablate.errors import AblateError
from ablate.store import read_metrics
from analysis_fixtures import reference_losses, write_csv, write_store

DECLARED = Declared.of((("zero_option", "baseline", "sink-logit"),))


def curve_of(folder) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in read_metrics(folder / "metrics.jsonl") if "val_loss" in r}


def expected(runs, minuend: str, subtrahend: str, tier: str, read) -> list[float]:
    """Per seed, read(curve of the minuend) − read(curve of the subtrahend), straight from the metrics files."""
    paths = {(r["arm"], r["seed"]): r["path"] for r in runs.completed.filter(tier=tier).iter_rows(named=True)}
    from pathlib import Path

    seeds = sorted(s for a, s in paths if a == minuend)
    return [read(curve_of(Path(paths[(minuend, s)]))) - read(curve_of(Path(paths[(subtrahend, s)]))) for s in seeds]


def area(curve: dict[int, float]) -> float:
    steps = sorted(curve)
    return float(np.trapezoid([curve[s] for s in steps], steps) / (steps[-1] - steps[0]))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study's store, a curve point every 100 of 1,000 steps; every summary's val_loss (the final, larger
    validation) moved 0.05 above the curve's last point for the baseline only, so a table that mixed it in shows."""
    root = tmp_path_factory.mktemp("results")
    folder = write_store(root, "study", curve_points=10)
    for run in folder.glob("*/baseline/seed*"):
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "val_loss": summary["val_loss"] + 0.05}))
    return load_runs(folder)


@pytest.mark.unit
def test_each_comparison_at_each_budget_is_read_from_the_logged_curve(study):
    table = build_table(study, "budgets", None, DECLARED)
    rows = table.frame.filter(tier="10M", comparison="zero_option")
    assert rows["budget"].to_list() == ["25%", "50%", "75%", "100%", "AUC"]
    assert rows["step"].to_list() == [200, 500, 700, 1000, 1000]  # the last logged at or before 250, 500, 750
    for row in rows.iter_rows(named=True):
        step = row["step"]
        read = area if row["budget"] == "AUC" else (lambda curve, step=step: curve[step])
        assert row["mean"] == pytest.approx(np.mean(expected(study, "baseline", "sink-logit", "10M", read)), rel=1e-9)
    final = rows.filter(budget="100%")["mean"][0]
    assert final == pytest.approx(0.0185, abs=1e-9)  # the curve's last point, not the summary's val_loss
    shared = build_table(study, "paired").frame.filter(tier="10M", arm="sink-logit")["mean"][0]
    assert shared == pytest.approx(0.0185 + 0.05, abs=1e-9)  # what mixing the final validation in would give
    assert rows.filter(budget="25%")["mean"][0] < final  # the fixture's curves close towards the end


@pytest.mark.unit
def test_every_row_is_exploratory_and_in_no_family(study):
    table = build_table(study, "budgets", None, DECLARED)
    assert "p_holm" not in table.columns and set(table.frame["marks"].to_list()) == {"exploratory"}
    comparisons = table.frame.filter(tier="50M")["comparison"].unique(maintain_order=True).to_list()
    assert comparisons[:3] == ["zero_option", "sink-logit vs baseline", "off-by-one vs baseline"]  # declared first
    assert len(comparisons) == 1 + 8  # the declared one and every arm against the reference
    text = render(table, "md")
    assert "| 10M | zero_option (baseline − sink-logit) | 25% | 200 | 3 |" in text and "p is unadjusted" in text
    assert "never the final larger validation" in text
    other = build_table(study, "budgets", "sink-logit")
    assert "baseline vs sink-logit" in other.frame["comparison"].to_list()


@pytest.mark.unit
def test_task_tiers_are_read_the_same_way(tmp_path):
    losses = {("abstain-stream", arm, seed): 0.7 - (0.2 if arm == "sink-logit" else 0.0) + 0.01 * seed
              for arm in ("baseline", "sink-logit") for seed in range(3)}
    runs = load_runs(write_store(tmp_path, "tb", losses, curve_points=8))
    rows = build_table(runs, "budgets").frame.filter(tier="abstain-stream")
    assert rows["step"].to_list() == [250, 500, 750, 1000, 1000]
    assert rows.filter(budget="100%")["mean"][0] == pytest.approx(0.2, abs=1e-12)
    assert rows.filter(budget="50%")["mean"][0] == pytest.approx(
        np.mean(expected(runs, "baseline", "sink-logit", "abstain-stream", lambda c: c[500])), rel=1e-12)


@pytest.mark.unit
def test_runs_without_a_curve_or_a_table_file_are_refused_in_one_line(tmp_path, study):
    with pytest.raises(AblateError, match=r"--kind budgets reads each run's logged validation curve; .* is a table "
                                          r"file without curves"):
        build_table(load_runs(write_csv(tmp_path / "runs.csv")), "budgets")
    folder = write_store(tmp_path, "bare", {k: v for k, v in reference_losses().items() if k[0] == "10M"})
    (folder / "10M" / "combo" / "seed1" / "metrics.jsonl").write_text('{"step": 5, "train_loss": 4.0}\n')
    with pytest.raises(AblateError, match=r"run .*10M/combo/seed1 has no logged validation curve"):
        build_table(load_runs(folder), "budgets")
    with pytest.raises(AblateError, match="--metric .* not budgets"):
        main_args = ["table", str(folder), "--kind", "budgets", "--metric", "hellaswag/acc"]
        from ablate.analysis.kinds import check_options, get_kind

        check_options(get_kind("budgets"), ["--metric"])
        assert main_args  # the command refuses it the same way (check_options is what table_command calls)


@pytest.mark.run
def test_trained_runs_read_the_curve_windows_not_the_final_validation(tmp_path, finished_runs, capsys):
    """Real smoke runs (4 steps): the curve is evaluated on val_tokens (2,048 tokens), the final val_loss on
    final_val_tokens (8,192): the 100% column is the curve's step-4 point, 25–75% its step-0 point. The runs other
    tests use too (the session trains each once)."""
    root = finished_runs(tmp_path, ("baseline", 0), ("sink-logit", 0))
    runs = load_runs(root / "study")
    rows = build_table(runs, "budgets").frame.filter(comparison="sink-logit vs baseline")
    assert rows["step"].to_list() == [0, 0, 0, 4, 4]
    curve = expected(runs, "baseline", "sink-logit", "smoke", lambda c: c[4])
    assert rows.filter(budget="100%")["mean"][0] == pytest.approx(np.mean(curve), rel=1e-12)
    final = build_table(runs, "paired").frame.filter(arm="sink-logit")["mean"][0]
    assert not math.isclose(final, np.mean(curve), rel_tol=1e-9)  # the final, larger validation is another number
    assert main(["table", str(root / "study"), "--kind", "budgets", "--format", "csv"]) == 0
    csv = pl.read_csv(capsys.readouterr().out.encode())
    assert csv.filter(pl.col("budget") == "AUC")["step"].to_list() == [4]
