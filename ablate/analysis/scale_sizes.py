"""The scale model's x: each tier's *trained* size, not its name.

A slope per decade of parameters is read off the sizes the tiers trained at: the baseline's
`params_non_embedding` at each tier, from the run summaries. A tier's name is a label; a run can be made at
another size than its name says (a config override, a changed ladder), and three tiers overridden to one
98,624-parameter model would otherwise give "+0.020 per decade, supported" across sizes that never varied.

So the sizes are checked before any slope is decided:

* not known (a CSV source without a `params_non_embedding` column, an older run without the count, no
  baseline run at a tier): x is the tiers' nominal size and every slope is exploratory, saying why;
* not distinct (two tiers of one trained size): no slope is fitted (a line through one size has no slope);
* distinct, but one departs from its tier's nominal size by more than the ladder's ±5% (`SIZE_TOLERANCE`,
  the rule `ablate.tiers` builds every tier by): x is the trained sizes and every slope is exploratory.

The note names the tiers and their sizes. Otherwise x is the trained sizes and the slopes may enter the family.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ablate.tiers import tier_rank

SIZE_TOLERANCE = 0.05  # the ladder's rule: a tier's baseline within ±5% of the size its name states
SIZE_COLUMN = "params_non_embedding"


@dataclass(frozen=True)
class TierSizes:
    """tier → the size (non-embedding parameters) the scale model's x is taken from; `problem`: why these sizes
    cannot carry a decision (every slope exploratory), None when they can; `distinct`: False when two tiers share
    one trained size (then no slope is fitted)."""

    params: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    distinct: bool = True

    def of(self, tier: str) -> float:
        """The size of `tier`: its trained size when known, else its nominal one (`ablate.tiers.tier_rank`)."""
        return self.params.get(tier, tier_rank(tier))

    def log10(self, tiers) -> np.ndarray:
        return np.log10([self.of(t) for t in tiers])


NOMINAL = TierSizes()  # the nominal sizes, no check: for callers with per-seed rows and no runs


def _count(value: float) -> str:
    return f"{int(value):,}"


def trained_sizes(frame: pl.DataFrame, tiers: list[str], reference: str) -> TierSizes:
    """The trained sizes of `tiers` (the real tiers a slope spans) from the counted runs of `reference` (the
    baseline) in `frame` (RUN_SCHEMA rows: tier, arm, reason, params_non_embedding), and what is wrong with them."""
    if len(tiers) < 2:
        return NOMINAL
    counted = frame.filter(pl.col("reason").is_null() & (pl.col("arm") == reference))
    sizes, unknown, mixed = {}, [], []
    for tier in tiers:
        values = counted.filter(tier=tier)[SIZE_COLUMN] if SIZE_COLUMN in counted.columns else pl.Series([])
        found = sorted({int(v) for v in values.drop_nulls().to_list()})
        if not found or values.null_count():
            unknown.append(tier)
        elif len(found) > 1:
            mixed.append(f"{tier} ({', '.join(map(_count, found))})")
        else:
            sizes[tier] = float(found[0])
    if unknown or mixed:
        why = (f"the trained sizes of {', '.join(unknown)} are not known (no {SIZE_COLUMN} of a counted {reference} "
               "run: a CSV source without that column, or runs that did not record it)" if unknown else
               f"the {reference}'s trained size differs between seeds at {'; '.join(mixed)}")
        return TierSizes({}, f"{why}, so x is each tier's nominal size, which nothing shows the runs trained at: "
                             "every slope is exploratory", True)
    return _checked(sizes, tiers, reference)


def _checked(sizes: dict[str, float], tiers: list[str], reference: str) -> TierSizes:
    named = "; ".join(f"{t} {_count(sizes[t])}" for t in tiers)
    by_size: dict[float, list[str]] = {}
    for tier in tiers:
        by_size.setdefault(sizes[tier], []).append(tier)
    shared = [group for group in by_size.values() if len(group) > 1]
    if shared:
        same = "; ".join(f"{', '.join(g)} all {_count(sizes[g[0]])}" for g in shared)
        return TierSizes(sizes, f"the tiers' trained sizes are not distinct ({same} non-embedding parameters of the "
                                f"{reference}; trained sizes {named}): a slope over one size is no trend in size, so "
                                "none is fitted", False)
    off = [t for t in tiers if math.isfinite(tier_rank(t)) and abs(sizes[t] / tier_rank(t) - 1) > SIZE_TOLERANCE]
    if off:
        departs = "; ".join(f"{t} trained at {_count(sizes[t])}, {sizes[t] / tier_rank(t) - 1:+.0%} of its nominal "
                            f"{_count(tier_rank(t))}" for t in off)
        return TierSizes(sizes, f"the {reference}'s trained size departs from its tier's nominal size by more than the "
                                f"ladder's ±{SIZE_TOLERANCE:.0%} ({departs}): the tiers are not the ladder's, so x is "
                                "the trained sizes and every slope is exploratory", True)
    return TierSizes(sizes, None, True)
