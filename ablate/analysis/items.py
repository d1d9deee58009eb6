"""Downstream metrics paired by item and by seed: `ablate table SOURCE --metric TASK/METRIC --by-item`.

Every arm of a tier answers the same eval items, so a downstream difference pairs twice. Within one
(tier, seed), the arm's and the reference's item files (`ablate.evals.items`) are joined on `doc_id`;
an item pairs only when both runs carry the same lm-eval `doc_hash` and `prompt_hash` (a differing
hash is refused, naming the task, the item and the runs: the two scored different text). Per item,
Δ = arm − reference when higher is better (accuracies, `gold_logprob`), so positive = the arm is
better; the seed's difference is the mean Δ over the items both runs answered.

A row (tier, arm): `n` seeds, `items` the distinct items paired; mean, sd (ddof 1), se and the 95%
Student-t interval over the seeds' differences, as for losses (`ablate.analysis.stats.summarise`);
`re_low`/`re_high` (`re_df` its degrees of freedom), the reported 95% interval: the wider of a crossed
seed × item random-effects model's (which counts the items' own variance, the same questions in every seed,
that the seed-level interval misses) and the seed-level one (which holds where the seeds dominate and
Satterthwaite's df for the crossed one is too large; `crossed_intervals`); not identified (empty) with one
seed. Every row is exploratory: the declared comparisons are on the loss (p_holm empty, never supported). With
one seed there is no seed spread: sd, se, the interval and p are then the item-level paired ones (Δ
over items, m − 1 degrees of freedom), marked `items-only`: they cover the variance over items, not
over training seeds. Torch-free: numpy, scipy and polars.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np
import polars as pl
from scipy.special import stdtr, stdtrit

from ablate.analysis.escape import latex_text, markdown_cell, markdown_text
from ablate.analysis.render import FORMATS, format_p, to_csv, to_json
from ablate.analysis.runs import Runs, sort_runs
from ablate.analysis.stats import CONFIDENCE, summarise
from ablate.analysis.figures import figure
from ablate.analysis.tables import EXPLORATORY, MARK_NOTES, Table, add_mark, is_pipeline_check
from ablate.errors import AblateError, choice_error
from ablate.evals.items import CORPUS_METRICS, GOLD, item_metrics, read_items
from ablate.evals.results import read_eval, settings_fingerprint, split_metric

MIN_CROSSED_SEEDS = 2  # one seed has no seed spread: the crossed model is not identified
ITEMS_ONLY = "items-only"
MARK_NOTES.setdefault(ITEMS_ONLY, "one seed: sd, se, the 95% CI and p are over the items of "
                                  "that seed only; they cover the variance over items, not over training seeds")
COLUMNS = ("n", "items", "mean", "sd", "se", "ci_low", "ci_high", "re_low", "re_high", "re_df", "min", "max", "agree",
           "p")
SCHEMA = {"tier": pl.String, "arm": pl.String, "seed": pl.Int64, "status": pl.String, "reason": pl.String}


@dataclasses.dataclass
class _Run:
    scores: dict  # doc_id → (doc_hash, prompt_hash, value)
    fingerprint: str
    path: str


def items_table(runs: Runs, metric: str, reference: str = "baseline") -> Table:
    """The by-item paired table of TASK/METRIC: tier, arm, reference, COLUMNS, p_holm, interval_over, marks."""
    task, name = split_metric(metric)
    if runs.root is None:
        raise AblateError("--by-item reads the run folders' eval_items/: give an experiment, not a table file")
    if reference not in runs.arm_order:
        raise AblateError(f"unknown reference arm {reference!r}; arms in {runs.name!r}: {', '.join(runs.arm_order)}")
    scored, excluded, directions = _read_runs(runs, task, name, metric)
    _check_settings(scored, task)
    per_seed, matrices, notes = _pair(scored, task, reference)
    frame = _rows(per_seed, matrices, reference, runs.arm_order)
    higher = directions.get(name, True)
    notes.insert(0, f"metric {metric} by item ({'higher' if higher else 'lower'} is better): Δ per item = "
                    f"{'arm − reference' if higher else 'reference − arm'}, positive means the arm is better; per seed "
                    "the mean Δ over the items both runs answered (equal doc_hash and prompt_hash)")
    used = pl.col("arm").is_in(runs.arm_order)
    gone = pl.DataFrame(excluded, schema=SCHEMA) if excluded else pl.DataFrame(schema=SCHEMA)
    excluded_frame = sort_runs(pl.concat([runs.excluded.select(list(SCHEMA)), gone]), runs.arm_order)
    return Table(kind="by-item", key="arm", frame=frame, name=f"{runs.name} [{metric} by item]", reference=reference,
                 missing=runs.missing.filter(used),
                 excluded=excluded_frame.select("tier", "arm", "seed", "status", "reason"),
                 notes=tuple(notes) + runs.notes_for(runs.arm_order), differences=per_seed)


def _read_runs(runs: Runs, task: str, name: str, metric: str):
    scored, excluded, directions, available, problems = {}, [], {}, set(), []
    for row in runs.completed.filter(pl.col("path").is_not_null()).iter_rows(named=True):
        items, entry, problem = read_items(row["path"], task)
        if items is not None:
            available.update(f"{task}/{m}" for m in item_metrics(items))
            directions.update({m: bool(v.get("higher_is_better")) for m, v in entry["metrics"].items()
                               if v.get("higher_is_better") is not None})
            if any(name not in item for item in items):
                problem = f"its {task} item file has no {name} for every item"
        if problem is not None:
            problems.append(problem)
            excluded.append({"tier": row["tier"], "arm": row["arm"], "seed": row["seed"], "status": row["status"],
                             "reason": problem})
            continue
        sign = 1.0 if directions.get(name, True) else -1.0
        scores = {item["doc_id"]: (item["doc_hash"], item["prompt_hash"], sign * float(item[name])) for item in items}
        scored[(row["tier"], row["arm"], row["seed"])] = _Run(scores, settings_fingerprint(entry["settings"]),
                                                             row["path"])
    if metric not in available:
        if not available:
            first = f" (e.g. {problems[0]})" if problems else ""
            raise AblateError(f"no counted run has per-item results of {task}{first}: run `ablate eval ... --tasks "
                              f"{task}` on them")
        hint = (f"; {name} is not a mean over items but computed from them ({CORPUS_METRICS[name]}): pair "
                f"{task}/{GOLD} instead") if name in CORPUS_METRICS else ""
        raise AblateError(f"unknown by-item metric {metric!r}; valid by-item metrics: "
                          f"{', '.join(sorted(available))}{hint}")
    return scored, excluded, directions


def _check_settings(scored: dict, task: str) -> None:
    """The runs of one tier are averaged into a row: they must be evaluated under the same settings."""
    first = {}
    for (tier, _, _), run in scored.items():
        other = first.setdefault(tier, run)
        if other.fingerprint != run.fingerprint:
            raise AblateError(f"runs {other.path} and {run.path} are not matched: their {task} evaluations used other "
                              "settings (task version, limit, data or lm-eval version); evaluate both with the same "
                              "settings (`ablate eval`)")


def _pair(scored: dict, task: str, reference: str):
    """Per (tier, arm, seed): the mean item Δ; per (tier, arm): the Δ of each (seed, item) for the crossed interval."""
    rows, matrices, counts = [], defaultdict(dict), defaultdict(dict)
    for (tier, arm, seed), run in scored.items():
        base = scored.get((tier, reference, seed))
        if arm == reference or base is None:
            continue
        deltas = {}
        for doc_id in sorted(run.scores.keys() & base.scores.keys()):
            (arm_doc, arm_prompt, value), (ref_doc, ref_prompt, ref_value) = run.scores[doc_id], base.scores[doc_id]
            if (arm_doc, arm_prompt) != (ref_doc, ref_prompt):
                what = "doc_hash" if arm_doc != ref_doc else "prompt_hash"
                raise AblateError(f"{task} item {doc_id}: runs {run.path} and {base.path} scored different text (their "
                                  f"{what} differs: {(arm_doc if what == 'doc_hash' else arm_prompt)[:12]}… vs "
                                  f"{(ref_doc if what == 'doc_hash' else ref_prompt)[:12]}…), so it cannot be paired; "
                                  "evaluate both on the same task data")
            deltas[doc_id] = value - ref_value
        if not deltas:
            continue
        scale = max(abs(np.mean([run.scores[d][2] for d in deltas])), abs(np.mean([base.scores[d][2] for d in deltas])))
        rows.append({"tier": tier, "arm": arm, "seed": seed, "diff": float(np.mean(list(deltas.values()))),
                     "scale": float(scale), "items": len(deltas)})
        matrices[(tier, arm)][seed] = deltas
        counts[(tier, arm)][seed] = len(deltas)
    notes = [f"{tier} {arm}: the seeds paired different numbers of items ("
             + ", ".join(f"seed {s}: {c}" for s, c in sorted(by_seed.items())) + ")"
             for (tier, arm), by_seed in counts.items() if len(set(by_seed.values())) > 1]
    schema = {"tier": pl.String, "arm": pl.String, "seed": pl.Int64, "diff": pl.Float64, "scale": pl.Float64,
              "items": pl.Int64}
    return pl.DataFrame(rows, schema=schema), matrices, notes


def _rows(per_seed: pl.DataFrame, matrices: dict, reference: str, arm_order) -> pl.DataFrame:
    frame = summarise(per_seed, ["tier", "arm"])
    extra = []
    for tier, arm, n in frame.select("tier", "arm", "n").iter_rows():
        by_seed = matrices[(tier, arm)]
        item_ids = sorted(set().union(*by_seed.values()))
        row = {"tier": tier, "arm": arm, "items": len(item_ids)}
        row.update(crossed_interval(by_seed, item_ids))
        if n == 1:
            row.update(_item_level(np.array(list(next(iter(by_seed.values())).values()))))
        extra.append(row)
    schema = {"tier": pl.String, "arm": pl.String, "items": pl.Int64, "re_low": pl.Float64, "re_high": pl.Float64,
              "re_df": pl.Float64, "re_items": pl.Int64,
              **{k: pl.Float64 for k in ("sd_i", "se_i", "ci_low_i", "ci_high_i", "p_i")}}
    joined = frame.join(pl.DataFrame(extra, schema=schema), on=["tier", "arm"], how="left")
    one = pl.col("n") == 1
    joined = joined.with_columns(*[pl.when(one).then(pl.col(f"{c}_i")).otherwise(pl.col(c)).alias(c)
                                   for c in ("sd", "se", "ci_low", "ci_high", "p")],
                                 interval_over=pl.when(one).then(pl.lit("items")).otherwise(pl.lit("seeds")))
    joined = joined.with_columns(reference=pl.lit(reference), marks=pl.lit(None, dtype=pl.String))
    joined = sort_runs(joined, arm_order).select("tier", "arm", "reference", *COLUMNS, "interval_over", "marks")
    joined = joined.with_columns(p_holm=pl.lit(None, dtype=pl.Float64)).select(
        "tier", "arm", "reference", *COLUMNS, "p_holm", "interval_over", "marks")
    joined = add_mark(add_mark(joined, pl.lit(True), EXPLORATORY), one, ITEMS_ONLY)
    checks = [t for t in joined["tier"].unique().to_list() if is_pipeline_check(t)]
    return add_mark(joined, pl.col("tier").is_in(checks), "pipeline-check") if checks else joined


def _item_level(deltas: np.ndarray) -> dict:
    """One seed: the paired t statistics over its items (sd ddof 1, se, 95% t interval, two-sided p)."""
    m = len(deltas)
    if m < 2:
        return {"sd_i": None, "se_i": None, "ci_low_i": None, "ci_high_i": None, "p_i": None}
    mean, sd = float(deltas.mean()), float(deltas.std(ddof=1))
    se = sd / math.sqrt(m)
    half = float(stdtrit(m - 1, 0.5 + CONFIDENCE / 2)) * se
    p = float(2.0 * stdtr(m - 1, -abs(mean / se))) if se > 0 else None
    return {"sd_i": sd, "se_i": se, "ci_low_i": mean - half, "ci_high_i": mean + half, "p_i": p}


def crossed_interval(by_seed: dict, item_ids: list) -> dict:
    """The reported 95% interval of the mean Δ: the wider of the crossed seed × item one and the seed-level one
    (`crossed_intervals`), on the items every seed paired; None with fewer than MIN_CROSSED_SEEDS seeds or 2 items."""
    seeds = sorted(by_seed)
    common = [d for d in item_ids if all(d in by_seed[s] for s in seeds)]
    n, m = len(seeds), len(common)
    none = {"re_low": None, "re_high": None, "re_df": None, "re_items": m}
    if n < MIN_CROSSED_SEEDS or m < 2:
        return none
    y = np.array([[by_seed[s][d] for d in common] for s in seeds], dtype=float)
    low, high, df = (float(v) for v in crossed_intervals(y))
    if not math.isfinite(low):
        return none
    return {"re_low": low, "re_high": high, "re_df": df, "re_items": m}


def crossed_intervals(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, df) of the 95% interval of the mean of Δ matrices y (..., n seeds, m items), vectorised over
    the leading axes; NaN where there is no spread.

    Δ_si = μ + a_s + b_i + e_si (seed effects a, item effects b, residual e, all independent normal): the items
    are the same questions for every seed, so the seed means share the item effects and their spread alone
    misses σ_b²/m. The two-way ANOVA mean squares MS_S (n − 1 df), MS_I (m − 1 df) and MS_E ((n − 1)(m − 1) df)
    give Var(mean) = (MS_S + MS_I − MS_E)/(nm), unbiased, with Satterthwaite's df (MS_S + MS_I − MS_E)² /
    (MS_S²/(n−1) + MS_I²/(m−1) + MS_E²/((n−1)(m−1))): the *crossed* interval. With two or three seeds and the
    seeds dominating, Satterthwaite's df is far too large (MS_I's many df outweigh MS_S's one or two) and the
    crossed interval undercovers (0.868 at 2 seeds); the *seed-level* interval, mean ± t_{n−1}·√(MS_S/(nm)),
    misses the items' variance where they dominate. The wider of the two is reported: it covers ≥ 0.93 at every
    mix measured (tests/test_items_coverage.py; docs/method.md gives the figures)."""
    y = np.asarray(y, dtype=float)
    n, m = y.shape[-2], y.shape[-1]
    grand = y.mean(axis=(-2, -1))
    seed_means, item_means = y.mean(axis=-1), y.mean(axis=-2)
    ms_s = m * ((seed_means - grand[..., None]) ** 2).sum(-1) / (n - 1)
    ms_i = n * ((item_means - grand[..., None]) ** 2).sum(-1) / (m - 1)
    resid = y - seed_means[..., :, None] - item_means[..., None, :] + grand[..., None, None]
    ms_e = (resid ** 2).sum(axis=(-2, -1)) / ((n - 1) * (m - 1))
    combined = np.maximum(ms_s + ms_i - ms_e, ms_s)  # the item part estimated ≤ 0: the seed means' variance alone
    with np.errstate(divide="ignore", invalid="ignore"):
        crossed_df = np.where(combined > ms_s, combined ** 2 / (ms_s ** 2 / (n - 1) + ms_i ** 2 / (m - 1)
                                                               + ms_e ** 2 / ((n - 1) * (m - 1))), n - 1.0)
    quantile = 0.5 + CONFIDENCE / 2
    crossed = stdtrit(crossed_df, quantile) * np.sqrt(combined / (n * m))
    seed_level = float(stdtrit(n - 1, quantile)) * np.sqrt(ms_s / (n * m))
    half = np.maximum(crossed, seed_level)
    df = np.where(crossed >= seed_level, crossed_df, n - 1.0)
    half = np.where(half > 0, half, np.nan)
    return grand - half, grand + half, df


def render_items(table: Table, fmt: str) -> str:
    if fmt not in FORMATS:
        raise choice_error("format", fmt, FORMATS)
    if fmt == "csv":
        return to_csv(table)
    if fmt == "json":
        return to_json(table)
    return _latex(table) if fmt == "latex" else _markdown(table)


TITLE = "Paired by item and seed against {reference}"
FOOTER = ("n: seeds; items: items paired (equal doc_hash and prompt_hash in both runs). mean: over seeds of each "
          "seed's mean item Δ; sd (ddof 1), se = sd/√n, 95% CI (Student-t, n − 1 degrees of freedom) and p (two-sided "
          "t-test against 0) over seeds, as for losses; crossed 95%: the wider of the seed × item random-effects "
          "interval (two-way ANOVA, Satterthwaite df), which counts the items' variance, and the seed-level one "
          "(n − 1 df) on the items every seed paired; \"not identified\" with one seed. Every row "
          "is exploratory: "
          "no declared comparison is on a downstream metric, so p_holm is empty and nothing is called supported. With "
          "one seed (interval over items) every spread is over that seed's items only.")


def _n(value, signed: bool = True) -> str:
    return figure(value, signed)


def _cells(row: dict) -> list[str]:
    spread = "–" if row["sd"] is None else _n(row["sd"], signed=False)
    over = " (1 seed: over items)" if row["interval_over"] == "items" else ""
    return [row["tier"], row["arm"], str(row["n"]), str(row["items"]), f"{_n(row['mean'])} ± {spread}{over}",
            _n(row["se"], signed=False), f"[{_n(row['ci_low'])}, {_n(row['ci_high'])}]",
            ("not identified" if row["re_low"] is None else f"[{_n(row['re_low'])}, {_n(row['re_high'])}] "
                                                            f"({row['re_df']:.0f} df)"), f"{row['agree']}/{row['n']}",
            format_p(row["p"]),
            format_p(row["p_holm"]), (row["marks"] or "").replace(",", ", ")]


HEAD = ["tier", "arm", "n", "items", "mean ± sd", "se", "95% CI", "crossed 95%", "agree", "p", "p_holm", "marks"]


def _markdown(table: Table) -> str:
    lines = [markdown_text(f"## {TITLE.format(reference=table.reference)} — {table.name}"), "",
             "| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
    lines += ["| " + " | ".join(markdown_cell(c) for c in _cells(row)) + " |"
              for row in table.frame.iter_rows(named=True)]
    if table.frame.is_empty():
        lines.append("| " + " | ".join(["–"] * len(HEAD)) + " |")
    lines += ["", FOOTER]
    if table.warnings:
        lines += ["", "Notes:", ""] + [f"- {markdown_text(w)}" for w in table.warnings]
    return "\n".join(lines) + "\n"


def _latex(table: Table) -> str:
    lines = ["% " + latex_text(f"{TITLE.format(reference=table.reference)} — {table.name}"),
             "\\begin{tabular}{llrr" + "l" * (len(HEAD) - 4) + "}", r"\toprule",
             " & ".join(latex_text(h) for h in HEAD) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_text(c) for c in _cells(row)) + r" \\" for row in table.frame.iter_rows(named=True)]
    lines += [r"\bottomrule", r"\end{tabular}", "% " + latex_text(FOOTER)]
    return "\n".join(lines + [f"% warning: {latex_text(w)}" for w in table.warnings]) + "\n"


def item_tasks(folders) -> dict[str, list[str]]:
    """{task: its by-item metrics} over the run folders whose item files score their final weights (the report)."""
    found = defaultdict(set)
    for folder in folders:
        for task in sorted(read_eval(folder)["tasks"]):
            items, _, _ = read_items(folder, task)
            if items is not None:
                found[task].update(item_metrics(items))
    return {task: sorted(metrics) for task, metrics in sorted(found.items())}

