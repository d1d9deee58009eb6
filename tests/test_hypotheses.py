"""Declared comparisons: validated against the experiment's arms; Holm over the declared family only;
every other row exploratory (unadjusted p, never supported); the report states the family and its size."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from ablate.analysis.hypotheses import Declared
from ablate.analysis.load import load_runs
from ablate.analysis.report import declared_section, flags_section, tables_section, write_report
from ablate.analysis.build import build_table
from ablate.cli import main
from ablate.errors import AblateError
from ablate.experiment import Comparison, Experiment, load_experiment
from analysis_fixtures import reference_losses, write_store

pytestmark = pytest.mark.unit

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))
ARMS = ("baseline", "sink-logit", "off-by-one", "combo", "combo2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_runs(write_store(tmp_path_factory.mktemp("results")))


def test_the_study_declares_its_three_increments_in_the_direction_the_tables_use():
    study = load_experiment("sink_vs_filter")
    assert [(c.name, c.minuend, c.subtrahend) for c in study.hypotheses] == list(STUDY)
    assert study.family == "tier" and study.family_size() == 3
    assert set(study.comparisons()) == set(study.tiers)


@pytest.mark.parametrize("kwargs, needle", [
    ({"hypotheses": [Comparison("x", "baseline", "proj-gate")]}, "arm 'proj-gate'"),
    ({"hypotheses": [Comparison("x", "baseline", "combo"), Comparison("x", "baseline", "combo2")]}, "'x' twice"),
    ({"hypotheses": [("x", "baseline", "combo")]}, "list of Comparison"),
    ({"family": "arm"}, "valid families: tier, experiment"),
])
def test_bad_declarations_are_refused_naming_the_value(kwargs, needle):
    with pytest.raises(AblateError, match=needle) as err:
        Experiment(name="e", tiers=("10M",), arms=ARMS, seeds=3, **kwargs)
    assert "\n" not in str(err.value)
    if "proj-gate" in needle:
        assert "its arms: baseline, sink-logit" in str(err.value)


def test_a_comparison_of_an_arm_with_itself_is_refused():
    with pytest.raises(AblateError, match="with itself"):
        Comparison("same", "combo", "combo")


def holm_reference(pvalues):
    return list(multipletests(pvalues, method="holm")[1])


def test_holm_adjusts_over_the_declared_family_only(runs):
    """Independent: scipy's paired t-test and statsmodels' Holm over the three declared comparisons of a tier."""
    losses = reference_losses()
    paired = build_table(runs, "paired", declared=Declared.of(STUDY))
    family = build_table(runs, "declared", declared=Declared.of(STUDY))
    for tier in ("10M", "50M", "124M"):
        p = [stats.ttest_rel([losses[(tier, a, s)] for s in range(3)], [losses[(tier, b, s)] for s in range(3)]).pvalue
             for _, a, b in STUDY]
        expected = holm_reference(p)
        rows = family.frame.filter(tier=tier).sort("comparison")
        got = dict(zip(rows["comparison"], rows["p_holm"]))
        assert [got[name] for name, _, _ in STUDY] == pytest.approx(expected, rel=1e-9)
        sink = paired.frame.filter(tier=tier, arm="sink-logit").row(0, named=True)
        assert sink["p_holm"] == pytest.approx(expected[0], rel=1e-9) and sink["marks"] is None
    before = build_table(runs, "paired").frame.filter(tier="10M")
    declared = family.frame.filter(tier="10M", comparison="zero_option")["p_holm"][0]
    undeclared = before.filter(arm="sink-logit")["p_holm"][0]  # over the 8 arms of the tier, as before
    assert undeclared == pytest.approx(holm_reference(before["p"].to_list())[0], rel=1e-9) and undeclared > declared


def test_other_rows_are_exploratory_with_unadjusted_p_and_no_p_holm(runs):
    declared = Declared.of(STUDY)
    for kind in ("paired", "increments", "overlap"):
        before, after = build_table(runs, kind), build_table(runs, kind, declared=declared)
        assert after.frame["p"].to_list() == before.frame["p"].to_list()  # p itself never changes
        exploratory = after.frame.filter(after.frame["marks"].fill_null("").str.contains("exploratory"))
        assert exploratory["p_holm"].null_count() == exploratory.height
        assert ("exploratory" in "\n".join(after.warnings)) == (exploratory.height > 0)
    overlap = build_table(runs, "overlap", declared=declared)
    assert overlap.frame["marks"].str.contains("exploratory").all()  # no overlap is a difference of two arms
    increments = build_table(runs, "increments", declared=declared)
    assert increments.frame["marks"].null_count() == increments.frame.height  # all three are declared


def test_the_experiment_wide_family_adjusts_every_tested_row_together(runs):
    family = build_table(runs, "declared", declared=Declared.of(STUDY, family="experiment")).frame
    tested = family.filter(family["p"].is_not_null())
    assert tested.height == 9  # 10M, 50M, 124M × 3; 350M has one seed and no test, yet its 3 count in m = 12
    # with family="experiment" the 5 scale slopes (on their law p) are in the same Holm: m = 12 + 5
    slopes = build_table(runs, "scale", declared=Declared.of(STUDY, family="experiment")).rows
    law = slopes.filter(slopes["family"] == "experiment")["law_p"].to_list()
    expected = holm_reference(tested["p"].to_list() + law + [1.0] * 3)[:9]
    assert tested["p_holm"].to_list() == pytest.approx(expected, rel=1e-9)


def test_no_declarations_leave_every_table_as_before(runs):
    for kind in ("paired", "increments", "overlap"):
        assert build_table(runs, kind, declared=None).frame.equals(build_table(runs, kind).frame)
        assert build_table(runs, kind, declared=Declared.of(())).frame.equals(build_table(runs, kind).frame)
    with pytest.raises(AblateError, match="no declared comparisons"):
        build_table(runs, "declared")


def supported_lines(summary: str) -> list[str]:
    part = summary.split("## Supported effects", 1)[1].split("## Effects whose", 1)[0]
    return [line for line in part.splitlines() if line.startswith("- ")]


def test_an_exploratory_row_is_never_supported_and_the_report_states_the_family(tmp_path):
    """The report's sections that list the supported effects, write the tables and state the declared family (the
    curves, scale and other sections are other tests')."""
    folder, sections = write_store(tmp_path / "results"), [tables_section, flags_section, declared_section]
    plain = supported_lines((write_report(folder, [flags_section]) / "summary.md").read_text())
    assert any("10M off-by-one vs baseline" in line for line in plain)  # p_holm over 8 arms: 0.0017
    summary = (write_report(folder, sections, declared=Declared.of(STUDY)) / "summary.md").read_text()
    lines = supported_lines(summary)
    assert lines and not any("off-by-one" in line or "overlap" in line for line in lines)
    assert all(any(name in line or "vs baseline" in line for name, _, _ in STUDY) for line in lines)
    assert "## Declared comparisons" in summary
    assert "Holm's m per tier = 10M: 3, 50M: 3, 124M: 3, 350M: 3 (the design's)" in summary
    assert "Every other row is exploratory" in summary
    assert (folder / "report" / "declared.md").is_file()


def test_the_table_command_takes_the_family_from_the_experiment_file(tmp_path, capsys):
    results = tmp_path / "results"
    write_store(results, "sink_vs_filter")
    assert main(["table", "sink_vs_filter", "--results", str(results), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    marks = {(r["tier"], r["arm"]): r["marks"] for r in rows}
    assert marks[("10M", "sink-logit")] is None and marks[("10M", "off-by-one")] == "exploratory"
    assert main(["table", "sink_vs_filter", "--results", str(results), "--kind", "declared"]) == 0
    out = capsys.readouterr().out
    assert "zero_option (baseline − sink-logit)" in out and "declared family only" in out
    assert np.isfinite([r["p"] for r in rows if r["p"] is not None]).all()


def test_a_comparison_declared_at_some_tiers_is_tested_and_adjusted_there_only(runs):
    """`Comparison(..., tiers=)`: its pairs at other tiers are no rows of the declared table and no members of
    those tiers' Holm families."""
    everywhere = Declared.of([Comparison(*STUDY[0]), Comparison(*STUDY[1])])
    restricted = Declared.of([Comparison(*STUDY[0]), Comparison(*STUDY[1], tiers=("50M",))])
    full = build_table(runs, "declared", declared=everywhere).frame
    some = build_table(runs, "declared", declared=restricted).frame
    assert set(some.filter(comparison="filtering_norm")["tier"]) == {"50M"}
    assert set(full.filter(comparison="filtering_norm")["tier"]) > {"50M"}
    assert set(some.filter(comparison="zero_option")["tier"]) == set(full.filter(comparison="zero_option")["tier"])
    # at 10M the family is the zero option alone: its p_holm is its p; at 50M both are in it, as before
    ten = some.filter(tier="10M", comparison="zero_option").row(0, named=True)
    assert ten["p_holm"] == pytest.approx(ten["p"])
    fifty = some.filter(tier="50M")
    assert fifty.select("p_holm").equals(full.filter(tier="50M").select("p_holm"))
