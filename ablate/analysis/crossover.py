"""The crossovers of a filtering increment and the zero-option increment: where filtering overtakes.

The study's claim is about scale: the zero option (baseline − sink-logit) helps most at small models
and the filtering increment (sink-logit − combo / combo2) grows with size, so somewhere they cross.

Where, and how firmly, comes from the scale model (`ablate.analysis.scale`): the gap filtering − zero
option per seed (both from that seed's matched runs) is fitted as a line in log10(trained non-embedding
parameters, `ablate.analysis.scale_sizes`) over the real tiers, seeds as repeated observations, spread pooled
within tiers; the crossover is where that line is 0, with Fieller's 95% interval (across these tier recipes, and
beside it as a law of N), reported only when it is identified (the slope
significant, and the crossing between two adjacent tiers that both have two or more seeds). This replaced
a percentile seed bootstrap whose "95%" interval covered the true crossing 62–71% of the time with the
study's reference effects at 3/3/3/1 seeds; the line's interval covers 93–97% (docs/method.md).

The means themselves are also described: every adjacent pair of real tiers where (filtering − zero
option) turns from ≤ 0 to > 0 is named (the pattern need not start ≤ 0: +, −, + has one sign change,
between the second and third tiers), with where the filtering increment falls back. These are a
description of the means, with no interval. Pipeline-check tiers (below the smallest real tier) never
enter: their numbers carry no evidence, so they must not make or erase a crossover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from ablate.analysis.scale import crossing_of, fit_quantity
from ablate.analysis.scale_sizes import NOMINAL, TierSizes
from ablate.increments import DESCRIPTIONS, GAPS, ZERO_OPTION
from ablate.analysis.tables import Table, is_pipeline_check
from ablate.tiers import tier_rank

GAP_OF = {form: gap for gap, form in GAPS.items()}


@dataclass(frozen=True)
class Crossing:
    """One sign change of the tier means from ≤ 0 (at `below`) to > 0 (at `above`), interpolated at
    `params` parameters on a log scale (a description of the means: no interval)."""

    params: float
    below: str
    above: str


@dataclass(frozen=True)
class Crossover:
    """Where `form` (a filtering increment) overtakes the zero-option increment.

    `params`: where the gap's fitted line crosses 0 upward inside the tiers' range (None otherwise), between
    tiers `below` and `above`; `low`/`high` its Fieller 95% interval across these tier recipes when `identified`,
    `law_low`/`law_high` its Fieller 95% interval as a law of N (the law error) when `law_identified`.
    `crossings`: every sign change from ≤ 0 to > 0 of the means, smallest scale first. `message` says all of it
    in words, naming both intervals.
    """

    form: str
    params: float | None
    below: str | None
    above: str | None
    message: str
    low: float | None = None
    high: float | None = None
    identified: bool = False
    crossings: tuple[Crossing, ...] = ()
    law_low: float | None = None
    law_high: float | None = None
    law_identified: bool = False


def format_params(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}"


def sized(tier: str) -> bool:
    rank = tier_rank(tier)
    return math.isfinite(rank) and rank > 0


def _bracket_crossings(gaps: np.ndarray, log_sizes: np.ndarray) -> np.ndarray:
    """The log10 crossing in each bracket of adjacent tiers where the gap turns from ≤ 0 to > 0, NaN elsewhere."""
    g0, g1 = gaps[:-1], gaps[1:]
    lo, hi = log_sizes[:-1], log_sizes[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = lo + (hi - lo) * (-g0) / (g1 - g0)
    return np.where((g0 <= 0) & (g1 > 0), crossing, np.nan)


def _gap_per_seed(increments: Table, form: str, tiers: list[str], means: dict) -> pl.DataFrame:
    """Per (tier, seed) filtering − zero option; from the means (one value per tier, no spread) when the
    table carries no per-seed rows."""
    differences = increments.differences
    if differences is None or differences.is_empty():
        return pl.DataFrame({"tier": tiers, "seed": [0] * len(tiers),
                             "diff": [means[(t, form)] - means[(t, ZERO_OPTION)] for t in tiers]})
    wide = (differences.filter(pl.col("tier").is_in(tiers), pl.col("quantity").is_in([form, ZERO_OPTION]))
            .pivot(on="quantity", index=["tier", "seed"], values="diff"))
    if form not in wide.columns or ZERO_OPTION not in wide.columns:
        return pl.DataFrame(schema={"tier": pl.String, "seed": pl.Int64, "diff": pl.Float64})
    return wide.drop_nulls([form, ZERO_OPTION]).select("tier", "seed",
                                                       (pl.col(form) - pl.col(ZERO_OPTION)).alias("diff"))


def find_crossover(increments: Table, form: str, sizes: TierSizes = NOMINAL) -> Crossover:
    """The crossover of one filtering form: the scale model's crossing of the gap (x: the tiers' `sizes`,
    `ablate.analysis.scale_sizes`), and the means' sign changes. Pipeline-check tiers are left out (and the
    message says so)."""
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
    gaps = np.array([means[(t, form)] - means[(t, ZERO_OPTION)] for t in tiers])
    log_sizes = sizes.log10(tiers)
    brackets = _bracket_crossings(gaps, log_sizes)
    crossings = tuple(Crossing(float(10 ** brackets[i]), tiers[i], tiers[i + 1])
                      for i in np.flatnonzero(~np.isnan(brackets)))
    falls = [tiers[i + 1] for i in range(len(tiers) - 1) if gaps[i] > 0 >= gaps[i + 1]]
    tail = f"; it falls back to or below the zero option at {', '.join(falls)}" if falls else ""
    if not crossings:
        what = (f"no crossover in range; filtering already exceeds the zero option at the smallest tier, {tiers[0]}"
                if gaps[0] > 0 else f"no crossover in range; the zero option stays at least as large up to {tiers[-1]}")
    elif len(crossings) == 1:
        what = f"overtakes the zero option between {crossings[0].below} and {crossings[0].above} (the means)"
    else:
        places = "; ".join(f"between {c.below} and {c.above}" for c in crossings)
        what = (f"overtakes the zero option {len(crossings)} times (the means): {places}. Several sign changes: "
                "the increments do not order the tiers one way")
    quantity = fit_quantity(_gap_per_seed(increments, form, tiers, means), sizes)
    misfit = quantity.row.get("_lack_of_fit")
    if misfit is not None and misfit < 0.05:
        tail += f"; the tier means depart from a line (lack-of-fit p {misfit:.2g})"
    if sizes.problem:
        tail += f"; the scale model's x: {sizes.problem}"
    crossing, reason = crossing_of(quantity)
    params, below, above, fitted = _fitted_place(crossing, quantity.row, quantity.tiers, sizes)
    identified = bool(crossing["identified"] and params is not None)
    law = bool(crossing["law_identified"] and params is not None)
    message = f"{label}{left_out}: {what}{tail}. {fitted}; {_intervals(crossing, reason, identified, law, form)}"
    return Crossover(form, params, below, above, message, crossing["ci_low"] if identified else None,
                     crossing["ci_high"] if identified else None, identified, crossings,
                     crossing["law_low"] if law else None, crossing["law_high"] if law else None, law)


def _intervals(crossing: dict, reason: str | None, identified: bool, law: bool, form: str) -> str:
    """Both 95% Fieller intervals of the crossing in words: across these tier recipes, and as a law of N."""
    if not identified:
        return (f"its interval is not identified, across these tier recipes or as a law of N: "
                f"{reason or 'the fitted line does not cross upward in range'}")
    recipe = (f"95% Fieller interval across these tier recipes {format_params(crossing['ci_low'])}–"
              f"{format_params(crossing['ci_high'])}")
    if law:
        law_interval = f"{format_params(crossing['law_low'])}–{format_params(crossing['law_high'])}"
        return (f"{recipe}, and as a law of N {law_interval} (the scale model of {GAP_OF[form]}; the law "
                "interval counts the tiers' scatter about the line)")
    return (f"{recipe} (the scale model of {GAP_OF[form]}); as a law of N it is not identified (with the tiers' "
            "scatter about the line as error, Fieller's set is not one bounded interval between tiers with two or "
            "more seeds)")


def _fitted_place(crossing: dict, row: dict, tiers: list[str], sizes: TierSizes):
    """(params, below, above, sentence) of the fitted line's upward crossing inside the tiers' range."""
    root, slope = crossing["params"], row["slope_per_decade"]
    if root is None or slope is None or slope <= 0 or not sizes.of(tiers[0]) <= root <= sizes.of(tiers[-1]):
        return None, None, None, ("The fitted line of the gap (across these tier recipes) does not cross 0 upward "
                                  "inside the tiers' range")
    k = max(i for i, t in enumerate(tiers[:-1]) if sizes.of(t) <= root)
    return (root, tiers[k], tiers[k + 1],
            f"The fitted line of the gap (across these tier recipes) crosses 0 at ≈ {format_params(root)} "
            f"parameters, between {tiers[k]} and {tiers[k + 1]}")
