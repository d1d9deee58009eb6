"""Families a paper can defend: the m the table states is the m Holm used, the study-wide
error of the design is stated, and a downstream metric's table is exploratory, never supported."""

from __future__ import annotations

import re

import polars as pl
import pytest

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared
from ablate.analysis.load import load_runs
from ablate.analysis.runs import Runs
from ablate.analysis.tables import EXPLORATORY
from analysis_fixtures import write_store

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return load_runs(write_store(tmp_path_factory.mktemp("results")))


def test_the_experiment_family_states_the_m_holm_used(runs):
    table = build_table(runs, "declared", declared=Declared.of(STUDY, "experiment"))
    evidence = table.frame.filter(~pl.col("tier").is_in(["smoke"]))
    with_p = evidence.filter(pl.col("p").is_not_null())
    stated = int(re.search(r"Holm's m = (\d+)", table.family).group(1))
    assert stated == with_p.height < evidence.height  # 350M has one seed: no p, not counted
    smallest = with_p.sort("p").row(0, named=True)
    assert smallest["p_holm"] == pytest.approx(min(1.0, stated * smallest["p"]))  # Holm's first step is m·p
    assert "study-wide chance of any false supported ≤ 0.05" in table.family


def test_the_tier_family_states_each_tiers_m_and_the_study_wide_error(runs):
    table = build_table(runs, "declared", declared=Declared.of(STUDY, "tier"))
    for tier, part in table.frame.partition_by("tier", as_dict=True).items():
        if tier[0] == "smoke":
            continue
        m = part["p"].drop_nulls().len()
        assert f"{tier[0]}: {m}" in table.family
        if m:
            smallest = part.sort("p", nulls_last=True).row(0, named=True)
            assert smallest["p_holm"] == pytest.approx(min(1.0, m * smallest["p"]))
    k = sum(1 for t, part in table.frame.partition_by("tier", as_dict=True).items()
            if t[0] != "smoke" and part["p"].drop_nulls().len())
    assert f"≤ {min(1.0, 0.05 * k):.2f} ({k} tier families" in table.family
    assert f"{1 - 0.95 ** k:.2f} if they were independent" in table.family


def test_a_downstream_metric_table_is_exploratory_with_a_family_declared(runs):
    metric = Runs(runs.name, runs.frame, runs.root, runs.notes, metric="hellaswag/acc", higher_is_better=True)
    table = build_table(metric, "paired", "baseline", declared=Declared.of(STUDY, "experiment"))
    assert table.family is None and table.frame["p_holm"].is_null().all()
    assert all(EXPLORATORY in (marks or "").split(",") for marks in table.frame["marks"].to_list())
    assert any("downstream metric" in note for note in table.notes)
