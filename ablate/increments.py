"""The study's named differences of arms: its increments, the 2×2 overlap's gates and the gaps between
increments, with the one line that says what each is (`DESCRIPTIONS`) and the words for the arms each needs
(`NEEDS`). Read by the analysis (its tables, captions, legends, crossover, scale model, family and the report's
"left out" lines) and by the experiment (the m a fixed design's power plan splits α over).

Torch-free and below both: the analysis may not import experiments, and the planner may not import the
analysis, yet both must count the same scale slopes. The overlap's gates live here beside the increments
because they are the same kind of fact (which arms a quantity is made of), not words of a table.

The one owner: the arms are named once (`OVERLAP_BASE`, `OVERLAP_SINK`, `OVERLAP_GATES`), and every increment,
filtering form, gap and sentence below is derived from them, so a reader never restates a name or an arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

# The 2×2 overlap of sink-logit with each value gate: gate → (the gate alone, the gate with sink-logit);
# gains are against baseline.
OVERLAP_BASE, OVERLAP_SINK = "baseline", "sink-logit"
OVERLAP_GATES = {"norm": ("norm-gate", "combo"), "proj": ("proj-gate", "combo2")}

ZERO_OPTION = "zero_option"
# Each gate's filtering increment (its form): filtering increment → its gate.
FILTERING = {f"filtering_{gate}": gate for gate in OVERLAP_GATES}
# increment → (reference arm, arm): the increment is L_reference − L_arm. The zero option is baseline − sink-logit;
# a filtering increment is sink-logit − the gate with sink-logit.
INCREMENTS = {ZERO_OPTION: (OVERLAP_BASE, OVERLAP_SINK),
              **{form: (OVERLAP_SINK, OVERLAP_GATES[gate][1]) for form, gate in FILTERING.items()}}
# The filtering forms in the order the report gives their crossovers: the last gate's first (proj, then norm).
FILTERING_FORMS = tuple(reversed(FILTERING))
GAPS = {f"gap_{gate}": form for form, gate in FILTERING.items()}  # gap name → its filtering increment

DESCRIPTIONS = {**{q: f"{ref} − {arm}" for q, (ref, arm) in INCREMENTS.items()},
                **{g: f"{alone} with {both}" for g, (alone, both) in OVERLAP_GATES.items()}}


@dataclass(frozen=True)
class Need:
    """What a quantity needs from an experiment's arms: any one of `choices` (each a tuple of arms, all of which
    must run), and the same in words (`words`, "needs …")."""

    choices: tuple[tuple[str, ...], ...]
    words: str

    def met_by(self, arms: Collection[str]) -> bool:
        return any(set(choice) <= set(arms) for choice in self.choices)


def _either(arms) -> str:
    return " or ".join(arms)


def _needs() -> dict[str, Need]:
    """increments, overlap and crossover → what each needs, from the arms above (the words the report prints)."""
    combos = [both for _, both in OVERLAP_GATES.values()]
    zero = INCREMENTS[ZERO_OPTION]
    return {
        "increments": Need(tuple(INCREMENTS.values()),
                           f"needs {zero[0]} and {zero[1]}, or {OVERLAP_SINK} with {_either(combos)}"),
        "overlap": Need(tuple((OVERLAP_BASE, OVERLAP_SINK, *gate) for gate in OVERLAP_GATES.values()),
                        f"needs {OVERLAP_BASE}, {OVERLAP_SINK} and a gate with its combo: "
                        + ", or ".join(f"{alone} and {both}" for alone, both in OVERLAP_GATES.values())),
        "crossover": Need(tuple((*zero, *INCREMENTS[form]) for form in FILTERING_FORMS),
                          f"needs {zero[0]}, {zero[1]} and {_either(combos)}"),
    }


NEEDS = _needs()


def increments_of(arms: Collection[str]) -> list[str]:
    """The increments whose two arms are both among `arms`."""
    return [q for q, pair in INCREMENTS.items() if set(pair) <= set(arms)]


def gaps_of(quantities: Collection[str]) -> list[str]:
    """The gaps (filtering − zero option) that `quantities` (increments or comparisons by name) can form."""
    return [gap for gap, form in GAPS.items() if form in quantities and ZERO_OPTION in quantities]
