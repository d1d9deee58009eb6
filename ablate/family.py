"""The declared comparisons (`Comparison`, what an experiment's `hypotheses` name) and their family: which
comparisons (and scale slopes) Holm adjusts together, and its m, from the design.

One rule, read by everyone who needs m: the planner (`plan --power` splits α over it), the sequential design
(its boundaries are set for it), the tables and the scale family (Holm's m), and the report (which states it).
Membership comes from what the experiment declares, never from what happened to run: a comparison that did
not run, or ran with one seed and has no p, still counts in m (its p taken as 1, so the decision on the others
can only get easier once it runs: it is "not final" until then).

Groups. With `kind="tier"` each tier is a family of its own. With `kind="experiment"` every tier that can
carry evidence is one group (`STUDY_GROUP`) together with the scale slopes of the declared comparisons and
the gaps (filtering − zero option) the design can form; the pipeline-check tiers (below the smallest real
tier) are a group apart, since they carry no evidence. A sequential design spends α over the declared
comparisons only, so its family has no slopes.

Torch-free and low in the layers: the experiment and the analysis both build it. `Comparison` lives here, with
the family its members form, rather than in a module of its own (comparison.py, carved out of experiment.py to
keep that file under 400 lines): a comparison is declared for the family it is tested in. Experiment files
import it from `ablate.experiment`, beside `Experiment`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ablate.errors import AblateError
from ablate.increments import INCREMENTS, gaps_of, increments_of
from ablate.store import check_name
from ablate.tiers import is_pipeline_check

# The families a declared comparison's p is adjusted in: each tier's own, or the whole experiment's (every tier's
# declared comparisons and the scale slopes together). The experiment, its sequential design, the tables and (through
# `Family.tier_size`) the planner read it; the planner has no rule of its own.
FAMILIES = ("tier", "experiment")
# The smallest tier that can carry evidence; any tier below it only shows that the pipeline runs.
PIPELINE_GROUP = "pipeline-check"
STUDY_GROUP = "all"


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


@dataclass(frozen=True)
class Family:
    """The declared family: `members` are (tier, comparison) in design order, `slopes` the scale quantities
    in the study-wide group (kind "experiment" in a fixed design only)."""

    kind: str
    members: tuple[tuple[str, str], ...]
    slopes: tuple[str, ...] = ()

    @classmethod
    def of(cls, comparisons: Iterable, tiers: Iterable[str], kind: str = "tier",
           at: Mapping[str, Collection[str]] | None = None, arms: Collection[str] | None = None,
           sequential: bool = False) -> Family:
        """From declared comparisons (`Comparison`s, or (name, minuend, subtrahend) triples), the experiment's
        tiers, `at`: name → the tiers a comparison is declared at (absent: all), `arms`: the arms the experiment
        runs (None: every study arm, so every increment is formable) and whether the design is sequential."""
        if kind not in FAMILIES:
            raise AblateError(f"unknown family {kind!r}; valid families: {', '.join(FAMILIES)}")
        triples = [tuple(c) if isinstance(c, (tuple, list)) else (c.name, c.minuend, c.subtrahend)
                   for c in comparisons]
        where = dict(at or {})
        for c in comparisons:
            if getattr(c, "tiers", ()):
                where[c.name] = tuple(c.tiers)
        tiers = list(dict.fromkeys(tiers))
        members = tuple((tier, name) for tier in tiers for name, _, _ in triples
                        if name not in where or tier in where[name])
        slopes: tuple[str, ...] = ()
        if kind == "experiment" and triples and not sequential:
            # a declared comparison's slope is its own row of the scale table unless its name is an increment's
            # and its arms are not that increment's (the row then is the increment's, not the comparison's)
            own = [name for name, a, b in triples if INCREMENTS.get(name, (a, b)) == (a, b)]
            formable = set(own) | set(increments_of(arms) if arms is not None else INCREMENTS)
            slopes = tuple(own + gaps_of(formable))
        return cls(kind, members, slopes)

    def group(self, tier: str) -> str:
        """The Holm group of a tier's rows: the tier itself, or the study-wide group (pipeline checks apart)."""
        if self.kind == "tier":
            return tier
        return PIPELINE_GROUP if is_pipeline_check(tier) else STUDY_GROUP

    def group_members(self, group: str) -> list[tuple[str, str]]:
        """The (tier, comparison) members of one group, in design order."""
        return [(tier, name) for tier, name in self.members if self.group(tier) == group]

    def group_slopes(self, group: str) -> tuple[str, ...]:
        return self.slopes if group == STUDY_GROUP else ()

    def size(self, group: str) -> int:
        """Holm's m of a group: its declared members and, in the study-wide group, the slopes."""
        return len(self.group_members(group)) + len(self.group_slopes(group))

    @property
    def groups(self) -> list[str]:
        return list(dict.fromkeys([*(self.group(t) for t, _ in self.members), *([STUDY_GROUP] if self.slopes else [])]))

    def tier_size(self, tier: str) -> int:
        """m of the family a comparison at `tier` is adjusted in."""
        return self.size(self.group(tier))

    @property
    def largest(self) -> int:
        """The largest m of any group that carries evidence (0: no members), the m a single design is set for."""
        sizes = [self.size(g) for g in self.groups if g != PIPELINE_GROUP and not is_pipeline_check(g)]
        return max(sizes, default=max((self.size(g) for g in self.groups), default=0))
