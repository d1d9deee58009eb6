"""The study's named differences of arms: its increments, the 2×2 overlap's gates and the gaps between
increments, with the one line that says what each is (`DESCRIPTIONS`). Read by the analysis (its tables,
captions, legends, scale model and family) and by the experiment (the m a fixed design's power plan splits α over).

Torch-free and below both: the analysis may not import experiments, and the planner may not import the
analysis, yet both must count the same scale slopes. The overlap's gates live here beside the increments
because they are the same kind of fact (which arms a quantity is made of), not words of a table.
"""

from __future__ import annotations

from typing import Collection

# increment → (reference arm, arm): the increment is L_reference − L_arm.
INCREMENTS = {
    "zero_option": ("baseline", "sink-logit"),
    "filtering_norm": ("sink-logit", "combo"),
    "filtering_proj": ("sink-logit", "combo2"),
}
ZERO_OPTION = "zero_option"
GAPS = {"gap_norm": "filtering_norm", "gap_proj": "filtering_proj"}  # gap name → its filtering increment

# The 2×2 overlap of sink-logit with each value gate: gate → (the gate alone, the gate with sink-logit);
# gains are against baseline.
OVERLAP_GATES = {"norm": ("norm-gate", "combo"), "proj": ("proj-gate", "combo2")}
OVERLAP_BASE, OVERLAP_SINK = "baseline", "sink-logit"

DESCRIPTIONS = {**{q: f"{ref} − {arm}" for q, (ref, arm) in INCREMENTS.items()},
                **{g: f"{alone} with {both}" for g, (alone, both) in OVERLAP_GATES.items()}}


def increments_of(arms: Collection[str]) -> list[str]:
    """The increments whose two arms are both among `arms`."""
    return [q for q, pair in INCREMENTS.items() if set(pair) <= set(arms)]


def gaps_of(quantities: Collection[str]) -> list[str]:
    """The gaps (filtering − zero option) that `quantities` (increments or comparisons by name) can form."""
    return [gap for gap, form in GAPS.items() if form in quantities and ZERO_OPTION in quantities]
