"""The study's increments and the gaps between them: named differences of two arms, read by the analysis (its
tables, scale model and family) and by the experiment (the m a fixed design's power plan splits α over).

Torch-free and below both: the analysis may not import experiments, and the planner may not import the
analysis, yet both must count the same scale slopes.
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


def increments_of(arms: Collection[str]) -> list[str]:
    """The increments whose two arms are both among `arms`."""
    return [q for q, pair in INCREMENTS.items() if set(pair) <= set(arms)]


def gaps_of(quantities: Collection[str]) -> list[str]:
    """The gaps (filtering − zero option) that `quantities` (increments or comparisons by name) can form."""
    return [gap for gap, form in GAPS.items() if form in quantities and ZERO_OPTION in quantities]
