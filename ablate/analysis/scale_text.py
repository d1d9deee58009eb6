"""The scale model as text: the headline sentences (each written from the table alone, with its figure) and
the table in md, csv, json or latex (`ablate table SOURCE --kind scale`, the report's Scale section)."""

from __future__ import annotations

import json

import polars as pl

from ablate.analysis.scale import (CROSSING_COLUMNS, EXPLORATORY, GAP_DESCRIPTIONS, GAPS, ScaleTable, _p, _params)
from ablate.analysis.scale_family import NO_DECLARATIONS, NOT_SUPPORTED, SUPPORTED
from ablate.analysis.figures import figure
from ablate.analysis.escape import latex_text, markdown_cell, markdown_text
from ablate.increments import DESCRIPTIONS
from ablate.errors import choice_error


def describe(quantity: str) -> str:
    if quantity in GAPS:
        return GAP_DESCRIPTIONS[quantity]
    return f"{quantity} ({DESCRIPTIONS[quantity]})" if quantity in DESCRIPTIONS else quantity


def trend_sentence(row: dict, unit: str = "nats") -> str:
    """The row in words, naming its estimand: the slope "as a law of N" (the law interval, `law_low`/`law_high`:
    tiers as draws around a line in log N) and "across these T tier recipes" (the recipe interval, exact for the
    weighted line through these tiers' means). A slope in the family shrinks or grows with scale only when it
    is supported (its law p, Holm-adjusted: p_holm < 0.05); an exploratory one (in no family) is read from its
    unadjusted intervals and says so."""
    what = describe(row["quantity"])
    if row["slope_per_decade"] is None:
        return f"{what}: no trend (fewer than two tiers of known size)"
    tiers = len(row["tiers"])
    slope = f"{figure(row['slope_per_decade'])} {unit} per decade of parameters"
    decision = row.get("decision") or EXPLORATORY
    if row["p"] is None:
        return (f"{what}: {slope} across these {tiers} tier recipes, with no interval (no tier has two or more seeds "
                f"with a spread), and none as a law of N; {decision}")
    recipe = (f"across these {tiers} tier recipes {slope} (95% CI [{figure(row['ci_low'])}, "
              f"{figure(row['ci_high'])}], df {row['df']}, p {_p(row['p'])}, tiers {', '.join(row['tiers'])} with "
              f"{'/'.join(map(str, row['seeds']))} seeds)")
    law = ("as a law of N no interval (fewer than three tiers: no error between tiers)" if row.get("law_p") is None
           else f"as a law of N 95% CI [{figure(row['law_low'])}, {figure(row['law_high'])}], df {row['law_df']}, "
                f"p {_p(row['law_p'])}")
    stats = f"{law}; {recipe}"
    if decision == EXPLORATORY:
        return _exploratory_sentence(what, row, stats)
    adjusted = f"p_holm {_p(row['p_holm'])} in the study-wide family, on the law interval"
    if decision == SUPPORTED:
        verb = "shrinks" if row["slope_per_decade"] < 0 else "grows"
        return f"{what} {verb} with scale as a law of N (supported, {adjusted}): {stats}"
    return f"{what}: no trend supported as a law of N (not supported, {adjusted}): {stats}"


def _direction(low, high) -> str | None:
    if low is None or high is None:
        return None
    return "shrinks" if high < 0 else "grows" if low > 0 else None


def _exploratory_sentence(what: str, row: dict, stats: str) -> str:
    law = _direction(row.get("law_low"), row.get("law_high"))
    recipe = _direction(row["ci_low"], row["ci_high"])
    if law:
        return (f"{what} {law} with scale as a law of N (exploratory: in no family, its unadjusted law interval "
                f"excludes 0): {stats}")
    if recipe:
        return (f"{what} {recipe} across these {len(row['tiers'])} tier recipes, not resolved as a law of N "
                f"(exploratory: in no family, the recipe interval excludes 0, the law interval does not): {stats}")
    return f"{what}: no trend resolved (exploratory: in no family), both intervals contain 0: {stats}"


def scale_intro(table: ScaleTable) -> str:
    """What the report's Scale section says of its rows before them: the model, and the family they are in."""
    return ("From the scale model ([scale.md](scale.md), [json](scale.json)): per quantity, the slope of its paired "
            "difference against log10 of the tier's trained non-embedding parameters (per decade), with two 95% "
            "intervals: across these tier recipes (seeds pooled within tiers: exact for the line through these "
            "tiers' means) and as a law of N (the tiers' scatter about the line counted as error: wider where the "
            "tier means depart from a line). " + family_sentence(table))


def family_sentence(table: ScaleTable) -> str:
    """Which slopes are tested, in what family, and what "supported" means for them."""
    if table.rows["decision"].is_in([SUPPORTED, NOT_SUPPORTED]).any():
        return ("A slope in the family (the declared comparisons' and the gaps') is called shrinking or growing only "
                "as a law of N when it is supported, p_holm < 0.05 of its law-interval p in one Holm family with every "
                "tier's declared comparisons ("
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
        law = (f"as a law of N 95% Fieller interval {_params(crossing['law_low'])}–{_params(crossing['law_high'])}"
               if crossing.get("law_identified") else
               "as a law of N not identified (with the tiers' scatter about the line as error, Fieller's set is not "
               "one bounded interval between tiers with two or more seeds)")
        return (f"across these tier recipes, filtering ({form}) {verb} the zero option at ≈ "
                f"{_params(crossing['params'])} parameters (95% Fieller interval {_params(crossing['ci_low'])}–"
                f"{_params(crossing['ci_high'])}); {law}{decision}")
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
           "trained non-embedding parameters, per decade: least squares over seeds (tier means weighted "
           "by their seeds). Two estimands: the recipe 95% CI, across these tier recipes (spread pooled within "
           "tiers, df = Σ(n_t − 1), exact for the weighted line through these tiers' means), and the law 95% CI, "
           "as a law of N (tiers as draws around a line in log N: of the pure error and the lack-of-fit mean square, "
           "the one with the larger t-scaled half-width, with its df); a family's decision is on the law one. "
           "x is each tier's trained size (the baseline's non-embedding parameters). Pipeline-check "
           "tiers left out. Crossing: where a gap's fitted line is 0, with Fieller's 95% interval across these tier "
           "recipes and as a law of N (the law error), each or both not identified when the set is not one bounded "
           "interval or the crossing is beyond the tiers with two or more seeds or next to a tier with one seed).")


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
                 r"\begin{tabular}{lllrlrlrl}", r"\toprule",
                 r"Quantity & Tiers (seeds) & Slope per decade & df & Recipe 95\% CI & $p$ & Law 95\% CI & "
                 r"$p_\mathrm{Holm}$ & Decision \\",
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
        law = ("–" if r["law_low"] is None
               else f"[{figure(r['law_low'])}, {figure(r['law_high'])}] ({r['law_df']} df, p {_p(r['law_p'])})")
        out.append((describe(r["quantity"]), tiers, slope, r["df"], interval, "–" if r["p"] is None else _p(r["p"]),
                    law, "–" if r["p_holm"] is None else _p(r["p_holm"]), r["decision"]))
    return out


def _markdown(table: ScaleTable) -> str:

    def line(cells) -> str:
        return "| " + " | ".join(markdown_cell(str(c)) for c in cells) + " |"

    lines = [f"## Scale model — {markdown_text(table.name)}", "",
             markdown_text(f"{CAPTION} Slopes in {table.unit} per decade of parameters."), "",
             markdown_text(family_sentence(table)), "",
             line(("quantity", "tiers (seeds)", "slope per decade", "df", "recipe 95% CI", "p", "law 95% CI (df, p)",
                   "p_holm", "decision")),
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [line(row) for row in _text_rows(table)]
    lines += ["", line(("crossing", "params", "recipe 95% interval", "law 95% interval", "identified")),
              "|---|---|---|---|---|"]
    for c in table.crossings.iter_rows(named=True):
        interval = f"{_params(c['ci_low'])}–{_params(c['ci_high'])}" if c["identified"] else "not identified"
        law = f"{_params(c['law_low'])}–{_params(c['law_high'])}" if c["law_identified"] else "not identified"
        lines.append(line((describe(c["quantity"]), "–" if c["params"] is None else _params(c["params"]), interval,
                           law, "yes" if c["identified"] else "no")))
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
