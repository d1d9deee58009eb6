"""`LRSweep`: an experiment's learning-rate sweep, declared in its file (`lr_sweep=LRSweep(...)`).

Torch-free records: the experiment expands it into runs (`Experiment.sweep_runs`), the store names their
folders (`<tier>/<arm>/lr<f>/seed<k>`), the analysis reads them (`ablate.analysis.lr`).

A room of its own by its concept, not to keep experiment.py short: the analysis reads the declared sweep (its
factors, seeds, margin and δ decide which runs count and how the best LR is chosen) and may not import the
experiment (the import contract in pyproject.toml: the analysis never runs experiment files), so the sweep's
declaration sits below both. Experiment files import it from `ablate.experiment`, beside `Experiment`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ablate.errors import AblateError

SWEEP_FIRST_SEED = 1000  # the sweep's seeds start here: far above any grid's, so confirmatory seeds never reuse them


@dataclass(frozen=True)
class LRSweep:
    """A learning-rate sweep: every arm of `tiers` at each of `factors` × the tier's lr, `seeds` seeds each.

    Its seeds are first_seed, first_seed + 1, …, none of the grid's: the confirmatory runs at each arm's best
    LR (the grid's seeds) are independent of the runs that chose it. Each sweep run ends by evaluating
    `selection_tokens` (default: the tier's val_tokens) of a selection split disjoint from the validation
    windows; the best LR is chosen on that loss only (docs/method.md). The largest stable LR ends within
    `margin` nats of the best; the LR range's width is taken within `delta` nats of it."""

    factors: Sequence[float]
    seeds: int = 1
    tiers: Sequence[str] = ()
    first_seed: int = SWEEP_FIRST_SEED
    selection_tokens: int | None = None
    margin: float = 0.05
    delta: float = 0.02

    def __post_init__(self):
        factors = self.factors
        def positive(f) -> bool:
            return isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f > 0

        if isinstance(factors, (str, int, float)) or not factors or not all(positive(f) for f in factors):
            raise AblateError(f"LRSweep factors must be a list of positive numbers (multiples of the tier's lr), "
                              f"not {factors!r}")
        if len(set(float(f) for f in factors)) != len(factors):
            raise AblateError(f"LRSweep factors {list(factors)} name one factor twice")
        object.__setattr__(self, "factors", tuple(sorted(float(f) for f in factors)))
        if isinstance(self.tiers, str) or not self.tiers:
            raise AblateError(f"LRSweep tiers must be a list of tier names, not {self.tiers!r}")
        object.__setattr__(self, "tiers", tuple(self.tiers))
        for name, value in (("seeds", self.seeds), ("first_seed", self.first_seed + 1),
                            ("selection_tokens", 1 if self.selection_tokens is None else self.selection_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AblateError(f"LRSweep {name} must be a positive integer, not {getattr(self, name)!r}")
        for name in ("margin", "delta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise AblateError(f"LRSweep {name} must be a positive number of nats, not {value!r}")

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))
