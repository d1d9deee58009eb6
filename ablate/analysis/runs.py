"""`Runs`: every run of one source (a run store or a table file) as one frame, whatever the source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ablate.arms.names import BUILTIN_ARMS
from ablate.tiers import tier_rank
from ablate.store import run_key


NOT_EVALUATED = "not evaluated on"  # the reason of a completed run that has no score of a table's metric


@dataclass(frozen=True)
class Runs:
    """All runs of one source. `frame` has the columns of RUN_SCHEMA, one row per (tier, arm, seed).

    `reason` is null for a run that counts and says why otherwise (e.g. "diverged at step 812").
    `root` is the experiment folder (None for a CSV/parquet source); `path` the run folder.
    """

    name: str
    frame: pl.DataFrame
    root: Path | None = None
    notes: tuple[str, ...] = ()  # what every table of this source must say (e.g. pairing not verified)
    metric: str | None = None  # TASK/METRIC of `ablate eval` in place of val_loss (oriented like a loss)
    higher_is_better: bool | None = None  # the metric's direction as lm-eval defines it (None: the loss)

    def notes_for(self, arms) -> tuple[str, ...]:
        """This source's notes, plus one naming the counted runs of `arms` whose pairing was not verified."""
        unverified = self.completed.filter(~pl.col("verified") & pl.col("arm").is_in(list(arms)))
        if self.root is None or unverified.is_empty():
            return self.notes
        names = ", ".join(run_key(r['tier'], r['arm'], r['seed']) for r in unverified.iter_rows(named=True))
        return self.notes + (f"pairing NOT verified for {names}: older runs without fingerprints or "
                             "config.json, admitted by --allow-unverified",)

    @property
    def completed(self) -> pl.DataFrame:
        return self.frame.filter(pl.col("reason").is_null())

    @property
    def excluded(self) -> pl.DataFrame:
        return sort_runs(self.frame.filter(pl.col("reason").is_not_null()), self.arm_order)

    @property
    def tiers(self) -> list[str]:
        """Tiers by model size (nominal parameters), unknown names last by name."""
        return sorted(self.frame["tier"].unique().to_list(), key=lambda t: (tier_rank(t), t))

    @property
    def arm_order(self) -> list[str]:
        """Built-in arms in registry order, then custom arms in order of first appearance."""
        seen = self.frame["arm"].unique(maintain_order=True).to_list()
        return [a for a in BUILTIN_ARMS if a in seen] + [a for a in seen if a not in BUILTIN_ARMS]

    @property
    def missing(self) -> pl.DataFrame:
        """(tier, arm, seed) with no run at all, where the tier has that seed and that arm otherwise.

        A tier's seeds and arms are those of any run in it (whatever its status): the store does not
        know the grid that was planned, only what was started. Runs that exist but do not count are
        in `excluded`, not here.
        """
        grid = (
            self.frame.select("tier", "arm").unique()
            .join(self.frame.select("tier", "seed").unique(), on="tier")
        )
        present = self.frame.select("tier", "arm", "seed")
        return sort_runs(grid.join(present, on=["tier", "arm", "seed"], how="anti"), self.arm_order)


def sort_runs(frame: pl.DataFrame, arm_order: list[str], arm_column: str = "arm") -> pl.DataFrame:
    """Tiers by size, arms in `arm_order` (others after, by name), then seed if present."""
    arm_rank = {arm: i for i, arm in enumerate(arm_order)}
    tiers = frame["tier"].unique().to_list()
    tier_pos = {t: i for i, t in enumerate(sorted(tiers, key=lambda t: (tier_rank(t), t)))}
    keyed = frame.with_columns(
        pl.col("tier").replace_strict(tier_pos, return_dtype=pl.Int64).alias("_tier"),
        pl.col(arm_column).replace_strict(arm_rank, default=len(arm_rank), return_dtype=pl.Int64).alias("_arm"),
    )
    keys = ["_tier", "_arm", arm_column] + (["seed"] if "seed" in frame.columns else [])
    return keyed.sort(keys).drop("_tier", "_arm")
