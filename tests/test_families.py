"""Families a paper can defend: the m the table states is the m Holm used, the study-wide
error of the design is stated (with family="experiment" the scale slopes are in the family, and a
simulation of null studies holds the study-wide false-"supported" rate to α), and a downstream
metric's table is exploratory, never supported."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import ALPHA, Declared, study_holm
from ablate.analysis.load import load_runs
from ablate.analysis.runs import Runs
from ablate.analysis.report import make_report
from ablate.analysis.scale import fit_lines, law_interval
from ablate.analysis.scale_family import scale_members
from ablate.analysis.scale_text import trend_sentence
from ablate.analysis.stats import holm
from ablate.analysis.tables import EXPLORATORY
from ablate.power import sequential_design
from ablate.family import Family
from ablate.tiers import tier_rank
from analysis_fixtures import write_store

pytestmark = pytest.mark.unit

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))
NULL_STUDIES = 2000
NULL_SEEDS = {"10M": 3, "50M": 3, "124M": 3, "350M": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_runs(write_store(tmp_path_factory.mktemp("results")))


def test_the_experiment_family_states_the_m_holm_used(runs):
    """family="experiment": one Holm over every tier's declared rows and the scale slopes of the declared comparisons
    and the gaps; at 3/3/3/1 seeds with the study's three comparisons that is 12 rows (350M's 3 have one seed and no
    p, yet they are the design's: they count at p = 1) and 5 slopes, and the m the family states is that 17."""
    declared = Declared.of(STUDY, "experiment")
    table = build_table(runs, "declared", declared=declared)
    scale = build_table(runs, "scale", declared=declared)
    evidence = table.frame.filter(~pl.col("tier").is_in(["smoke"]))
    with_p = evidence.filter(pl.col("p").is_not_null())
    slopes = scale.rows.filter(pl.col("family") == "experiment")
    assert slopes["quantity"].to_list() == [*(name for name, _, _ in STUDY), "gap_norm", "gap_proj"]
    stated = int(re.search(r"Holm's m = (\d+)", table.family).group(1))
    assert stated == evidence.height + slopes.height == 17 and with_p.height == 9 < evidence.height
    untested = [1.0] * (evidence.height - with_p.height)
    # the union, adjusted together; a slope on its law-of-N p
    joint = holm(with_p["p"].to_list() + slopes["law_p"].to_list() + untested)[:14]
    assert with_p["p_holm"].to_list() + slopes["p_holm"].to_list() == pytest.approx(joint, rel=1e-12)
    smallest = min(with_p["p"].to_list() + slopes["law_p"].to_list())
    assert min(joint) == pytest.approx(min(1.0, stated * smallest))  # Holm's first step is m·p
    assert scale.family == table.family and "study-wide chance of any false supported ≤ 0.05" in table.family
    assert "5 scale slope(s): zero_option, filtering_norm, filtering_proj, gap_norm, gap_proj" in table.family
    decisions = ["supported" if p < 0.05 else "not supported" for p in slopes["p_holm"].to_list()]
    assert slopes["decision"].to_list() == decisions


def test_an_increment_that_is_not_declared_is_an_exploratory_slope(runs):
    declared = Declared.of(STUDY[:1], "experiment")
    scale = build_table(runs, "scale", declared=declared)
    rows = {r["quantity"]: r for r in scale.rows.iter_rows(named=True)}
    assert {q for q, r in rows.items() if r["family"] == "experiment"} == {"zero_option", "gap_norm", "gap_proj"}
    for quantity in ("filtering_norm", "filtering_proj"):
        assert rows[quantity]["decision"] == "exploratory" and rows[quantity]["p_holm"] is None
        assert rows[quantity]["p"] is not None
    table = build_table(runs, "declared", declared=declared)
    assert "Holm's m = 7 (4 declared comparison row(s) and 3 scale slope(s)" in table.family


def test_the_tier_family_and_a_sequential_design_leave_every_slope_exploratory(runs):
    tier = build_table(runs, "scale", declared=Declared.of(STUDY, "tier"))
    design = sequential_design(0.05, 12, 2, 3)
    sequential = build_table(runs, "scale", declared=Declared.of(STUDY, "experiment", design))
    for scale, why in ((tier, 'family="tier"'), (sequential, "a sequential design spends α")):
        assert scale.rows["decision"].to_list() == ["exploratory"] * scale.rows.height
        assert scale.rows["p_holm"].is_null().all() and scale.rows["family"].is_null().all()
        assert scale.family.startswith(why) and "every slope is exploratory" in scale.family
        assert all("(exploratory" in trend_sentence(r) for r in scale.rows.iter_rows(named=True) if r["p"])
    family = build_table(runs, "declared", declared=Declared.of(STUDY, "experiment", design))
    assert "Holm's m = 12" in family.family and "the scale slopes are in no family" in family.family
    assert "the scale slopes span the tiers, so they are in no family: exploratory" in build_table(
        runs, "declared", declared=Declared.of(STUDY, "tier")).family


def test_the_scale_table_and_the_report_cite_the_adjusted_decision(tmp_path):
    folder = write_store(tmp_path / "results")
    ctx = make_report(folder, declared=Declared.of(STUDY, "experiment"))
    rows = {r["quantity"]: r for r in json.loads((ctx.out_dir / "scale.json").read_text())["rows"]}
    zero = rows["zero_option"]
    assert zero["family"] == "experiment" and zero["p_holm"] > zero["law_p"] > zero["p"]
    # across these four tier recipes the zero option's slope is certain (p 4e-7), but the tier means depart from a
    # line: as a law of N (2 df between tiers) it is not supported in the study-wide family of 17
    assert zero["decision"] == "not supported" and zero["law_low"] < zero["ci_low"] < zero["ci_high"] < zero["law_high"]
    section = (ctx.out_dir / "summary.md").read_text().split("## Scale")[1].split("\n## ")[0]
    assert (f"zero_option (baseline − sink-logit): no trend supported as a law of N (not supported, p_holm "
            f"{zero['p_holm']:.3g} in the study-wide family, on the law interval): as a law of N 95% CI "
            f"[{zero['law_low']:+.4f}, {zero['law_high']:+.4f}], df 2") in section
    assert f"across these 4 tier recipes {zero['slope_per_decade']:+.4f} nats per decade" in section
    assert "Holm's m = 17" in section and "the gap's slope is not supported (p_holm" in section
    assert "| p | law 95% CI (df, p) | p_holm | decision |" in (ctx.out_dir / "scale.md").read_text()


def _null_studies(rng: np.random.Generator) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """R studies with no effect anywhere (every arm's loss the same normal at every tier, seeds 3/3/3/1): the
    tiers of the declared rows with a test, their paired-t p (R × rows), and per scale quantity the slope's p."""
    per_run = {arm: [rng.normal(0.0, 1.0, (NULL_STUDIES, n)) for n in NULL_SEEDS.values()]
               for arm in ("baseline", "sink-logit", "combo", "combo2")}
    diffs = {name: [a - b for a, b in zip(per_run[minuend], per_run[subtrahend])]
             for name, minuend, subtrahend in STUDY}
    diffs["gap_norm"] = [f - z for f, z in zip(diffs["filtering_norm"], diffs["zero_option"])]
    diffs["gap_proj"] = [f - z for f, z in zip(diffs["filtering_proj"], diffs["zero_option"])]
    tiers, p_rows = [], []
    for k, (tier, n) in enumerate(NULL_SEEDS.items()):
        for name, _, _ in STUDY:
            if n > 1:
                tiers.append(tier)
                p_rows.append(stats.ttest_1samp(diffs[name][k], 0.0, axis=1).pvalue)
    counts, sizes = np.array(list(NULL_SEEDS.values())), np.log10([tier_rank(t) for t in NULL_SEEDS])
    slopes = {}
    for quantity, groups in diffs.items():
        means = np.stack([g.mean(axis=1) for g in groups], axis=-1)
        within = sum(((g - g.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) for g in groups)
        slopes[quantity] = law_interval(fit_lines(sizes, counts, means, within), sizes, counts, means)[3]
    return tiers, np.stack(p_rows, axis=1), slopes


def test_the_study_wide_false_supported_rate_is_held_with_the_slopes_in_the_family(runs):
    """2000 null studies, each judged as the analysis judges one: the declared rows and the member slopes in one
    Holm family (`study_holm`, members by `scale_members`). A study has a false "supported" when any row or slope
    gets p_holm < α. Its rate is ≤ α within Monte Carlo error (3 se, se = √(α(1−α)/R) = 0.0049); leaving the slopes
    out of the family (each read from its unadjusted 95% interval, as the headline sentences were) breaks it."""
    declared = Declared.of(STUDY, "experiment")
    members = scale_members(build_table(runs, "scale", declared=declared), declared, runs)
    tiers, p_rows, p_slopes = _null_studies(np.random.default_rng(20261203))
    bound = ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / NULL_STUDIES)
    family = Family.of(STUDY, NULL_SEEDS, "experiment")
    names = [name for _ in range(len(tiers) // len(STUDY)) for name, _, _ in STUDY]
    joint = alone = 0
    for r in range(NULL_STUDIES):
        frame = pl.DataFrame({"tier": tiers, "comparison": names, "p": p_rows[r]})
        rows, slopes = study_holm(frame, family, {q: float(p_slopes[q][r]) for q in members})
        joint += min(rows.min(), min(slopes.values())) < ALPHA
        held, _ = study_holm(frame, dataclasses.replace(family, slopes=()))
        alone += held.min() < ALPHA or min(p_slopes[q][r] for q in members) < ALPHA
    assert len(slopes) == 5 and joint / NULL_STUDIES <= bound
    assert alone / NULL_STUDIES > bound  # the test can tell: the slopes outside the family exceed α
    method = " ".join((Path(__file__).resolve().parents[1] / "docs" / "method.md").read_text().split())
    assert (f"finds {joint / NULL_STUDIES:.4f} with the slopes in the family, {alone / NULL_STUDIES:.4f} with them "
            "read from their unadjusted intervals") in method
    assert "`family=\"experiment\"` has m = 12 rows + 5 slopes = 17" in method


def test_the_tier_family_states_each_tiers_m_and_the_study_wide_error(runs):
    table = build_table(runs, "declared", declared=Declared.of(STUDY, "tier"))
    for tier, part in table.frame.partition_by("tier", as_dict=True).items():
        if tier[0] == "smoke":
            continue
        m = part.height  # the design's: 350M's rows have one seed and no p, yet they count
        assert m == 3 and f"{tier[0]}: {m}" in table.family
        if part["p"].drop_nulls().len():
            smallest = part.sort("p", nulls_last=True).row(0, named=True)
            assert smallest["p_holm"] == pytest.approx(min(1.0, m * smallest["p"]))
    k = sum(1 for t in table.frame.partition_by("tier", as_dict=True) if t[0] != "smoke")
    assert f"≤ {min(1.0, 0.05 * k):.2f} ({k} tier families" in table.family
    assert f"{1 - 0.95 ** k:.2f} if they were independent" in table.family


def test_a_downstream_metric_table_is_exploratory_with_a_family_declared(runs):
    metric = Runs(runs.name, runs.frame, runs.root, runs.notes, metric="hellaswag/acc", higher_is_better=True)
    table = build_table(metric, "paired", "baseline", declared=Declared.of(STUDY, "experiment"))
    assert table.family is None and table.frame["p_holm"].is_null().all()
    assert all(EXPLORATORY in (marks or "").split(",") for marks in table.frame["marks"].to_list())
    assert any("downstream metric" in note for note in table.notes)
