"""The by-item interval covers: a crossed seed × item random-effects model simulated at
several variance mixes, 2-4 seeds × 80 items; the 95% interval must cover the true mean ≥ 93% of the time.
The seed-level t interval (what a per-seed mean alone gives) misses the items' variance and fails it."""

from __future__ import annotations

import numpy as np
import pytest

from ablate.analysis.items import crossed_interval

MIXES = [  # (seed sd, item sd, residual sd) of Δ_si = μ + a_s + b_i + e_si
    (0.01, 0.001, 0.05), (0.001, 0.01, 0.05), (0.005, 0.005, 0.05), (0.01, 0.0, 0.2), (0.0, 0.02, 0.2),
    (0.003, 0.003, 0.3), (0.001, 0.05, 0.05), (0.0, 0.1, 0.1),  # the last two: the items dominate
]
REPETITIONS, ITEMS, TRUE_MEAN = 500, 80, 0.01


def coverage(seeds: int, mix, rng) -> float:
    sa, sb, se = mix
    hits = 0
    for _ in range(REPETITIONS):
        y = (TRUE_MEAN + rng.normal(0, sa, (seeds, 1)) + rng.normal(0, sb, (1, ITEMS))
             + rng.normal(0, se, (seeds, ITEMS)))
        row = crossed_interval({s: dict(enumerate(y[s])) for s in range(seeds)}, list(range(ITEMS)))
        hits += row["re_low"] <= TRUE_MEAN <= row["re_high"]
    return hits / REPETITIONS


@pytest.mark.parametrize("seeds", [2, 3, 4])
def test_the_crossed_interval_covers_at_every_variance_mix(seeds):
    rng = np.random.default_rng(20261201 + seeds)
    found = {mix: coverage(seeds, mix, rng) for mix in MIXES}
    assert min(found.values()) >= 0.93, found


def test_one_seed_is_not_identified():
    row = crossed_interval({0: {i: 0.01 * i for i in range(10)}}, list(range(10)))
    assert row["re_low"] is None and row["re_high"] is None
