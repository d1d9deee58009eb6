"""Paired differences across seeds and their summary statistics (SPEC.md §3).

A difference is taken only between two runs of the same (tier, seed): those share initial values
and batches, so the difference measures the arm alone. When the store recorded fingerprints, a
pair whose fingerprints disagree is refused rather than averaged, because it was not a matched run.
"""

from __future__ import annotations

from typing import Sequence

import polars as pl
from scipy.special import stdtrit  # the Student-t quantile; scipy.stats costs ~1 s to import

from ablate.errors import AblateError
from ablate.analysis.load import FINGERPRINTS

STAT_COLUMNS = ("n", "mean", "sd", "se", "ci_low", "ci_high", "min", "max", "agree")
CONFIDENCE = 0.95


def paired_differences(completed: pl.DataFrame, arms: Sequence[str], reference: str) -> pl.DataFrame:
    """Per (tier, seed) where both ran: `diff` = L_reference − L_arm (positive: the arm is better).

    Returns columns tier, seed, arm, diff. Raises AblateError on a pair with differing fingerprints.
    """
    ref = completed.filter(pl.col("arm") == reference).select(
        "tier", "seed", pl.col("val_loss").alias("ref_loss"), *[pl.col(c).alias(f"ref_{c}") for c in FINGERPRINTS]
    )
    pairs = completed.filter(pl.col("arm").is_in(list(arms))).join(ref, on=["tier", "seed"], how="inner")
    for column in FINGERPRINTS:
        clash = pairs.filter(
            pl.col(column).is_not_null() & pl.col(f"ref_{column}").is_not_null()
            & (pl.col(column) != pl.col(f"ref_{column}"))
        )
        if clash.height:
            row = clash.sort("tier", "arm", "seed").row(0, named=True)
            raise AblateError(
                f"runs {row['tier']}/{reference}/seed{row['seed']} and {row['tier']}/{row['arm']}/seed{row['seed']} "
                f"are not matched: their {column} differs ({row[f'ref_{column}']} vs {row[column]}); a paired "
                "difference needs runs that share initial values and batches (same seed, same data)"
            )
    return pairs.select("tier", "seed", "arm", (pl.col("ref_loss") - pl.col("val_loss")).alias("diff"))


def summarise(differences: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """Per group of `by`, the seed statistics of column `diff`: STAT_COLUMNS.

    sd uses ddof 1, se = sd/√n, the interval is the 95% Student-t interval with n − 1 degrees of
    freedom, `agree` counts positive differences. With n = 1 there is no spread: sd, se and the
    interval are null, never zero. Group order is left to the caller (tables sort by tier size).
    """
    # A fixed summation order, so that the same runs give bit-identical figures from any source.
    ordered = differences.sort([*by, "seed"] if "seed" in differences.columns else list(by))
    grouped = ordered.group_by(list(by), maintain_order=True).agg(
        n=pl.len().cast(pl.Int64),
        mean=pl.col("diff").mean(),
        sd=pl.col("diff").std(ddof=1),
        min=pl.col("diff").min(),
        max=pl.col("diff").max(),
        agree=(pl.col("diff") > 0).sum().cast(pl.Int64),
    )
    t_quantile = {n: float(stdtrit(n - 1, 0.5 + CONFIDENCE / 2)) for n in grouped["n"].unique() if n >= 2}
    spread = pl.col("n") >= 2
    half_width = pl.col("n").replace_strict(t_quantile, default=None, return_dtype=pl.Float64) * pl.col("se")
    return (
        grouped.with_columns(sd=pl.when(spread).then(pl.col("sd")))
        .with_columns(se=pl.col("sd") / pl.col("n").sqrt())
        .with_columns(ci_low=pl.col("mean") - half_width, ci_high=pl.col("mean") + half_width)
        .select(*by, *STAT_COLUMNS)
    )
