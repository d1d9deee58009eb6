"""Tables as text: markdown for reading, CSV and JSON for machines, LaTeX for papers.

Markdown and LaTeX show mean ± sd with the 95% interval and say "1 seed" where there is no spread;
CSV and JSON carry the exact machine columns (empty / null spread at n = 1). Markdown and JSON also
carry the excluded runs, missing seeds and skipped quantities; CSV cannot, so the CLI prints those
to stderr.
"""

from __future__ import annotations

import json
import math

from ablate.errors import choice_error
from ablate.analysis.tables import DESCRIPTIONS, Table

FORMATS = ("md", "csv", "latex", "json")
DIGITS = 4  # reference figures are quoted to 1e-4 nats

TITLES = {
    "paired": "Paired differences against {reference}",
    "increments": "Zero-option and filtering increments",
    "overlap": "2×2 overlap of sink-logit with each value gate",
}
EXPLAIN = {
    "paired": "Δ = L_{reference} − L_arm per seed; positive: the arm lowers the loss",
    "increments": "zero_option = baseline − sink-logit; filtering_norm = sink-logit − combo; "
                  "filtering_proj = sink-logit − combo2; positive: the quantity lowers the loss",
    "overlap": "overlap = g_sink + g_gate − g_both per seed, gains g against baseline "
               "(norm: norm-gate with combo; proj: proj-gate with combo2); positive: together the two "
               "lower the loss by less than the sum of their separate gains",
}


def render(table: Table, fmt: str) -> str:
    if fmt not in FORMATS:
        raise choice_error("format", fmt, FORMATS)
    return {"md": to_markdown, "csv": to_csv, "latex": to_latex, "json": to_json}[fmt](table)


def _num(value, signed: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{DIGITS}f}" if signed else f"{value:.{DIGITS}f}"


def effect_cells(row: dict) -> tuple[str, str]:
    """("mean ± sd", "[low, high]") — or ("mean (1 seed)", "–") when there is no spread."""
    if row["n"] < 2 or row["sd"] is None:
        return f"{_num(row['mean'])} (1 seed)", "–"
    return f"{_num(row['mean'])} ± {_num(row['sd'], signed=False)}", f"[{_num(row['ci_low'])}, {_num(row['ci_high'])}]"


def title(table: Table) -> str:
    return TITLES[table.kind].format(reference=table.reference)


def to_markdown(table: Table) -> str:
    key = table.key
    head = ["tier", key, "n", "mean ± sd", "95% CI", "min", "max", "agree"]
    lines = [
        f"## {title(table)} — {table.name}",
        "",
        "Validation loss in nats. " + EXPLAIN[table.kind].format(reference=table.reference) + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for row in table.frame.iter_rows(named=True):
        effect, interval = effect_cells(row)
        label = row[key] if key == "arm" else f"{row[key]} ({DESCRIPTIONS[row[key]]})"
        cells = [row["tier"], label, str(row["n"]), effect, interval, _num(row["min"]), _num(row["max"]),
                 f"{row['agree']}/{row['n']}"]
        lines.append("| " + " | ".join(cells) + " |")
    if table.frame.is_empty():
        lines.append("| " + " | ".join(["–"] * len(head)) + " |")
    lines += ["", "95% CI: Student-t interval over seeds (n − 1 degrees of freedom); sd with ddof 1; "
              "agree: seeds whose difference is positive. Statistics use complete pairs only."]
    lines += _listing("Missing seeds (no run; pairs with them are left out)", _missing_lines(table))
    lines += _listing("Excluded runs (not completed, or no finite val_loss)", [
        f"{r['tier']} {r['arm']} seed {r['seed']}: {r['reason']}" for r in table.excluded.iter_rows(named=True)
    ])
    lines += _listing("Skipped", list(table.notes))
    return "\n".join(lines) + "\n"


def _missing_lines(table: Table) -> list[str]:
    grouped = table.missing.group_by("tier", "arm", maintain_order=True).agg("seed")
    return [
        f"{r['tier']} {r['arm']}: seed{'s' if len(r['seed']) > 1 else ''} {', '.join(map(str, r['seed']))}"
        for r in grouped.iter_rows(named=True)
    ]


def _listing(heading: str, items: list[str]) -> list[str]:
    return ["", f"{heading}:", ""] + [f"- {item}" for item in items] if items else []


def to_csv(table: Table) -> str:
    return table.frame.write_csv(float_precision=None)


def to_json(table: Table) -> str:
    return json.dumps({
        "kind": table.kind,
        "source": table.name,
        "reference": table.reference,
        "columns": table.columns,
        "rows": table.frame.to_dicts(),
        "missing": table.missing.to_dicts(),
        "excluded": table.excluded.to_dicts(),
        "warnings": table.warnings,
    }, indent=2) + "\n"


def to_latex(table: Table) -> str:
    """A booktabs tabular; '1 seed' in place of a spread that does not exist."""
    key = table.key
    lines = [
        f"% {title(table)} — {table.name}; nats; " + EXPLAIN[table.kind].format(reference=table.reference),
        r"\begin{tabular}{llrlllr}",
        r"\toprule",
        f"Tier & {key.capitalize()} & $n$ & Mean $\\pm$ sd & 95\\% CI & Range & Agree \\\\",
        r"\midrule",
    ]
    for row in table.frame.iter_rows(named=True):
        if row["n"] < 2 or row["sd"] is None:
            effect, interval = f"${_num(row['mean'])}$ (1 seed)", "--"
        else:
            effect = f"${_num(row['mean'])} \\pm {_num(row['sd'], signed=False)}$"
            interval = f"$[{_num(row['ci_low'])}, {_num(row['ci_high'])}]$"
        label = _latex_escape(row[key])
        span = f"$[{_num(row['min'])}, {_num(row['max'])}]$"
        lines.append(f"{row['tier']} & {label} & {row['n']} & {effect} & {interval} & {span} & {row['agree']}/{row['n']} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% warning: {_latex_escape(w)}" for w in table.warnings]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    return str(text).replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")
