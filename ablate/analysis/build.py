"""`build_table`: the one entry point the commands and the report use, a kind's table (`ablate.analysis.kinds`)
from a source's runs, with p adjusted over the experiment's declared comparisons when it declares them
(`ablate.analysis.hypotheses`). Every kind's builder is here, registered for its kind with its renderer
(`@builds`) when this module is imported: whoever builds a table has imported it, so every kind has its builder."""

from __future__ import annotations

import dataclasses

from ablate.analysis import budgets  # noqa: F401  (registers the budgets kind's builder)
from ablate.analysis.hypotheses import adjust_over_family, count_diverged, exploratory_metric_table
from ablate.analysis.kinds import TableKind, builds, check_options, get_kind
from ablate.analysis.lr import lr_table, render_lr
from ablate.analysis.render import render
from ablate.analysis.runs import Runs
from ablate.analysis.scale import ScaleTable
from ablate.analysis.scale_family import study_family
from ablate.analysis.scale_text import render_scale
from ablate.analysis.tables import Table, increments_table, losses_table, overlap_table, paired_table
from ablate.errors import AblateError


def build_table(runs: Runs, kind: TableKind | str, reference: str | None = None, declared=None) -> Table | ScaleTable:
    """The one entry point the CLI and the report use: `kind`'s table. The library hands the `TableKind` itself
    (as `get_kind` gave it); a kind's name, from a caller outside it, is looked up once here. A `Table` carries its
    kind by name (a builder that starts from another kind's table still makes its own kind's: its title, caption
    and layout); `reference` applies to the kinds that take one.

    `declared` (`ablate.analysis.hypotheses.Declared`, the experiment's declared comparisons): p_holm
    over that family only, every other row marked exploratory; kind "declared" is the family's own table;
    kind "scale" is the scale model (`ablate.analysis.scale.ScaleTable`), with the declared comparisons as rows;
    with `family="experiment"` the slopes of the declared comparisons and the gaps are in the same Holm family
    (`ablate.analysis.scale_family`).
    """
    kind = get_kind(kind) if isinstance(kind, str) else kind
    check_options(kind, ["--reference"] * (reference is not None) + ["--metric"] * (runs.metric is not None))
    table = kind.build(runs, reference, declared)
    if isinstance(table, Table) and table.kind != kind.name:
        table = dataclasses.replace(table, kind=kind.name)
    design_notes = tuple(getattr(declared, "notes", ()))  # the design's history (`ablate.design`): every table says it
    if design_notes and isinstance(table, (Table, ScaleTable)):
        table = dataclasses.replace(table, notes=tuple(table.notes) + design_notes)
    return table


def _family(runs: Runs, declared):
    """The declared family's table, or None (no declared comparisons, or a downstream metric, whose family is
    on the loss: `exploratory_metric_table`)."""
    return study_family(runs, declared)[0]


def _adjusted(table: Table, runs: Runs, declared) -> Table:
    table = count_diverged(table, runs)
    if runs.metric is not None:
        return exploratory_metric_table(table)
    family = _family(runs, declared)
    return adjust_over_family(table, family) if family is not None else table


@builds("paired", render)
def build_paired(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(paired_table(runs, reference or "baseline"), runs, declared)


@builds("increments", render)
def build_increments(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(increments_table(runs), runs, declared)


@builds("overlap", render)
def build_overlap(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(overlap_table(runs), runs, declared)


@builds("losses", render)
def build_losses(runs: Runs, reference: str | None, declared) -> Table:
    return losses_table(runs)


@builds("declared", render)
def build_declared(runs: Runs, reference: str | None, declared) -> Table:
    family = _family(runs, declared)
    if family is None:
        raise AblateError(f"{runs.name!r} has no declared comparisons: give an experiment whose file declares "
                          "hypotheses=[Comparison(...)], or use --kind paired/increments/overlap")
    return family


@builds("scale", render_scale)
def build_scale(runs: Runs, reference: str | None, declared) -> ScaleTable:
    return study_family(runs, declared)[1]  # its own shape (rows and crossings): `ablate.analysis.scale`


@builds("lr", render_lr)
def build_lr(runs: Runs, reference: str | None, declared):
    """The LR sweep's table of the source's folder, at the default margin and δ (`ablate table --kind lr` reads the
    experiment's own from its LRSweep: `ablate.cli.analysis._lr_command`)."""
    return lr_table(runs.root)
