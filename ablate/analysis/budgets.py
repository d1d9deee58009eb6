"""The budgets table (`ablate table EXPERIMENT --kind budgets`): each declared comparison and each arm against the
reference at 25, 50, 75 and 100% of the training budget and as the area under the curve, so that a reader sees
whether a gain is a speed effect that closes by the end (or one that grows).

Every number is read from the runs' logged validation curve (metrics.jsonl's `val_loss` lines: the evaluation
windows of `val_tokens`, the same windows at every step of every run of a tier), never from the final, larger
validation (`final_val_tokens`) the other tables report — the 100% column is the curve's last point, not
val_loss. Per tier, the steps read are those every counted run logged; at a fraction f of the budget (the last of
those steps), the last of them at or before f × the budget. AUC is the area under that curve divided by its
steps (trapezoids; a mean loss over training, lower for an arm that learns sooner). Exploratory throughout: no
row is in any family, p is unadjusted and nothing here is ever called supported. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from ablate.analysis.kinds import builds
from ablate.analysis.render import render
from ablate.analysis.runs import Runs
from ablate.analysis.stats import STAT_COLUMNS, paired_differences, summarise
from ablate.analysis.tables import EXPLORATORY, PIPELINE_CHECK, Table, add_mark
from ablate.errors import AblateError
from ablate.store import METRICS, read_metrics
from ablate.tiers import is_pipeline_check

FRACTIONS = (0.25, 0.5, 0.75, 1.0)
AUC = "AUC"
BUDGETS = tuple(f"{f:.0%}" for f in FRACTIONS) + (AUC,)
COLUMNS = ("tier", "comparison", "minuend", "subtrahend", "budget", "step")
NOTE = ("every row exploratory: read from the logged validation curve (the val_tokens windows, never the final "
        "larger validation the other tables report), no row in any family, p unadjusted")


def logged_curve(run: str | Path) -> dict[int, float]:
    """{step: val_loss} of a run's logged evaluations (metrics.jsonl), refused in one line when it has none."""
    curve = {int(row["step"]): float(row["val_loss"]) for row in read_metrics(Path(run) / METRICS)
             if isinstance(row.get("step"), int) and isinstance(row.get("val_loss"), (int, float))}
    if not curve:
        raise AblateError(f"run {run} has no logged validation curve ({METRICS} without val_loss lines): the budgets "
                          "table reads each run's curve; rerun it or move it out")
    return curve


def budget_readings(runs: Runs) -> pl.DataFrame:
    """Per counted run and budget (BUDGETS): tier, arm, seed, budget, step (the step read; the budget's last step
    for AUC), val_loss (the curve's value there, or its area per step), path."""
    if runs.root is None:
        raise AblateError(f"--kind budgets reads each run's logged validation curve; {runs.name!r} is a table file "
                          "without curves: give an experiment or its results folder")
    rows = []
    for (tier,), part in runs.completed.group_by("tier", maintain_order=True):
        curves = {r["path"]: logged_curve(r["path"]) for r in part.iter_rows(named=True)}
        steps = np.array(sorted(set.intersection(*(set(c) for c in curves.values()))))
        end = int(steps[-1])
        for r in part.iter_rows(named=True):
            curve = curves[r["path"]]
            for fraction, budget in zip(FRACTIONS, BUDGETS):
                step = int(steps[steps <= fraction * end][-1]) if (steps <= fraction * end).any() else None
                rows.append((tier, r["arm"], r["seed"], budget, step, None if step is None else curve[step]))
            values = np.array([curve[int(s)] for s in steps])
            area = float(np.trapezoid(values, steps) / (end - steps[0])) if end > steps[0] else None
            rows.append((tier, r["arm"], r["seed"], AUC, end, area))
    schema = {"tier": pl.String, "arm": pl.String, "seed": pl.Int64, "budget": pl.String, "step": pl.Int64,
              "val_loss": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").drop_nulls("val_loss")


def comparisons(runs: Runs, reference: str, declared) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(name, minuend, subtrahend, tiers: empty for all) of each declared comparison, then each arm against
    `reference` (named "ARM vs REFERENCE")."""
    found = []
    if declared is not None:
        at = dict(declared.tiers)
        found += [(name, minuend, subtrahend, tuple(at.get(name, ()))) for name, minuend, subtrahend in
                  declared.comparisons]
    if reference in runs.arm_order:
        found += [(f"{arm} vs {reference}", reference, arm, ()) for arm in runs.arm_order if arm != reference]
    return found


@builds("budgets", render)
def build_budgets(runs: Runs, reference: str | None, declared) -> Table:
    """The budgets table: COLUMNS, STAT_COLUMNS and marks (every row exploratory) over `comparisons`."""
    if reference is not None and reference not in runs.arm_order:
        raise AblateError(f"unknown reference arm {reference!r}; arms in {runs.name!r}: {', '.join(runs.arm_order)}")
    readings = budget_readings(runs)
    parts = []
    for name, minuend, subtrahend, tiers in comparisons(runs, reference or "baseline", declared):
        for budget in BUDGETS:
            at = readings.filter(pl.col("budget") == budget)
            diffs = paired_differences(at, [subtrahend], minuend)
            if tiers:
                diffs = diffs.filter(pl.col("tier").is_in(list(tiers)))
            stats = summarise(diffs, ["tier"])
            step = at.group_by("tier").agg(pl.col("step").max())
            parts.append(stats.join(step, on="tier", how="left").with_columns(
                comparison=pl.lit(name), minuend=pl.lit(minuend), subtrahend=pl.lit(subtrahend),
                budget=pl.lit(budget)))
    frame = (pl.concat([p.select(*COLUMNS, *STAT_COLUMNS) for p in parts]) if parts else
             pl.DataFrame(schema={c: pl.String for c in COLUMNS}))
    frame = _ordered(frame, runs).with_columns(marks=pl.lit(EXPLORATORY))
    checks = [t for t in frame["tier"].unique().to_list() if is_pipeline_check(t)] if frame.height else []
    frame = add_mark(frame, pl.col("tier").is_in(checks), PIPELINE_CHECK)
    notes = (NOTE,) + (() if (reference or "baseline") in runs.arm_order else
                       (f"no {reference or 'baseline'} runs: no arm against the reference (--reference names one)",))
    return Table(kind="budgets", key="comparison", frame=frame, name=runs.name, reference=reference or "baseline",
                 missing=runs.missing, excluded=runs.excluded.select("tier", "arm", "seed", "status", "reason"),
                 notes=notes + runs.notes, source_notes=runs.notes)


def _ordered(frame: pl.DataFrame, runs: Runs) -> pl.DataFrame:
    """Tiers in the source's order, then the comparisons as listed, then the budgets in BUDGETS order."""
    if frame.is_empty():
        return frame
    tiers = {t: i for i, t in enumerate(runs.tiers)}
    names = {n: i for i, n in enumerate(frame["comparison"].unique(maintain_order=True).to_list())}
    return frame.with_columns(_t=pl.col("tier").replace_strict(tiers, default=len(tiers)),
                              _c=pl.col("comparison").replace_strict(names),
                              _b=pl.col("budget").replace_strict({b: i for i, b in enumerate(BUDGETS)})
                              ).sort("_t", "_c", "_b").drop("_t", "_c", "_b")
