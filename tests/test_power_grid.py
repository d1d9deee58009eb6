"""The planner's seed counts against an independent noncentral-t search on a fine grid.

The independent search takes the two-sided power of the paired t from scipy.stats.nct (boost's
noncentral t, not the cdflib `nctdtr` the planner uses) and, at the few points where it is not a
number, from a trapezoid integral over the sample sd written here; it walks n up from 2 on every δ
at once. Nan counts as not enough power nowhere in it: a point that stays nan fails the test.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ablate.power import seeds_needed, smallest_seeds

pytestmark = pytest.mark.unit

GRID = np.round(np.arange(50, 6001) / 100, 2)  # δ = effect/sd from 0.5 to 60 in steps of 0.01
TARGET = 0.8


def integral_power(noncentrality: np.ndarray, df: np.ndarray, critical: np.ndarray) -> np.ndarray:
    """P(|Z + λ| ≥ c·S), S = √(χ²_df/df), by the trapezoid rule on 20,001 points of S (its chi density)."""
    s = np.linspace(1e-9, 1 + 40 / np.sqrt(df.min()), 20_001)
    out = []
    for lam, k, c in zip(noncentrality, df, critical):
        density = stats.chi.pdf(s * np.sqrt(k), k) * np.sqrt(k)
        tails = stats.norm.cdf(lam - c * s) + stats.norm.cdf(-lam - c * s)
        out.append(np.trapezoid(tails * density, s))
    return np.asarray(out)


def independent_power(d: np.ndarray, n: np.ndarray, level: float) -> np.ndarray:
    df, lam = n - 1, d * np.sqrt(n)
    critical = stats.t.ppf(1 - level / 2, df)
    with np.errstate(all="ignore"):
        value = stats.nct.sf(critical, df, lam) + stats.nct.sf(critical, df, -lam)
    bad = ~np.isfinite(value)
    if bad.any():
        value[bad] = integral_power(lam[bad], df[bad], critical[bad])
    assert np.all(np.isfinite(value))
    return value


def independent_seeds(d: np.ndarray, level: float) -> np.ndarray:
    n = np.full(d.shape, 2)
    short = independent_power(d, n, level) < TARGET
    while short.any():
        n[short] += 1
        short[short] = independent_power(d[short], n[short], level) < TARGET
    return n


@pytest.mark.parametrize("m", [1, 3, 12])
def test_seeds_agree_with_an_independent_noncentral_t_search_on_a_fine_grid(m):
    level = 0.05 / m
    planned = smallest_seeds(GRID, level, TARGET)
    expected = independent_seeds(GRID, level)
    wrong = np.flatnonzero(planned != expected)
    assert wrong.size == 0, [(float(GRID[i]), int(planned[i]), int(expected[i])) for i in wrong[:10]]


def test_the_issue_examples():
    # plan sink_vs_filter --power --effect 0.018 --sd 0.004 --tier 10M: m = 3, power at 3 seeds 0.640
    assert seeds_needed(0.018, 0.004, 0.05, 3, 0.8) == 4
    for d in (35.0, 40.0, 47.0):  # 2 seeds suffice here; nan had made it 3
        assert seeds_needed(d, 1.0, 0.05, 3, 0.8) == 2
