"""Statistics that cannot fake an effect (rounding as spread, crossovers hidden or made)."""

from __future__ import annotations

import numpy as np
import polars as pl
from analysis_fixtures import write_run

from ablate.analysis.crossover import find_crossover
from ablate.analysis.load import load_runs
from ablate.analysis.report import write_report
from ablate.analysis.build import build_table
from ablate.analysis.tables import Table
import pytest

pytestmark = pytest.mark.unit


def _csv(tmp_path, rows) -> pl.DataFrame:
    path = tmp_path / "t.csv"
    path.write_text("tier,arm,seed,val_loss\n" + "".join(f"{t},{a},{s},{v!r}\n" for t, a, s, v in rows))
    return path


def test_a_gain_equal_in_decimal_has_no_spread_and_no_p(tmp_path):
    rows = [("10M", "baseline", s, v) for s, v in enumerate((3.9, 4.3, 4.7))]
    rows += [("10M", "sink-logit", s, v) for s, v in enumerate((3.8, 4.2, 4.6))]
    row = build_table(load_runs(_csv(tmp_path, rows)), "paired").frame.row(0, named=True)
    assert np.std([3.9 - 3.8, 4.3 - 4.2, 4.7 - 4.6], ddof=1) > 0  # the binary rounding the table must not test
    assert row["n"] == 3 and row["sd"] == 0.0 and row["se"] == 0.0
    assert row["p"] is None and row["p_holm"] is None
    assert row["ci_low"] == row["ci_high"] == row["mean"]


def test_a_real_small_spread_is_still_tested(tmp_path):
    rows = [("10M", "baseline", s, 4.0) for s in range(3)]
    rows += [("10M", "sink-logit", s, 4.0 - g) for s, g in enumerate((0.0101, 0.0099, 0.0100))]
    row = build_table(load_runs(_csv(tmp_path, rows)), "paired").frame.row(0, named=True)
    assert row["sd"] > 0 and row["p"] is not None and row["p"] < 1e-3


def test_rounding_is_not_a_supported_effect_in_the_report(tmp_path):
    losses = {"baseline": (3.9, 4.3, 4.7), "sink-logit": (3.8, 4.2, 4.6), "combo": (3.7, 4.1, 4.5),
              "norm-gate": (3.85, 4.25, 4.65), "combo2": (3.7, 4.1, 4.5), "proj-gate": (3.85, 4.25, 4.65)}
    for arm, values in losses.items():
        for seed, value in enumerate(values):
            write_run(tmp_path, "study", "10M", arm, seed, value, curve_points=2)
    summary = (write_report(tmp_path / "study") / "summary.md").read_text()
    supported = summary.split("## Supported effects")[1].split("##")[0]
    assert "- none: no effect outside a pipeline-check tier has two seeds with a spread" in supported, supported
    for kind in ("increments", "overlap"):
        frame = build_table(load_runs(tmp_path / "study"), kind).frame
        assert frame["p"].null_count() == frame.height, (kind, frame)


def _increments(gaps: dict[str, float], differences: pl.DataFrame | None = None) -> Table:
    """An increments table whose filtering_proj − zero_option gap per tier is `gaps`."""
    rows = []
    for tier, gap in gaps.items():
        rows += [{"tier": tier, "quantity": "zero_option", "mean": 0.01},
                 {"tier": tier, "quantity": "filtering_proj", "mean": 0.01 + gap}]
    return Table("increments", "quantity", pl.DataFrame(rows), "t", None, pl.DataFrame(), pl.DataFrame(),
                 differences=differences)


def test_a_crossover_after_a_positive_smallest_tier_is_found():
    result = find_crossover(_increments({"10M": 0.004, "50M": -0.002, "124M": 0.003}), "filtering_proj")
    crossing = result.crossings[0]  # the means' sign change (the fitted line is another matter)
    assert (crossing.below, crossing.above) == ("50M", "124M") and 50e6 < crossing.params < 124e6
    assert "overtakes the zero option between 50M and 124M" in result.message
    assert len(result.crossings) == 1


def test_a_pipeline_check_tier_neither_erases_nor_makes_a_crossover():
    real = find_crossover(_increments({"smoke": 0.004, "10M": -0.002, "50M": 0.003}), "filtering_proj")
    assert (real.below, real.above) == ("10M", "50M")
    assert (real.crossings[0].below, real.crossings[0].above) == ("10M", "50M")
    assert "pipeline-check tier smoke left out" in real.message
    made = find_crossover(_increments({"smoke": -0.004, "10M": 0.002, "50M": 0.003}), "filtering_proj")
    assert made.params is None and not made.crossings and "already exceeds" in made.message
    assert "smoke left out" in made.message


def _seeded(gaps: dict[str, float], noise=(0.0003, -0.0001, -0.0002)) -> pl.DataFrame:
    rows = []
    for tier, gap in gaps.items():
        for seed, e in enumerate(noise):
            rows += [{"tier": tier, "quantity": "zero_option", "seed": seed, "diff": 0.01},
                     {"tier": tier, "quantity": "filtering_proj", "seed": seed, "diff": 0.01 + gap + e}]
    return pl.DataFrame(rows)


def test_every_sign_change_of_the_means_is_reported():
    gaps = {"10M": -0.004, "50M": 0.003, "124M": -0.005, "350M": 0.004}
    result = find_crossover(_increments(gaps, _seeded(gaps)), "filtering_proj")
    assert [(c.below, c.above) for c in result.crossings] == [("10M", "50M"), ("124M", "350M")]
    for crossing, (lo, hi) in zip(result.crossings, ((10e6, 50e6), (124e6, 350e6))):
        assert lo < crossing.params < hi
    assert "2 times" in result.message and "Several sign changes" in result.message
    assert "between 10M and 50M" in result.message and "between 124M and 350M" in result.message
    assert "falls back to or below the zero option at 124M" in result.message
    assert "The fitted line of the gap" in result.message  # the scale model's place is stated beside the means'
    assert "the tier means depart from a line (lack-of-fit p" in result.message  # a zig-zag is no line
