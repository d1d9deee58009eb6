"""The crossovers of a filtering increment and the zero-option increment, with seed-bootstrap intervals.

The study's claim is about scale: the zero option (baseline − sink-logit) helps most at small models
and the filtering increment (sink-logit − combo / combo2) grows with size, so somewhere they cross.
A crossover is placed by linear interpolation of the *mean* increments in log10(nominal
non-embedding parameters of the tiers) between two adjacent tiers where (filtering − zero option)
turns from ≤ 0 to > 0. Every such sign change is reported (the pattern need not start ≤ 0 at the
smallest tier: +, −, + has one crossover, between the second and third tiers), and the message says when
there are several and where the filtering increment falls back. Pipeline-check tiers (below the
smallest real tier) never enter: their numbers carry no evidence, so they must not make or erase one.

How firmly the means place a crossover comes from a seed bootstrap: within each tier, resample the seeds
with replacement (paired: one seed's zero-option and filtering increments move together, since both come
from that seed's matched runs), recompute the mean increments and their crossings, `BOOTSTRAP_RESAMPLES`
times with a fixed RNG seed (numpy's Generator). Each resample's crossing nearest to a crossover of the
means (and nearer to it than to any other of theirs) counts for that crossover; the interval is the 2.5th
and 97.5th percentiles of those. Rule: the interval is reported only if at least `IDENTIFIED_SHARE` (95%)
of the resamples have such a crossing; otherwise the crossover is "not identified" (a percentile interval
would need the resamples without one, whose scale is unknown). A tier with one seed resamples to itself
and adds no spread, so the interval then understates the uncertainty; the message says so.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl

from ablate.analysis.tables import DESCRIPTIONS, Table, is_pipeline_check
from ablate.tiers import tier_rank

FILTERING_FORMS = ("filtering_proj", "filtering_norm")
ZERO_OPTION = "zero_option"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
IDENTIFIED_SHARE = 0.95


@dataclass(frozen=True)
class Crossing:
    """One sign change of the means from ≤ 0 (at `below`) to > 0 (at `above`), at `params` parameters;
    `low`/`high` its bootstrap interval (None when not identified or not computed), `share` the fraction
    of resamples with a crossing that counts for it (None when not computed)."""

    params: float
    below: str
    above: str
    low: float | None = None
    high: float | None = None
    share: float | None = None


@dataclass(frozen=True)
class Crossover:
    """Where `form` (a filtering increment) overtakes the zero-option increment.

    `crossings` holds every sign change from ≤ 0 to > 0 of the means, smallest scale first. `params`,
    `below`, `above`, `low`, `high` and `share` are those of the first (None when there is none; `share`
    is then the fraction of resamples that cross anywhere, None when not computed). `message` says all
    of it in words.
    """

    form: str
    params: float | None
    below: str | None
    above: str | None
    message: str
    low: float | None = None
    high: float | None = None
    share: float | None = None
    crossings: tuple[Crossing, ...] = ()


def format_params(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}"


def sized(tier: str) -> bool:
    rank = tier_rank(tier)
    return math.isfinite(rank) and rank > 0


def _bracket_crossings(gaps: np.ndarray, log_sizes: np.ndarray) -> np.ndarray:
    """Per row of gaps (rows × tiers), the log10 crossing in each bracket of adjacent tiers where the gap
    turns from ≤ 0 to > 0, NaN in the others (rows × tiers − 1)."""
    g0, g1 = gaps[:, :-1], gaps[:, 1:]
    lo, hi = log_sizes[:-1], log_sizes[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = lo + (hi - lo) * (-g0) / (g1 - g0)
    return np.where((g0 <= 0) & (g1 > 0), crossing, np.nan)


def _first(crossings: np.ndarray) -> np.ndarray:
    """Per row, the crossing at the smallest scale, NaN where there is none."""
    found = ~np.isnan(crossings)
    first = np.take_along_axis(crossings, found.argmax(axis=1)[:, None], axis=1)[:, 0]
    return np.where(found.any(axis=1), first, np.nan)


def _nearest(crossings: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """Per row, its crossing nearest to targets[k] among those nearer to it than to any other target."""
    distance = np.abs(crossings[:, :, None] - targets[None, None, :])  # rows × brackets × targets
    mine = np.where(np.argmin(np.where(np.isnan(distance), np.inf, distance), axis=2) == k, distance[:, :, k], np.nan)
    mine = np.where(np.isnan(crossings), np.nan, mine)
    has = ~np.isnan(mine).all(axis=1)
    pick = np.argmin(np.where(np.isnan(mine), np.inf, mine), axis=1)
    return np.where(has, crossings[np.arange(crossings.shape[0]), pick], np.nan)


def _bootstrap_gaps(differences: pl.DataFrame, form: str, tiers: list[str], resamples: int, seed: int) -> np.ndarray:
    """Per resample and tier, mean filtering − mean zero option over the drawn seeds (resamples × tiers)."""
    rng = np.random.default_rng(seed)
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
    return gaps


def bootstrap_crossover(differences: pl.DataFrame, form: str, tiers: list[str],
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """First crossing scales (parameters; NaN where a resample does not cross) of `resamples` seed resamples.

    `differences`: the increments table's per-seed rows (tier, quantity, seed, diff). Each tier's
    seeds (those with either increment) are drawn with replacement, as many as it has; an increment a
    drawn seed lacks is left out of that mean. Same arguments → same array.
    """
    log_sizes = np.log10([tier_rank(t) for t in tiers])
    return 10 ** _first(_bracket_crossings(_bootstrap_gaps(differences, form, tiers, resamples, seed), log_sizes))


def find_crossover(increments: Table, form: str, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> Crossover:
    """Every crossover of one filtering form from the per-tier means, each with its bootstrap interval when
    the table carries its per-seed differences. Pipeline-check tiers are left out (and the message says so)."""
    means = {(row["tier"], row["quantity"]): row["mean"] for row in increments.frame.iter_rows(named=True)}
    candidates = sorted({t for t, _ in means if sized(t)}, key=tier_rank)
    checks = [t for t in candidates if is_pipeline_check(t)]
    tiers = [t for t in candidates if t not in checks and (t, form) in means and (t, ZERO_OPTION) in means]
    label = f"{form} ({DESCRIPTIONS[form]})"
    left_out = (f" (pipeline-check tier{'s' if len(checks) > 1 else ''} {', '.join(checks)} left out: "
                "no evidence either way)" if checks else "")
    if len(tiers) < 2:
        return Crossover(form, None, None, None,
                         f"{label}: not enough tiers to place a crossover (needs both increments at two or more "
                         f"real tiers of known size; have {', '.join(tiers) or 'none'}){left_out}")
    gaps = np.array([[means[(t, form)] - means[(t, ZERO_OPTION)] for t in tiers]])
    log_sizes = np.log10([tier_rank(t) for t in tiers])
    brackets = _bracket_crossings(gaps, log_sizes)[0]
    found = [int(i) for i in np.flatnonzero(~np.isnan(brackets))]
    falls = [tiers[i + 1] for i in range(len(tiers) - 1) if gaps[0, i] > 0 >= gaps[0, i + 1]]
    tail = f"; it falls back to or below the zero option at {', '.join(falls)}" if falls else ""
    boot = _bootstrap(increments, form, tiers, resamples, seed)
    if not found:
        share, text = _no_crossing_interval(boot, tiers)
        if gaps[0, 0] > 0:
            what = f"no crossover in range; filtering already exceeds the zero option at the smallest tier, {tiers[0]}"
        else:
            what = f"no crossover in range; the zero option stays at least as large up to {tiers[-1]}"
        return Crossover(form, None, None, None, f"{label}{left_out}: {what}{tail}{text}", share=share)
    targets = brackets[found]
    crossings, texts = [], []
    for k, i in enumerate(found):
        low, high, share, text = _crossing_interval(boot, targets, k, tiers)
        crossing = Crossing(float(10 ** targets[k]), tiers[i], tiers[i + 1], low, high, share)
        crossings.append(crossing)
        place = f"between {crossing.below} and {crossing.above}, at ≈ {format_params(crossing.params)} parameters"
        texts.append((place, text))
    how = "(interpolated on a log scale from the means)"
    if len(found) == 1:
        message = f"{label}{left_out}: overtakes the zero option {texts[0][0]} {how}{tail}{texts[0][1]}"
    else:
        parts = "; ".join(f"{place}{' (' + text.removeprefix('. ') + ')' if text else ''}" for place, text in texts)
        message = (f"{label}{left_out}: overtakes the zero option {len(found)} times, {how}: {parts}{tail}. "
                   "Several sign changes: the increments do not order the tiers one way")
    first = crossings[0]
    return Crossover(form, first.params, first.below, first.above, message, first.low, first.high, first.share,
                     tuple(crossings))


def _bootstrap(increments: Table, form: str, tiers: list[str], resamples: int, seed: int):
    """(crossings per bracket in log10, resamples, RNG seed, tiers with one seed), or None without per-seed rows."""
    differences = increments.differences
    if differences is None or differences.is_empty():
        return None
    log_sizes = np.log10([tier_rank(t) for t in tiers])
    crossings = _bracket_crossings(_bootstrap_gaps(differences, form, tiers, resamples, seed), log_sizes)
    single = [t for t in tiers if differences.filter(tier=t)["seed"].n_unique() < 2]
    return crossings, resamples, seed, single


def _caveat(single: list[str]) -> str:
    if not single:
        return ""
    one = len(single) == 1
    return (f"; {', '.join(single)} ha{'s' if one else 've'} one seed and add{'s' if one else ''} no spread, so the "
            "interval understates the uncertainty")


def _summarise(values: np.ndarray, boot, tiers: list[str], where: str):
    """(low, high, share, sentence) of one set of bootstrap crossings (log10, NaN where none counts)."""
    _, resamples, seed, single = boot
    crossed = 10 ** values[~np.isnan(values)]
    share = crossed.size / values.size
    what = f"seed bootstrap ({resamples} resamples, RNG seed {seed})"
    if share < IDENTIFIED_SHARE:
        return None, None, share, (f". Not identified: in the {what} only {share:.0%} of resamples cross {where} "
                                   f"(an interval needs ≥ {IDENTIFIED_SHARE:.0%}){_caveat(single)}")
    low, high = (float(v) for v in np.percentile(crossed, [2.5, 97.5]))
    return low, high, share, (f". 95% {what}: {format_params(low)}–{format_params(high)} parameters "
                              f"({share:.0%} of resamples cross){_caveat(single)}")


def _crossing_interval(boot, targets: np.ndarray, k: int, tiers: list[str]):
    if boot is None:
        return None, None, None, ""
    where = f"inside {tiers[0]}–{tiers[-1]}" + (" near this crossover" if len(targets) > 1 else "")
    return _summarise(_nearest(boot[0], targets, k), boot, tiers, where)


def _no_crossing_interval(boot, tiers: list[str]):
    if boot is None:
        return None, ""
    _, _, share, text = _summarise(_first(boot[0]), boot, tiers, f"inside {tiers[0]}–{tiers[-1]}")
    return share, text
