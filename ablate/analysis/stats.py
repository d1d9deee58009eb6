"""Paired differences across seeds, their summary statistics, tests and the Holm adjustment.

A difference is taken only between two runs of the same (tier, seed): those share initial values
and batches, so the difference measures the arm alone. When the store recorded fingerprints, a
pair whose fingerprints disagree is refused rather than averaged, because it was not a matched run.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import polars as pl
# The Student-t quantile and distribution function; scipy.stats costs ~1 s to import.
from scipy.special import stdtr, stdtrit

from ablate.power import RESOLUTION

STAT_COLUMNS = ("n", "mean", "sd", "se", "ci_low", "ci_high", "min", "max", "agree", "p")
CONFIDENCE = 0.95
# A spread of the differences at or below RESOLUTION × the losses' magnitude is rounding, not noise:
# 3.9 − 3.8 and 4.3 − 4.2 differ in binary by ~1e-16, and a t-test on that would call any gain certain.
# RESOLUTION has one owner (ablate.power), so that the fixed-sample tables and the sequential decision
# apply one rule.


def paired_differences(completed: pl.DataFrame, arms: Sequence[str], reference: str) -> pl.DataFrame:
    """Per (tier, seed) where both ran: `diff` = L_reference − L_arm (positive: the arm is better).

    Returns columns tier, seed, arm, diff, scale (the larger |loss| of the two: what float resolution is
    relative to, see `summarise`). That the two runs of a pair differ only in the arm (init,
    data, config and validation fingerprints) is checked once for every source by
    `ablate.analysis.load.load_runs`, before any table is built.
    """
    ref = completed.filter(pl.col("arm") == reference).select("tier", "seed", pl.col("val_loss").alias("ref_loss"))
    pairs = completed.filter(pl.col("arm").is_in(list(arms))).join(ref, on=["tier", "seed"], how="inner")
    return pairs.select("tier", "seed", "arm", (pl.col("ref_loss") - pl.col("val_loss")).alias("diff"),
                        pl.max_horizontal(pl.col("ref_loss").abs(), pl.col("val_loss").abs()).alias("scale"))


def summarise(differences: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Per group of `by`, the seed statistics of column `diff`: STAT_COLUMNS.

    sd uses ddof 1, se = sd/√n, the interval is the 95% Student-t interval with n − 1 degrees of
    freedom. `agree` counts the seeds whose difference has the sign of the mean (strictly: a
    difference of exactly zero agrees with neither sign, and a mean of exactly zero has no sign, so
    agree is 0 then): "3/3" says every seed points the way the mean does, whichever way that is.
    `p` is the two-sided one-sample t-test of the differences against zero, which is the paired
    t-test of the two arms' losses (scipy's `ttest_1samp(diff, 0)` = `ttest_rel`).

    With n = 1 there is no spread: sd, se, the interval and p are null, never zero. With sd = 0
    (every seed's difference equal) p is null too: the t statistic is undefined there (scipy gives
    p = 0 for equal non-zero differences, which would call an effect certain on no evidence of noise,
    and NaN for equal zeros); sd, se and the interval are then 0 as computed. Group order is left to
    the caller (tables sort by tier size).

    A spread at float resolution is no spread: when sd ≤ RESOLUTION × the largest |loss| behind the group
    (column `scale`, else the largest |diff|), sd is taken as 0 and p is null, as for equal differences.
    """
    # A fixed summation order, so that the same runs give bit-identical figures from any source.
    ordered = differences.sort([*by, "seed"] if "seed" in differences.columns else list(by))
    grouped = ordered.group_by(list(by), maintain_order=True).agg(
        n=pl.len().cast(pl.Int64),
        mean=pl.col("diff").mean(),
        sd=pl.col("diff").std(ddof=1),
        min=pl.col("diff").min(),
        max=pl.col("diff").max(),
        agree=((pl.col("diff").sign() == pl.col("diff").mean().sign()) & (pl.col("diff") != 0)).sum().cast(pl.Int64),
        _scale=(pl.col("scale") if "scale" in differences.columns else pl.col("diff")).abs().max(),
    )
    spread = pl.col("n") >= 2
    rounding = pl.col("sd") <= RESOLUTION * pl.col("_scale")
    grouped = grouped.with_columns(sd=pl.when(spread & rounding).then(0.0).when(spread).then(pl.col("sd")))
    grouped = grouped.with_columns(se=pl.col("sd") / pl.col("n").sqrt())
    ns = grouped["n"].to_numpy()
    t_quantile = np.full(len(ns), np.nan)
    t_quantile[ns >= 2] = stdtrit(ns[ns >= 2] - 1, 0.5 + CONFIDENCE / 2)
    mean, se = grouped["mean"].to_numpy().astype(float), grouped["se"].fill_null(np.nan).to_numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / se
        p = 2.0 * stdtr(np.maximum(ns - 1, 1), -np.abs(t))
    p[~((ns >= 2) & (se > 0) & np.isfinite(t))] = np.nan
    half_width = pl.Series(t_quantile) * pl.col("se")
    return (
        grouped.with_columns(ci_low=pl.col("mean") - half_width, ci_high=pl.col("mean") + half_width,
                             p=pl.Series(p, dtype=pl.Float64).fill_nan(None))
        .select(*by, *STAT_COLUMNS)
    )


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values, in the order given.

    The m non-null p-values sorted ascending, p_(1) ≤ … ≤ p_(m), become
    max over j ≤ i of min(1, (m − j + 1)·p_(j)): monotone in p, capped at 1, never below the raw p.
    Nulls (effects with no test) stay null and are not counted in m. It controls the chance of any
    false "supported" among the family at the level used, with no assumption about dependence
    (arms sharing one reference are dependent).
    """
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    m = len(present)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def holm_by(frame: pl.DataFrame, group: str = "tier") -> pl.Series:
    """`holm` of column p within each value of `group` (e.g. the arms of one tier), in row order."""
    out: list[float | None] = [None] * frame.height
    rows = frame.with_row_index("_row")
    for part in rows.partition_by(group, maintain_order=True):
        for row, value in zip(part["_row"].to_list(), holm(part["p"].to_list())):
            out[row] = value
    return pl.Series("p_holm", out, dtype=pl.Float64)
