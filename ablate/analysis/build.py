"""`build_table`: the one entry point the commands and the report use, a kind's table from a source's
runs, with p adjusted over the experiment's declared comparisons when it declares them
(`ablate.analysis.hypotheses`)."""

from __future__ import annotations

from ablate.analysis.hypotheses import (DECLARED, adjust_over_family, count_diverged, declared_table,
                                       exploratory_metric_table)
from ablate.analysis.runs import Runs
from ablate.analysis.scale import SCALE, ScaleTable, scale_table
from ablate.analysis.tables import KINDS, Table, _fixed_arms, increments_table, overlap_table, paired_table
from ablate.errors import AblateError, choice_error


def build_table(runs: Runs, kind: str, reference: str | None = None, declared=None) -> Table | ScaleTable:
    """The one entry point the CLI and the report use; `reference` applies to the paired table only.

    `declared` (`ablate.analysis.hypotheses.Declared`, the experiment's declared comparisons): p_holm
    over that family only, every other row marked exploratory; kind "declared" is the family's own table;
    kind "scale" is the scale model (`ablate.analysis.scale.ScaleTable`), with the declared comparisons as rows.
    """
    if kind not in (*KINDS, DECLARED, SCALE):
        raise choice_error("kind", kind, (*KINDS, DECLARED, SCALE))
    if kind == SCALE:  # its own shape (rows and crossings): `ablate.analysis.scale`
        if reference is not None:
            raise AblateError("--reference applies to --kind paired only; the scale table fits every increment, "
                              "declared comparison and gap")
        return scale_table(runs, declared)
    if runs.metric is not None:  # a downstream metric: the declared family is on the loss (`exploratory_metric_table`)
        declared = None
    family = declared_table(runs, declared) if declared is not None and declared.comparisons else None
    family = count_diverged(family, runs) if family is not None else None
    if kind == DECLARED:
        if family is None:
            raise AblateError(f"{runs.name!r} has no declared comparisons: give an experiment whose file declares "
                              "hypotheses=[Comparison(...)], or use --kind paired/increments/overlap")
        return family
    if kind == "paired":
        table = paired_table(runs, reference or "baseline")
    elif reference is not None:
        raise AblateError(
            f"--reference applies to --kind paired only; the {kind} table has fixed arms ({_fixed_arms(kind)})"
        )
    else:
        table = increments_table(runs) if kind == "increments" else overlap_table(runs)
    table = count_diverged(table, runs)
    if runs.metric is not None:
        return exploratory_metric_table(table)
    return adjust_over_family(table, family) if family is not None else table
