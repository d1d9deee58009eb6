"""The analysis tables: paired differences, increments, the 2×2 overlap, and absolute final losses.

Sign convention throughout: positive means the arm (or the quantity) lowers the validation loss.
A table carries, besides its rows, the runs it could not use (missing seeds, excluded runs) and
notes on quantities it had to skip, so that no renderer can show the numbers without them.

Every table ends in a `marks` column: per-row caveats by name, comma-separated, null when none
(e.g. `pipeline-check` on a tier too small to carry evidence). `MARK_NOTES` explains each mark once;
renderers print the explanation under any table that uses it. To add a mark, register its text in
`MARK_NOTES` and set it with `add_mark(frame, condition, name)`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from ablate.errors import AblateError
from ablate.store import run_key
from ablate.increments import INCREMENTS, OVERLAP_BASE, OVERLAP_GATES, OVERLAP_SINK
from ablate.analysis.numerics import MIXED_NUMERICS, MIXED_NUMERICS_NOTE, mixed_numerics
from ablate.analysis.runs import NOT_EVALUATED, Runs, sort_runs
from ablate.analysis.stats import STAT_COLUMNS, holm_by, paired_differences, summarise
from ablate.tiers import SMALLEST_REAL_TIER, TIERS, is_pipeline_check

LOSS_COLUMNS = ("n", "mean", "sd", "se", "min", "max")

PIPELINE_CHECK = "pipeline-check"
PARAMETER_MATCHED = "parameter-matched"
EXPLORATORY = "exploratory"
MARK_NOTES = {
    PARAMETER_MATCHED: "the arm's MLP was narrowed (match_params) so its non-embedding parameters equal the "
                       "reference's within 0.5%; the two share the initial values of every parameter with the same "
                       "name and shape (not the MLP matrices), and the same data, optimiser and schedule",
    PIPELINE_CHECK: f"a tier smaller than the smallest real tier ({SMALLEST_REAL_TIER}): a pipeline check that "
                    "shows the harness runs end to end; its numbers carry no evidence about the arms",
    EXPLORATORY: "not one of the experiment's declared comparisons: its p is unadjusted, it is in no family "
                 "(p_holm empty) and it is never called supported",
    MIXED_NUMERICS: MIXED_NUMERICS_NOTE,
}


@dataclass(frozen=True)
class Table:
    """One analysis table. `frame` holds exactly the machine-readable columns of its kind.

    `key` names the row column (arm, quantity or gate); `missing` and `excluded` list the runs of the
    arms this table uses that did not count; `notes` say what was skipped and why, and what holds for
    the whole source (`source_notes`, a renderer shows those on their own lines); `differences`
    holds the per-seed values behind the rows (the forest plot and the crossover bootstrap use them).
    """

    kind: str
    key: str
    frame: pl.DataFrame
    name: str
    reference: str | None
    missing: pl.DataFrame
    excluded: pl.DataFrame
    notes: tuple[str, ...] = ()
    differences: pl.DataFrame | None = None  # per seed: tier, key, seed, diff (what the rows summarise)
    # The caption's quantity: None for val_loss, else the `ablate eval` metric (TASK/METRIC) and its direction.
    metric: str | None = None
    higher_is_better: bool | None = None
    source_notes: tuple[str, ...] = ()  # the part of `notes` about the source itself (e.g. pairing NOT verified)
    family: str | None = None  # the declared family p_holm adjusts over (None: no declarations)

    @property
    def columns(self) -> list[str]:
        return self.frame.columns

    @property
    def unevaluated(self) -> pl.DataFrame:
        """The completed runs of `excluded` that only lack a score of the metric (`ablate eval` would count them)."""
        return self.excluded.filter(pl.col("reason").str.starts_with(NOT_EVALUATED))

    @property
    def left_out(self) -> pl.DataFrame:
        """The runs of `excluded` that cannot count: not completed, no finite val_loss, a score of other weights."""
        return self.excluded.filter(~pl.col("reason").str.starts_with(NOT_EVALUATED))

    @property
    def warnings(self) -> list[str]:
        """Everything a reader of the numbers must also know, one line each."""
        lines = [f"excluded {run_key(r['tier'], r['arm'], r['seed'])}: {r['reason']}"
                 for r in self.left_out.iter_rows(named=True)]
        lines += [f"{run_key(r['tier'], r['arm'], r['seed'])}: {r['reason']}"
                  for r in self.unevaluated.iter_rows(named=True)]
        lines += [f"missing {run_key(r['tier'], r['arm'], r['seed'])}: no run"
                  for r in self.missing.iter_rows(named=True)]
        return lines + list(self.notes) + [f"{mark}: {MARK_NOTES.get(mark, mark)}" for mark in self.marks_used]

    @property
    def marks_used(self) -> list[str]:
        """The marks that appear in the rows, in MARK_NOTES order (then any others by name)."""
        found = {m for cell in self.frame["marks"].drop_nulls().to_list() for m in cell.split(",") if m}
        return [m for m in MARK_NOTES if m in found] + sorted(found - set(MARK_NOTES))


def pipeline_check_text(tier: str) -> str:
    """One line on why `tier` carries no evidence, with its size and budget when the ladder knows it."""
    known = TIERS.get(tier)
    size = (f" ({known.nominal_params:,.0f} nominal non-embedding parameters, {known.tokens:,} training tokens)"
            if known else "")
    return f"{tier}{size} is {MARK_NOTES[PIPELINE_CHECK]}"


def add_mark(frame: pl.DataFrame, condition: pl.Expr, mark: str) -> pl.DataFrame:
    """Append `mark` to the `marks` cell of the rows where `condition` holds (the hook for row caveats)."""
    joined = pl.when(pl.col("marks").is_null()).then(pl.lit(mark)).otherwise(pl.col("marks") + "," + mark)
    return frame.with_columns(marks=pl.when(condition).then(joined).otherwise(pl.col("marks")))


def paired_table(runs: Runs, reference: str = "baseline") -> Table:
    """Every arm against `reference` per tier: tier, arm, reference, STAT_COLUMNS."""
    arms = runs.arm_order
    if reference not in arms:
        raise AblateError(f"unknown reference arm {reference!r}; arms in {runs.name!r}: {', '.join(arms)}")
    others = [a for a in arms if a != reference]
    diffs = paired_differences(runs.completed, others, reference)
    notes = []
    with_reference = set(runs.completed.filter(pl.col("arm") == reference)["tier"].to_list())
    for tier in runs.tiers:
        if tier not in with_reference:
            tier_arms = sorted(set(runs.completed.filter(pl.col("tier") == tier)["arm"].to_list()) - {reference})
            if tier_arms:
                notes.append(f"tier {tier} has no completed {reference} run: its arms ({', '.join(tier_arms)}) have "
                             "no paired difference and are not in the table")
    frame = summarise(diffs, ["tier", "arm"]).with_columns(reference=pl.lit(reference))
    frame = sort_runs(frame, arms).select("tier", "arm", "reference", *STAT_COLUMNS)
    frame = frame.with_columns(holm_by(frame, "tier"))
    table = _table("paired", "arm", frame, runs, arms, reference=reference, differences=diffs, notes=notes)
    widths = runs.completed.select("tier", "arm", "mlp_hidden").unique()
    ref_widths = widths.filter(pl.col("arm") == reference).select("tier", pl.col("mlp_hidden").alias("ref_width"))
    narrowed = widths.join(ref_widths, on="tier").filter(pl.col("mlp_hidden") != pl.col("ref_width"))
    if narrowed.height:
        keys = [f"{t}/{a}" for t, a in narrowed.select("tier", "arm").iter_rows()]
        frame = add_mark(table.frame, pl.concat_str("tier", pl.lit("/"), "arm").is_in(keys), PARAMETER_MATCHED)
        table = dataclasses.replace(table, frame=frame)
    return table


def losses_table(runs: Runs) -> Table:
    """Absolute final validation loss per (tier, arm) over the counted seeds: tier, arm, LOSS_COLUMNS, marks.

    The differences tables say which arm is better; this one says how far training got at all (a
    loss near ln(50257) ≈ 10.8 is an untrained model whatever the differences say).
    """
    completed = runs.completed.sort("tier", "arm", "seed")
    frame = completed.group_by("tier", "arm", maintain_order=True).agg(
        n=pl.len().cast(pl.Int64), mean=pl.col("val_loss").mean(), sd=pl.col("val_loss").std(ddof=1),
        min=pl.col("val_loss").min(), max=pl.col("val_loss").max(),
    ).with_columns(sd=pl.when(pl.col("n") >= 2).then(pl.col("sd"))).with_columns(se=pl.col("sd") / pl.col("n").sqrt())
    frame = sort_runs(frame, runs.arm_order).select("tier", "arm", *LOSS_COLUMNS)
    frame = _with_marks(frame.cast({"n": pl.Int64, **{c: pl.Float64 for c in LOSS_COLUMNS if c != "n"}}))
    frame, mixed = _mark_mixed_numerics(frame, runs, "arm")
    return Table(kind="losses", key="arm", frame=frame, name=runs.name, reference=None, missing=runs.missing,
                 excluded=runs.excluded.select("tier", "arm", "seed", "status", "reason"), notes=runs.notes + mixed,
                 metric=runs.metric, higher_is_better=runs.higher_is_better, source_notes=runs.notes)


def increments_table(runs: Runs) -> Table:
    """zero_option and the two filtering increments per tier: tier, quantity, STAT_COLUMNS."""
    parts, notes, used = [], [], set()
    for quantity, (reference, arm) in INCREMENTS.items():
        absent = [a for a in (reference, arm) if a not in runs.arm_order]
        if absent:
            notes.append(_skip_note(quantity, (reference, arm), absent))
            continue
        used.update((reference, arm))
        diffs = paired_differences(runs.completed, [arm], reference)
        parts.append(diffs.with_columns(quantity=pl.lit(quantity)))
    return _keyed_table("increments", "quantity", list(INCREMENTS), parts, runs, used, notes)


def overlap_table(runs: Runs) -> Table:
    """Per seed, overlap = g_sink + g_G − g_both with gains against baseline; tier, gate, STAT_COLUMNS.

    Positive overlap: the two mechanisms' gains are not additive (they partly do the same work).
    """
    parts, notes, used = [], [], set()
    for gate, (alone, both) in OVERLAP_GATES.items():
        needed = (OVERLAP_BASE, OVERLAP_SINK, alone, both)
        absent = [a for a in needed if a not in runs.arm_order]
        if absent:
            notes.append(_skip_note(f"{gate} overlap", needed, absent))
            continue
        used.update(needed)
        gains = paired_differences(runs.completed, [OVERLAP_SINK, alone, both], OVERLAP_BASE)
        scale = gains.group_by("tier", "seed").agg(pl.col("scale").max())  # the largest |loss| of the four runs
        wide = gains.pivot(on="arm", index=["tier", "seed"], values="diff").join(scale, on=["tier", "seed"])
        for arm in (OVERLAP_SINK, alone, both):
            if arm not in wide.columns:  # an arm with no pair at all in any tier
                wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(arm))
        per_seed = wide.drop_nulls([OVERLAP_SINK, alone, both]).select(
            "tier", "seed", (pl.col(OVERLAP_SINK) + pl.col(alone) - pl.col(both)).alias("diff"), "scale"
        )
        parts.append(per_seed.with_columns(gate=pl.lit(gate)))
    return _keyed_table("overlap", "gate", list(OVERLAP_GATES), parts, runs, used, notes)


def _keyed_table(kind, key, order, parts, runs: Runs, used, notes) -> Table:
    schema = {"tier": pl.String, key: pl.String, "seed": pl.Int64, "diff": pl.Float64, "scale": pl.Float64}
    diffs = pl.concat([p.select(list(schema)) for p in parts]) if parts else pl.DataFrame(schema=schema)
    frame = sort_runs(summarise(diffs, ["tier", key]), order, arm_column=key).select("tier", key, *STAT_COLUMNS)
    frame = frame.with_columns(holm_by(frame, "tier"))  # the quantities of one tier are one family
    arms = [a for a in runs.arm_order if a in used]
    return _table(kind, key, frame, runs, arms, notes=notes, differences=diffs)


def _with_marks(frame: pl.DataFrame) -> pl.DataFrame:
    frame = frame.with_columns(marks=pl.lit(None, dtype=pl.String))
    checks = [t for t in frame["tier"].unique().to_list() if is_pipeline_check(t)]
    return add_mark(frame, pl.col("tier").is_in(checks), PIPELINE_CHECK) if checks else frame


def _table(kind, key, frame, runs: Runs, arms, reference=None, notes=(), differences=None) -> Table:
    frame = frame.cast({"n": pl.Int64, "agree": pl.Int64})
    frame = _with_marks(frame.cast({c: pl.Float64 for c in frame.columns if c in (*STAT_COLUMNS, "p_holm")
                                    and c not in ("n", "agree")}))
    used = pl.col("arm").is_in(list(arms))
    source_notes = runs.notes_for(arms)
    frame, mixed = _mark_mixed_numerics(frame, runs, key, reference)
    return Table(
        kind=kind, key=key, frame=frame, name=runs.name, reference=reference,
        missing=runs.missing.filter(used),
                 excluded=runs.excluded.filter(used).select("tier", "arm", "seed", "status", "reason"),
        notes=tuple(notes) + mixed + source_notes, differences=differences, metric=runs.metric,
        higher_is_better=runs.higher_is_better, source_notes=source_notes,
    )


def _row_arms(key: str, row: dict, reference: str | None) -> tuple[str, ...]:
    """The arms whose runs one row draws on: an arm (and its reference), a comparison's two, a quantity's."""
    if "minuend" in row:
        return row["minuend"], row["subtrahend"]
    if key == "quantity":
        return INCREMENTS[row["quantity"]]
    if key == "gate":
        return (OVERLAP_BASE, OVERLAP_SINK, *OVERLAP_GATES[row["gate"]])
    return (row["arm"],) + ((reference,) if reference else ())


def _mark_mixed_numerics(frame: pl.DataFrame, runs: Runs, key: str, reference: str | None = None):
    """Mark the rows whose runs were computed on more than one kernel set or device; a note per such row."""
    mixed = {}
    for row in frame.iter_rows(named=True):
        found = mixed_numerics(runs.completed, row["tier"], _row_arms(key, row, reference))
        if found:
            mixed[f"{row['tier']}/{row[key]}"] = found
    if not mixed:
        return frame, ()
    frame = add_mark(frame, pl.concat_str("tier", pl.lit("/"), key).is_in(list(mixed)), MIXED_NUMERICS)
    return frame, tuple(f"{MIXED_NUMERICS} {row}: {found}" for row, found in mixed.items())


def _skip_note(what: str, needed, absent) -> str:
    return f"{what} skipped: it needs arms {', '.join(needed)}; not in this source: {', '.join(absent)}"
