"""`ablate report`: the tables, the figures and a short summary, written to `<experiment>/report/`.

Files: summary.md; paired/increments/overlap/losses as .md and .csv; paired.png (forest plot),
increments.png (when a tier of known size has increments), curves.png; probes.md when probe results
exist; testbed_<tier>.png with the mechanism signature of a task tier's runs (experiments/testbed.py).

Honesty rules the summary follows: an effect is called supported only if p_holm < 0.05 (Holm over
the arms of its tier against the reference, or over the quantities of its tier for increments and
overlap) and never in a pipeline-check tier; every list that is empty says so and why.

The report is a list of sections. Each section is a function of one `ReportContext`: it may write
files into the report folder (through `ctx.write`) and returns the markdown it adds to summary.md.
A later area (e.g. the probes, whose run folders hold probe.json / inject.json) adds its summary by
appending a section to `SECTIONS`, or by passing its own list to `write_report`; nothing here changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import polars as pl

from ablate.analysis.armcode import check_arm_code
from ablate.analysis.figures import figure
from ablate.analysis.hypotheses import (MISSING_SEEDS, Declared, fixed_decision,
                                        supported as declared_support)
from ablate.analysis.crossover import Crossover, find_crossover
from ablate.analysis.scale import SCALE, ScaleTable, confounded, confounder_sentence, sizes_of
from ablate.analysis.scale_text import crossing_sentence, render_scale, scale_intro, trend_sentence
from ablate.analysis.items import item_tasks, items_table, render_items
from ablate.analysis.load import TABLE_SUFFIXES, load_curves, load_runs
from ablate.analysis.lr_report import lr_section
from ablate.analysis.runs import Runs
from ablate.analysis.plots import plot_curves, plot_increments, plot_paired
from ablate.analysis.probes import summarise_injections, summarise_probes
from ablate.analysis.render import decision_text, effect_cells, format_p
from ablate.analysis.testbed import (dose_response_markdown, graded_families, plot_dose_response, plot_testbed,
                                     task_runs, testbed_markdown)
from ablate.analysis.build import build_table
from ablate.analysis.kinds import KINDS, get_kind, kind_where, paired_seed_kinds, report_kinds
from ablate.analysis.tables import Table, is_pipeline_check, pipeline_check_text
from ablate.errors import AblateError
from ablate.evals.results import available_metrics
from ablate.increments import FILTERING_FORMS, NEEDS
from ablate.store import REPORT_DIR, atomic_write_bytes
from ablate.sweep import LRSweep

ALPHA = 0.05


@dataclass
class ReportContext:
    """What every section may use. `tables` maps each kind the report writes (`report_kinds`) to its table; a
    section asks for the table of a part (`table_where`), never for a kind by its name."""

    runs: Runs
    out_dir: Path
    tables: dict[str, Table]  # `report_kinds`: "declared" only when the experiment declares comparisons
    crossovers: list[Crossover]
    scale: ScaleTable | None = None
    written: list[Path] = field(default_factory=list)
    allow_unverified: bool = False
    declared: Declared | None = None  # the experiment's declared comparisons (the LR section's tuned table uses them)
    left_out: dict[str, str] = field(default_factory=dict)  # section → why this experiment's arms cannot give it
    lr_sweep: LRSweep | None = None  # the experiment's declared LR sweep: only its factors × seeds count

    def table_where(self, attribute: str) -> Table | None:
        """The table of the first kind the report writes whose `attribute` is true (`forest`: the forest plot's
        table, against the report's reference; `crossover`; `needs_declared`: the declared family), or None."""
        found = [self.tables[kind.name] for kind in KINDS.values() if getattr(kind, attribute) and kind.name in
                 self.tables]
        return found[0] if found else None

    def write(self, name: str, data: str | bytes) -> Path:
        path = self.out_dir / name
        atomic_write_bytes(path, data.encode() if isinstance(data, str) else data)
        self.written.append(path)
        return path

    def record(self, name: str) -> Path:
        """For files a section wrote itself (figures)."""
        path = self.out_dir / name
        self.written.append(path)
        return path


Section = Callable[[ReportContext], str]


def overview_section(ctx: ReportContext) -> str:
    runs = ctx.runs
    total, counted = runs.frame.height, runs.completed.height
    lines = [
        f"# Report: {runs.name}",
        "",
        f"Runs: {counted} of {total} completed and counted; tiers {', '.join(runs.tiers)}; "
        f"arms {', '.join(runs.arm_order)}.",
    ]
    excluded = [f"- {r['tier']} {r['arm']} seed {r['seed']}: {r['reason']}"
                for r in runs.excluded.iter_rows(named=True)]
    if excluded:
        lines += ["", "Excluded runs (not completed, left out of every statistic):", "", *excluded]
    missing = runs.missing
    if missing.height:
        lines += ["", "Seeds with no run at all (statistics use complete pairs only):", ""]
        lines += [f"- {r['tier']} {r['arm']} seed {r['seed']}" for r in missing.iter_rows(named=True)]
    if ctx.left_out:
        lines += ["", "Left out, as this experiment's arms cannot give them: "
                  + "; ".join(f"{what} ({why})" for what, why in ctx.left_out.items()) + "."]
    checks = [t for t in runs.tiers if is_pipeline_check(t)]
    if checks:
        lines += ["", "**Pipeline check.** " + " ".join(pipeline_check_text(t) + "." for t in checks)
                  + " Its rows are marked `pipeline-check` in every table and never count as supported."]
    return "\n".join(lines)


def tables_section(ctx: ReportContext) -> str:
    lines = ["## Tables", ""]
    for kind in (k for k in ctx.tables if k not in ctx.left_out):
        table = ctx.tables[kind]
        ctx.write(f"{kind}.md", get_kind(kind).render(table, "md"))
        ctx.write(f"{kind}.csv", get_kind(kind).render(table, "csv"))
        lines.append(f"- [{kind}.md]({kind}.md) ([csv]({kind}.csv)): {table.frame.height} rows")
        lines += [f"  - {note}" for note in table.notes]
    paired = ctx.table_where("forest")
    plot_paired(paired, ctx.runs.arm_order, ctx.record("paired.png"), _starred(ctx, paired))
    lines += ["", f"Paired differences against {paired.reference}, one panel per tier (each seed a dot, the mean "
              "with its 95% interval):", "", "![paired](paired.png)"]
    return "\n".join(lines)


def crossover_section(ctx: ReportContext) -> str:
    if "crossover" in ctx.left_out:
        return ""
    increments = ctx.table_where("crossover")
    lines = ["## Crossover", ""]
    if increments.frame.is_empty():
        return "\n".join(lines + ["No increments could be computed, so there is no crossover:",
                                  *[f"- {note}" for note in increments.notes]])
    lines += [f"- {c.message}" for c in ctx.crossovers] or ["- no crossover: neither filtering increment "
                                                            "could be computed"]
    lines += [f"- {note}" for note in increments.notes]
    if confounded(ctx.scale):
        lines += [f"- {confounder_sentence(ctx.scale)}"]
    lines += ["", "Crossover: where the filtering increment overtakes the zero-option increment. The means' sign "
              "changes (≤ 0 to > 0 between adjacent tiers that can carry evidence) are a description; the place "
              "and its 95% interval come from the scale model (see Scale): where the fitted line of the gap "
              "filtering − zero option crosses 0, with Fieller's interval, reported only when identified."]
    if plot_increments(increments, ctx.crossovers, ctx.out_dir / "increments.png"):
        ctx.record("increments.png")
        lines += ["", "![increments](increments.png)"]
    else:
        lines += ["", "No figure: no tier with increments has a known size to place on the scale axis."]
    return "\n".join(lines)


def scale_section(ctx: ReportContext) -> str:
    """The scale model (scale.md, scale.json) and the headline sentences, each written from its table only."""
    table = ctx.scale
    if "scale" in ctx.left_out:
        return ""
    if table is None or table.rows.is_empty():
        return ("## Scale\n\nNo scale model: no increment or declared comparison at two or more real tiers of "
                "known size.")
    ctx.write("scale.md", render_scale(table, "md"))
    ctx.write("scale.json", render_scale(table, "json"))
    lines = ["## Scale", "", scale_intro(table), ""]
    lines += [f"- {trend_sentence(row, table.unit)}" for row in table.rows.iter_rows(named=True)]
    lines += [f"- {crossing_sentence(table, c)}" for c in table.crossings.iter_rows(named=True)]
    if confounded(table):
        lines += ["", f"{confounder_sentence(table)}."]
    return "\n".join(lines)


def _support_rule(ctx: ReportContext, family, fixed_sample: bool, families: list[str]) -> str:
    """What "supported" means in this report: Holm within each table's families, or the declared family only
    (by its sequential design's decision when it follows one); pipeline-check tiers left out of both lists."""
    checks = sorted({r["tier"] for t in _kinds(ctx) for r in ctx.tables[t].frame.iter_rows(named=True)
                     if is_pipeline_check(r["tier"])})
    left_out = f" Pipeline-check tiers ({', '.join(checks)}) are left out of both lists." if checks else ""
    if fixed_sample:
        return (f"Supported means p_holm < {ALPHA} (the p_holm column of each table): the two-sided paired t-test over "
                "seeds, Holm-adjusted within each family (" + "; ".join(KINDS[k].family for k in _kinds(ctx))
                + "). Comparisons made: " + ("; ".join(families) if families else "none") + f".{left_out}")
    return (f"Only the declared comparisons can be supported ({family.family}): "
            + ("the sequential design decided effect" if "decision" in family.columns
               else f"p_holm < {ALPHA}, Holm over that family only")
            + ". Every other row is exploratory (unadjusted p) and never listed here." + left_out)


def flags_section(ctx: ReportContext) -> str:
    """Supported effects (p_holm < 0.05), effects whose interval contains zero, effects from one seed.

    Every list says, when empty, that it is empty and why. Pipeline-check tiers are never supported.
    """
    supported, contains_zero, single, families = [], [], [], []
    tested: set[tuple] = set()  # the distinct effects tested: (tier, n, mean, interval's low end)
    family = ctx.table_where("needs_declared")
    verdicts = declared_support(family, ALPHA) if family is not None else None
    for kind in _kinds(ctx):
        table = ctx.tables[kind]
        frame = table.frame
        for tier, part in ((t, frame.filter(tier=t)) for t in frame["tier"].unique(maintain_order=True).to_list()):
            m = part["p"].drop_nulls().len()
            if m and not is_pipeline_check(tier) and verdicts is None:
                families.append(f"{tier} {kind}: {m}")
        for row in frame.iter_rows(named=True):
            what, (effect, interval) = _effect_name(table, row), effect_cells(row)
            if row["n"] < 2 or row["ci_low"] is None:
                single.append(f"- {what}: {effect}")
                continue
            stats = _stats(row, effect, interval)
            if is_pipeline_check(row["tier"]):
                continue
            if row["p"] is not None:  # one effect shown by two tables (paired, increments) is one effect tested
                tested.add((row["tier"], row["n"], round(row["mean"], 12), round(row["ci_low"], 12)))
            if verdicts is None and row["p_holm"] is not None and row["p_holm"] < ALPHA:
                supported.append(f"- {what}: {stats}")
            if row["ci_low"] <= 0.0 <= row["ci_high"]:
                contains_zero.append(f"- {what}: {stats}")
    if verdicts is not None:  # the declared comparisons whose decision is "supported", each once, from its own row
        supported = [f"- {row['tier']} {row['comparison']} ({row['minuend']} − {row['subtrahend']}): "
                     + _stats(row, *effect_cells(row)) for row in family.frame.iter_rows(named=True)
                     if verdicts.get((row["tier"], row["minuend"], row["subtrahend"]))]
    rule = _support_rule(ctx, family, verdicts is None, families)
    lines = ["## Supported effects", "", rule, ""]
    lines += supported or [_none_supported(family, verdicts, len(tested))]
    lines += _not_final_lines(family)
    lines += ["", "## Effects whose 95% interval contains zero", ""]
    if contains_zero:
        lines += contains_zero
    elif tested:
        count = f"{len(tested)} tested effect{'s' if len(tested) > 1 else ''}"
        lines.append(f"- none of the {count}; an interval that excludes zero is not by itself support: with many "
                     "comparisons, see the p_holm rule above")
    else:
        lines.append("- none to list: no effect outside a pipeline-check tier has an interval (an interval "
                     "needs two seeds)")
    lines += ["", "## Effects from one seed (no interval and no test, so they cannot count either way)", ""]
    lines += single or ["- none: every effect has two or more seeds"]
    return "\n".join(lines)


def _not_final_lines(family) -> list[str]:
    """The declared comparisons short of their fixed design's seeds, each naming the seeds missing: not final."""
    if family is None or MISSING_SEEDS not in family.columns:
        return []
    short = [f"- {r['tier']} {r['comparison']} ({r['minuend']} − {r['subtrahend']}): n = {r['n']}, seeds "
             f"{r[MISSING_SEEDS]} missing" for r in family.frame.iter_rows(named=True) if r[MISSING_SEEDS]]
    return ["", "Not final (fewer seeds run than the design declares; a seed moved aside counts as missing), so "
                "never listed as supported until they have run:", *short]


def _none_supported(family, verdicts, tested: int) -> str:
    """Why the Supported list is empty, in one line."""
    if verdicts is not None and "decision" in family.columns:  # the design decides, never a fixed-sample p
        return ("- none: the sequential design has decided effect for no declared comparison yet (its look and "
                "decision are listed under the declared comparisons)")
    if verdicts is not None:
        failed = [r["comparison"] for r in family.frame.iter_rows(named=True) if fixed_decision(r) == "failed"]
        return ("- none: no declared comparison's decision is supported"
                + (f" ({', '.join(failed)}: failed, p_holm < {ALPHA} against the declared direction, never "
                   "supported)" if failed else ""))
    if tested:
        return (f"- none: {tested} effect{'s were' if tested > 1 else ' was'} tested and "
                f"{'none has' if tested > 1 else 'it has no'} p_holm < {ALPHA}")
    return ("- none: no effect outside a pipeline-check tier has two seeds with a spread, so none "
            "could be tested")


def _stats(row: dict, effect: str, interval: str) -> str:
    return f"{effect}, 95% CI {interval}, p {format_p(row['p'])}, p_holm {format_p(row['p_holm'])}, n = {row['n']}"


def declared_section(ctx: ReportContext) -> str:
    """The family p is adjusted over, its size, and (sequential) per comparison the look, decision and interval."""
    family = ctx.table_where("needs_declared")
    if family is None:
        return ""
    tiers = family.frame["tier"].unique(maintain_order=True).to_list()
    tested = family.frame.filter(pl.col("p").is_not_null() & ~pl.col("tier").map_elements(
        is_pipeline_check, return_dtype=pl.Boolean)).height
    lines = ["## Declared comparisons", "",
             f"Family for multiplicity control: {family.family}. {family.frame.height} declared comparison row(s) over "
             f"{len(tiers)} tier(s), {tested} with a test outside pipeline-check tiers; p_holm adjusts "
             "over this family "
             "only. [declared.md](declared.md) has the table; rows of the other tables that are not declared "
             "comparisons are marked exploratory.", ""]
    history = ctx.declared.notes if ctx.declared is not None else ()  # `ablate.design`: after runs, amendments
    lines += [*(f"Design: {note}." for note in history), ""] if history else []
    sequential = "decision" in family.columns
    for row in family.frame.iter_rows(named=True):
        effect, interval = effect_cells(row)
        line = f"- {row['tier']} {row['comparison']} ({row['minuend']} − {row['subtrahend']}): {effect}"
        if sequential:
            design = ("–" if row["seq_ci_low"] is None
                      else f"[{figure(row['seq_ci_low'])}, {figure(row['seq_ci_high'])}]")
            line += (f"; look {row['look']} ({row['seeds_used']} seeds), decision {decision_text(row)}, "
                     f"interval for the design {design}")
        else:
            line += (f", 95% CI {interval}, p {format_p(row['p'])}, p_holm {format_p(row['p_holm'])}, "
                     f"decision {fixed_decision(row)}")
            if row.get(MISSING_SEEDS):
                line += f" (seeds {row[MISSING_SEEDS]} of the design missing)"
        lines.append(line)
    return "\n".join(lines)


def curves_section(ctx: ReportContext) -> str:
    curves = load_curves(ctx.runs)
    reference = ctx.table_where("forest").reference
    plot_curves(curves, ctx.runs.tiers, ctx.runs.arm_order, ctx.record("curves.png"), ctx.runs.name, reference)
    note = "" if curves.height else " (no validation lines found in metrics.jsonl)"
    return ("## Validation curves\n\nMean over seeds of the completed runs (band: min to max over seeds), one column "
            f"per tier: the whole run, then its second half zoomed; below, the paired gap to {reference} (positive: "
            f"lower loss){note}.\n\n![curves](curves.png)")


def probes_section(ctx: ReportContext) -> str:
    """`ablate probe` / `ablate inject` results found in the run folders, by tier and arm across seeds."""
    parts = [p for p in (summarise_probes(ctx.runs.root), summarise_injections(ctx.runs.root)) if p]
    if parts:
        ctx.write("probes.md", "\n\n".join(parts) + "\n")
    return "## Probes\n\n" + "\n\n".join(parts) if parts else ""


def testbed_section(ctx: ReportContext) -> str:
    """Each task tier's mechanism signature per arm with its seeds (testbed_<tier>.png), when there are any."""
    parts = []
    by_tier = task_runs(ctx.runs)
    for tier, by_arm in by_tier.items():
        plot_testbed(tier, by_arm, ctx.record(f"testbed_{tier}.png"))
        parts.append(testbed_markdown(tier, by_arm) + f"\n\n![testbed {tier}](testbed_{tier}.png)")
    losses = {tier: {arm: [s.val_loss for s in summaries] for arm, summaries in by_arm.items()}
              for tier, by_arm in by_tier.items()}
    if graded_families(losses):  # the graded testbed's tiers (experiments/testbed_dose.py)
        plot_dose_response(losses, ctx.record("testbed_dose_response.png"))
        parts.append(dose_response_markdown(losses) + "\n\n![dose–response](testbed_dose_response.png)")
    return "## Mechanism testbed\n\n" + "\n\n".join(parts) if parts else ""


def downstream_section(ctx: ReportContext) -> str:
    """Paired tables of every `ablate eval` metric the counted runs carry (downstream.md).

    A task whose runs kept per-item results (RUN/eval_items/) is paired by item and seed
    (`ablate.analysis.items`), with `gold_logprob` beside its accuracies; its other metrics (the
    perplexities, which are not means over items) and tasks without item files pair per seed.
    """
    folders = [Path(p) for p in ctx.runs.completed["path"].drop_nulls().to_list()]
    metrics = available_metrics(folders)
    by_item = item_tasks(folders)
    names = sorted(set(metrics) | {f"{task}/{m}" for task, found in by_item.items() for m in found})
    if not names:
        return ""
    reference = ctx.table_where("forest").reference
    parts, paired_by_item = [], []
    for metric in names:
        task, _, name = metric.partition("/")
        if name in by_item.get(task, ()):
            runs = load_runs(ctx.runs.root, allow_unverified=ctx.allow_unverified)
            parts.append(f"### {metric} (by item)\n\n" + render_items(items_table(runs, metric, reference), "md"))
            paired_by_item.append(metric)
            continue
        runs = load_runs(ctx.runs.root, allow_unverified=ctx.allow_unverified, metric=metric)
        forest = kind_where("forest")
        parts.append(f"### {metric}\n\n" + forest.render(build_table(runs, forest, reference), "md"))
    ctx.write("downstream.md", "# Downstream evaluation (lm-evaluation-harness)\n\n" + "\n\n".join(parts))
    items = (f"; paired by item and seed: {', '.join(paired_by_item)}" if paired_by_item else "")
    return (f"## Downstream evaluation\n\n[downstream.md](downstream.md): paired tables of {len(names)} metrics "
            f"({', '.join(names)}), positive = the arm is better{items}.")


SECTIONS: list[Section] = [overview_section, tables_section, crossover_section, scale_section, declared_section,
                           flags_section,
                           curves_section,
                           downstream_section, probes_section, testbed_section, lr_section]


def _starred(ctx: ReportContext, paired: Table) -> set[tuple[str, str]] | None:
    """(tier, arm) of the paired rows the plot marks `*`: with declarations, the declared comparisons whose
    decision is "supported" (`declared_support`, the report's own list); None without (p_holm < α)."""
    family = ctx.table_where("needs_declared")
    if family is None:
        return None
    verdicts = declared_support(family, ALPHA)
    return {(row["tier"], row["arm"]) for row in paired.frame.iter_rows(named=True)
            if verdicts.get((row["tier"], paired.reference, row["arm"]))}


def _kinds(ctx: ReportContext) -> list[str]:
    """The paired-seed tables this experiment can have (`paired_seed_kinds` less those its arms cannot give)."""
    return [kind for kind in paired_seed_kinds() if kind not in ctx.left_out]


def cannot_have(arms: list[str], declares: bool = False) -> dict[str, str]:
    """The sections whose arms are absent from the source, each with the arms it needs: increments and overlap
    when none of their quantities has its arms, the crossover without zero_option and a filtering increment,
    the scale model without increments and without declared comparisons (`declares`)."""
    out = {name: need.words for name, need in NEEDS.items() if not need.met_by(arms)}
    if "increments" in out and not declares:
        out["scale"] = "needs increments or declared comparisons"
    return out


def _effect_name(table: Table, row: dict) -> str:
    return get_kind(table.kind).effect_name(row, table.key, table.reference)


def write_report(source: str | os.PathLike, sections: list[Section] | None = None,
                 allow_unverified: bool = False, declared: Declared | None = None) -> Path:
    """Build the report of an experiment's folder of runs and return the report folder (`make_report`)."""
    return make_report(source, sections, allow_unverified, declared).out_dir


def make_report(source: str | os.PathLike, sections: list[Section] | None = None,
                allow_unverified: bool = False, declared: Declared | None = None,
                lr_sweep: LRSweep | None = None, arm_code: Mapping[str, str | None] | None = None) -> ReportContext:
    """Build the report of an experiment's folder of runs; its context says what was written and left out.

    `declared`: the experiment's declared comparisons (and sequential design), which decide the family
    p_holm adjusts over and what can be called supported (`ablate.analysis.hypotheses`). Sections the
    experiment's arms cannot give (`cannot_have`) are left out, and the overview says so once. `arm_code`: each
    arm's identity now (`ablate.analysis.armcode`); None checks nothing."""
    if Path(source).suffix.lower() in TABLE_SUFFIXES:
        raise AblateError(f"a report needs an experiment's run store, not the table file {str(source)!r}; "
                          "use `ablate table` for a CSV/parquet source")
    runs = load_runs(source, allow_unverified=allow_unverified)
    if arm_code is not None:  # each arm's identity now: a row of another version's runs is refused
        runs = check_arm_code(runs, arm_code)
    reference = "baseline" if "baseline" in runs.arm_order else runs.arm_order[0]
    declared = declared if declared is not None and declared.comparisons else None
    tables = {name: build_table(runs, get_kind(name), reference if get_kind(name).takes_reference else None,
                                declared) for name in report_kinds(declared is not None)}
    ctx = ReportContext(runs=runs, out_dir=runs.root / REPORT_DIR, tables=tables, crossovers=[],
                        scale=build_table(runs, get_kind(SCALE), declared=declared),
                        allow_unverified=allow_unverified, declared=declared,
                        left_out=cannot_have(runs.arm_order, declared is not None), lr_sweep=lr_sweep)
    increments = ctx.table_where("crossover")
    ctx.crossovers = [find_crossover(increments, form, sizes_of(runs)) for form in FILTERING_FORMS
                      if not increments.frame.filter(quantity=form).is_empty()]
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    parts = [section(ctx) for section in (SECTIONS if sections is None else sections)]
    ctx.write("summary.md", "\n\n".join(p for p in parts if p) + "\n")
    return ctx
