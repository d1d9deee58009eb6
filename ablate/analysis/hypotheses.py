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
* with a sequential design (`ablate.boundaries.sequential_design`, recorded by `submit --sequential`) each
  row also says the look reached, the decision and the interval valid for that design, and a
  comparison is supported only when the design decided "effect" (the fixed-sample p ignores the looks).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from dataclasses import dataclass
from typing import Mapping

import polars as pl

from ablate.analysis.runs import Runs, sort_runs
from ablate.analysis.stats import STAT_COLUMNS, holm, paired_differences, summarise
from ablate.analysis.kinds import INCREMENTS
from ablate.analysis.tables import (EXPLORATORY, MARK_NOTES, Table, _skip_note, _table, add_mark,
                                    is_pipeline_check)
from ablate.errors import AblateError
from ablate.boundaries import sequential_decision
from ablate.power import FAMILIES
from ablate.sequential import recorded_design
from ablate.store import LEDGER

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
    seeds: tuple[tuple[str, int], ...] = ()  # (tier, n): a fixed design's seeds 0..n-1 (none: every seed counts)

    @classmethod
    def of(cls, comparisons, family: str = "tier", design: dict | None = None,
           seeds: Mapping[str, int] | None = None) -> Declared:
        """From `Comparison`s (anything with name, minuend, subtrahend, and maybe tiers) or triples; `seeds`:
        {tier: the fixed design's seed count} (a sequential `design` fixes its own: its last look's)."""
        triples = tuple(tuple(c) if isinstance(c, (tuple, list)) else (c.name, c.minuend, c.subtrahend)
                        for c in comparisons)
        if family not in FAMILIES:
            raise AblateError(f"unknown family {family!r}; valid families: {', '.join(FAMILIES)}")
        where = tuple((c.name, tuple(c.tiers)) for c in comparisons if getattr(c, "tiers", ()))
        return cls(triples, family, design, where, tuple(sorted((seeds or {}).items())))

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

    def describe(self, frame: pl.DataFrame, alpha: float = ALPHA,
                 slopes: Mapping[str, float | None] | None = None) -> str:
        """The family and its members, the m Holm used in each group (the rows and slopes with a p: `holm`
        counts no other), and the study-wide chance of any false "supported" the design allows. `slopes`:
        the scale slopes in the family (quantity → p), None when they are in none (`study_holm`)."""
        names = ", ".join(f"{name} ({a} − {b})" for name, a, b in self.comparisons)
        groups = family_groups(frame, self.family)
        sizes: dict[str, int] = {}
        for group, p in zip(groups, frame["p"].to_list()):
            sizes[group] = sizes.get(group, 0) + (p is not None)
        untested = frame.height - sum(sizes.values())
        left = f"; {untested} row(s) without a p (one seed or no spread) are not counted" if untested else ""
        evidence = [g for g in sizes if g != PIPELINE_GROUP and not is_pipeline_check(g) and sizes[g]]
        if self.family == "tier":
            per = ", ".join(f"{g}: {sizes[g]}" for g in sizes if g != PIPELINE_GROUP and not is_pipeline_check(g))
            k = len(evidence)
            study = (f"study-wide chance of any false supported: ≤ {min(1.0, k * alpha):.2f} ({k} tier families at "
                     f"{alpha:g} each; {1 - (1 - alpha) ** k:.2f} if they were independent); declare "
                     f'family="experiment" to hold it to {alpha:g}') if k > 1 else f"study-wide error ≤ {alpha:g}"
            return (f"each tier's declared comparisons: {names}; Holm's m per tier = {per}{left}; {study}; the scale "
                    "slopes span the tiers, so they are in no family: exploratory")
        rows = sum(sizes[g] for g in evidence)
        if slopes is None:
            why = ("a sequential design spends α over the declared comparisons only" if self.design
                   else "none were given to this table")
            return (f"the experiment's declared comparisons at every tier together: {names}; Holm's m = {rows}{left} "
                    f"(pipeline-check tiers apart); study-wide chance of any false supported ≤ {alpha:g}; the scale "
                    f"slopes are in no family ({why}): exploratory")
        tested = [q for q, p in slopes.items() if p is not None]
        none = [q for q, p in slopes.items() if p is None]
        no_slope = f"; slope(s) without a p, not counted: {', '.join(none)}" if none else ""
        return (f"the experiment's declared comparisons at every tier and the scale slopes of the declared comparisons "
                f"and the gaps together: {names}; Holm's m = {rows + len(tested)} ({rows} declared comparison row(s) "
                f"and {len(tested)} scale slope(s): {', '.join(tested) or 'none'}){left}{no_slope} (pipeline-check "
                f"tiers apart); study-wide chance of any false supported ≤ {alpha:g}")


def comparison_differences(runs: Runs, declared: Declared) -> tuple[pl.DataFrame, list[str]]:
    """Per (tier, comparison, seed) the paired difference L_minuend − L_subtrahend; notes on skipped ones."""
    parts, notes = [], []
    for name, minuend, subtrahend in declared.comparisons:
        absent = [a for a in (minuend, subtrahend) if a not in runs.arm_order]
        if absent:
            notes.append(_skip_note(f"declared comparison {name}", (minuend, subtrahend), absent))
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
    """tier, comparison, minuend, subtrahend, STAT_COLUMNS, p_holm (over the family: `study_holm`, with the
    scale slopes `slopes` when given), the sequential columns when a design is recorded, marks."""
    diffs, notes = comparison_differences(runs, declared)
    order = [name for name, _, _ in declared.comparisons]
    frame = sort_runs(summarise(diffs, ["tier", "comparison"]), order, arm_column="comparison")
    arms_of = {name: (a, b) for name, a, b in declared.comparisons}
    frame = frame.with_columns(
        minuend=pl.col("comparison").replace_strict({k: v[0] for k, v in arms_of.items()}, return_dtype=pl.String),
        subtrahend=pl.col("comparison").replace_strict({k: v[1] for k, v in arms_of.items()}, return_dtype=pl.String),
    )
    frame = frame.select("tier", "comparison", "minuend", "subtrahend", *STAT_COLUMNS)
    frame = frame.with_columns(study_holm(frame, declared.family, slopes)[0])
    if declared.design is not None:
        frame = frame.with_columns(**_sequential_columns(frame, diffs, declared.design))
    used = {a for _, a, b in declared.comparisons} | {b for _, a, b in declared.comparisons}
    arms = [a for a in runs.arm_order if a in used]
    table = _table(DECLARED, "comparison", frame, runs, arms, notes=notes, differences=diffs)
    return dataclasses.replace(table, family=declared.describe(frame, slopes=slopes))


PIPELINE_GROUP = "pipeline-check"


def family_groups(frame: pl.DataFrame, family: str) -> list[str]:
    """Each row's Holm family: its tier, or every tier that can carry evidence together (pipeline checks apart)."""
    return [t if family == "tier" else (PIPELINE_GROUP if is_pipeline_check(t) else "all")
            for t in frame["tier"].to_list()]


def study_holm(frame: pl.DataFrame, family: str, slopes: Mapping[str, float | None] | None = None
               ) -> tuple[pl.Series, dict[str, float | None]]:
    """Holm of p within each family (`family_groups`): p_holm of the frame's rows, and of the scale slopes
    `slopes` (quantity → p), which join the study-wide group of `family="experiment"` and no other."""
    groups = family_groups(frame, family)
    p = frame["p"].to_list()
    slopes = dict(slopes or {}) if family == "experiment" else {}
    out: list[float | None] = [None] * frame.height
    adjusted_slopes: dict[str, float | None] = {}
    for group in dict.fromkeys([*groups, *(["all"] if slopes else [])]):
        rows = [i for i, g in enumerate(groups) if g == group]
        extra = list(slopes) if group == "all" else []
        values = holm([p[i] for i in rows] + [slopes[q] for q in extra])
        for row, value in zip(rows, values):
            out[row] = value
        adjusted_slopes.update(zip(extra, values[len(rows):]))
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
    """(minuend, subtrahend) of a row: the reference and the arm, an increment's two arms, or None."""
    if table.kind == "paired":
        return table.reference, row["arm"]
    if table.kind == "increments":
        return INCREMENTS[row["quantity"]]
    if table.kind == DECLARED:
        return row["minuend"], row["subtrahend"]
    return None


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
    if table.kind not in ("paired", "increments", DECLARED) or gone.is_empty():
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
    """(tier, minuend, subtrahend) → whether that declared comparison is supported: p_holm < α in a
    fixed design, the design's decision "effect" in a sequential one; never in a pipeline-check tier."""
    out = {}
    for row in family.frame.iter_rows(named=True):
        if "decision" in row:
            verdict = row["decision"] == "effect"
        else:
            verdict = row["p_holm"] is not None and row["p_holm"] < alpha
        better = row["subtrahend"] if (row["mean"] or 0) > 0 else row["minuend"]
        unstable = better in (row.get("diverged_arms") or "").split(",")  # its failed seeds left its mean
        out[(row["tier"], row["minuend"], row["subtrahend"])] = (verdict and not unstable
                                                                 and not is_pipeline_check(row["tier"]))
    return out


def fixed_decision(row: dict, alpha: float = ALPHA) -> str:
    """A declared comparison's decision in a fixed design: "supported" (p_holm < α and Δ > 0: the subtrahend
    lowers the loss, as declared), "failed" (p_holm < α and Δ < 0: the opposite holds), else "not supported"
    (no test, or p_holm ≥ α). A pipeline-check tier's comparison is never supported."""
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
    refused), else the experiment's own (`experiment`: an `ablate.experiment.Experiment` or None, taken as
    given so the analysis never loads an experiment file). None: no family."""
    design = recorded_design(folder) if Path(folder).is_dir() else None
    if design is not None and experiment is not None:
        design.check_declares(experiment.hypotheses, experiment.family, experiment.family_size(), experiment.name,
                              str(Path(folder) / LEDGER))
    if design is not None:
        return Declared.of(design.comparisons, design.family, design.boundaries)
    if experiment is not None and experiment.hypotheses:
        return Declared.of(experiment.hypotheses, experiment.family,
                           seeds={tier: experiment.seed_count(tier) for tier in experiment.tiers})
    return None
