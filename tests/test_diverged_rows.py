"""Diverged runs are outcomes: a row counts its diverged seeds, says what dropping them does,
and a comparison whose better arm diverged is never called supported."""

from __future__ import annotations

import polars as pl

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared, supported
from ablate.analysis.load import load_runs
from analysis_fixtures import reference_losses, write_run, write_store
import pytest

pytestmark = pytest.mark.unit

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))


def test_a_diverged_seed_is_counted_in_its_row_and_never_favours_the_unstable_arm(tmp_path):
    losses = reference_losses()
    for seed in (0, 2):  # combo clearly better on the seeds it finished
        losses[("10M", "combo", seed)] = losses[("10M", "sink-logit", seed)] - 0.01 - 0.0001 * seed
    losses[("10M", "combo", 1)] = None  # written below as diverged
    store = write_store(tmp_path / "results", "study", {k: v for k, v in losses.items() if v is not None})
    write_run(tmp_path / "results", "study", "10M", "combo", 1, None, status="diverged", diverged_step=500)
    runs = load_runs(store)
    declared = Declared.of(STUDY, "tier")
    family = build_table(runs, "declared", declared=declared)
    row = family.frame.filter((pl.col("tier") == "10M") & (pl.col("comparison") == "filtering_norm")).row(0, named=True)
    assert row["diverged"] == 1 and row["n"] == 2 and "diverged" in row["marks"].split(",")
    assert any("10M filtering_norm: 1 of 3 seeds diverged (combo seed 1)" in note for note in family.notes)
    other = family.frame.filter((pl.col("tier") == "10M") & (pl.col("comparison") == "zero_option")).row(0, named=True)
    assert other["diverged"] == 0
    assert row["mean"] > 0 and row["p_holm"] < 0.05  # the seeds left favour combo, the arm that diverged
    assert supported(family)[("10M", "sink-logit", "combo")] is False
    paired = build_table(runs, "paired", "baseline", declared=declared)
    combo = paired.frame.filter((pl.col("tier") == "10M") & (pl.col("arm") == "combo")).row(0, named=True)
    assert combo["diverged"] == 1 and "1 of 3 seeds diverged" in " ".join(paired.warnings)
