"""A declared comparison of two arms: what an experiment's `hypotheses` name, the tables test and Holm adjusts.

Its own module, below the experiment, so that the experiment's grid and the declarations stay apart; experiment
files import it from `ablate.experiment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ablate.errors import AblateError
from ablate.store import check_name


@dataclass(frozen=True)
class Comparison:
    """A declared comparison: Δ = L_minuend − L_subtrahend per seed at every tier (positive: the
    subtrahend, the arm, lowers the loss), as the paired tables define Δ against a reference.
    `tiers`: only these of the experiment's tiers (empty: all of them)."""

    name: str
    minuend: str
    subtrahend: str
    tiers: Sequence[str] = ()

    def __post_init__(self):
        check_name("comparison", self.name)
        if isinstance(self.tiers, str) or not all(isinstance(t, str) for t in self.tiers):
            raise AblateError(f"comparison {self.name!r}: tiers is a list of tier names, not {self.tiers!r}")
        object.__setattr__(self, "tiers", tuple(self.tiers))
        for role in ("minuend", "subtrahend"):
            if not isinstance(getattr(self, role), str) or not getattr(self, role):
                raise AblateError(f"comparison {self.name!r}: its {role} must be an arm's name, not "
                                  f"{getattr(self, role)!r}")
        if self.minuend == self.subtrahend:
            raise AblateError(f"comparison {self.name!r} compares arm {self.minuend!r} with itself; name two "
                              "different arms")

    @property
    def description(self) -> str:
        return f"{self.minuend} − {self.subtrahend}"

    def at(self, tier: str) -> bool:
        """Whether the comparison is declared at `tier`."""
        return not self.tiers or tier in self.tiers
