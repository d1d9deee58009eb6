"""Tables as text: markdown for reading, CSV and JSON for machines, LaTeX for papers.

Markdown and LaTeX show mean ± sd, se, the 95% interval and the p-values, and say "1 seed" where
there is no spread; CSV and JSON carry the exact machine columns (empty / null spread and p at
n = 1). Markdown and JSON also carry the excluded runs, missing seeds, skipped quantities and the
meaning of every row mark; CSV cannot, so the CLI prints those to stderr.

Every cell is escaped for its format (`ablate.analysis.escape`): a name is data, never markup. The layout is
chosen by the table's kind's `shape` (`ablate.analysis.kinds.SHAPES`), never by the kind's name, so a kind
registered anywhere renders in every format.
"""

from __future__ import annotations

import json
import math

from ablate.errors import AblateError, choice_error
from ablate.analysis.figures import figure
from ablate.analysis.escape import latex_text, markdown_cell, markdown_text
from ablate.analysis.kinds import ABSOLUTE, BY_BUDGET, DIFFERENCE, get_kind
from ablate.increments import DESCRIPTIONS
from ablate.analysis.tables import MARK_NOTES, Table
from ablate.tiers import TIERS

FORMATS = ("md", "csv", "latex", "json")

# val_loss's convention (docs/method.md §4), under every table of losses.
PADDED_VOCAB, REAL_VOCAB = 50_304, 50_257
VAL_LOSS_FOOTER = (f"val_loss: mean token cross-entropy in nats of the softmax over the model's whole output layer, "
                   f"GPT-2's {REAL_VOCAB:,} tokens padded to {PADDED_VOCAB:,} rows; the {PADDED_VOCAB - REAL_VOCAB} "
                   "padding rows are never a target but stay in the normaliser, so val_loss is never below the "
                   "real-vocabulary loss that `ablate eval` scores (about 2e-4 nats above it after a smoke run's "
                   "100 steps; docs/method.md, section 4).")
FOOTER = ("95% CI: Student-t interval over seeds (n − 1 degrees of freedom); sd with ddof 1; se = sd/√n; "
          "agree: seeds whose difference has the sign of the mean; p: two-sided paired t-test (one-sample "
          "t-test of the per-seed differences against 0), empty with one seed or no spread.")
HOLM_FOOTER = ("p_holm: Holm's step-down adjustment of p over the arms of one tier against {reference} "
               "(the comparisons with a p in that tier); an effect counts as supported only if p_holm < 0.05.")
QUANTITY_HOLM_FOOTER = ("p_holm: Holm's step-down adjustment of p over the rows of one tier (the quantities with a "
                        "p in that tier); an effect counts as supported only if p_holm < 0.05.")
FAMILY_FOOTER = ("p_holm: Holm's step-down adjustment over the declared family only ({family}); an effect counts "
                 "as supported only if p_holm < 0.05. Rows marked exploratory are not in the family: their p is "
                 "unadjusted and they are never called supported.")
SEQUENTIAL_HOLM_FOOTER = ("p_holm: Holm's step-down adjustment over the declared family only ({family}), as a fixed "
                          "design would take it: it ignores the looks and decides nothing here. Rows marked "
                          "exploratory are not in the family and are never called supported.")
SEQUENTIAL_FOOTER = ("Sequential design: look = the last look whose seeds are all in; decision = effect (|t| reached "
                     "that look's boundary), continue (the next look's seeds are needed) or max seeds reached; the "
                     "design interval is the repeated confidence interval valid for the design at the look reached "
                     "(the fixed-sample 95% CI and p ignore the looks). A sequential comparison counts as supported "
                     "only when the design decided effect.")
LOSS_FOOTER = "sd with ddof 1; se = sd/√n; completed runs with a finite val_loss only."


def render(table: Table, fmt: str) -> str:
    """`table` as text in `fmt`, laid out by its kind's shape (every kind whose table is a `Table`)."""
    if fmt not in FORMATS:
        raise choice_error("format", fmt, FORMATS)
    return {"md": to_markdown, "csv": to_csv, "latex": to_latex, "json": to_json}[fmt](table)


def _num(value, signed: bool = True) -> str:
    return figure(value, signed)


def _tex(value, signed: bool = True) -> str:
    return figure(value, signed, latex=True)


def format_p(value) -> str:
    """Three significant figures, '<0.0001' below that, '–' when there is no test."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return "<0.0001" if value < 1e-4 else f"{value:.3g}"


def _marks(row: dict) -> str:
    return (row.get("marks") or "").replace(",", ", ")


def effect_cells(row: dict) -> tuple[str, str]:
    """("mean ± sd", "[low, high]") — or ("mean (1 seed)", "–") when there is no spread."""
    if row["n"] == 0:
        return "not run", "–"
    if row["n"] < 2 or row["sd"] is None:
        return f"{_num(row['mean'])} (1 seed)", "–"
    return f"{_num(row['mean'])} ± {_num(row['sd'], signed=False)}", f"[{_num(row['ci_low'])}, {_num(row['ci_high'])}]"


def shape(table: Table) -> str:
    """How `table` is laid out: its kind's shape, one of those a `Table` has (the others render themselves)."""
    found = get_kind(table.kind).shape
    if found not in (DIFFERENCE, ABSOLUTE, BY_BUDGET):
        raise AblateError(f"table kind {table.kind!r} has shape {found!r}, which a Table has not: give the kind "
                          f"shape {DIFFERENCE!r}, {ABSOLUTE!r} or {BY_BUDGET!r}, or its own renderer")
    return found


def title(table: Table) -> str:
    return get_kind(table.kind).title.format(reference=table.reference)


def caption(table: Table) -> str:
    """What the numbers are and which way is better: the quantity, then the kind's definitions."""
    if table.metric is None:
        return ("Validation loss in nats (lower is better). "
                + get_kind(table.kind).explain.format(reference=table.reference) + ".")
    higher = bool(table.higher_is_better)
    short = table.metric.rsplit("/", 1)[-1]
    reference = table.reference or "reference"
    gain = f"{short}_arm − {short}_{reference}" if higher else f"{short}_{reference} − {short}_arm"
    quantity = (f"Downstream metric {table.metric} (`ablate eval`, lm-evaluation-harness; "
                f"{'higher' if higher else 'lower'} is better), not the validation loss. ")
    explain = get_kind(table.kind).metric_explain
    return quantity + explain.format(gain=gain, m=f"−{short}" if higher else short, s=short) + "."


def footer_lines(table: Table) -> list[str]:
    """The val_loss convention under a table of losses (a metric table has none: it is not val_loss)."""
    if table.metric is not None:
        return []
    tiers = set(table.frame["tier"].to_list()) if "tier" in table.frame.columns else set()
    on_tasks = [t for t in sorted(tiers) if t in TIERS and TIERS[t].task is not None]
    task_line = [f"val_loss of a task tier ({', '.join(on_tasks)}): mean cross-entropy in nats over the answers of the "
                 "fixed validation set, over the task's own tokens (docs/method.md, the mechanism testbed)."
                 ] if on_tasks else []
    return ["", *(task_line + ([VAL_LOSS_FOOTER] if tiers - set(on_tasks) or not tiers else []))]


def to_markdown(table: Table) -> str:
    key = table.key
    if shape(table) == ABSOLUTE:
        return _losses_markdown(table)
    if shape(table) == BY_BUDGET:
        return _budgets_markdown(table)
    holm, sequential = "p_holm" in table.columns, "decision" in table.columns
    head = ["tier", key, "n", "mean ± sd", "se", "95% CI", "min", "max", "agree", "p", *(["p_holm"] if holm else []),
            *(["look", "decision", "design interval"] if sequential else []), "marks"]
    lines = _markdown_head(table, head)
    for row in table.frame.iter_rows(named=True):
        effect, interval = effect_cells(row)
        cells = [row["tier"], row_label(table, row), str(row["n"]), effect, _num(row["se"], signed=False), interval,
                 _num(row["min"]), _num(row["max"]), f"{row['agree']}/{row['n']}", format_p(row["p"]),
                 *([format_p(row["p_holm"])] if holm else []), *(sequential_cells(row) if sequential else []),
                 _marks(row)]
        lines.append(_markdown_row(cells))
    if table.frame.is_empty():
        lines.append("| " + " | ".join(["–"] * len(head)) + " |")
    lines += ["", FOOTER + (" " + holm_footer(table) if holm else "") + " Statistics use complete pairs only."
              + (" " + SEQUENTIAL_FOOTER if sequential else "")]
    return "\n".join(lines + footer_lines(table) + _markdown_tail(table)) + "\n"


def row_label(table: Table, row: dict) -> str:
    """The arm; a quantity with what it is; a comparison with its two arms."""
    if table.key == "arm":
        return row["arm"]
    if "minuend" in row:
        return f"{row[table.key]} ({row['minuend']} − {row['subtrahend']})"
    described = DESCRIPTIONS.get(row[table.key])
    return f"{row[table.key]} ({described})" if described else row[table.key]


METRIC_FOOTER = ("p_holm: empty, because no declared comparison is on this metric: every row is exploratory "
                 "(unadjusted p) and none is called supported.")


def holm_footer(table: Table) -> str:
    if "decision" in table.columns:  # a sequential study: the design decides, never the fixed-sample p_holm
        return SEQUENTIAL_HOLM_FOOTER.format(family=table.family)
    if table.metric is not None and "p_holm" in table.columns and table.frame["p_holm"].is_null().all():
        return METRIC_FOOTER
    if table.family:
        return FAMILY_FOOTER.format(family=table.family)
    return HOLM_FOOTER.format(reference=table.reference) if table.reference is not None else QUANTITY_HOLM_FOOTER


def decision_text(row: dict) -> str:
    """effect (the subtrahend better / worse), continue (to n seeds), max seeds reached; – before the first look."""
    if row["look"] == 0:
        return f"continue (first look at {row['next_seeds']} seeds)"
    if row["decision"] == "effect":
        return "effect (" + ("Δ > 0" if (row["sign"] or 0) > 0 else "Δ < 0") + ")"
    if row["decision"] == "continue":
        return f"continue (to {row['next_seeds']} seeds)"
    return row["decision"]


def sequential_cells(row: dict) -> list[str]:
    if row["look"] is None:  # not a declared comparison: the design says nothing about it
        return ["–", "– (exploratory)", "–"]
    interval = "–" if row["seq_ci_low"] is None else f"[{_num(row['seq_ci_low'])}, {_num(row['seq_ci_high'])}]"
    return [f"{row['look']} ({row['seeds_used']} seeds)", decision_text(row), interval]


def _losses_markdown(table: Table) -> str:
    head = ["tier", "arm", "n", "mean ± sd", "se", "min", "max", "marks"]
    lines = _markdown_head(table, head)
    for row in table.frame.iter_rows(named=True):
        spread = f" ± {_num(row['sd'], signed=False)}" if row["sd"] is not None else " (1 seed)"
        lines.append(_markdown_row([row["tier"], row["arm"], str(row["n"]), _num(row["mean"], signed=False) + spread,
                                    _num(row["se"], signed=False), _num(row["min"], signed=False),
                                    _num(row["max"], signed=False), _marks(row)]))
    return "\n".join(lines + ["", LOSS_FOOTER] + footer_lines(table) + _markdown_tail(table)) + "\n"


def _budgets_markdown(table: Table) -> str:
    """A row per comparison and budget (`ablate.analysis.budgets`), with the logged step it was read at."""
    head = ["tier", "comparison", "budget", "step", "n", "mean ± sd", "se", "95% CI", "agree", "p", "marks"]
    lines = _markdown_head(table, head)
    for row in table.frame.iter_rows(named=True):
        effect, interval = effect_cells(row)
        lines.append(_markdown_row([row["tier"], f"{row['comparison']} ({row['minuend']} − {row['subtrahend']})",
                                    row["budget"], str(row["step"]), str(row["n"]), effect,
                                    _num(row["se"], signed=False), interval, f"{row['agree']}/{row['n']}",
                                    format_p(row["p"]), _marks(row)]))
    lines += ["", FOOTER + " Statistics use complete pairs only; p is unadjusted: every row is exploratory."]
    return "\n".join(lines + _markdown_tail(table)) + "\n"


def _markdown_row(cells: list) -> str:
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def _markdown_head(table: Table, head: list[str]) -> list[str]:
    return [
        markdown_text(f"## {title(table)} — {table.name}"),
        "",
        markdown_text(caption(table)),
        "",
        *[line for note in table.source_notes for line in (markdown_text(f"Note: {note}."), "")],
        _markdown_row(head),
        "|" + "|".join("---" for _ in head) + "|",
    ]


def _markdown_tail(table: Table) -> list[str]:
    lines = _listing("Marks", [f"{mark}: {MARK_NOTES.get(mark, mark)}" for mark in table.marks_used])
    lines += _listing("Missing seeds (no run; pairs with them are left out)", _missing_lines(table))
    lines += _listing("Excluded runs (not completed, or no finite val_loss)" if table.metric is None else
                      "Excluded runs (not completed, no finite val_loss, or scored on other weights)", [
        f"{r['tier']} {r['arm']} seed {r['seed']}: {r['reason']}" for r in table.left_out.iter_rows(named=True)
    ])
    lines += _listing(f"Not evaluated on {table.metric} (completed runs; `ablate eval` them to count them)", [
        f"{r['tier']} {r['arm']} seed {r['seed']}" for r in table.unevaluated.iter_rows(named=True)
    ])
    return lines + _listing("Skipped", [note for note in table.notes if note not in table.source_notes])


def _missing_lines(table: Table) -> list[str]:
    grouped = table.missing.group_by("tier", "arm", maintain_order=True).agg("seed")
    return [
        f"{r['tier']} {r['arm']}: seed{'s' if len(r['seed']) > 1 else ''} {', '.join(map(str, r['seed']))}"
        for r in grouped.iter_rows(named=True)
    ]


def _listing(heading: str, items: list[str]) -> list[str]:
    return ["", f"{heading}:", ""] + [f"- {markdown_text(item)}" for item in items] if items else []


def to_csv(table: Table) -> str:
    return table.frame.write_csv(float_precision=None)


def to_json(table: Table) -> str:
    return json.dumps({
        "kind": table.kind,
        "source": table.name,
        "reference": table.reference,
        "metric": table.metric,  # null: val_loss
        "higher_is_better": table.higher_is_better,
        "columns": table.columns,
        "rows": table.frame.to_dicts(),
        **({"family": table.family} if table.family else {}),
        "missing": table.missing.to_dicts(),
        "excluded": table.left_out.to_dicts(),
        **({"not_evaluated": table.unevaluated.to_dicts()} if table.metric is not None else {}),
        "warnings": table.warnings,
    }, indent=2) + "\n"


def to_latex(table: Table) -> str:
    """A booktabs tabular; '1 seed' in place of a spread that does not exist; marks as a last column."""
    key, layout = table.key, shape(table)
    if layout == ABSOLUTE:
        head, spec = "Tier & Arm & $n$ & Mean $\\pm$ sd & se & Marks \\\\", "llrlll"
    else:
        holm, sequential = "p_holm" in table.columns, "decision" in table.columns
        head = (f"Tier & {key.capitalize()} & $n$ & Mean $\\pm$ sd & se & 95\\% CI & Range & Agree & $p$"
                + (" & $p_\\mathrm{Holm}$" if holm else "") + (" & Look & Decision" if sequential else "")
                + " & Marks \\\\")
        spec = "llrlllllr" + "l" * (2 if holm else 1) + ("ll" if sequential else "")
    lines = [
        "% " + latex_text(f"{title(table)} — {table.name}. " + caption(table)),
        f"\\begin{{tabular}}{{{spec}}}", r"\toprule", head, r"\midrule",
    ]
    for row in table.frame.iter_rows(named=True):
        label = f"{row[key]} at {row['budget']}" if layout == BY_BUDGET else row[key]
        tier, label, marks = latex_text(row["tier"]), latex_text(label), latex_text(_marks(row))
        se = f"${_tex(row['se'], signed=False)}$"
        if layout == ABSOLUTE:
            effect = f"${_tex(row['mean'], signed=False)}" + (f" \\pm {_tex(row['sd'], signed=False)}$"
                                                              if row["sd"] is not None else "$ (1 seed)")
            lines.append(f"{tier} & {label} & {row['n']} & {effect} & {se} & {marks} \\\\")
            continue
        if row["n"] == 0:
            effect, interval = "not run", "--"
        elif row["n"] < 2 or row["sd"] is None:
            effect, interval = f"${_tex(row['mean'])}$ (1 seed)", "--"
        else:
            effect = f"${_tex(row['mean'])} \\pm {_tex(row['sd'], signed=False)}$"
            interval = f"$[{_tex(row['ci_low'])}, {_tex(row['ci_high'])}]$"
        span = f"$[{_tex(row['min'])}, {_tex(row['max'])}]$"
        ps = [format_p(row["p"])] + ([format_p(row["p_holm"])] if "p_holm" in row else [])
        ps += sequential_cells(row)[:2] if "decision" in row else []
        lines.append(f"{tier} & {label} & {row['n']} & {effect} & {se} & {interval} & {span} & "
                     f"{row['agree']}/{row['n']} & " + " & ".join(latex_text(p) for p in ps) + f" & {marks} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% {latex_text(line)}" for line in footer_lines(table) if line]
    lines += [f"% warning: {latex_text(w)}" for w in table.warnings]
    return "\n".join(lines) + "\n"

