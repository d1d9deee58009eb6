"""Declared comparisons: the family p is adjusted over, the sequential decisions, a pilot's differences.

An experiment declares the comparisons it exists for (`ablate.experiment.Comparison`: a name and two
arms, Δ = L_minuend − L_subtrahend per seed, positive: the subtrahend lowers the loss). The analysis
gets them as plain values (`Declared`), never the experiment file. With declarations:

* the `declared` table has one row per (tier, comparison) with the paired statistics and p_holm,
  Holm over the family only: a tier's declared comparisons (`family="tier"`) or all of the
  experiment's together with the scale slopes of the declared comparisons and of the gaps
  (`"experiment"`, pipeline-check tiers kept apart; `ablate.analysis.scale_family`);
* every other table takes p_holm of a row from that family when the row is a declared comparison
  (same tier, same two arms) and marks every other row `exploratory`: unadjusted p, p_holm empty,
  never called supported;
* with a sequential design (`ablate.power.sequential_design`, recorded by `submit --sequential`) each
  row also says the look reached, the decision and the interval valid for that design, and a
  comparison is supported only when the design decided "effect" (the fixed-sample p ignores the looks).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from dataclasses import dataclass
from typing import Mapping

import polars as pl

from ablate.analysis.kinds import get_kind
from ablate.analysis.load import RunFolders
from ablate.analysis.runs import Runs, sort_runs
from ablate.analysis.stats import STAT_COLUMNS, holm, paired_differences, summarise
from ablate.design import DesignState, design_state
from ablate.analysis.tables import (EXPLORATORY, MARK_NOTES, Table, _skip_note, _table, add_mark,
                                    is_pipeline_check)
from ablate.errors import AblateError
from ablate.family import FAMILIES, PIPELINE_GROUP, STUDY_GROUP, Family
from ablate.power import sequential_decision
from ablate.sequential import recorded_design
from ablate.store import LEDGER
from ablate.tiers import tier_rank

DECLARED = "declared"
ALPHA = 0.05
SEQUENTIAL_COLUMNS = {"look": pl.Int64, "seeds_used": pl.Int64, "decision": pl.String, "sign": pl.Int64,
                      "t_boundary": pl.Float64, "seq_ci_low": pl.Float64, "seq_ci_high": pl.Float64,
                      "next_seeds": pl.Int64}


@dataclass(frozen=True)
class Declared:
    """The declared comparisons as (name, minuend, subtrahend), the family they are adjusted in, and
    the sequential design the study follows (None: a fixed design)."""

    comparisons: tuple[tuple[str, str, str], ...]
    family: str = "tier"
    design: dict | None = None
    tiers: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (name, tiers) of a comparison declared at those only
    members: Family | None = None  # the design's family (`ablate.family.Family`); None: built from the runs' tiers
    seeds: tuple[tuple[str, int], ...] = ()  # (tier, n): a fixed design's seeds 0..n-1 (none: every seed counts)
    notes: tuple[str, ...] = ()  # the design's history every table and the report carry (`ablate.design`)

    @classmethod
    def of(cls, comparisons, family: str = "tier", design: dict | None = None,
           members: Family | None = None, seeds: Mapping[str, int] | None = None,
           notes: tuple[str, ...] = ()) -> Declared:
        """From `Comparison`s (anything with name, minuend, subtrahend, and maybe tiers) or triples; `members`:
        the experiment's `declared_family()` (None: every declared comparison at every tier the runs have);
        `seeds`: {tier: the fixed design's seed count} (a sequential `design` fixes its own: its last look's)."""
        triples = tuple(tuple(c) if isinstance(c, (tuple, list)) else (c.name, c.minuend, c.subtrahend)
                        for c in comparisons)
        if family not in FAMILIES:
            raise AblateError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
        where = tuple((c.name, tuple(c.tiers)) for c in comparisons if getattr(c, "tiers", ()))
        return cls(triples, family, design, where, members, tuple(sorted((seeds or {}).items())), tuple(notes))

    def family_of(self, runs: Runs) -> Family:
        """The family Holm adjusts over: the design's when given, else every declared comparison at every tier of
        the source (its runs of any status, so a comparison whose arms did not run still counts)."""
        if self.members is not None:
            return self.members
        tiers = sorted(set(runs.frame["tier"].to_list()) | set(runs.missing["tier"].to_list()), key=tier_rank)
        return Family.of(self.comparisons, tiers, self.family, at=dict(self.tiers), arms=runs.arm_order,
                         sequential=self.design is not None)

    def seed_count(self, tier: str) -> int | None:
        """How many seeds (0..n-1) of `tier` the design counts: a sequential design's last look, else the fixed
        design's; None when nothing fixes it (declarations read without their experiment)."""
        if self.design is not None:
            return int(self.design["looks"][-1]["seeds"])
        return dict(self.seeds).get(tier)

    @property
    def pairs(self) -> dict[tuple[str, str], str]:
        """(minuend, subtrahend) → the comparison's name."""
        return {(a, b): name for name, a, b in self.comparisons}

    def describe(self, frame: pl.DataFrame, family: Family, alpha: float = ALPHA,
                 slopes: Mapping[str, float | None] | None = None) -> str:
        """The family and its members, Holm's m of each group (the design's: `family`, whatever ran), what did
        not run or has no p (counted in m at p = 1, so the decisions are not final until they run), and the
        study-wide chance of any false "supported" the design allows. `slopes`: the scale slopes in the family
        (quantity → p), None when they are in none."""
        names = ", ".join(f"{name} ({a} − {b})" for name, a, b in self.comparisons)
        left = _untested_note(frame, family, slopes)
        groups = [g for g in dict.fromkeys(family.group(t) for t in frame["tier"].to_list()) if _evidence(g)]
        if self.family == "tier":
            per = ", ".join(f"{g}: {group_size(frame, family, g)}" for g in groups)
            k = len(groups)
            study = (f"study-wide chance of any false supported: ≤ {min(1.0, k * alpha):.2f} ({k} tier families at "
                     f"{alpha:g} each; {1 - (1 - alpha) ** k:.2f} if they were independent); declare "
                     f'family="experiment" to hold it to {alpha:g}') if k > 1 else f"study-wide error ≤ {alpha:g}"
            return (f"each tier's declared comparisons: {names}; Holm's m per tier = {per} (the design's){left}; "
                    f"{study}; the scale slopes span the tiers, so they are in no family: exploratory")
        rows = len(_group_keys(frame, family, STUDY_GROUP))
        if slopes is None:
            why = ("a sequential design spends α over the declared comparisons only" if self.design
                   else "none were given to this table")
            return (f"the experiment's declared comparisons at every tier together: {names}; Holm's m = {rows} "
                    f"(the design's){left} (pipeline-check tiers apart); study-wide chance of any false supported "
                    f"≤ {alpha:g}; the scale slopes are in no family ({why}): exploratory")
        members = family.group_slopes(STUDY_GROUP)
        return (f"the experiment's declared comparisons at every tier and the scale slopes of the declared comparisons "
                f"and the gaps together: {names}; Holm's m = {rows + len(members)} ({rows} declared comparison row(s) "
                f"and {len(members)} scale slope(s): {', '.join(members) or 'none'}; the design's){left} "
                f"(pipeline-check tiers apart); study-wide chance of any false supported ≤ {alpha:g}")


def _evidence(group: str) -> bool:
    return group != PIPELINE_GROUP and not is_pipeline_check(group)


def _group_keys(frame: pl.DataFrame, family: Family, group: str) -> list[tuple[str, str]]:
    """The (tier, comparison) members of one Holm group: the design's, and any other row the table has there."""
    present = [(t, c) for t, c in frame.select("tier", "comparison").iter_rows() if family.group(t) == group]
    return list(dict.fromkeys([*family.group_members(group), *present]))


def group_size(frame: pl.DataFrame, family: Family, group: str) -> int:
    """Holm's m of one group: its declared members (run or not) and, study-wide, the slopes in the family."""
    return len(_group_keys(frame, family, group)) + len(family.group_slopes(group))


def _untested_note(frame: pl.DataFrame, family: Family, slopes: Mapping[str, float | None] | None) -> str:
    """What counts in m without a p of its own: members that did not run, rows with one seed or no spread,
    slopes the scale table could not fit."""
    not_run = frame.filter(pl.col("n") == 0).height
    no_p = frame.filter((pl.col("n") > 0) & pl.col("p").is_null()).height
    short = [f"{r['tier']} {r['comparison']} (seeds {r[MISSING_SEEDS]})" for r in frame.iter_rows(named=True)
             if r.get(MISSING_SEEDS)]
    slopes_left = [q for q in family.slopes if slopes is not None and (slopes.get(q) is None)]
    parts = [f"{not_run} declared comparison row(s) not run" if not_run else "",
             f"{no_p} row(s) without a p (one seed or no spread)" if no_p else "",
             f"slope(s) without a p: {', '.join(slopes_left)}" if slopes_left else ""]
    parts = [p for p in parts if p]
    missing = (f"; seeds of the design missing in {', '.join(short)}: those rows are not final and never supported "
               "until they have run") if short else ""
    if not parts:
        return missing
    return (f"; {'; '.join(parts)}: each counts in m at p = 1, so every decision of its group is not final until "
            f"it has run (its p can only lower the others' p_holm){missing}")


def comparison_differences(runs: Runs, declared: Declared) -> tuple[pl.DataFrame, list[str]]:
    """Per (tier, comparison, seed) the paired difference L_minuend − L_subtrahend; notes on skipped ones."""
    parts, notes = [], []
    for name, minuend, subtrahend in declared.comparisons:
        absent = [a for a in (minuend, subtrahend) if a not in runs.arm_order]
        if absent:
            notes.append(_skip_note(f"declared comparison {name}", (minuend, subtrahend), absent)
                         + " (it still counts in Holm's m: a row marked not run)")
            continue
        diffs = paired_differences(runs.completed, [subtrahend], minuend)
        if name in dict(declared.tiers):  # declared at some tiers only: its other tiers' pairs are not tested
            diffs = diffs.filter(pl.col("tier").is_in(list(dict(declared.tiers)[name])))
        parts.append(diffs.select("tier", pl.lit(name).alias("comparison"), "seed", "diff", "scale"))
    schema = {"tier": pl.String, "comparison": pl.String, "seed": pl.Int64, "diff": pl.Float64, "scale": pl.Float64}
    frame = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    frame, outside = within_design(frame.cast(schema), declared)
    return frame, notes + outside


def within_design(diffs: pl.DataFrame, declared: Declared) -> tuple[pl.DataFrame, list[str]]:
    """The differences of the design's seeds only, and a note per tier naming the seeds left outside it.

    Seeds added beyond a fixed design (by hand, `ablate run --seed 3`, `submit --seeds 5`) are optional stopping:
    adding seeds until p crosses α makes a false "supported" far likelier than α. A sequential design
    (`submit --sequential`) is the way to add seeds with α held."""
    limits = {tier: declared.seed_count(tier) for tier in diffs["tier"].unique().to_list()}
    beyond = pl.col("seed") >= pl.col("tier").replace_strict(
        {t: n if n is not None else 2**62 for t, n in limits.items()}, return_dtype=pl.Int64)
    notes = []
    for tier in sorted(limits):
        seeds = sorted(set(diffs.filter(beyond & (pl.col("tier") == tier))["seed"].to_list()))
        if seeds:
            what = "the sequential design's last look" if declared.design is not None else "the experiment's seeds"
            notes.append(f"{tier}: seed(s) {', '.join(map(str, seeds))} lie outside the design ({what}: seeds "
                         f"0–{limits[tier] - 1}) and are not counted in the declared family (seeds added after "
                         "the fact are optional stopping; `submit --sequential` adds seeds with α held)")
    return (diffs.filter(~beyond) if diffs.height else diffs), notes


def declared_table(runs: Runs, declared: Declared, slopes: Mapping[str, float | None] | None = None) -> Table:
    """tier, comparison, minuend, subtrahend, STAT_COLUMNS, p_holm (over the design's family: `study_holm`, with
    the scale slopes `slopes` when given), the sequential columns when a design is recorded, marks. A declared
    (tier, comparison) with no pair of runs is a row of its own, n = 0, marked `not run`."""
    diffs, notes = comparison_differences(runs, declared)
    family = declared.family_of(runs)
    order = [name for name, _, _ in declared.comparisons]
    frame = _with_not_run(summarise(diffs, ["tier", "comparison"]), family)
    frame = sort_runs(frame, order, arm_column="comparison")
    arms_of = {name: (a, b) for name, a, b in declared.comparisons}
    frame = frame.with_columns(
        minuend=pl.col("comparison").replace_strict({k: v[0] for k, v in arms_of.items()}, return_dtype=pl.String),
        subtrahend=pl.col("comparison").replace_strict({k: v[1] for k, v in arms_of.items()}, return_dtype=pl.String),
    )
    frame = frame.select("tier", "comparison", "minuend", "subtrahend", *STAT_COLUMNS)
    frame = frame.with_columns(study_holm(frame, family, slopes)[0])
    if declared.design is not None:
        frame = frame.with_columns(**_sequential_columns(frame, diffs, declared.design))
    used = {a for _, a, b in declared.comparisons} | {b for _, a, b in declared.comparisons}
    arms = [a for a in runs.arm_order if a in used]
    missing = seeds_missing(frame, runs, declared)
    if any(missing):  # a fixed design's row short of its seeds: not final (`fixed_decision`), never supported
        frame = frame.with_columns(pl.Series(MISSING_SEEDS, missing, dtype=pl.String))
        notes = [*notes, *_missing_notes(frame, declared)]
    table = _table(DECLARED, "comparison", frame, runs, arms, notes=notes, differences=diffs)
    table = dataclasses.replace(table, frame=add_mark(table.frame, pl.col("n") == 0, NOT_RUN))
    if any(missing):
        table = dataclasses.replace(table, frame=add_mark(table.frame, pl.col(MISSING_SEEDS).is_not_null(),
                                                          SEEDS_MISSING))
    return dataclasses.replace(table, family=declared.describe(frame, family, slopes=slopes))


MISSING_SEEDS = "missing_seeds"  # the declared table's column: a fixed design's seeds a row has no pair of runs for
SEEDS_MISSING = "seeds missing"
MARK_NOTES.setdefault(SEEDS_MISSING, "a declared comparison with fewer seeds run than its fixed design: its decision "
                                     "is not final (as a member that has not run) and it is never called supported "
                                     "until every seed of the design has run")


def seeds_missing(frame: pl.DataFrame, runs: Runs, declared: Declared) -> list[str | None]:
    """Per row of the declared table (tier, minuend, subtrahend, n), the fixed design's seeds (0..n−1) that have no
    run of one of its two arms that counts or diverged, as "3, 4" (None: none missing, a row that has not run at
    all, a sequential design, which decides at its looks, or no design known). A diverged seed has run (the
    diverged-arm rule handles it); a seed moved aside, running, failed or not counted is missing."""
    if declared.design is not None:
        return [None] * frame.height
    ran = pl.concat([runs.completed.select("tier", "arm", "seed"),
                     runs.frame.filter(pl.col("status") == "diverged").select("tier", "arm", "seed")])
    done = {(t, a): set() for t, a in ran.select("tier", "arm").iter_rows()}
    for tier, arm, seed in ran.iter_rows():
        done[(tier, arm)].add(seed)
    out = []
    for tier, minuend, subtrahend, n in frame.select("tier", "minuend", "subtrahend", "n").iter_rows():
        design = declared.seed_count(tier)
        lacking = [k for k in range(design or 0)
                   if not all(k in done.get((tier, a), ()) for a in (minuend, subtrahend))]
        out.append(", ".join(map(str, lacking)) if lacking and n else None)
    return out


def _missing_notes(frame: pl.DataFrame, declared: Declared) -> list[str]:
    return [f"{row['tier']} {row['comparison']}: seed(s) {row[MISSING_SEEDS]} of the design's "
            f"{declared.seed_count(row['tier'])} not run (or moved aside): not final, never called supported until "
            "they have run" for row in frame.iter_rows(named=True) if row[MISSING_SEEDS]]


NOT_RUN = "not run"
MARK_NOTES.setdefault(NOT_RUN, "a declared comparison with no pair of runs at this tier: it counts in Holm's m (at "
                               "p = 1), so the decisions of its family are not final until it has run")


def _with_not_run(summary: pl.DataFrame, family: Family) -> pl.DataFrame:
    """The summary with a row (n = 0, no statistics) for each member of the design's family that has none."""
    present = set(summary.select("tier", "comparison").iter_rows())
    absent = [m for m in family.members if m not in present]
    if not absent:
        return summary
    empty = pl.DataFrame({"tier": [t for t, _ in absent], "comparison": [c for _, c in absent],
                          "n": [0] * len(absent), "agree": [0] * len(absent)},
                         schema={"tier": pl.String, "comparison": pl.String, "n": pl.Int64, "agree": pl.Int64})
    return pl.concat([summary, empty.cast({"n": summary.schema["n"], "agree": summary.schema["agree"]})],
                     how="diagonal_relaxed")


def study_holm(frame: pl.DataFrame, family: Family, slopes: Mapping[str, float | None] | None = None
               ) -> tuple[pl.Series, dict[str, float | None]]:
    """Holm of p within each group of the design's `family`: p_holm of the frame's rows (tier, comparison, p),
    and of the family's scale slopes (`slopes`: quantity → p; a slope absent or without a p has none). m is the
    design's (`group_size`): a member that did not run, or has no p, counts at p = 1."""
    groups = [family.group(t) for t in frame["tier"].to_list()]
    p = frame["p"].to_list()
    slopes = dict(slopes or {})
    out: list[float | None] = [None] * frame.height
    adjusted_slopes: dict[str, float | None] = {}
    for group in dict.fromkeys([*groups, *family.groups]):
        rows = [i for i, g in enumerate(groups) if g == group]
        extra = list(family.group_slopes(group))
        values = [p[i] for i in rows] + [slopes.get(q) for q in extra]
        tested = sum(v is not None and not math.isnan(v) for v in values)
        untested = max(0, group_size(frame, family, group) - tested)
        adjusted = holm(values + [1.0] * untested)
        for row, value in zip(rows, adjusted):
            out[row] = value
        adjusted_slopes.update(zip(extra, adjusted[len(rows):len(rows) + len(extra)]))
    return pl.Series("p_holm", out, dtype=pl.Float64), adjusted_slopes


def _sequential_columns(frame: pl.DataFrame, diffs: pl.DataFrame, design: dict) -> dict:
    values = {column: [] for column in SEQUENTIAL_COLUMNS}
    for tier, name in frame.select("tier", "comparison").iter_rows():
        part = diffs.filter((pl.col("tier") == tier) & (pl.col("comparison") == name)).sort("seed")
        decision = _decision(part, design)
        for column, key in (("look", "look"), ("seeds_used", "seeds"), ("decision", "decision"), ("sign", "sign"),
                            ("t_boundary", "t_boundary"), ("seq_ci_low", "ci_low"), ("seq_ci_high", "ci_high"),
                            ("next_seeds", "next_seeds")):
            values[column].append(decision[key])
    return {column: pl.Series(column, values[column], dtype=dtype) for column, dtype in SEQUENTIAL_COLUMNS.items()}


def _decision(part: pl.DataFrame, design: dict) -> dict:
    """The design's decision on one comparison's paired differences (seed, diff, scale), with float
    resolution relative to the losses behind them, as the fixed-sample statistics take it."""
    scale = part["scale"].abs().max() if "scale" in part.columns and part.height else None
    return sequential_decision(dict(zip(part["seed"].to_list(), part["diff"].to_list())), design, scale)


def row_pair(table: Table, row: dict) -> tuple[str, str] | None:
    """(minuend, subtrahend) of a row, as its kind's rows name them (`TableKind.pairs`), or None."""
    return get_kind(table.kind).row_pair(table.reference, row)


def adjust_over_family(table: Table, family: Table) -> Table:
    """The table with p_holm from the declared family for its declared rows; every other row exploratory.

    In a sequential study the declared rows also carry the design's look and decision (SEQUENTIAL_COLUMNS):
    every table then says where the design stands, and the fixed-sample p_holm decides nothing."""
    adjusted = {(r["tier"], r["minuend"], r["subtrahend"]): r for r in family.frame.iter_rows(named=True)}
    carried = ["p_holm", *(SEQUENTIAL_COLUMNS if "decision" in family.columns else ())]
    values, declared = {column: [] for column in carried}, []
    for row in table.frame.iter_rows(named=True):
        key = row_pair(table, row)
        found = adjusted.get((row["tier"], *key)) if key is not None else None
        declared.append(found is not None)
        for column in carried:
            values[column].append(found[column] if found is not None else None)
    columns = [c for c in table.frame.columns if c not in ("p_holm", "marks")]
    types = {"p_holm": pl.Float64, **SEQUENTIAL_COLUMNS}
    frame = table.frame.with_columns(*(pl.Series(c, values[c], dtype=types[c]) for c in carried),
                                     pl.Series("_declared", declared, dtype=pl.Boolean))
    frame = add_mark(frame, ~pl.col("_declared"), EXPLORATORY).select(*columns, *carried, "marks")
    return dataclasses.replace(table, frame=frame, family=family.family)


METRIC_NOTE = ("the declared comparisons are on the validation loss, so no row of a downstream metric's table is in a "
               "family: every row is exploratory (unadjusted p, p_holm empty) and none is called supported")


def exploratory_metric_table(table: Table) -> Table:
    """A downstream metric's table: no family (declarations are on the loss), so every row exploratory."""
    return exploratory_table(table, METRIC_NOTE)


def exploratory_table(table: Table, why: str) -> Table:
    """`table` with every row exploratory (p_holm empty, never supported) and `why` among its notes: a table whose
    rows no declared family covers (a downstream metric; a budget the predictions were not declared at)."""
    columns = [c for c in table.frame.columns if c not in ("p_holm", "marks")]
    frame = table.frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("p_holm"))
    frame = add_mark(frame, pl.lit(True), EXPLORATORY).select(*columns, "p_holm", "marks")
    return dataclasses.replace(table, frame=frame, family=None, notes=table.notes + (why,))


DIVERGED = "diverged"
MARK_NOTES.setdefault(DIVERGED, "a seed of one of the row's arms diverged: that seed has no pair, so the "
                                "row's statistics "
                                "are over the seeds where both arms finished, and a diverged seed is an outcome of its "
                                "arm (the note says how many and what dropping them does); a comparison whose better "
                                "arm diverged is never called supported")


def count_diverged(table: Table, runs: Runs) -> Table:
    """Per row the seeds where one of its two arms diverged (column `diverged`, mark and note): dropping them
    must not pass unseen, since it removes the unstable arm's worst seeds from its mean."""
    gone = runs.frame.filter(pl.col("status") == "diverged")
    if not get_kind(table.kind).pairs or gone.is_empty():
        return table
    counts, arms_gone, notes = [], [], []
    for row in table.frame.iter_rows(named=True):
        pair = row_pair(table, row)
        hit = gone.filter((pl.col("tier") == row["tier"]) & pl.col("arm").is_in(list(pair or ())))
        seeds = sorted(set(hit["seed"].to_list()))
        counts.append(len(seeds))
        arms_gone.append(",".join(sorted(set(hit["arm"].to_list()))) or None)
        if seeds:
            total = runs.frame.filter((pl.col("tier")
                                       == row["tier"]) & pl.col("arm").is_in(list(pair)))["seed"].n_unique()
            who = ", ".join(f"{a} seed {s}" for a, s in hit.select("arm", "seed").sort("seed").iter_rows())
            notes.append(f"{row['tier']} {row.get(table.key)}: {len(seeds)} of {total} seeds diverged ({who}); the row "
                         f"is over the {row['n']} seed(s) where both arms finished; counting each diverged seed as a "
                         f"loss of the arm that diverged, {total - len(seeds)} of {total} seeds are left to favour it")
    columns = [c for c in table.frame.columns if c != "marks"]
    frame = table.frame.with_columns(pl.Series("diverged", counts, dtype=pl.Int64),
                                     pl.Series("diverged_arms", arms_gone, dtype=pl.String))
    frame = add_mark(frame.select(*columns, "diverged", "diverged_arms", "marks"), pl.col("diverged") > 0, DIVERGED)
    return dataclasses.replace(table, frame=frame, notes=table.notes + tuple(notes))


def supported(family: Table, alpha: float = ALPHA) -> dict[tuple[str, str, str], bool]:
    """(tier, minuend, subtrahend) → whether that declared comparison's decision is "supported": in a fixed
    design `fixed_decision` (p_holm < α *and* Δ > 0, the direction declared; a significant Δ < 0 is a failed
    prediction, never supported), in a sequential one the design's "effect" with Δ > 0; never in a
    pipeline-check tier, nor when the better arm diverged on a seed. The report's list and the plots' `*` read it."""
    out = {}
    for row in family.frame.iter_rows(named=True):
        if "decision" in row:
            verdict = row["decision"] == "effect" and (row["sign"] or 0) > 0
        else:
            verdict = fixed_decision(row, alpha) == "supported"
        better = row["subtrahend"] if (row["mean"] or 0) > 0 else row["minuend"]
        unstable = better in (row.get("diverged_arms") or "").split(",")  # its failed seeds left its mean
        out[(row["tier"], row["minuend"], row["subtrahend"])] = (verdict and not unstable
                                                                 and not is_pipeline_check(row["tier"]))
    return out


def fixed_decision(row: dict, alpha: float = ALPHA) -> str:
    """A declared comparison's decision in a fixed design: "supported" (p_holm < α and Δ > 0: the subtrahend
    lowers the loss, as declared), "failed" (p_holm < α and Δ < 0: the opposite holds), "not run" (no pair of
    runs yet), "not final" (seeds of the design missing: `seeds_missing`), else "not supported" (no test, or
    p_holm ≥ α). A pipeline-check tier's comparison is never
    supported."""
    if not row.get("n"):
        return "not run"
    if row.get(MISSING_SEEDS):
        return "not final"
    if row.get("p_holm") is None or row["p_holm"] >= alpha or is_pipeline_check(row["tier"]):
        return "not supported"
    return "supported" if row["mean"] > 0 else "failed"


def pilot_differences(runs: Runs, declared: Declared) -> dict[tuple[str, str], list[float]]:
    """(tier, comparison) → the pilot's paired differences in seed order (what `plan --pilot` plans with)."""
    diffs, _ = comparison_differences(runs, declared)
    out = {}
    for (tier, name), part in diffs.sort("seed").group_by("tier", "comparison", maintain_order=True):
        out[(tier, name)] = part["diff"].to_list()
    return out


def seeds_to_queue(runs: Runs | None, declared: Declared, tiers) -> dict[str, int]:
    """Per tier, how many seeds (0..n−1) a sequential study needs queued now: the next look's count
    while one of its declared comparisons is undecided, 0 once every one is decided (an effect, or
    the last look passed). A tier with no completed pairs yet needs the first look's seeds."""
    design = declared.design
    if design is None:
        raise AblateError("no sequential design recorded; start one with `ablate submit EXPERIMENT --sequential "
                          "--looks K --max-seeds N`")
    diffs = comparison_differences(runs, declared)[0] if runs is not None else None
    first = int(design["looks"][0]["seeds"])
    out = {}
    for tier in tiers:
        needed = []
        for name, _, _ in declared.comparisons:
            part = diffs.filter((pl.col("tier") == tier) & (pl.col("comparison")
                                                            == name)) if diffs is not None else None
            if part is None or part.is_empty():
                needed.append(first)
                continue
            decision = _decision(part, design)
            needed.append(decision["next_seeds"] or 0)
        out[tier] = max(needed, default=0)
    return out


def declared_for(experiment, folder) -> Declared | None:
    """The declared comparisons a source's tables adjust over: those a `submit --sequential` recorded in the
    folder's ledger, with their design (which `experiment`, when given, must still declare: a changed design is
    refused), else the fixed design the first submit recorded there (`ablate.design`: likewise checked, its
    history in `notes`), else the experiment's own (`experiment`: an `ablate.experiment.Experiment` or None, taken as
    given so the analysis never loads an experiment file). None: no family. `folder`: a path, or the `RunFolders`
    the command reads it through (its runs' summaries read once)."""
    reads = RunFolders.of(folder)
    folder = reads.root
    design = recorded_design(folder) if Path(folder).is_dir() else None
    if design is not None and experiment is not None:
        design.check_declares(experiment.hypotheses, experiment.family, experiment.family_size(), experiment.name,
                              str(Path(folder) / LEDGER))
    if design is not None:
        members = experiment.declared_family(sequential=True) if experiment is not None else None
        return Declared.of(design.comparisons, design.family, design.boundaries, members)
    # a fixed design: decided under the declaration recorded at the first submit (`ablate.design`), which the
    # experiment file must still declare
    state = design_state(experiment, folder, reads) if Path(folder).is_dir() else DesignState(None, ())
    if state.declaration is not None:
        recorded = state.declaration
        return Declared.of(recorded.comparisons_of(), recorded.family, members=recorded.family_of(),
                           seeds=dict(recorded.seeds), notes=state.notes)
    if experiment is not None and experiment.hypotheses:
        return Declared.of(experiment.hypotheses, experiment.family, members=experiment.declared_family(),
                           seeds={tier: experiment.seed_count(tier) for tier in experiment.tiers}, notes=state.notes)
    return None
