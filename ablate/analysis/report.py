"""`ablate report`: the tables, two figures and a short summary, written to `<experiment>/report/`.

The report is a list of sections. Each section is a function of one `ReportContext`: it may write
files into the report folder (through `ctx.write`) and returns the markdown it adds to summary.md.
A later area (e.g. the probes, whose run folders hold probe.json / inject.json) adds its summary by
appending a section to `SECTIONS`, or by passing its own list to `write_report`; nothing here changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ablate.errors import AblateError
from ablate.analysis.load import TABLE_SUFFIXES, Runs, load_curves, load_runs
from ablate.analysis.plots import FILTERING_FORMS, Crossover, find_crossover, plot_curves, plot_increments
from ablate.analysis.render import DESCRIPTIONS, effect_cells, render
from ablate.analysis.tables import KINDS, Table, build_table
from ablate.store import atomic_write_bytes

REPORT_DIR = "report"


@dataclass
class ReportContext:
    """What every section may use. `tables` maps each kind of KINDS to its table."""

    runs: Runs
    out_dir: Path
    tables: dict[str, Table]
    crossovers: list[Crossover]
    written: list[Path] = field(default_factory=list)

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
    excluded = [f"- {r['tier']} {r['arm']} seed {r['seed']}: {r['reason']}" for r in runs.excluded.iter_rows(named=True)]
    if excluded:
        lines += ["", "Excluded runs (not completed, left out of every statistic):", "", *excluded]
    missing = runs.missing
    if missing.height:
        lines += ["", "Seeds with no run at all (statistics use complete pairs only):", ""]
        lines += [f"- {r['tier']} {r['arm']} seed {r['seed']}" for r in missing.iter_rows(named=True)]
    return "\n".join(lines)


def tables_section(ctx: ReportContext) -> str:
    lines = ["## Tables", ""]
    for kind in KINDS:
        table = ctx.tables[kind]
        ctx.write(f"{kind}.md", render(table, "md"))
        ctx.write(f"{kind}.csv", render(table, "csv"))
        lines.append(f"- [{kind}.md]({kind}.md) ([csv]({kind}.csv)): {table.frame.height} rows")
        lines += [f"  - {note}" for note in table.notes]
    return "\n".join(lines)


def crossover_section(ctx: ReportContext) -> str:
    increments = ctx.tables["increments"]
    lines = ["## Crossover", ""]
    if increments.frame.is_empty():
        return "\n".join(lines + ["No increments could be computed, so there is no crossover:",
                                  *[f"- {note}" for note in increments.notes]])
    plot_increments(increments, ctx.crossovers, ctx.record("increments.png"))
    lines += [f"- {c.message}" for c in ctx.crossovers] or ["- no crossover: neither filtering increment could be computed"]
    lines += [f"- {note}" for note in increments.notes]
    lines += ["", "Crossover: the scale where the filtering increment overtakes the zero-option increment; the "
              "intervals in the figure show how firmly the means place it.", "", "![increments](increments.png)"]
    return "\n".join(lines)


def flags_section(ctx: ReportContext) -> str:
    """Every effect whose 95% interval contains zero, and every effect from one seed (cannot be flagged)."""
    contains_zero, single = [], []
    for kind in KINDS:
        table = ctx.tables[kind]
        for row in table.frame.iter_rows(named=True):
            what = _effect_name(table, row)
            effect, interval = effect_cells(row)
            if row["n"] < 2 or row["ci_low"] is None:
                single.append(f"- {what}: {effect}")
            elif row["ci_low"] <= 0.0 <= row["ci_high"]:
                contains_zero.append(f"- {what}: {effect}, 95% CI {interval}, n = {row['n']}, agree {row['agree']}/{row['n']}")
    lines = ["## Effects whose 95% interval contains zero", ""]
    lines += contains_zero or ["- none: every effect with two or more seeds has an interval that excludes zero"]
    if single:
        lines += ["", "## Effects from one seed (no interval, so they cannot be flagged either way)", "", *single]
    return "\n".join(lines)


def curves_section(ctx: ReportContext) -> str:
    curves = load_curves(ctx.runs)
    reference = ctx.tables["paired"].reference
    plot_curves(curves, ctx.runs.tiers, ctx.runs.arm_order, ctx.record("curves.png"), ctx.runs.name, reference)
    note = "" if curves.height else " (no validation lines found in metrics.jsonl)"
    return f"## Validation curves\n\nMean over seeds of the completed runs, one column per tier; below, the paired gap to {reference} (positive: lower loss){note}.\n\n![curves](curves.png)"


def probes_section(ctx: ReportContext) -> str:
    """`ablate probe` / `ablate inject` results found in the run folders, by tier and arm across seeds."""
    from ablate.probes import summarise_injections, summarise_probes

    parts = [p for p in (summarise_probes(ctx.runs.root), summarise_injections(ctx.runs.root)) if p]
    if parts:
        ctx.write("probes.md", "\n\n".join(parts) + "\n")
    return "## Probes\n\n" + "\n\n".join(parts) if parts else ""


SECTIONS: list[Section] = [overview_section, tables_section, crossover_section, flags_section, curves_section,
                           probes_section]


def _effect_name(table: Table, row: dict) -> str:
    if table.kind == "paired":
        return f"{row['tier']} {row['arm']} vs {table.reference}"
    name = f"{row[table.key]} overlap" if table.kind == "overlap" else row[table.key]
    return f"{row['tier']} {name} ({DESCRIPTIONS[row[table.key]]})"


def write_report(source: str | os.PathLike, results: str | os.PathLike | None = None,
                 sections: list[Section] | None = None, allow_unverified: bool = False) -> Path:
    """Build the report of an experiment (name, .py file or folder) and return the report folder."""
    if Path(source).suffix.lower() in TABLE_SUFFIXES:
        raise AblateError(f"a report needs an experiment's run store, not the table file {str(source)!r}; "
                          "use `ablate table` for a CSV/parquet source")
    runs = load_runs(source, results, allow_unverified=allow_unverified)
    reference = "baseline" if "baseline" in runs.arm_order else runs.arm_order[0]
    tables = {kind: build_table(runs, kind, reference if kind == "paired" else None) for kind in KINDS}
    crossovers = [find_crossover(tables["increments"], form) for form in FILTERING_FORMS
                  if not tables["increments"].frame.filter(quantity=form).is_empty()]
    ctx = ReportContext(runs=runs, out_dir=runs.root / REPORT_DIR, tables=tables, crossovers=crossovers)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    parts = [section(ctx) for section in (SECTIONS if sections is None else sections)]
    ctx.write("summary.md", "\n\n".join(p for p in parts if p) + "\n")
    return ctx.out_dir
