"""Claims that mean what they say: Holm's m is the design's (one `Family`, read by the planner, the sequential
design, the tables and the report), the report's "Supported effects" lists only declared comparisons whose
decision is "supported" (the plot's `*` from the same decision), and tiny numbers keep their digits."""

from __future__ import annotations

import re

import polars as pl
import pytest

from ablate.analysis.build import build_table
from ablate.analysis.figures import figure
from ablate.analysis.hypotheses import Declared, declared_for, fixed_decision
from ablate.analysis.load import load_runs
from ablate.analysis.plots import starred_arms
from ablate.analysis.render import render
from ablate.analysis.report import _starred, make_report
from ablate.experiment import Comparison, Experiment
from ablate.family import Family
from ablate.plan import _family_note
from ablate.power import family_sizes
from analysis_fixtures import reference_losses, write_store

pytestmark = pytest.mark.unit

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))


def _losses(arms, tiers=("10M",)):
    return {k: v for k, v in reference_losses().items() if k[1] in arms and k[0] in tiers}


def test_comparisons_that_did_not_run_count_in_holms_m(tmp_path):
    """The demo's case: only baseline and sink-logit ran, three comparisons are declared. zero_option's p is
    adjusted in a family of 3 (the other two at p = 1, "not run"), as the whole grid would, never in m = 1."""
    folder = write_store(tmp_path / "results", losses=_losses(("baseline", "sink-logit")))
    table = build_table(load_runs(folder), "declared", declared=Declared.of(STUDY))
    rows = {r["comparison"]: r for r in table.frame.iter_rows(named=True)}
    assert set(rows) == {"zero_option", "filtering_norm", "filtering_proj"}
    zero = rows["zero_option"]
    assert zero["p"] is not None and zero["p_holm"] == pytest.approx(min(1.0, 3 * zero["p"]), rel=1e-12)
    for name in ("filtering_norm", "filtering_proj"):
        assert rows[name]["n"] == 0 and rows[name]["p_holm"] is None and "not run" in rows[name]["marks"]
        assert fixed_decision(rows[name]) == "not run"
    assert "Holm's m per tier = 10M: 3 (the design's)" in table.family
    assert "2 declared comparison row(s) not run" in table.family and "not final" in table.family
    markdown = render(table, "md")
    cells = [line for line in markdown.splitlines() if "filtering" in line and line.startswith("|")]
    assert len(cells) == 2 and all("| not run |" in line and "| 0/0 |" in line for line in cells)
    assert "not run:" in markdown
    assert "(it still counts in Holm's m: a row marked not run)" in markdown


def test_the_experiment_file_gives_the_family_and_the_planner_uses_the_same_m(tmp_path):
    """An experiment declaring three comparisons at 10M and 50M (family="experiment") with only one tier and two
    arms run: the table's m is the experiment's planned m (6 rows + the slopes), the power plan's m too."""
    experiment = Experiment("fam", tiers=("10M", "50M"), arms=["baseline", "sink-logit", "combo", "combo2"], seeds=3,
                            hypotheses=[Comparison(*c) for c in STUDY], family="experiment")
    family = experiment.declared_family()
    assert family.members == tuple((t, name) for t in ("10M", "50M") for name, _, _ in STUDY)
    assert family.slopes == ("zero_option", "filtering_norm", "filtering_proj", "gap_norm", "gap_proj")
    assert experiment.planned_family_size() == family.largest == 11 and experiment.family_size() == 6
    folder = write_store(tmp_path / "results", "fam", losses=_losses(("baseline", "sink-logit")))
    declared = declared_for(experiment, folder)
    table = build_table(load_runs(folder), "declared", declared=declared)
    assert int(re.search(r"Holm's m = (\d+)", table.family).group(1)) == 11
    zero = table.frame.filter(comparison="zero_option").row(0, named=True)
    assert zero["p_holm"] == pytest.approx(min(1.0, 11 * zero["p"]), rel=1e-12)
    assert table.frame.filter(pl.col("n") == 0).height == 5
    sizes = family_sizes({t: [name for name, _, _ in STUDY] for t in experiment.tiers},
                         {t: family.tier_size(t) for t in experiment.tiers})
    assert sizes == {"10M": 11, "50M": 11} and "m = 11" in _family_note(experiment)[0]


def test_the_tier_family_counts_a_comparison_declared_at_that_tier_only():
    family = Family.of([Comparison("a", "baseline", "sink-logit"), Comparison("b", "baseline", "renorm",
                                                                             tiers=("50M",))], ("10M", "50M"))
    assert family.tier_size("10M") == 1 and family.tier_size("50M") == 2 and family.largest == 2
    assert Family.of(STUDY, ("smoke", "10M"), "experiment", sequential=True).tier_size("smoke") == 3  # apart


def _reversed_sink(tmp_path):
    """The study's losses with baseline and sink-logit swapped at 10M: zero_option's Δ is significantly < 0."""
    losses = _losses(("baseline", "sink-logit", "off-by-one"))
    for seed in range(3):
        losses[("10M", "baseline", seed)], losses[("10M", "sink-logit", seed)] = (
            losses[("10M", "sink-logit", seed)], losses[("10M", "baseline", seed)])
    return write_store(tmp_path / "results", losses=losses)


def _supported_lines(summary: str) -> list[str]:
    part = summary.split("## Supported effects", 1)[1].split("## Effects whose", 1)[0]
    return [line for line in part.splitlines() if line.startswith("- ")]


def test_a_failed_prediction_is_never_listed_as_supported_nor_starred(tmp_path):
    ctx = make_report(_reversed_sink(tmp_path), declared=Declared.of(STUDY[:1]))
    family = ctx.tables["declared"].frame.row(0, named=True)
    assert family["mean"] < 0 and family["p_holm"] < 0.05 and fixed_decision(family) == "failed"
    summary = (ctx.out_dir / "summary.md").read_text()
    listed = [line for line in _supported_lines(summary) if not line.startswith("- none")]
    assert not [line for line in listed if "sink-logit" in line or "zero_option" in line]
    assert "decision failed" in summary
    assert "- none: no declared comparison's decision is supported (zero_option: failed, p_holm < 0.05" in summary
    paired = ctx.tables["paired"]
    assert ("10M", "sink-logit") in starred_arms(paired)  # p_holm < 0.05 alone would star it
    assert _starred(ctx, paired) == set() and starred_arms(paired, _starred(ctx, paired)) == set()


def test_a_supported_declared_comparison_is_listed_once_from_its_own_row(tmp_path):
    folder = write_store(tmp_path / "results", losses=_losses(("baseline", "sink-logit", "off-by-one")))
    ctx = make_report(folder, declared=Declared.of(STUDY[:1]))
    lines = _supported_lines((ctx.out_dir / "summary.md").read_text())
    assert lines == [line for line in lines if line.startswith("- 10M zero_option (baseline − sink-logit): ")]
    assert len(lines) == 1 and _starred(ctx, ctx.tables["paired"]) == {("10M", "sink-logit")}


@pytest.mark.parametrize("value, signed, text", [(1.234e-6, True, "+1.23e-06"), (-4.0e-7, True, "-4.00e-07"),
                                                 (2.5e-6, False, "2.50e-06"), (0.0, True, "+0.0000"),
                                                 (0.01234, True, "+0.0123"), (None, True, "–")])
def test_a_nonzero_figure_never_prints_as_zero(value, signed, text):
    assert figure(value, signed) == text
    if "e" in text:
        assert figure(value, signed, latex=True).endswith(f"\\times10^{{{int(text.split('e')[1])}}}")


def test_tiny_effects_keep_their_digits_in_markdown_latex_and_the_report(tmp_path):
    """The testbed's effects are ~1e-6 nats: mean, sd and interval ends print with significant digits."""
    losses = {}
    for seed, gain in enumerate((1.1e-6, 0.9e-6, 1.3e-6)):
        base = 3.5 + 0.01 * seed
        losses[("10M", "baseline", seed)], losses[("10M", "sink-logit", seed)] = base, base - gain
    folder = write_store(tmp_path / "results", losses=losses)
    table = build_table(load_runs(folder), "declared", declared=Declared.of(STUDY[:1]))
    markdown, latex = render(table, "md"), render(table, "latex")
    row = [line for line in markdown.splitlines() if "zero_option" in line][0]
    assert "0.0000" not in row and "e-06 ± " in row and "e-07" in row
    assert "0.0000" not in [line for line in latex.splitlines() if "zero" in line][0] and "\\times10^{-6}" in latex
    summary = (make_report(folder, declared=Declared.of(STUDY[:1])).out_dir / "summary.md").read_text()
    sentence = [line for line in summary.splitlines() if line.startswith("- 10M zero_option")][0]
    assert "0.0000" not in sentence and "e-06" in sentence
