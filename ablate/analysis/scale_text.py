"""The scale model as text: the headline sentences (each written from the table alone, with its figure) and
the table in md, csv, json or latex (`ablate table SOURCE --kind scale`, the report's Scale section)."""

from __future__ import annotations

import json

import polars as pl

from ablate.analysis.scale import (CROSSING_COLUMNS, EXPLORATORY, GAP_DESCRIPTIONS, GAPS, ScaleTable, _p, _params)
from ablate.analysis.scale_family import NO_DECLARATIONS, NOT_SUPPORTED, SUPPORTED
from ablate.analysis.figures import figure
from ablate.analysis.escape import latex_text, markdown_cell, markdown_text
from ablate.analysis.kinds import DESCRIPTIONS
from ablate.errors import choice_error


def describe(quantity: str) -> str:
    if quantity in GAPS:
        return GAP_DESCRIPTIONS[quantity]
    return f"{quantity} ({DESCRIPTIONS[quantity]})" if quantity in DESCRIPTIONS else quantity


def trend_sentence(row: dict, unit: str = "nats") -> str:
    """The row in words, with its decision: a slope in the family shrinks or grows with scale only when it is
    supported (p_holm < 0.05); an exploratory one (in no family) is read from its unadjusted 95% interval and
    says so."""
    what = describe(row["quantity"])
    if row["slope_per_decade"] is None:
        return f"{what}: no trend (fewer than two tiers of known size)"
    slope = f"{figure(row['slope_per_decade'])} {unit} per decade of parameters"
    decision = row.get("decision") or EXPLORATORY
    if row["p"] is None:
        return f"{what}: {slope}, with no interval (no tier has two or more seeds with a spread); {decision}"
    stats = (f"{slope} (95% CI [{figure(row['ci_low'])}, {figure(row['ci_high'])}], df {row['df']}, "
             f"p {_p(row['p'])}, tiers {', '.join(row['tiers'])} with {'/'.join(map(str, row['seeds']))} seeds)")
    direction = "shrinks with scale" if row["ci_high"] < 0 else "grows with scale" if row["ci_low"] > 0 else None
    if decision == EXPLORATORY and direction:
        return f"{what} {direction} (exploratory: in no family, its unadjusted 95% interval excludes 0): {stats}"
    if decision == EXPLORATORY:
        return f"{what}: no trend resolved (exploratory: in no family), the interval contains 0: {stats}"
    adjusted = f"p_holm {_p(row['p_holm'])} in the study-wide family"
    if decision == SUPPORTED:
        verb = "shrinks" if row["slope_per_decade"] < 0 else "grows"
        return f"{what} {verb} with scale (supported, {adjusted}): {stats}"
    return f"{what}: no trend supported (not supported, {adjusted}): {stats}"


def scale_intro(table: ScaleTable) -> str:
    """What the report's Scale section says of its rows before them: the model, and the family they are in."""
    return ("From the scale model ([scale.md](scale.md), [json](scale.json)): per quantity, the slope of its paired "
            "difference against log10 of the tier's nominal non-embedding parameters (per decade, 95% interval, "
            "seeds pooled within tiers). " + family_sentence(table))


def family_sentence(table: ScaleTable) -> str:
    """Which slopes are tested, in what family, and what "supported" means for them."""
    if table.rows["decision"].is_in([SUPPORTED, NOT_SUPPORTED]).any():
        return ("A slope in the family (the declared comparisons' and the gaps') is called shrinking or growing only "
                "when it is supported, p_holm < 0.05 in one Holm family with every tier's declared comparisons ("
                f"{table.family}); every other slope is exploratory: its unadjusted interval, never supported.")
    return (f"Every slope is exploratory ({table.family or NO_DECLARATIONS}); a trend is read from its unadjusted "
            "95% interval.")


def crossing_sentence(table: ScaleTable, crossing: dict) -> str:
    form = GAPS[crossing["quantity"]]
    gap = table.rows.filter(quantity=crossing["quantity"])
    slope = gap["slope_per_decade"].to_list()
    decision = _slope_decision(gap.row(0, named=True)) if gap.height else ""
    if crossing["identified"]:
        verb = "overtakes" if slope and slope[0] > 0 else "falls behind"
        return (f"filtering ({form}) {verb} the zero option at ≈ {_params(crossing['params'])} parameters (95% "
                f"Fieller interval {_params(crossing['ci_low'])}–{_params(crossing['ci_high'])}){decision}")
    reason = next((n.split(": ", 1)[1] for n in table.notes
                   if n.startswith(f"{crossing['quantity']} crossing not identified")), "")
    point = f" (the fitted line crosses 0 at ≈ {_params(crossing['params'])})" if crossing["params"] else ""
    return f"where filtering ({form}) overtakes the zero option is not identified{point}: {reason}{decision}"


def _slope_decision(row: dict) -> str:
    if row["decision"] == EXPLORATORY:
        return "; the gap's slope is exploratory (in no family)"
    return f"; the gap's slope is {row['decision']} (p_holm {'–' if row['p_holm'] is None else _p(row['p_holm'])})"


CAPTION = ("Slope of each paired difference (positive: the quantity is better, e.g. lowers the loss) against log10 "
           "of the tier's "
           "nominal non-embedding parameters, per decade: least squares over seeds (tier means weighted "
           "by their seeds), spread pooled within tiers (df = Σ(n_t − 1)), 95% Student-t interval; pipeline-check "
           "tiers left out. Crossing: where a gap's fitted line is 0, with Fieller's 95% interval, or not "
           "identified (slope not significant, or the crossing beyond the tiers with two or more seeds or next "
           "to a tier with one seed).")


def render_scale(table: ScaleTable, fmt: str) -> str:
    """md, csv, json or latex (the formats of `ablate.analysis.render`)."""

    if fmt == "json":
        return json.dumps({"rows": table.rows.to_dicts(), "crossings": table.crossings.to_dicts(),
                           "confounders": table.confounders.to_dicts(), "family": table.family,
                           "notes": table.warnings}, indent=2) + "\n"
    if fmt == "csv":
        return _flat(table).write_csv(float_precision=None)
    if fmt == "latex":

        lines = [f"% {latex_text('Scale model — ' + table.name + '. ' + CAPTION)}",
                 r"\begin{tabular}{lllrlrrl}", r"\toprule",
                 r"Quantity & Tiers (seeds) & Slope per decade & df & 95\% CI & $p$ & $p_\mathrm{Holm}$ & Decision \\",
                 r"\midrule"]
        for row in _text_rows(table):
            lines.append(" & ".join(latex_text(str(c)) for c in row) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", f"% {latex_text(family_sentence(table))}",
                  *[f"% {latex_text(w)}" for w in table.warnings]]
        return "\n".join(lines) + "\n"
    if fmt == "md":
        return _markdown(table)

    raise choice_error("format", fmt, ("md", "csv", "latex", "json"))


def _text_rows(table: ScaleTable) -> list[tuple]:
    out = []
    for r in table.rows.iter_rows(named=True):
        tiers = ", ".join(f"{t} ({n})" for t, n in zip(r["tiers"], r["seeds"]))
        slope = "–" if r["slope_per_decade"] is None else figure(r['slope_per_decade'])
        interval = "–" if r["ci_low"] is None else f"[{figure(r['ci_low'])}, {figure(r['ci_high'])}]"
        out.append((describe(r["quantity"]), tiers, slope, r["df"], interval, "–" if r["p"] is None else _p(r["p"]),
                    "–" if r["p_holm"] is None else _p(r["p_holm"]), r["decision"]))
    return out


def _markdown(table: ScaleTable) -> str:

    def line(cells) -> str:
        return "| " + " | ".join(markdown_cell(str(c)) for c in cells) + " |"

    lines = [f"## Scale model — {markdown_text(table.name)}", "",
             markdown_text(f"{CAPTION} Slopes in {table.unit} per decade of parameters."), "",
             markdown_text(family_sentence(table)), "",
             line(("quantity", "tiers (seeds)", "slope per decade", "df", "95% CI", "p", "p_holm", "decision")),
             "|---|---|---|---|---|---|---|---|"]
    lines += [line(row) for row in _text_rows(table)]
    lines += ["", line(("crossing", "params", "95% interval", "identified")), "|---|---|---|---|"]
    for c in table.crossings.iter_rows(named=True):
        interval = f"{_params(c['ci_low'])}–{_params(c['ci_high'])}" if c["identified"] else "not identified"
        lines.append(line((describe(c["quantity"]), "–" if c["params"] is None else _params(c["params"]), interval,
                           "yes" if c["identified"] else "no")))
    lines += ["", line(("tier", "tokens per parameter", "learning rate", "batch (sequences × tokens)")),
              "|---|---|---|---|"]
    for r in table.confounders.iter_rows(named=True):
        known = r["lr"] is not None
        lines.append(line((r["tier"], f"{r['tokens_per_param']:.1f}" if known else "unknown",
                           f"{r['lr']:g}" if known else "unknown",
                           f"{r['batch_sequences']} × {r['batch_tokens'] // r['batch_sequences']}" if known
                           else "unknown")))
    lines += ["", "Notes:", "", *[f"- {markdown_text(w)}" for w in table.warnings]]
    return "\n".join(lines) + "\n"


def _flat(table: ScaleTable) -> pl.DataFrame:
    """One CSV: the rows, tiers and seeds joined by '/', with each gap's crossing beside it."""
    crossings = table.crossings.rename({c: f"crossing_{c}" for c in CROSSING_COLUMNS if c != "quantity"})
    rows = table.rows.with_columns(tiers=pl.col("tiers").list.join("/"),
                                   seeds=pl.col("seeds").cast(pl.List(pl.String)).list.join("/"))
    return rows.join(crossings, on="quantity", how="left", maintain_order="left")
