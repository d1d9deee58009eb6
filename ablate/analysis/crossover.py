"""The crossover of a filtering increment and the zero-option increment, and its seed-bootstrap interval.

The study's claim is about scale: the zero option (baseline − sink-logit) helps most at small models
and the filtering increment (sink-logit − combo / combo2) grows with size, so somewhere they cross.
The crossover is placed by linear interpolation of the *mean* increments in log10(nominal
non-embedding parameters of the tiers) between the two adjacent tiers where (filtering − zero
option) first turns from ≤ 0 to > 0.

How firmly the means place it comes from a seed bootstrap: within each tier, resample the seeds with
replacement (paired: one seed's zero-option and filtering increments move together, since both come
from that seed's matched runs), recompute the mean increments and the crossover, `BOOTSTRAP_RESAMPLES`
times with a fixed RNG seed (numpy's Generator), and take the 2.5th and 97.5th percentiles of the
crossings. Rule: the interval is reported only if at least `IDENTIFIED_SHARE` (95%) of the resamples
cross inside the tier range; otherwise the crossover is "not identified" (a percentile interval would
need the resamples without a crossing, whose scale is unknown). A tier with one seed resamples to
itself and adds no spread, so the interval then understates the uncertainty; the message says so.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl

from ablate.analysis.tables import DESCRIPTIONS, Table
from ablate.tiers import tier_rank

FILTERING_FORMS = ("filtering_proj", "filtering_norm")
ZERO_OPTION = "zero_option"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
IDENTIFIED_SHARE = 0.95


@dataclass(frozen=True)
class Crossover:
    """Where `form` (a filtering increment) first overtakes the zero-option increment.

    `params` is the crossing of the means between the tiers `below` and `above`; None when there is
    no such flip. `low`/`high` is the bootstrap percentile interval (None when not identified or not
    computed), `share` the fraction of resamples that cross (None when not computed). `message`
    says all of it in words.
    """

    form: str
    params: float | None
    below: str | None
    above: str | None
    message: str
    low: float | None = None
    high: float | None = None
    share: float | None = None


def format_params(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}"


def sized(tier: str) -> bool:
    rank = tier_rank(tier)
    return math.isfinite(rank) and rank > 0


def _crossings(gaps: np.ndarray, log_sizes: np.ndarray) -> np.ndarray:
    """Per row of gaps (resamples × tiers), the log10 crossing or NaN (the rule of `find_crossover`)."""
    flips = (gaps[:, :-1] <= 0) & (gaps[:, 1:] > 0)
    found = flips.any(axis=1) & (gaps[:, 0] <= 0) & ~np.isnan(gaps).any(axis=1)
    i = flips.argmax(axis=1)
    rows = np.arange(gaps.shape[0])
    lo, hi = log_sizes[i], log_sizes[i + 1]
    g0, g1 = gaps[rows, i], gaps[rows, i + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = lo + (hi - lo) * (-g0) / (g1 - g0)
    return np.where(found, crossing, np.nan)


def bootstrap_crossover(differences: pl.DataFrame, form: str, tiers: list[str],
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Crossing scales (parameters; NaN where a resample does not cross) of `resamples` seed resamples.

    `differences`: the increments table's per-seed rows (tier, quantity, seed, diff). Each tier's
    seeds (those with either increment) are drawn with replacement, as many as it has; an increment a
    drawn seed lacks is left out of that mean. Same arguments → same array.
    """
    rng = np.random.default_rng(seed)
    log_sizes = np.log10([tier_rank(t) for t in tiers])
    gaps = np.empty((resamples, len(tiers)))
    for column, tier in enumerate(tiers):
        wide = (differences.filter(pl.col("tier") == tier, pl.col("quantity").is_in([form, ZERO_OPTION]))
                .pivot(on="quantity", index="seed", values="diff").sort("seed"))
        values = {q: wide[q].cast(pl.Float64).fill_null(np.nan).to_numpy() if q in wide.columns
                  else np.full(wide.height, np.nan) for q in (form, ZERO_OPTION)}
        draw = rng.integers(0, wide.height, size=(resamples, wide.height))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a resample with none of a quantity's seeds: NaN
            gaps[:, column] = np.nanmean(values[form][draw], axis=1) - np.nanmean(values[ZERO_OPTION][draw], axis=1)
    return 10 ** _crossings(gaps, log_sizes)


def find_crossover(increments: Table, form: str, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> Crossover:
    """The crossover of one filtering form from the per-tier means, with the bootstrap interval when the
    table carries its per-seed differences."""
    means = {(row["tier"], row["quantity"]): row["mean"] for row in increments.frame.iter_rows(named=True)}
    tiers = sorted({t for t, _ in means if sized(t)}, key=tier_rank)
    tiers = [t for t in tiers if (t, form) in means and (t, ZERO_OPTION) in means]
    label = f"{form} ({DESCRIPTIONS[form]})"
    if len(tiers) < 2:
        return Crossover(form, None, None, None,
                         f"{label}: not enough tiers to place a crossover (needs both increments at two or more "
                         f"tiers of known size; have {', '.join(tiers) or 'none'})")
    gaps = np.array([[means[(t, form)] - means[(t, ZERO_OPTION)] for t in tiers]])
    log_sizes = np.log10([tier_rank(t) for t in tiers])
    crossing = _crossings(gaps, log_sizes)[0]
    interval = _interval(increments, form, tiers, resamples, seed)
    if math.isnan(crossing):
        if gaps[0, 0] > 0:
            text = f"no crossover in range; filtering already exceeds the zero option at the smallest tier, {tiers[0]}"
        else:
            text = f"no crossover in range; the zero option stays at least as large up to {tiers[-1]}"
        return Crossover(form, None, None, None, f"{label}: {text}{interval[3]}", *interval[:3])
    i = int(np.flatnonzero((gaps[0, :-1] <= 0) & (gaps[0, 1:] > 0))[0])
    params = float(10 ** crossing)
    later = [t for t, g in zip(tiers[i + 2:], gaps[0, i + 2:]) if g <= 0]
    tail = f"; it falls back to or below the zero option at {', '.join(later)}" if later else ""
    return Crossover(form, params, tiers[i], tiers[i + 1],
                     f"{label}: overtakes the zero option between {tiers[i]} and {tiers[i + 1]}, at "
                     f"≈ {format_params(params)} parameters (interpolated on a log scale from the means){tail}"
                     f"{interval[3]}", *interval[:3])


def _interval(increments: Table, form: str, tiers: list[str], resamples: int, seed: int):
    """(low, high, share, sentence) of the bootstrap, or Nones and "" without per-seed differences."""
    differences = increments.differences
    if differences is None or differences.is_empty():
        return None, None, None, ""
    crossings = bootstrap_crossover(differences, form, tiers, resamples, seed)
    crossed = crossings[~np.isnan(crossings)]
    share = crossed.size / crossings.size
    seeds = {t: differences.filter(tier=t)["seed"].n_unique() for t in tiers}
    single = [t for t in tiers if seeds[t] < 2]
    caveat = (f"; {', '.join(single)} ha{'s' if len(single) == 1 else 've'} one seed and add{'s' if len(single) == 1 else ''} "
              "no spread, so the interval understates the uncertainty" if single else "")
    what = f"seed bootstrap ({resamples} resamples, RNG seed {seed})"
    if share < IDENTIFIED_SHARE:
        return None, None, share, (f". Not identified: in the {what} only {share:.0%} of resamples cross inside "
                                   f"{tiers[0]}–{tiers[-1]} (an interval needs ≥ {IDENTIFIED_SHARE:.0%}){caveat}")
    low, high = (float(v) for v in np.percentile(crossed, [2.5, 97.5]))
    return low, high, share, (f". 95% {what}: {format_params(low)}–{format_params(high)} parameters "
                              f"({share:.0%} of resamples cross){caveat}")
