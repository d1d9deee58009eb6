"""The scale model: how each increment changes with model size, and where filtering overtakes the zero option.

The study's headline is a statement about scale ("the zero-option gain shrinks, the filtering gain grows,
filtering overtakes between 50M and 124M"), so the trend itself is the tested quantity, not each tier's
increment against zero.

Model. For one quantity (an increment, a declared comparison, or the gap filtering − zero option, each a paired
difference per seed), d_ts = a + b·x_t + e_ts with x_t = log10(the tier's trained non-embedding parameters: the
baseline's, `ablate.analysis.scale_sizes`, which also says when they cannot carry a decision), over the tiers
that can carry evidence (pipeline-check tiers never enter). Seeds are repeated observations within a tier: the
fit is least squares over every seed, which is weighted least squares of the tier means with weights n_t, so a
tier with one seed contributes its mean (weight 1) and no spread of its own. The spread is the *pooled
within-tier* (pure-error) variance s² = Σ_t Σ_s (d_ts − d̄_t)² / df with df = Σ_t (n_t − 1), from the tiers with
two or more seeds only; the residuals about the line are not used, because the tier means need not lie on a
line, and their lack of fit is not seed noise. With this s² the interval for b is exact (Student t, df) under
normal, equal-variance seed noise *whatever the shape of the true tier means*: b̂ is then unbiased for the
n_t-weighted least-squares slope through them, which is the slope when the truth is a line: the *recipe*
interval ("across these tier recipes"). Read as a *law of N* (tiers as draws around a line in log N, their means
scattering about it by a tier-level τ) it undercovers once the tiers scatter, so each row also has the *law*
interval (`law_interval`: of the pure error and the lack-of-fit mean square, the larger t-scaled half-width, its
df, never narrower), which a family's decision uses. b is reported per decade of parameters. Built here every
slope is exploratory; `ablate.analysis.scale_family` puts the declared comparisons' and the gaps' slopes in the
study-wide Holm family when the experiment declares `family="experiment"` (p_holm, decision, family).

Crossing. Where the gap's fitted line a + b·x crosses 0: x0 = −a/b, with Fieller's interval, the set of x
at which "the line is 0 at x" is not rejected at 5% — {x : (â + b̂x)² ≤ t²·var(â + b̂x)}. That set is a
bounded interval only when b̂ is significant; otherwise it is the whole axis or two rays, and the crossing
is "not identified". It is also not identified when the fitted crossing is not between two adjacent tiers
that both have two or more seeds (beyond the measured range, or next to a tier with one seed): there it
rests on an extrapolation or on a mean with no spread of its own. (Requiring the whole *interval* inside
that span was measured too and rejected: it selects intervals that sit to one side of the truth, and
covers 0.82 with the reference effects at seed sd 0.004.) docs/method.md
gives the measured coverage (tests/test_analysis_scale.py simulates it with the study's reference effects).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.special import fdtrc

from ablate.analysis.hypotheses import comparison_differences
from ablate.analysis.scale_core import (CONFIDENCE, LineFit, fieller, fit_lines, identified_crossings,  # noqa: F401
                                        lack_mean_square, law_interval, law_variance, replicated_bracket,
                                        slope_interval)
from ablate.analysis.scale_sizes import NOMINAL, TierSizes, trained_sizes
from ablate.analysis.stats import RESOLUTION
from ablate.analysis.tables import increments_table, is_pipeline_check
from ablate.increments import GAPS, INCREMENTS, ZERO_OPTION
from ablate.tiers import TIERS, tier_rank

SCALE = "scale"
GAP_DESCRIPTIONS = {gap: f"{gap} ({form} − {ZERO_OPTION})" for gap, form in GAPS.items()}
ROW_COLUMNS = ("quantity", "tiers", "seeds", "slope_per_decade", "ci_low", "ci_high", "df", "p", "law_low", "law_high",
               "law_df", "law_p", "p_holm", "decision", "family")
EXPLORATORY = "exploratory"  # a row's decision when its slope is in no family (`ablate.analysis.scale_family`)
CROSSING_COLUMNS = ("quantity", "params", "ci_low", "ci_high", "identified", "law_low", "law_high", "law_identified")


# ------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class ScaleTable:
    """The scale model of one source: `rows` (ROW_COLUMNS), `crossings` (CROSSING_COLUMNS), `confounders`
    (per tier what else changes with scale) and `notes` (why a quantity or crossing has no interval).
    `family`: the family the slopes' p_holm adjusts over, or why every slope is exploratory
    (`ablate.analysis.scale_family`; built here, every row is exploratory)."""

    name: str
    rows: pl.DataFrame
    crossings: pl.DataFrame
    confounders: pl.DataFrame
    notes: tuple[str, ...] = ()
    kind: str = SCALE
    unit: str = "nats"  # of the differences: nats of val_loss, or the `ablate eval` metric's own units
    family: str | None = None
    unsized: str | None = None  # why the tiers' trained sizes cannot carry a decision (`scale_sizes`), or None

    @property
    def warnings(self) -> list[str]:
        """What a reader of the numbers must also know (the CLI prints it beside CSV and LaTeX)."""
        return [*self.notes, *([confounder_sentence(self)] if confounded(self) else [])]


def per_tier(per_seed: pl.DataFrame) -> tuple[list[str], np.ndarray, np.ndarray, float, float]:
    """(tiers by size, seeds per tier, tier means, within-tier sum of squares, the largest |diff|) of one
    quantity's per-seed rows (tier, diff), real tiers of known size only."""
    kept = per_seed.filter(pl.col("diff").is_not_null() & pl.col("diff").is_finite())
    tiers = slope_tiers(kept["tier"].to_list())[0]
    counts, means, within = [], [], 0.0
    for tier in tiers:
        values = np.sort(kept.filter(tier=tier)["diff"].to_numpy().astype(float))
        counts.append(values.size)
        means.append(values.mean())
        within += float(((values - values.mean()) ** 2).sum())
    biggest = float(kept["diff"].abs().max() or 0.0) if kept.height else 0.0
    return tiers, np.array(counts), np.array(means), within, biggest


def slope_tiers(names) -> tuple[list[str], list[str]]:
    """(the tiers a slope spans, by size; the real tiers left out because they are of another task).

    A slope is a trend over model size within one task: a toy task's tier next to corpus tiers adds a point of
    another experiment (its loss, its effect), and one such tier can make a flat corpus trend "supported". So a
    slope spans the corpus tiers of known size when there are any, else the task tiers when all are of one task,
    else nothing; pipeline-check tiers never enter."""
    real = sorted({t for t in names if math.isfinite(tier_rank(t)) and not is_pipeline_check(t)}, key=tier_rank)
    tasks = {t: TIERS[t].task if t in TIERS else None for t in real}
    corpus = [t for t in real if tasks[t] is None]
    kept = corpus if corpus else (real if len(set(tasks.values())) == 1 else [])
    return kept, [t for t in real if t not in kept]


def lack_of_fit(fit: LineFit, log_sizes: np.ndarray, counts: np.ndarray, means: np.ndarray) -> float | None:
    """p of the lack-of-fit F test (tier means about the line against the pooled seed spread; df T − 2 and
    fit.df); None with fewer than three tiers or no spread. A small p says the means are not on a line:
    the slope is then the trend of the least-squares line, not a description of every tier."""

    tiers = len(log_sizes)
    if tiers < 3 or fit.df == 0 or not fit.s2 > 0:
        return None
    line = fit.level + fit.slope * (np.asarray(log_sizes) - fit.center)
    statistic = float((counts * (means - line) ** 2).sum()) / (tiers - 2) / float(fit.s2)
    return float(fdtrc(tiers - 2, fit.df, statistic))


@dataclass(frozen=True)
class QuantityFit:
    """One quantity's scale model: its table row (ROW_COLUMNS less quantity; the private `_lack_of_fit` is the p
    of `lack_of_fit`, not a column), the fit (None when fewer than two tiers, or the tiers' sizes not distinct),
    and the tiers (by size), their seed counts, means and log10 sizes (the model's x)."""

    row: dict
    fit: LineFit | None
    tiers: list[str]
    counts: np.ndarray
    means: np.ndarray
    log_sizes: np.ndarray


def fit_quantity(per_seed: pl.DataFrame, sizes: TierSizes = NOMINAL) -> QuantityFit:
    """The scale model of one quantity's per-seed rows (tier, diff), x = log10 of each tier's size in `sizes`
    (`ablate.analysis.scale_sizes`: the trained sizes; by default the nominal ones)."""

    tiers, counts, means, within, biggest = per_tier(per_seed)
    row = {"tiers": tiers, "seeds": [int(c) for c in counts], "slope_per_decade": None, "ci_low": None,
           "ci_high": None, "df": int((counts - 1).sum()) if len(tiers) else 0, "p": None, "law_low": None,
           "law_high": None, "law_df": None, "law_p": None}
    log_sizes = sizes.log10(tiers) if tiers else np.array([])
    if len(tiers) < 2 or not sizes.distinct:
        return QuantityFit(row, None, tiers, counts, means, log_sizes)
    if within <= (RESOLUTION * max(biggest, 1.0)) ** 2 * max(row["df"], 1):
        within = 0.0  # a spread at float resolution is no spread (as in ablate.analysis.stats.summarise)
    fit = fit_lines(log_sizes, counts, means, within)
    low, high, p = slope_interval(fit)
    row["slope_per_decade"] = float(fit.slope)
    row["_lack_of_fit"] = lack_of_fit(fit, log_sizes, counts, means)
    if np.isfinite(p):
        row.update(ci_low=float(low), ci_high=float(high), p=float(p))
    law_low, law_high, law_df, law_p = law_interval(fit, log_sizes, counts, means)
    if np.isfinite(law_p):
        row.update(law_low=float(law_low), law_high=float(law_high), law_df=int(law_df), law_p=float(law_p))
    return QuantityFit(row, fit, tiers, counts, means, log_sizes)


def crossing_of(quantity: QuantityFit) -> tuple[dict, str | None]:
    """The crossing row (CROSSING_COLUMNS less quantity) and, when the recipe interval is not identified, why.
    Two Fieller intervals: across these tier recipes (`ci_low`/`ci_high`: the pure error) and as a law of N
    (`law_low`/`law_high`: the law error of `law_variance`, three or more tiers), each identified on its own
    (`identified`, `law_identified`: its set bounded and the root between two adjacent tiers with two or more
    seeds)."""
    fit, tiers, counts = quantity.fit, quantity.tiers, quantity.counts
    row = {"params": None, "ci_low": None, "ci_high": None, "identified": False, "law_low": None, "law_high": None,
           "law_identified": False}
    if fit is None:
        return row, "fewer than two tiers of distinct size"
    sizes = quantity.log_sizes
    root, low, high, identified = (np.asarray(v) for v in identified_crossings(fit, sizes, counts))
    _, law_low, law_high, law_identified = identified_crossings(fit, sizes, counts, quantity.means)
    if bool(law_identified):
        row.update(law_low=float(10**law_low), law_high=float(10**law_high), law_identified=True)
    bounded = np.isfinite(low)
    row["params"] = float(10**root) if np.isfinite(root) else None
    if fit.df == 0 or not fit.s2 > 0:
        return row, "no tier has two or more seeds with a spread, so the line has no error estimate"
    if not bounded:
        return row, ("the slope is not significant at 5%, so Fieller's 95% set is not one bounded interval "
                     "(the whole axis or two rays)")
    if not identified:
        single = [t for t, n in zip(tiers, counts) if n < 2]
        return row, (f"the fitted crossing ({_params(10**root)}) is not between two adjacent tiers that both have two "
                     f"or more seeds (it is outside {tiers[0]}–{tiers[-1]}"
                     + (f", or next to a tier with one seed: {', '.join(single)})" if single else ")"))
    row.update(ci_low=float(10**low), ci_high=float(10**high), identified=True)
    return row, None


def confounders(tiers: list[str]) -> pl.DataFrame:
    """Per tier what changes with scale besides the parameters (from the tier ladder; null when unknown)."""
    rows = []
    for tier in tiers:
        known = TIERS.get(tier)
        rows.append({"tier": tier, "params": tier_rank(tier),
                     "tokens_per_param": known.tokens / known.nominal_params if known else None,
                     "lr": known.lr if known else None,
                     "batch_sequences": known.global_batch if known else None,
                     "batch_tokens": known.tokens_per_step if known else None})
    schema = {"tier": pl.String, "params": pl.Float64, "tokens_per_param": pl.Float64, "lr": pl.Float64,
              "batch_sequences": pl.Int64, "batch_tokens": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def _params(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}"


def quantities(increments: pl.DataFrame, comparisons: pl.DataFrame | None) -> dict[str, pl.DataFrame]:
    """quantity → per-seed rows (tier, seed, diff): the increments, the declared comparisons and the gaps
    filtering − zero option (per seed: both from that seed's matched runs)."""
    out = {q: increments.filter(quantity=q).select("tier", "seed", "diff")
           for q in INCREMENTS if not increments.filter(quantity=q).is_empty()}
    if comparisons is not None:
        for name in comparisons["comparison"].unique(maintain_order=True).to_list():
            out.setdefault(name, comparisons.filter(comparison=name).select("tier", "seed", "diff"))
    for gap, form in GAPS.items():
        if form in out and ZERO_OPTION in out:
            joined = out[form].join(out[ZERO_OPTION], on=["tier", "seed"], suffix="_zero")
            out[gap] = joined.select("tier", "seed", (pl.col("diff") - pl.col("diff_zero")).alias("diff"))
    return out


def scale_table(runs, declared=None) -> ScaleTable:
    """The scale model of every increment, declared comparison and gap of `runs` (`ablate.analysis.runs.Runs`);
    `declared`: the experiment's declared comparisons (`ablate.analysis.hypotheses.Declared`) or None."""

    increments = increments_table(runs)
    comparisons = comparison_differences(runs, declared)[0] if declared is not None and declared.comparisons else None
    table = scale_from_differences(runs.name, increments.differences, comparisons, increments.notes,
                                   sizes_of(runs))
    return table if runs.metric is None else dataclasses.replace(table, unit=f"units of {runs.metric}")


def sizes_of(runs) -> TierSizes:
    """The trained sizes of the tiers `runs`' slopes span (`ablate.analysis.scale_sizes`), from its baseline's runs
    (the first arm's when it has no baseline)."""
    reference = "baseline" if "baseline" in runs.arm_order else (runs.arm_order or [""])[0]
    return trained_sizes(runs.frame, slope_tiers(runs.frame["tier"].to_list())[0], reference)


def scale_from_differences(name: str, increments: pl.DataFrame, comparisons: pl.DataFrame | None = None,
                           notes: tuple[str, ...] = (), sizes: TierSizes = NOMINAL) -> ScaleTable:
    """The table from per-seed rows: increments (tier, quantity, seed, diff), comparisons (tier, comparison,
    seed, diff) or None; x the tiers' `sizes` (`ablate.analysis.scale_sizes`; by default the nominal ones,
    unchecked)."""
    rows, crossings, why, used = [], [], list(notes), set()
    left_out = slope_tiers(increments["tier"].to_list() + (comparisons["tier"].to_list() if comparisons is not None
                                                          else []))[1]
    if sizes.problem:
        why.append(f"Scale model's x: {sizes.problem}")
    if left_out:
        why.append(f"{', '.join(left_out)} left out of every slope: a slope spans the corpus tiers of one task "
                   f"(the tiers of a synthetic task are another experiment, not another model size)")
    for quantity, per_seed in quantities(increments, comparisons).items():
        fitted = fit_quantity(per_seed, sizes)
        row, fit, tiers = fitted.row, fitted.fit, fitted.tiers
        used.update(tiers)
        misfit = row.pop("_lack_of_fit", None)
        if misfit is not None and misfit < 0.05:
            why.append(f"{quantity}: the tier means depart from a line (lack-of-fit F test p {_p(misfit)}): the "
                       "slope is the trend of the least-squares line through them, not a description of every tier; "
                       "the law interval takes that scatter as its error")
        rows.append({"quantity": quantity, **row, "p_holm": None, "decision": EXPLORATORY, "family": None})
        if row["p"] is None and (sizes.distinct or len(tiers) < 2):
            why.append(f"{quantity}: no slope interval (" + ("fewer than two real tiers of known size; pipeline-check "
                                                             "tiers never enter" if fit is None else
                       "no tier has two or more seeds with a spread") + ")")
        if quantity in GAPS:
            crossing, reason = crossing_of(fitted)
            crossings.append({"quantity": quantity, **crossing})
            if reason:
                why.append(f"{quantity} crossing not identified: {reason}")
    row_schema = {"quantity": pl.String, "tiers": pl.List(pl.String), "seeds": pl.List(pl.Int64),
                  "slope_per_decade": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "df": pl.Int64,
                  "p": pl.Float64, "law_low": pl.Float64, "law_high": pl.Float64, "law_df": pl.Int64,
                  "law_p": pl.Float64, "p_holm": pl.Float64, "decision": pl.String, "family": pl.String}
    crossing_schema = {"quantity": pl.String, "params": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
                       "identified": pl.Boolean, "law_low": pl.Float64, "law_high": pl.Float64,
                       "law_identified": pl.Boolean}
    return ScaleTable(name, pl.DataFrame(rows, schema=row_schema), pl.DataFrame(crossings, schema=crossing_schema),
                      confounders(sorted(used, key=tier_rank)), tuple(why), unsized=sizes.problem)


def confounded(table: ScaleTable | None) -> bool:
    """Whether the table spans tiers whose recipes can differ (two or more): with one, there is nothing to say."""
    return table is not None and table.confounders.height >= 2


def confounder_sentence(table: ScaleTable) -> str:
    """What besides the parameters differs between the table's tiers (`confounded` says whether there is any)."""
    parts = []
    for r in table.confounders.iter_rows(named=True):
        if r["lr"] is None:
            parts.append(f"{r['tier']} unknown to the tier ladder")
            continue
        parts.append(f"{r['tier']} {r['tokens_per_param']:.1f} tokens per parameter, lr {r['lr']:g}, batch "
                     f"{r['batch_sequences']} × {r['batch_tokens'] // r['batch_sequences']} tokens")
    return ("Scale is confounded: besides the parameters, the tiers differ in tokens per nominal parameter, "
            "learning rate and batch (" + "; ".join(parts) + "), so a slope is the trend of the whole tier recipe, "
            "not of size alone")


def _p(p: float) -> str:
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"
