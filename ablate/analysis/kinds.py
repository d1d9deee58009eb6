"""The table kinds, each declared once: its name, the function that builds it, its title and caption, whether
it takes `--reference`, and whether it is one of the report's paired-seed tables. `ablate table --kind`
(argparse), `build_table`, the renderers and the report all read this registry, so an unknown kind is
refused in one line naming the valid ones, everywhere.

Import-light (no polars): the CLI lists the kinds without loading the analysis, so a builder is named by
its module and function (`TableKind.builder`) and imported when a table of that kind is built. A new kind
is one `register_kind(TableKind(...))` here, beside a builder `(runs, reference, declared) -> table`.

The 2×2 overlap's gates are declared here too (`OVERLAP_GATES`), the study's increments in `ablate.increments`
(the planner counts them as well): the tables compute them and every caption, legend and description is
written from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

from ablate.errors import choice_error
from ablate.increments import INCREMENTS  # noqa: F401 (read here by the tables, captions and report)

# gate → (the gate alone, the gate with sink-logit); gains are against baseline.
OVERLAP_GATES = {"norm": ("norm-gate", "combo"), "proj": ("proj-gate", "combo2")}
OVERLAP_BASE, OVERLAP_SINK = "baseline", "sink-logit"
DESCRIPTIONS = {**{q: f"{ref} − {arm}" for q, (ref, arm) in INCREMENTS.items()},
                **{g: f"{alone} with {both}" for g, (alone, both) in OVERLAP_GATES.items()}}

_INCREMENT_TERMS = "; ".join(f"{q} = {DESCRIPTIONS[q]}" for q in INCREMENTS)
_GATE_TERMS = "; ".join(f"{g}: {DESCRIPTIONS[g]}" for g in OVERLAP_GATES)


@dataclass(frozen=True)
class TableKind:
    """One kind of table. `builder` is "module:function" under ablate.analysis, called as
    builder(runs, reference, declared); `renderer` ("module:function", (table, fmt) -> text) writes it as text;
    `title` and `explain` may use {reference}; `metric_explain` is the
    caption for an `ablate eval` metric ({gain}, {m}, {s}: see `ablate.analysis.render.caption`), None when
    the kind is the loss's only; `fixed` says what the table compares when it takes no reference;
    `family` names the family Holm adjusts over in one of the report's paired-seed tables (`paired_seed`)."""

    name: str
    builder: str
    title: str
    explain: str
    help: str
    metric_explain: str | None = None
    takes_reference: bool = False
    fixed: str = ""
    paired_seed: bool = False
    family: str = ""
    renderer: str = "ablate.analysis.render:render"

    def build(self, runs, reference: str | None = None, declared=None):
        """The table of this kind (its builder is imported here: see the module's docstring)."""
        return _named(self.builder)(runs, reference, declared)

    def render(self, table, fmt: str) -> str:
        """The table as text in `fmt` (md, csv, latex, json), by this kind's renderer."""
        return _named(self.renderer)(table, fmt)


def _named(where: str):
    module, function = where.split(":")
    return getattr(import_module(module), function)


KINDS: dict[str, TableKind] = {}


def register_kind(kind: TableKind) -> TableKind:
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> TableKind:
    """The registered kind `name`, or one line naming the valid ones."""
    if name not in KINDS:
        raise choice_error("kind", name, KINDS)
    return KINDS[name]


def paired_seed_kinds() -> tuple[str, ...]:
    """The report's paired-seed tables, in order (each its own family of Holm's adjustment)."""
    return tuple(name for name, kind in KINDS.items() if kind.paired_seed)


BUILD = "ablate.analysis.build"
register_kind(TableKind(
    "paired", f"{BUILD}:build_paired", "Paired differences against {reference}",
    "Δ = L_{reference} − L_arm per seed; positive: the arm lowers the loss",
    "paired differences of every arm against --reference (default baseline)",
    metric_explain="Δ = {gain} per seed; positive: the arm is better", takes_reference=True, paired_seed=True,
    family="the arms of one tier against the reference"))
register_kind(TableKind(
    "increments", f"{BUILD}:build_increments", "Zero-option and filtering increments",
    f"{_INCREMENT_TERMS}; positive: the quantity lowers the loss",
    "the zero-option and filtering increments",
    metric_explain=f"{_INCREMENT_TERMS}, each a difference of m = {{m}}; positive: the quantity improves {{s}}",
    fixed=_INCREMENT_TERMS, paired_seed=True, family="the increments of one tier"))
register_kind(TableKind(
    "overlap", f"{BUILD}:build_overlap", "2×2 overlap of sink-logit with each value gate",
    f"overlap = g_sink + g_gate − g_both per seed, gains g against baseline ({_GATE_TERMS}); positive: together "
    "the two lower the loss by less than the sum of their separate gains",
    "the 2×2 overlap of sink-logit with each value gate",
    metric_explain=f"overlap = g_sink + g_gate − g_both per seed, gains g = m_baseline − m_arm with m = {{m}} "
                   f"({_GATE_TERMS}); positive: together the two improve {{s}} by less than the sum of their "
                   "separate gains",
    fixed="; ".join(f"{g}: {OVERLAP_BASE}, {OVERLAP_SINK}, {DESCRIPTIONS[g]}" for g in OVERLAP_GATES),
    paired_seed=True, family="the overlaps of one tier"))
register_kind(TableKind(
    "losses", f"{BUILD}:build_losses", "Final validation loss per arm",
    "absolute final val_loss over the counted seeds (mean ± sd, n); lower is better",
    "absolute final losses per arm",
    metric_explain="the metric over the counted seeds as m = {m} (mean ± sd, n)",
    fixed="every arm's absolute loss"))
register_kind(TableKind(
    "declared", f"{BUILD}:build_declared", "Declared comparisons",
    "Δ = L_minuend − L_subtrahend per seed for each comparison the experiment declares; positive: the subtrahend "
    "lowers the loss",
    "the experiment's declared comparisons (p_holm over that family)",
    fixed="the declared comparisons' arms"))
register_kind(TableKind(
    "scale", f"{BUILD}:build_scale", "Scale model: slopes per decade of parameters and crossings",
    "slope of each paired difference against log10 of the tier's nominal non-embedding parameters, per decade "
    "(ablate.analysis.scale renders it: CAPTION there)",
    "the scale model (slopes per decade, crossings)",
    fixed="every increment, declared comparison and gap", renderer="ablate.analysis.scale_text:render_scale"))
register_kind(TableKind(
    "lr", f"{BUILD}:build_lr", "LR sweep: each arm's loss per lr factor and its best factor",
    "the final loss of each arm at every lr factor of its sweep (LRSweep), and the factor that minimises it",
    "the LR sweep: each arm's loss per lr factor, its best factor (ablate.analysis.lr)",
    fixed="each arm's sweep", renderer="ablate.analysis.lr:render_lr"))
