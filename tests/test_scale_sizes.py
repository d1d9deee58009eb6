"""The scale model's x is each tier's trained size (the baseline's `params_non_embedding`), never its name: three
tiers overridden to one 98,624-parameter model got "+0.020 per decade of parameters, supported" (issue 54, item 7).
Sizes not distinct: no slope; off the ladder's ±5%: exploratory; unknown (a CSV without sizes): exploratory. Each
note names the tiers and sizes."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared
from ablate.analysis.load import load_runs
from ablate.analysis.scale_sizes import trained_sizes
from ablate.cli import main
from ablate.tiers import tier_rank
from analysis_fixtures import write_csv, write_run

pytestmark = pytest.mark.unit

STUDY = (("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
         ("filtering_proj", "sink-logit", "combo2"))
TIERS = ("10M", "50M", "124M")
OVERRIDE = 98_624  # the size three tiers were overridden to in the attack


def _losses() -> dict:
    """3 tiers × 3 seeds whose zero option shrinks by 0.02 per decade and filtering grows by 0.02, on a line."""
    rng = np.random.default_rng(3)
    losses = {}
    for tier in TIERS:
        decades = np.log10(tier_rank(tier) / 1e7)
        for seed in range(3):
            base = float(4.0 - 0.3 * decades + 0.01 * seed)
            sink = float(base - (0.05 - 0.02 * decades + rng.normal(0, 2e-4)))
            losses[(tier, "baseline", seed)] = base
            losses[(tier, "sink-logit", seed)] = sink
            losses[(tier, "combo", seed)] = float(sink - (0.01 + 0.02 * decades + rng.normal(0, 2e-4)))
            losses[(tier, "combo2", seed)] = float(sink - (0.02 + 0.02 * decades + rng.normal(0, 2e-4)))
    return losses


def _store(results, sizes: dict[str, int] | None = None):
    for (tier, arm, seed), loss in _losses().items():
        extra = {"params_non_embedding": sizes[tier]} if sizes and tier in sizes else {}
        write_run(results, "study", tier, arm, seed, loss, curve_points=2, **extra)
    return load_runs(results / "study")


def _scale(runs):
    return build_table(runs, "scale", declared=Declared.of(STUDY, "experiment"))


def test_the_ladders_sizes_support_the_trend(tmp_path):
    scale = _scale(_store(tmp_path / "results"))
    rows = {r["quantity"]: r for r in scale.rows.iter_rows(named=True)}
    assert rows["zero_option"]["decision"] == "supported" and rows["filtering_proj"]["decision"] == "supported"
    assert scale.unsized is None and not any("Scale model's x" in n for n in scale.notes)


def test_three_tiers_of_one_trained_size_get_no_slope(tmp_path):
    scale = _scale(_store(tmp_path / "results", dict.fromkeys(TIERS, OVERRIDE)))
    assert "supported" not in scale.rows["decision"].to_list()
    assert scale.rows["decision"].to_list() == ["exploratory"] * scale.rows.height
    assert scale.rows["slope_per_decade"].is_null().all()  # a line through one size has no slope
    assert "10M, 50M, 124M all 98,624 non-embedding parameters of the baseline" in scale.unsized
    assert scale.unsized in scale.family and any(scale.unsized in n for n in scale.notes)
    assert not scale.crossings["identified"].any()


def test_sizes_off_the_ladder_make_every_slope_exploratory_naming_them(tmp_path):
    runs = _store(tmp_path / "results", {"10M": 12_000_000})
    scale = _scale(runs)
    assert scale.rows["decision"].to_list() == ["exploratory"] * scale.rows.height
    assert "10M trained at 12,000,000, +20% of its nominal 10,000,000" in scale.unsized
    # x is the trained sizes: the slope is the one over log10(12M), log10(50M), log10(124M)
    zero = scale.rows.filter(quantity="zero_option").row(0, named=True)
    x = np.log10([12e6, 50e6, 124e6])
    means = [np.mean([_losses()[(t, "baseline", s)] - _losses()[(t, "sink-logit", s)] for s in range(3)])
             for t in TIERS]
    assert zero["slope_per_decade"] == pytest.approx(np.polyfit(x, means, 1)[0], rel=1e-9)


def test_a_declared_slope_without_sizes_still_counts_in_m(tmp_path):
    """Exploratory slopes stay in the family's m at p = 1: the other members' Holm does not loosen."""
    sized = build_table(_store(tmp_path / "a"), "declared", declared=Declared.of(STUDY, "experiment"))
    unsized = build_table(_store(tmp_path / "b", dict.fromkeys(TIERS, OVERRIDE)), "declared",
                          declared=Declared.of(STUDY, "experiment"))
    assert "Holm's m = 14" in sized.family and "Holm's m = 14" in unsized.family
    assert (unsized.frame["p_holm"].drop_nulls() >= sized.frame["p_holm"].drop_nulls() - 1e-15).all()


def test_a_csv_without_sizes_is_exploratory_saying_why_and_one_with_them_is_checked(tmp_path, capsys):
    path = write_csv(tmp_path / "losses.csv", _losses())
    assert main(["table", str(path), "--kind", "scale", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("the trained sizes of 10M, 50M, 124M are not known" in n and "a CSV source without that column" in n
               for n in out["notes"])
    runs = load_runs(path)
    assert trained_sizes(runs.frame, list(TIERS), "baseline").problem.startswith("the trained sizes of 10M")
    sized = pl.read_csv(path).with_columns(params_non_embedding=pl.lit(OVERRIDE))
    sized.write_csv(tmp_path / "sized.csv")
    problem = trained_sizes(load_runs(tmp_path / "sized.csv").frame, list(TIERS), "baseline").problem
    assert "not distinct" in problem and "all 98,624" in problem
