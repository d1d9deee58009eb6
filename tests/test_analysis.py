"""Tables of the analysis: reference figures, statistics and Holm against scipy and a direct implementation,
pairing, missing and excluded runs, row marks, the absolute-loss table."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
from scipy import stats

from analysis_fixtures import REFERENCE, SEEDS, TIERS, reference_losses, write_csv, write_run, write_store
from ablate.experiment import results_of
from ablate.analysis.load import load_runs
from ablate.analysis.render import render
from ablate.analysis.stats import holm, summarise
from ablate.analysis.build import build_table
from ablate.analysis.tables import (PIPELINE_CHECK, add_mark, increments_table, losses_table, overlap_table,
                                    paired_table)
from ablate.errors import AblateError

pytestmark = pytest.mark.unit

PAIRED_COLUMNS = ["tier", "arm", "reference", "n", "mean", "sd", "se", "ci_low", "ci_high", "min", "max", "agree", "p",
                  "p_holm", "marks"]
STAT_COLUMNS = ["n", "mean", "sd", "se", "ci_low", "ci_high", "min", "max", "agree", "p"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("results"), curve_points=3)


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store)


def _row(table, tier, key_value):
    rows = table.frame.filter((pl.col("tier") == tier) & (pl.col(table.key) == key_value)).to_dicts()
    assert len(rows) == 1, (tier, key_value, rows)
    return rows[0]


def test_increments_reproduce_the_reference_figures(runs):
    table = increments_table(runs)
    assert table.columns == ["tier", "quantity", *STAT_COLUMNS, "p_holm", "marks"]
    for quantity, figures in REFERENCE.items():
        for tier, figure, seeds in zip(TIERS, figures, (SEEDS[t] for t in TIERS)):
            row = _row(table, tier, quantity)
            assert row["mean"] == pytest.approx(figure, abs=1e-9), (tier, quantity)
            assert row["n"] == seeds


def holm_reference(pvalues):
    """Holm's procedure written out directly: reject in ascending order while p_(i) ≤ α/(m − i + 1);
    the adjusted p is the smallest α at which a hypothesis would be rejected."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    for position, i in enumerate(order):
        adjusted[i] = min(1.0, max((m - k) * pvalues[order[k]] for k in range(position + 1)))
    return adjusted


def test_statistics_match_scipy(runs):
    losses = reference_losses()
    table = paired_table(runs, "baseline")
    checked = 0
    for row in table.frame.iter_rows(named=True):
        seeds = range(SEEDS[row["tier"]])
        base = np.array([losses[(row["tier"], "baseline", s)] for s in seeds])
        arm = np.array([losses[(row["tier"], row["arm"], s)] for s in seeds])
        diffs = base - arm
        if len(diffs) < 2:
            assert row["p"] is None and row["p_holm"] is None
            continue
        assert row["p"] == pytest.approx(stats.ttest_rel(base, arm).pvalue, rel=1e-9)
        assert row["p"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
        interval = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
        assert row["n"] == len(diffs)
        assert row["mean"] == pytest.approx(diffs.mean(), abs=1e-12)
        assert row["sd"] == pytest.approx(np.std(diffs, ddof=1), rel=1e-9)
        assert row["se"] == pytest.approx(stats.sem(diffs), rel=1e-9)
        assert row["ci_low"] == pytest.approx(interval.low, rel=1e-9)
        assert row["ci_high"] == pytest.approx(interval.high, rel=1e-9)
        assert (row["min"] == pytest.approx(diffs.min(), abs=1e-12) and row["max"]
                == pytest.approx(diffs.max(), abs=1e-12))
        assert row["agree"] == int((np.sign(diffs) == np.sign(diffs.mean())).sum())
        checked += 1
    assert checked == 8 * 3  # eight arms against baseline at the three tiers with three seeds
    for tier in TIERS[:3]:
        rows = table.frame.filter(tier=tier)
        assert rows["p_holm"].to_list() == pytest.approx(holm_reference(rows["p"].to_list()), rel=1e-12)
    assert (table.frame["p_holm"].drop_nulls() >= table.frame["p"].drop_nulls()).all()


def test_holm_against_the_direct_procedure():
    rng = np.random.default_rng(5)
    for m in (1, 2, 5, 11):
        pvalues = rng.uniform(0.0, 0.2, m).tolist()
        assert holm(pvalues) == pytest.approx(holm_reference(pvalues), rel=1e-12)
    assert holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])  # m = 3: nulls not counted
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1 and monotone
    assert holm([]) == []


def test_agree_follows_the_sign_of_the_mean_and_degenerate_groups_do_not_crash():
    diffs = pl.DataFrame({
        "g": ["neg"] * 3 + ["mixed"] * 3 + ["tie"] * 3 + ["zero"] * 2 + ["one"],
        "seed": [0, 1, 2] * 3 + [0, 1, 0],
        "diff": [-0.01, -0.02, -0.03, 0.02, 0.01, -0.005, 0.004, 0.004, 0.004, 0.0, 0.0, 0.3],
    })
    rows = {r["g"]: r for r in summarise(diffs, ["g"]).iter_rows(named=True)}
    assert rows["neg"]["agree"] == 3  # an effect negative in every seed agrees 3/3, not 0/3
    assert rows["mixed"]["agree"] == 2
    assert rows["neg"]["p"] == pytest.approx(stats.ttest_1samp([-0.01, -0.02, -0.03], 0.0).pvalue, rel=1e-9)
    for name in ("tie", "zero"):  # no spread: the t statistic is undefined, so no p (scipy: 0 and NaN)
        assert rows[name]["sd"] == 0.0 and rows[name]["p"] is None
    assert rows["tie"]["agree"] == 3 and rows["zero"]["agree"] == 0
    assert rows["one"]["n"] == 1 and rows["one"]["p"] is None and rows["one"]["sd"] is None


def test_pipeline_check_tier_is_marked_and_losses_table(tmp_path):
    losses = {(tier, arm, s): 7.6 + 0.01 * s + (0.002 if arm == "sink-logit" else 0.0)
              for tier in ("smoke", "10M") for arm in ("baseline", "sink-logit") for s in range(2)}
    runs = load_runs(write_store(tmp_path, losses=losses, curve_points=2))
    for kind in ("paired", "increments"):
        table = build_table(runs, kind)
        marks = dict(zip(table.frame["tier"], table.frame["marks"]))
        assert marks == {"smoke": PIPELINE_CHECK, "10M": None}, kind
        md = render(table, "md")
        assert "| smoke |" in md and md.count(PIPELINE_CHECK) >= 2 and "carry no evidence" in md
        assert any("carry no evidence" in w for w in table.warnings)
    table = losses_table(runs)
    assert table.columns == ["tier", "arm", "n", "mean", "sd", "se", "min", "max", "marks"]
    row = table.frame.filter(tier="10M", arm="sink-logit").row(0, named=True)
    assert (row["n"] == 2 and row["mean"] == pytest.approx(7.607) and row["sd"]
            == pytest.approx(np.std([7.602, 7.612], ddof=1)))
    assert row["se"] == pytest.approx(row["sd"] / np.sqrt(2))
    md = render(table, "md")
    assert "| 10M | sink-logit | 2 | 7.6070 ± 0.0071 | 0.0050 |" in md and "pipeline-check" in md
    assert "Marks" in render(table, "latex")
    marked = add_mark(table.frame, pl.col("arm") == "sink-logit", "parameter-matched")
    assert marked.filter(tier="smoke", arm="sink-logit")["marks"].item() == "pipeline-check,parameter-matched"
    assert marked.filter(tier="10M", arm="baseline")["marks"].item() is None


def test_overlap_matches_its_definition(runs):
    losses = reference_losses()
    table = overlap_table(runs)
    assert table.columns == ["tier", "gate", *STAT_COLUMNS, "p_holm", "marks"]
    for gate, alone, both in (("norm", "norm-gate", "combo"), ("proj", "proj-gate", "combo2")):
        for tier in TIERS:
            def gain(arm, s, tier=tier):
                return losses[(tier, "baseline", s)] - losses[(tier, arm, s)]
            per_seed = [gain("sink-logit", s) + gain(alone, s) - gain(both, s) for s in range(SEEDS[tier])]
            row = _row(table, tier, gate)
            assert row["mean"] == pytest.approx(np.mean(per_seed), abs=1e-12)
            assert row["agree"] == sum(v > 0 for v in per_seed)


def test_one_seed_has_no_spread(runs):
    table = increments_table(runs)
    row = _row(table, "350M", "zero_option")
    assert row["n"] == 1
    assert all(row[c] is None for c in ("sd", "se", "ci_low", "ci_high"))
    assert row["min"] == row["max"] == row["mean"]
    md = render(table, "md")
    line = next(line for line in md.splitlines() if line.startswith("| 350M | zero_option"))
    assert "1 seed" in line and "±" not in line
    csv_line = next(line for line in render(table, "csv").splitlines() if line.startswith("350M,zero_option"))
    assert csv_line.split(",")[4:8] == ["", "", "", ""]  # sd, se, ci_low, ci_high empty
    assert csv_line.split(",")[11] == ""  # p empty
    assert json.loads(render(table, "json"))["rows"][-3]["sd"] is None


def test_columns_and_ordering(runs):
    table = paired_table(runs)
    assert table.columns == PAIRED_COLUMNS
    tiers = table.frame["tier"].unique(maintain_order=True).to_list()
    assert tiers == ["10M", "50M", "124M", "350M"]  # by size, not alphabetically
    arms = table.frame.filter(tier="10M")["arm"].to_list()
    assert arms == ["sink-logit", "off-by-one", "sink-token", "norm-gate", "proj-gate", "renorm", "combo", "combo2"]
    assert set(table.frame["reference"].to_list()) == {"baseline"}


def test_custom_arm_sorts_after_builtins_and_other_reference(tmp_path):
    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M" and k[1] in ("baseline", "sink-logit")}
    losses.update({("10M", "my-arm", s): 4.2 for s in range(3)})
    runs = load_runs(write_store(tmp_path, losses=losses, curve_points=2))
    assert paired_table(runs).frame["arm"].to_list() == ["sink-logit", "my-arm"]
    other = paired_table(runs, "sink-logit").frame
    assert other["arm"].to_list() == ["baseline", "my-arm"]
    base = other.filter(arm="baseline").row(0, named=True)
    assert base["mean"] == pytest.approx(-REFERENCE["zero_option"][0], abs=1e-9)  # sign flips with the reference
    with pytest.raises(AblateError, match="unknown reference arm 'nope'.*baseline, sink-logit, my-arm"):
        paired_table(runs, "nope")


def test_csv_and_parquet_give_the_store_tables(runs, tmp_path):
    csv_runs = load_runs(write_csv(tmp_path / "losses.csv"))
    parquet = tmp_path / "losses.parquet"
    pl.read_csv(tmp_path / "losses.csv").write_parquet(parquet)
    for source in (csv_runs, load_runs(parquet)):
        for kind in ("paired", "increments", "overlap"):
            assert build_table(source, kind).frame.equals(build_table(runs, kind).frame), kind


def test_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("tier,arm,seed,loss\n10M,baseline,0,4.2\n")
    with pytest.raises(AblateError, match=r"lacks column\(s\) val_loss.*found: tier, arm, seed, loss"):
        load_runs(path)


def test_fingerprint_mismatch_is_refused(tmp_path):
    folder = write_store(tmp_path, curve_points=2)
    write_run(tmp_path, "study", "50M", "combo", 1, reference_losses()[("50M", "combo", 1)], curve_points=2,
              data_fingerprint="deadbeef")
    with pytest.raises(AblateError) as err:
        load_runs(folder)
    message = str(err.value)
    assert "50M/baseline/seed1" in message and "50M/combo/seed1" in message and "data_fingerprint" in message
    write_run(tmp_path, "study", "50M", "combo", 1, 3.5, curve_points=2, init_fingerprint="cafe")
    with pytest.raises(AblateError, match="init_fingerprint"):
        load_runs(folder)
    write_run(tmp_path, "study", "50M", "combo", 1, 3.5, curve_points=2, val_fingerprint="0ther")
    with pytest.raises(AblateError, match="baseline/seed1 and .*combo/seed1 are not matched: their val_fingerprint"):
        load_runs(folder)
    write_run(tmp_path, "study", "50M", "combo", 1, 3.5, curve_points=2, settings={"lr": 2e-3})
    with pytest.raises(AblateError, match=r"baseline/seed1 and .*combo/seed1 are not matched: their "
                                          r"settings differ \(lr"):
        load_runs(folder)
    # a config_fingerprint that is not its config.json's: the run itself is damaged (tests/test_table_run_identity.py)
    write_run(tmp_path, "study", "50M", "combo", 1, 3.5, curve_points=2, config_fingerprint="0ther")
    with pytest.raises(AblateError, match="combo/seed1 is damaged: its config.json is not the configuration"):
        load_runs(folder)


def test_missing_seed_reduces_n_and_is_listed(tmp_path):
    folder = write_store(tmp_path, curve_points=2)
    shutil.rmtree(folder / "124M" / "combo" / "seed2")
    table = increments_table(load_runs(folder))
    row = _row(table, "124M", "filtering_norm")
    assert row["n"] == 2
    assert _row(table, "124M", "zero_option")["n"] == 3
    losses = reference_losses()
    diffs = [losses[("124M", "sink-logit", s)] - losses[("124M", "combo", s)] for s in (0, 1)]
    assert row["mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    md = render(table, "md")
    assert "Missing seeds" in md and "- 124M combo: seed 2" in md
    assert "missing 124M/combo/seed2: no run" in table.warnings


def test_non_completed_runs_are_excluded_and_listed(tmp_path):
    folder = write_store(tmp_path, curve_points=2)
    write_run(tmp_path, "study", "10M", "sink-logit", 0, None, status="diverged", curve_points=2, diverged_step=812)
    write_run(tmp_path, "study", "10M", "combo2", 2, None, status="failed", curve_points=2, error="CUDA OOM\ntrace")
    write_run(tmp_path, "study", "50M", "combo2", 2, None, status="running", curve_points=2)
    table = increments_table(load_runs(folder))
    assert _row(table, "10M", "zero_option")["n"] == 2
    assert _row(table, "10M", "filtering_proj")["n"] == 1  # seed 0 lacks sink-logit, seed 2 lacks combo2
    assert _row(table, "50M", "filtering_proj")["n"] == 2
    assert table.missing.is_empty()  # every run exists; those that do not count are excluded instead
    md = render(table, "md")
    assert "10M sink-logit seed 0: diverged at step 812" in md
    assert "10M combo2 seed 2: failed: CUDA OOM" in md and "trace" not in md
    assert "50M combo2 seed 2: running" in md
    warnings = json.loads(render(table, "json"))["warnings"]
    assert any("diverged at step 812" in w for w in warnings) and any("running" in w for w in warnings)


def test_csv_status_column_and_bad_values(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("tier,arm,seed,val_loss,status\n10M,baseline,0,4.2,completed\n10M,sink-logit,0,,diverged\n"
                    "10M,baseline,1,4.3,completed\n10M,sink-logit,1,4.28,completed\n")
    runs = load_runs(path)
    table = paired_table(runs)
    assert table.frame["n"].to_list() == [1]
    assert table.excluded.select("arm", "seed", "reason").row(0) == ("sink-logit", 0, "diverged")
    path.write_text("tier,arm,seed,val_loss\n10M,baseline,0,4.2\n10M,baseline,0,4.3\n")
    with pytest.raises(AblateError, match="more than one row for run 10M/baseline/seed0"):
        load_runs(path)


def test_absent_arms_skip_quantities_with_a_note(tmp_path):
    losses = {k: v for k, v in reference_losses().items() if k[1] in ("baseline", "sink-logit", "norm-gate")}
    runs = load_runs(write_store(tmp_path, losses=losses, curve_points=2))
    increments = increments_table(runs)
    assert increments.frame["quantity"].unique().to_list() == ["zero_option"]
    assert any("filtering_norm skipped" in n and "combo" in n for n in increments.notes)
    overlap = overlap_table(runs)
    assert overlap.frame.is_empty() and len(overlap.notes) == 2
    assert "Skipped" in render(overlap, "md")


def test_the_kind_registry_is_what_every_reader_knows(runs, store, capsys):
    """One registry (`ablate.analysis.kinds`): build_table, argparse and the renderers take their kinds from it,
    so a kind registered there is listed and built, and any other name is refused in one line everywhere
    (build_table used to build an overlap table for any name it did not know)."""
    from ablate.analysis.build import build_losses
    from ablate.analysis.kinds import ABSOLUTE, KINDS, TableKind, builds, register_kind
    from ablate.cli import main

    for name, kind in KINDS.items():
        if name not in ("declared", "lr"):  # a declared family and an LR sweep: their own tests
            table = build_table(runs, kind)
            assert table.kind == name and render(table, "json") if name != "scale" else table.kind == name
    with pytest.raises(AblateError, match=r"^unknown kind 'lossess'; valid kinds: paired, increments, overlap, "
                                          r"losses, declared, scale, lr, budgets$"):
        build_table(runs, "lossess")
    with pytest.raises(SystemExit):
        main(["table", str(store), "--kind", "lossess"])
    assert "invalid choice: 'lossess'" in capsys.readouterr().err
    register_kind(TableKind("final-losses", "t", "e", "a kind added in a test", shape=ABSOLUTE))
    builds("final-losses", render)(build_losses)
    try:
        assert build_table(runs, "final-losses").kind == "final-losses"
        assert main(["table", str(store), "--kind", "final-losses", "--format", "csv"]) == 0
        assert capsys.readouterr().out.startswith("tier,arm,")
    finally:
        KINDS.pop("final-losses")


def test_kind_format_and_reference_errors(runs):
    with pytest.raises(AblateError, match="unknown kind 'pairs'.*paired, increments, overlap"):
        build_table(runs, "pairs")
    with pytest.raises(AblateError, match="--reference applies to --kind paired or budgets only"):
        build_table(runs, "increments", "sink-logit")
    with pytest.raises(AblateError, match="unknown format 'html'.*md, csv, latex, json"):
        render(paired_table(runs), "html")
    latex = render(increments_table(runs), "latex")
    assert r"\begin{tabular}" in latex and "filtering\\_norm" in latex and "(1 seed)" in latex


def test_unknown_source_is_refused(tmp_path):
    with pytest.raises(AblateError, match="no such file"):
        load_runs(tmp_path / "nope.csv")
    with pytest.raises(AblateError, match="unknown experiment 'no-such-experiment'"):
        load_runs(results_of("no-such-experiment", results=tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AblateError, match="no runs"):
        load_runs(tmp_path / "empty")


def test_experiment_name_and_file_resolve_under_results(store, tmp_path):
    by_name = load_runs(results_of("study", results=store.parent))
    assert by_name.root == store and by_name.frame.height == 9 * 10
    definition = tmp_path / "my_study.py"  # the file's stem differs from the experiment's name on purpose
    definition.write_text("from ablate.experiment import Experiment\n"
                          "EXPERIMENT = Experiment(name='study', tiers=('10M',), arms=('baseline',), seeds=3)\n")
    assert load_runs(results_of(definition, results=store.parent)).root == store
    with pytest.raises(AblateError, match="experiment 'study' has no runs under"):
        load_runs(results_of(definition, results=tmp_path))
