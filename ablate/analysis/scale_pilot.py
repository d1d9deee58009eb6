"""A pilot's scale slopes as planning inputs (`ablate plan --power --slope --pilot`): per declared slope its fitted
slope (per decade), its seed sd (pooled within tiers) and the tier means' scatter about the line, estimated from
the lack of fit.

With seeds n_t and tier scatter τ, the lack-of-fit mean square Σ n_t (d̄_t − line_t)²/(T − 2) has expectation
σ² + n̄τ² (exactly n τ² with equal seeds; n̄ = the mean seeds per tier otherwise), so τ̂² = max(0, (lack − s²)/n̄).
A pilot with fewer than three tiers has no lack of fit: its τ is not estimated (None) and the caller says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ablate.analysis.runs import Runs
from ablate.analysis.scale import fit_quantity, lack_mean_square, quantities, sizes_of
from ablate.analysis.tables import increments_table


@dataclass(frozen=True)
class PilotSlope:
    """One quantity's slope in a pilot: slope per decade, seed sd, tier scatter (None: not estimable), its tiers
    and seeds."""

    quantity: str
    slope: float
    sd: float
    tier_sd: float | None
    tiers: tuple[str, ...]
    seeds: tuple[int, ...]

    @property
    def source(self) -> str:
        scatter = "tier sd from its lack of fit" if self.tier_sd is not None else "no lack of fit (two tiers)"
        return (f"pilot ({', '.join(self.tiers)} with {'/'.join(map(str, self.seeds))} seeds: its slope, pooled "
                f"sd, {scatter})")


def pilot_slopes(runs: Runs, comparisons=None) -> dict[str, PilotSlope]:
    """quantity → the pilot's `PilotSlope` of every increment, declared comparison (`comparisons`: per-seed rows
    tier, comparison, seed, diff) and gap with a slope and a pooled sd (two or more tiers, a tier with two seeds)."""
    sizes = sizes_of(runs)
    out = {}
    for quantity, per_seed in quantities(increments_table(runs).differences, comparisons).items():
        fitted = fit_quantity(per_seed, sizes)
        fit = fitted.fit
        if fit is None or fit.df == 0 or not float(fit.s2) > 0:
            continue
        tier_sd = None
        if len(fitted.tiers) >= 3:
            lack = float(lack_mean_square(fit, fitted.log_sizes, fitted.counts, fitted.means))
            tier_sd = math.sqrt(max(0.0, (lack - float(fit.s2)) / float(np.mean(fitted.counts))))
        out[quantity] = PilotSlope(quantity, float(fit.slope), math.sqrt(float(fit.s2)), tier_sd,
                                   tuple(fitted.tiers), tuple(int(c) for c in fitted.counts))
    return out
