"""The three tables of SPEC.md §3: paired differences, increments, and the 2×2 overlap.

Sign convention throughout: positive means the arm (or the quantity) lowers the validation loss.
A table carries, besides its rows, the runs it could not use (missing seeds, excluded runs) and
notes on quantities it had to skip, so that no renderer can show the numbers without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ablate.errors import AblateError, choice_error
from ablate.analysis.load import Runs, sort_runs
from ablate.analysis.stats import STAT_COLUMNS, paired_differences, summarise

KINDS = ("paired", "increments", "overlap")

# quantity → (reference arm, arm): the increment is L_reference − L_arm.
INCREMENTS = {
    "zero_option": ("baseline", "sink-logit"),
    "filtering_norm": ("sink-logit", "combo"),
    "filtering_proj": ("sink-logit", "combo2"),
}
# gate → (the gate alone, the gate with sink-logit); gains are against baseline.
OVERLAP_GATES = {"norm": ("norm-gate", "combo"), "proj": ("proj-gate", "combo2")}
OVERLAP_BASE, OVERLAP_SINK = "baseline", "sink-logit"

DESCRIPTIONS = {
    "zero_option": "baseline − sink-logit",
    "filtering_norm": "sink-logit − combo",
    "filtering_proj": "sink-logit − combo2",
    "norm": "norm-gate with combo",
    "proj": "proj-gate with combo2",
}


@dataclass(frozen=True)
class Table:
    """One analysis table. `frame` holds exactly the machine-readable columns of its kind.

    `key` names the row column (arm, quantity or gate); `missing` and `excluded` list the runs of the
    arms this table uses that did not count; `notes` say what was skipped and why.
    """

    kind: str
    key: str
    frame: pl.DataFrame
    name: str
    reference: str | None
    missing: pl.DataFrame
    excluded: pl.DataFrame
    notes: tuple[str, ...] = ()

    @property
    def columns(self) -> list[str]:
        return self.frame.columns

    @property
    def warnings(self) -> list[str]:
        """Everything a reader of the numbers must also know, one line each."""
        lines = [f"excluded {r['tier']}/{r['arm']}/seed{r['seed']}: {r['reason']}" for r in self.excluded.iter_rows(named=True)]
        lines += [f"missing {r['tier']}/{r['arm']}/seed{r['seed']}: no run" for r in self.missing.iter_rows(named=True)]
        return lines + list(self.notes)


def build_table(runs: Runs, kind: str, reference: str | None = None) -> Table:
    """The one entry point the CLI and the report use; `reference` applies to the paired table only."""
    if kind not in KINDS:
        raise choice_error("kind", kind, KINDS)
    if kind == "paired":
        return paired_table(runs, reference or "baseline")
    if reference is not None:
        raise AblateError(
            f"--reference applies to --kind paired only; the {kind} table has fixed arms ({_fixed_arms(kind)})"
        )
    return increments_table(runs) if kind == "increments" else overlap_table(runs)


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
    return _table("paired", "arm", frame, runs, arms, reference=reference, notes=notes)


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
        wide = gains.pivot(on="arm", index=["tier", "seed"], values="diff")
        for arm in (OVERLAP_SINK, alone, both):
            if arm not in wide.columns:  # an arm with no pair at all in any tier
                wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(arm))
        per_seed = wide.drop_nulls([OVERLAP_SINK, alone, both]).select(
            "tier", "seed", (pl.col(OVERLAP_SINK) + pl.col(alone) - pl.col(both)).alias("diff")
        )
        parts.append(per_seed.with_columns(gate=pl.lit(gate)))
    return _keyed_table("overlap", "gate", list(OVERLAP_GATES), parts, runs, used, notes)


def _keyed_table(kind, key, order, parts, runs: Runs, used, notes) -> Table:
    schema = {"tier": pl.String, key: pl.String, "seed": pl.Int64, "diff": pl.Float64}
    diffs = pl.concat([p.select(list(schema)) for p in parts]) if parts else pl.DataFrame(schema=schema)
    frame = sort_runs(summarise(diffs, ["tier", key]), order, arm_column=key)
    arms = [a for a in runs.arm_order if a in used]
    return _table(kind, key, frame.select("tier", key, *STAT_COLUMNS), runs, arms, notes=notes)


def _table(kind, key, frame, runs: Runs, arms, reference=None, notes=()) -> Table:
    frame = frame.cast({"n": pl.Int64, "agree": pl.Int64})
    frame = frame.cast({c: pl.Float64 for c in STAT_COLUMNS if c not in ("n", "agree")})
    used = pl.col("arm").is_in(list(arms))
    return Table(
        kind=kind, key=key, frame=frame, name=runs.name, reference=reference,
        missing=runs.missing.filter(used), excluded=runs.excluded.filter(used).select("tier", "arm", "seed", "status", "reason"),
        notes=tuple(notes) + runs.notes_for(arms),
    )


def _skip_note(what: str, needed, absent) -> str:
    return f"{what} skipped: it needs arms {', '.join(needed)}; not in this source: {', '.join(absent)}"


def _fixed_arms(kind: str) -> str:
    if kind == "increments":
        return "; ".join(f"{q} = {DESCRIPTIONS[q]}" for q in INCREMENTS)
    return "; ".join(f"{g}: baseline, sink-logit, {DESCRIPTIONS[g]}" for g in OVERLAP_GATES)
