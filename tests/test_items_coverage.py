"""The by-item interval covers: a crossed seed × item random-effects model simulated at several variance mixes,
2-4 seeds × 50 and 200 items, 2,000 studies per cell (vectorised); the reported 95% interval (the wider of the
crossed and the seed-level ones) must cover the true mean ≥ 93% of the time in every cell (se of a coverage near
0.95 is 0.0049, so 0.93 is 4 se below it). The grid holds the seed-dominated cells where the items still matter
(the last three mixes), where the crossed interval alone covered 0.88-0.89 at 2 seeds × 200 items."""

from __future__ import annotations

import numpy as np
import pytest

from ablate.analysis.items import crossed_interval, crossed_intervals

pytestmark = pytest.mark.unit

MIXES = [  # (seed sd, item sd, residual sd) of Δ_si = μ + a_s + b_i + e_si
    (0.01, 0.001, 0.05), (0.001, 0.01, 0.05), (0.005, 0.005, 0.05), (0.01, 0.0, 0.2), (0.0, 0.02, 0.2),
    (0.003, 0.003, 0.3), (0.001, 0.05, 0.05), (0.0, 0.1, 0.1),  # these two: the items dominate
    (0.01, 0.02, 0.05), (0.02, 0.05, 0.1), (0.01, 0.05, 0.1),  # these three: the seeds dominate, the items matter
]
ITEMS = (50, 200)
REPETITIONS, TRUE_MEAN = 2000, 0.01


def coverage(seeds: int, items: int, mix, rng) -> float:
    sa, sb, se = mix
    y = (TRUE_MEAN + rng.normal(0, sa, (REPETITIONS, seeds, 1)) + rng.normal(0, sb, (REPETITIONS, 1, items))
         + rng.normal(0, se, (REPETITIONS, seeds, items)))
    low, high, _ = crossed_intervals(y)
    return float(np.mean((low <= TRUE_MEAN) & (TRUE_MEAN <= high)))


@pytest.mark.parametrize("seeds", [2, 3, 4])
def test_the_reported_interval_covers_at_every_variance_mix(seeds):
    rng = np.random.default_rng(20261204 + seeds)
    found = {(mix, items): coverage(seeds, items, mix, rng) for mix in MIXES for items in ITEMS}
    assert min(found.values()) >= 0.93, found


def test_the_table_row_is_the_vectorised_interval():
    rng = np.random.default_rng(7)
    y = 0.01 + rng.normal(0, 0.01, (3, 1)) + rng.normal(0, 0.02, (1, 40)) + rng.normal(0, 0.05, (3, 40))
    row = crossed_interval({s: dict(enumerate(y[s])) for s in range(3)}, list(range(40)))
    low, high, df = (float(v) for v in crossed_intervals(y))
    assert (row["re_low"], row["re_high"], row["re_df"]) == pytest.approx((low, high, df), rel=1e-12)


def test_one_seed_is_not_identified():
    row = crossed_interval({0: {i: 0.01 * i for i in range(10)}}, list(range(10)))
    assert row["re_low"] is None and row["re_high"] is None


def test_the_help_text_says_what_the_interval_is(capsys):
    from ablate.cli import main

    with pytest.raises(SystemExit):
        main(["table", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    by_item = text.split("--by-item with --metric", 1)[1].split("--allow-unverified", 1)[0]
    assert "bootstrap" not in by_item and "the wider of a seed × item random-effects one" in by_item
    assert "seed-level t interval" in by_item
