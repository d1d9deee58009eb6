"""`build_table`: the one entry point the commands and the report use, a kind's table (`ablate.analysis.kinds`)
from a source's runs, with p adjusted over the experiment's declared comparisons when it declares them
(`ablate.analysis.hypotheses`). The builders of the kinds whose rows are paired-seed statistics are here."""

from __future__ import annotations

from ablate.analysis.hypotheses import adjust_over_family, count_diverged, exploratory_metric_table
from ablate.analysis.kinds import KINDS, get_kind
from ablate.analysis.runs import Runs
from ablate.analysis.scale import ScaleTable
from ablate.analysis.scale_family import study_family
from ablate.analysis.tables import Table, increments_table, losses_table, overlap_table, paired_table
from ablate.errors import AblateError


def build_table(runs: Runs, kind: str, reference: str | None = None, declared=None) -> Table | ScaleTable:
    """The one entry point the CLI and the report use; `reference` applies to the kinds that take one.

    `declared` (`ablate.analysis.hypotheses.Declared`, the experiment's declared comparisons): p_holm
    over that family only, every other row marked exploratory; kind "declared" is the family's own table;
    kind "scale" is the scale model (`ablate.analysis.scale.ScaleTable`), with the declared comparisons as rows;
    with `family="experiment"` the slopes of the declared comparisons and the gaps are in the same Holm family
    (`ablate.analysis.scale_family`).
    """
    spec = get_kind(kind)
    if reference is not None and not spec.takes_reference:
        takes = "/".join(name for name, k in KINDS.items() if k.takes_reference)
        raise AblateError(f"--reference applies to --kind {takes} only; the {kind} table has fixed arms ({spec.fixed})")
    return spec.build(runs, reference, declared)


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


def build_paired(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(paired_table(runs, reference or "baseline"), runs, declared)


def build_increments(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(increments_table(runs), runs, declared)


def build_overlap(runs: Runs, reference: str | None, declared) -> Table:
    return _adjusted(overlap_table(runs), runs, declared)


def build_losses(runs: Runs, reference: str | None, declared) -> Table:
    return losses_table(runs)


def build_declared(runs: Runs, reference: str | None, declared) -> Table:
    family = _family(runs, declared)
    if family is None:
        raise AblateError(f"{runs.name!r} has no declared comparisons: give an experiment whose file declares "
                          "hypotheses=[Comparison(...)], or use --kind paired/increments/overlap")
    return family


def build_scale(runs: Runs, reference: str | None, declared) -> ScaleTable:
    return study_family(runs, declared)[1]  # its own shape (rows and crossings): `ablate.analysis.scale`


def build_lr(runs: Runs, reference: str | None, declared):
    """The LR sweep's table of the source's folder, at the default margin and δ (`ablate table --kind lr` reads the
    experiment's own from its LRSweep: `ablate.cli.analysis._lr_command`)."""
    from ablate.analysis.lr import lr_table  # reason: the sweep's reader is loaded only for its own table

    return lr_table(runs.root)
