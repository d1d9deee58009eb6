"""The scale slopes in the declared family: one study-wide family of the declared comparisons and the trends.

The study's headline claims are about scale (the zero-option gain shrinks, filtering grows, filtering
overtakes), so with `family="experiment"` the slopes that carry them are tested in the same Holm family as
every tier's declared comparisons: the slope of each declared comparison and of the two gaps (filtering −
zero option). The m the family states is then the m Holm used, and the chance of any false "supported"
across the whole study, tiers and slopes together, is ≤ α. Every other slope (an increment that is not
declared) is exploratory: its unadjusted p, never called supported.

A slope is decided only on tiers whose trained sizes are known, distinct and the ladder's (within ±5% of their
nominal sizes: `ablate.analysis.scale_sizes`); otherwise every slope is exploratory, the table's `family` says
why, and each declared slope still counts in the family's m at p = 1 (the other members' Holm does not loosen).

With `family="tier"` each tier is a family of its own and a slope spans the tiers, so every slope is
exploratory; so is every slope of a downstream metric (the declarations are on the loss), of a source
with no declarations, and of a sequential study (its design spends α over the declared comparisons only).
"""

from __future__ import annotations

import dataclasses

import polars as pl

from ablate.analysis.hypotheses import ALPHA, Declared, count_diverged, declared_table, study_holm
from ablate.analysis.runs import Runs
from ablate.analysis.scale import EXPLORATORY, ScaleTable, scale_table
from ablate.analysis.tables import Table

SUPPORTED, NOT_SUPPORTED = "supported", "not supported"
NO_DECLARATIONS = ("no declared comparisons, so no family: every slope is exploratory (unadjusted p, p_holm empty, "
                   "never called supported)")
METRIC = ("the declared comparisons are on the validation loss, so no slope of a downstream metric is in a family: "
          "every slope is exploratory (unadjusted p, p_holm empty, never called supported)")
TIER = ('family="tier": each tier\'s declared comparisons are a family of their own and a slope spans the tiers, so '
        'every slope is exploratory (unadjusted p, p_holm empty, never called supported); declare '
        'family="experiment" to test the slopes of the declared comparisons and the gaps in one study-wide family')
SEQUENTIAL = ("a sequential design spends α over the declared comparisons only, so every slope is exploratory "
              "(unadjusted p, p_holm empty, never called supported)")


def scale_members(scale: ScaleTable, declared: Declared | None, runs: Runs) -> list[str]:
    """The quantities whose slope is in the declared family (`Declared.family_of`: with `family="experiment"` in
    a fixed design, each declared comparison's and each gap's the design can form), those the table has a row of."""
    if declared is None or not declared.comparisons or declared.family != "experiment" or declared.design:
        return []
    slopes = declared.family_of(runs).slopes
    return [q for q in scale.rows["quantity"].to_list() if q in slopes]


def _why_exploratory(runs: Runs, declared: Declared | None) -> str | None:
    if runs.metric is not None:
        return METRIC
    if declared is None or not declared.comparisons:
        return NO_DECLARATIONS
    if declared.family == "tier":
        return TIER
    return SEQUENTIAL if declared.design else None


def study_family(runs: Runs, declared: Declared | None) -> tuple[Table | None, ScaleTable]:
    """The declared family's table (None without declarations or for a downstream metric) and the scale table,
    with p_holm from one Holm over both where `family="experiment"` puts the slopes in the family."""
    scale = scale_table(runs, declared)
    why = _why_exploratory(runs, declared)
    if runs.metric is not None or declared is None or not declared.comparisons:
        return None, dataclasses.replace(scale, family=why)
    members = scale_members(scale, declared, runs)
    # a "shrinks/grows with scale" claim is about N, so the family tests each slope on its law interval's p
    slopes = {q: p for q, p in scale.rows.select("quantity", "law_p").iter_rows() if q in members}
    if scale.unsized:  # sizes that cannot carry a slope: each stays in the family's m at p = 1, none is decided
        slopes = dict.fromkeys(slopes)
    family = count_diverged(declared_table(runs, declared, slopes if why is None else None), runs)
    adjusted = study_holm(family.frame, declared.family_of(runs), slopes)[1] if why is None else {}
    if scale.unsized:
        return family, adjust_scale(scale, {}, why or f"{scale.unsized} (each declared slope still counts in the "
                                                      "family's m, at p = 1)")
    return family, adjust_scale(scale, adjusted, why or family.family)


def slope_decision(p_holm: float | None, alpha: float = ALPHA) -> str:
    """A family member's decision: "supported" (p_holm < α of its law-of-N p: the slope's sign is resolved as a
    law of N), else "not supported"."""
    return SUPPORTED if p_holm is not None and p_holm < alpha else NOT_SUPPORTED


def adjust_scale(scale: ScaleTable, adjusted: dict[str, float | None], family: str) -> ScaleTable:
    """The table with p_holm and the decision of each member slope (`adjusted`: quantity → p_holm, from the
    family's Holm), every other row exploratory; `family` says what the family is, or why there is none."""
    quantities = scale.rows["quantity"].to_list()
    inside = [q in adjusted for q in quantities]
    rows = scale.rows.with_columns(
        pl.Series("p_holm", [adjusted.get(q) for q in quantities], dtype=pl.Float64),
        pl.Series("decision", [slope_decision(adjusted[q]) if q in adjusted else EXPLORATORY for q in quantities],
                  dtype=pl.String),
        pl.Series("family", ["experiment" if i else None for i in inside], dtype=pl.String))
    return dataclasses.replace(scale, rows=rows, family=family)
