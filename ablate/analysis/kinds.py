"""The table kinds, each declared once: its name, title and caption, and what the commands and the report ask
of it by name (whether it takes `--reference`, `--metric`, `--tuned`, `--by-item`; whether the report writes
it; whether it is one of the report's paired-seed tables). `ablate table --kind` (argparse), `build_table`,
the renderers and the report all read this registry, so an unknown kind is refused in one line naming the
valid ones, everywhere, and no reader compares a kind's name to decide what it may do.

Words only, and below the code that builds the tables: the CLI lists the kinds without loading polars, and
this module imports no builder. A kind carries its `shape` (how its table is laid out: SHAPES; the renderers
choose the layout by it, never by the kind's name) and, once built, its builder and renderer: the built-in kinds
are declared here and each builder attaches itself to its kind (`@builds("paired", render)` in
`ablate.analysis.build`, the one entry point); a kind whose builder is not attached is refused in one line
when it is built. A new kind is one call in one place: `register_kind(TableKind(..., shape=..., builder=...,
renderer=...))`, a builder `(runs, reference, declared) -> table` and a renderer `(table, fmt) -> text`
(`ablate.analysis.render.render` lays out any `Table` by its kind's shape).

The quantities the tables compute (the increments, the 2×2 overlap's gates) and the words for each are
declared in `ablate.increments`; every caption here is written from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ablate.errors import AblateError, choice_error
from ablate.increments import DESCRIPTIONS, INCREMENTS, OVERLAP_BASE, OVERLAP_GATES, OVERLAP_SINK

Builder = Callable[[Any, "str | None", Any], Any]  # (runs, reference, declared) -> a table
Renderer = Callable[[Any, str], str]  # (table, fmt) -> text

_INCREMENT_TERMS = "; ".join(f"{q} = {DESCRIPTIONS[q]}" for q in INCREMENTS)
_GATE_TERMS = "; ".join(f"{g}: {DESCRIPTIONS[g]}" for g in OVERLAP_GATES)

# How a kind's table is laid out (`TableKind.shape`): what `ablate.analysis.render.render` reads to choose its
# columns, and the only thing it reads of a kind to choose them.
DIFFERENCE, ABSOLUTE, BY_BUDGET, OWN = "difference", "absolute", "by-budget", "own"
SHAPES = {
    DIFFERENCE: "a paired difference per row (tier, arm or quantity or comparison, n, mean ± sd, se, 95% CI, min, "
                "max, agree, p, p_holm when adjusted)",
    ABSOLUTE: "an absolute value per row (tier, arm, n, mean ± sd, se, min, max)",
    BY_BUDGET: "a paired difference per row and budget (tier, comparison, budget, step, n, mean ± sd, se, 95% CI, "
               "agree, p)",
    OWN: "not a `Table`: its own renderer lays it out (the scale model, the LR sweep)",
}

# How a row of a kind's table names the two arms it compares (`TableKind.pairs`, read by `TableKind.row_pair`):
# the table's reference and the row's arm, the row's increment's two arms, the row's minuend and subtrahend; a kind
# without one ("") has no row that a declared comparison or a diverged arm can be matched to.
REFERENCE_ARM, INCREMENT, MINUEND_SUBTRAHEND = "reference-arm", "increment", "minuend-subtrahend"


@dataclass(frozen=True)
class TableKind:
    """One kind of table. `title` and `explain` may use {reference}; `metric_explain` is the caption for an
    `ablate eval` metric ({gain}, {m}, {s}: see `ablate.analysis.render.caption`), None when the kind is the
    loss's only; `fixed` says what the table compares when it takes no reference; `family` names the family
    Holm adjusts over in one of the report's paired-seed tables (`paired_seed`).

    What the commands ask: `takes_reference` (`--reference`), `takes_metric` (`--metric`: a downstream metric
    instead of the loss), `tunable` (`--tuned`: each arm at its own best LR beside the shared LR), `by_item`
    (`--by-item`: a downstream metric paired by item), `sweep` (the LR sweep's own table, read with the
    experiment's LRSweep). What the report asks: `in_report` (it writes the table as .md and .csv),
    `needs_declared` (the table exists only when the experiment declares comparisons) and `effect`, how its
    lists name one row ({tier}, {key}: the row's arm or quantity, {reference}, {description}), `forest` (its table
    is the report's forest plot, and its reference the one the report's curves and downstream tables pair
    against) and `crossover` (the report finds the crossover on its rows).

    How its rows pair arms: `pairs` (REFERENCE_ARM, INCREMENT, MINUEND_SUBTRAHEND or ""): Holm's family and the
    diverged-seed count match a row to its two arms by it.

    How it is made and written: `shape` (SHAPES: the layout `ablate.analysis.render.render` gives its table),
    `builder` (runs, reference, declared) -> its table and `renderer` (table, fmt) -> text, given here or
    attached by `builds`."""

    name: str
    title: str
    explain: str
    help: str
    metric_explain: str | None = None
    takes_reference: bool = False
    fixed: str = ""
    paired_seed: bool = False
    family: str = ""
    takes_metric: bool = True
    tunable: bool = False
    by_item: bool = False
    sweep: bool = False
    in_report: bool = False
    needs_declared: bool = False
    effect: str = "{tier} {key}"
    forest: bool = False
    crossover: bool = False
    shape: str = DIFFERENCE
    pairs: str = ""
    builder: Builder | None = field(default=None, compare=False, repr=False)
    renderer: Renderer | None = field(default=None, compare=False, repr=False)

    def build(self, runs, reference: str | None = None, declared=None):
        """The table of this kind, by its builder."""
        return self._made()[0](runs, reference, declared)

    def render(self, table, fmt: str) -> str:
        """The table as text in `fmt` (md, csv, latex, json), by its renderer."""
        return self._made()[1](table, fmt)

    def _made(self) -> tuple[Builder, Renderer]:
        """Its builder and renderer; a kind taken from the registry before its builder attached (`builds` registers
        the kind with them) finds them there."""
        kind = self if self.builder is not None else KINDS.get(self.name, self)
        if kind.builder is None or kind.renderer is None:
            raise AblateError(f"table kind {self.name!r} has no builder: decorate one with @builds({self.name!r}, "
                              "renderer) in a module that build_table's module imports, or give the kind its "
                              "builder and renderer")
        return kind.builder, kind.renderer

    def row_pair(self, reference: str | None, row: dict) -> tuple[str, str] | None:
        """(minuend, subtrahend) of one row of this kind's table (`pairs`), or None."""
        if self.pairs == REFERENCE_ARM:
            return reference, row["arm"]
        if self.pairs == INCREMENT:
            return INCREMENTS[row["quantity"]]
        if self.pairs == MINUEND_SUBTRAHEND:
            return row["minuend"], row["subtrahend"]
        return None

    def effect_name(self, row: dict, key: str, reference: str | None) -> str:
        """How the report's lists name one row of this kind's table."""
        return self.effect.format(tier=row["tier"], key=row[key], reference=reference,
                                  description=DESCRIPTIONS.get(row[key], ""))


KINDS: dict[str, TableKind] = {}


def register_kind(kind: TableKind) -> TableKind:
    """Declare `kind` (with its builder and renderer, or they attach later by `builds`); a shape no renderer
    knows is refused in one line naming the valid ones."""
    if kind.shape not in SHAPES:
        raise choice_error("shape", kind.shape, SHAPES)
    KINDS[kind.name] = kind
    return kind


def get_kind(name: str) -> TableKind:
    """The registered kind `name`, or one line naming the valid ones."""
    if name not in KINDS:
        raise choice_error("kind", name, KINDS)
    return KINDS[name]


def builds(name: str, renderer: Renderer) -> Callable[[Builder], Builder]:
    """Decorator: `@builds("paired", render) def build_paired(runs, reference, declared)` makes the function
    the builder of the declared kind `name`, and `renderer` (table, fmt) -> text the writer of its tables: both
    attach to the kind (`KINDS[name]` becomes the kind with them).

    The builder's module registers it when it is imported (`build_table`'s module imports every module
    that holds one), so this module names no builder. A second, different builder for one kind is refused;
    the same function defined again (its module loaded twice) is the same builder."""
    get_kind(name)

    def register(builder: Builder) -> Builder:
        old = get_kind(name).builder
        if old is not None and _where(old) != _where(builder):
            raise AblateError(f"table kind {name!r} is already built by {_where(old)}; one kind has one builder")
        KINDS[name] = dataclasses.replace(get_kind(name), builder=builder, renderer=renderer)
        return builder

    return register


def _where(function) -> str:
    return f"{function.__module__}.{function.__qualname__}"


def paired_seed_kinds() -> tuple[str, ...]:
    """The report's paired-seed tables, in order (each its own family of Holm's adjustment)."""
    return tuple(name for name, kind in KINDS.items() if kind.paired_seed)


def report_kinds(declares: bool) -> tuple[str, ...]:
    """The tables the report writes, in order; those that need declared comparisons only when there are some."""
    return tuple(name for name, kind in KINDS.items() if kind.in_report and (declares or not kind.needs_declared))


def kind_where(attribute: str) -> TableKind:
    """The first kind whose `attribute` is true (e.g. `forest`: the report's forest plot): what the report asks
    for a part it plays, never a kind's name."""
    found = [kind for kind in KINDS.values() if getattr(kind, attribute)]
    if not found:
        raise AblateError(f"no table kind is {attribute}: declare one with {attribute}=True")
    return found[0]


def names_where(attribute: str) -> list[str]:
    """The kinds whose `attribute` is true, in order: what an error lists as the valid kinds for an option."""
    return [name for name, kind in KINDS.items() if getattr(kind, attribute)]


# A command's option → the attribute of a kind that says whether the kind takes it.
OPTIONS = {"--reference": "takes_reference", "--metric": "takes_metric", "--tuned": "tunable", "--by-item": "by_item"}


def check_options(kind: TableKind, given) -> None:
    """Refuse the first option of `given` (names in OPTIONS) that `kind` does not take, in one line naming the
    kinds that take it."""
    for option in given:
        if getattr(kind, OPTIONS[option]):
            continue
        takes = _listed(names_where(OPTIONS[option]))
        raise AblateError({
            "--reference": f"--reference applies to --kind {takes} only; the {kind.name} table has fixed arms "
                           f"({kind.fixed})",
            "--metric": f"--metric (a downstream metric instead of the loss) applies to --kind {takes} only, not "
                        f"{kind.name}",
            "--tuned": f"--tuned pairs the arms at their own best LRs: use it with --kind {takes}, not {kind.name}",
            "--by-item": f"--by-item makes the {takes} table only, not --kind {kind.name}; drop --kind or --by-item",
        }[option])


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


register_kind(TableKind(
    "paired", "Paired differences against {reference}",
    "Δ = L_{reference} − L_arm per seed; positive: the arm lowers the loss",
    "paired differences of every arm against --reference (default baseline)",
    metric_explain="Δ = {gain} per seed; positive: the arm is better", takes_reference=True, paired_seed=True,
    family="the arms of one tier against the reference", tunable=True, by_item=True, in_report=True,
    effect="{tier} {key} vs {reference}", forest=True, pairs=REFERENCE_ARM))
register_kind(TableKind(
    "increments", "Zero-option and filtering increments",
    f"{_INCREMENT_TERMS}; positive: the quantity lowers the loss",
    "the zero-option and filtering increments",
    metric_explain=f"{_INCREMENT_TERMS}, each a difference of m = {{m}}; positive: the quantity improves {{s}}",
    fixed=_INCREMENT_TERMS, paired_seed=True, family="the increments of one tier", tunable=True, in_report=True,
    effect="{tier} {key} ({description})", crossover=True, pairs=INCREMENT))
register_kind(TableKind(
    "overlap", "2×2 overlap of sink-logit with each value gate",
    f"overlap = g_sink + g_gate − g_both per seed, gains g against baseline ({_GATE_TERMS}); positive: together "
    "the two lower the loss by less than the sum of their separate gains",
    "the 2×2 overlap of sink-logit with each value gate",
    metric_explain=f"overlap = g_sink + g_gate − g_both per seed, gains g = m_baseline − m_arm with m = {{m}} "
                   f"({_GATE_TERMS}); positive: together the two improve {{s}} by less than the sum of their "
                   "separate gains",
    fixed="; ".join(f"{g}: {OVERLAP_BASE}, {OVERLAP_SINK}, {DESCRIPTIONS[g]}" for g in OVERLAP_GATES),
    paired_seed=True, family="the overlaps of one tier", tunable=True, in_report=True,
    effect="{tier} {key} overlap ({description})"))
register_kind(TableKind(
    "losses", "Final validation loss per arm",
    "absolute final val_loss over the counted seeds (mean ± sd, n); lower is better",
    "absolute final losses per arm",
    metric_explain="the metric over the counted seeds as m = {m} (mean ± sd, n)",
    fixed="every arm's absolute loss", in_report=True, shape=ABSOLUTE))
register_kind(TableKind(
    "declared", "Declared comparisons",
    "Δ = L_minuend − L_subtrahend per seed for each comparison the experiment declares; positive: the subtrahend "
    "lowers the loss",
    "the experiment's declared comparisons (p_holm over that family)",
    fixed="the declared comparisons' arms", takes_metric=False, tunable=True, in_report=True, needs_declared=True,
    pairs=MINUEND_SUBTRAHEND))
register_kind(TableKind(
    "scale", "Scale model: slopes per decade of parameters and crossings",
    "slope of each paired difference against log10 of the tier's nominal non-embedding parameters, per decade "
    "(ablate.analysis.scale renders it: CAPTION there)",
    "the scale model (slopes per decade, crossings)",
    fixed="every increment, declared comparison and gap", shape=OWN))
register_kind(TableKind(
    "lr", "LR sweep: each arm's loss per lr factor and its best factor",
    "the final loss of each arm at every lr factor of its sweep (LRSweep), and the factor that minimises it",
    "the LR sweep: each arm's loss per lr factor, its best factor (ablate.analysis.lr)",
    fixed="each arm's sweep", takes_metric=False, sweep=True, shape=OWN))
register_kind(TableKind(
    "budgets", "Each comparison at 25 / 50 / 75 / 100% of the budget and as AUC (exploratory)",
    "Δ = L_minuend − L_subtrahend per seed for each declared comparison, and L_{reference} − L_arm for each arm, "
    "read from the logged validation curve (the in-training evaluation windows, never the final larger "
    "validation): at each fraction of the budget the last logged evaluation at or before it, and AUC, the area "
    "under the curve per step; positive: the subtrahend lowers the loss. Every row exploratory (no family, p "
    "unadjusted): whether a gain is a speed effect that closes by the end",
    "each declared and paired comparison at 25/50/75/100% of the budget and as AUC, from the logged curve "
    "(exploratory)",
    takes_reference=True, takes_metric=False, fixed="each declared comparison and each arm against the reference",
    shape=BY_BUDGET))
