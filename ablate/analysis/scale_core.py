"""The scale model's vectorised core: the line over seeds, its recipe and law intervals, and Fieller's set for its
root (arrays broadcast over leading axes, so a simulation of many studies runs them at once). The model, the
estimands and the measured coverage are `ablate.analysis.scale`'s docstring and docs/method.md, "Scale model"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr, stdtrit

from ablate.power import law_error

CONFIDENCE = 0.95


@dataclass(frozen=True)
class LineFit:
    """Least squares over seeds of one quantity, centred at the seeds' mean log size (arrays broadcast over
    any leading axes, e.g. simulation repetitions): line(x) = level + slope·(x − center)."""

    center: float
    weight: float  # total seeds W
    sxx: float  # Σ_t n_t (x_t − center)²
    level: np.ndarray  # grand mean of the seeds (the line at `center`)
    slope: np.ndarray  # per decade
    s2: np.ndarray  # pooled within-tier variance (NaN when df = 0)
    df: int

    @property
    def se_slope(self) -> np.ndarray:
        return np.sqrt(self.s2 / self.sxx)

    def t_quantile(self) -> float:
        return float(stdtrit(self.df, 0.5 + CONFIDENCE / 2)) if self.df > 0 else math.nan


def fit_lines(log_sizes: np.ndarray, counts: np.ndarray, means: np.ndarray, within_ss: np.ndarray) -> LineFit:
    """The fit from per-tier means (..., T) and the within-tier sum of squares (...); needs ≥ 2 distinct sizes."""
    x, n = np.asarray(log_sizes, float), np.asarray(counts, float)
    weight = n.sum()
    center = float((n * x).sum() / weight)
    sxx = float((n * (x - center) ** 2).sum())
    means = np.asarray(means, float)
    df = int((n - 1).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.asarray(within_ss, float) / df if df > 0 else np.full(np.shape(within_ss), np.nan)
    return LineFit(center, float(weight), sxx, (means * n).sum(-1) / weight,
                   (means * n * (x - center)).sum(-1) / sxx, s2, df)


def slope_interval(fit: LineFit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, two-sided p) of the slope; NaN without a spread (df = 0 or s² = 0)."""
    se = fit.se_slope
    half = fit.t_quantile() * se
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 2.0 * stdtr(max(fit.df, 1), -np.abs(fit.slope / se))
    p = np.where((se > 0) & np.isfinite(se), p, np.nan)
    return fit.slope - half, fit.slope + half, p


def lack_mean_square(fit: LineFit, log_sizes: np.ndarray, counts: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Σ n_t (d̄_t − line_t)²/(T − 2): the tier means' scatter about the fitted line (needs ≥ 3 tiers)."""
    x, n = np.asarray(log_sizes, float), np.asarray(counts, float)
    line = fit.level[..., None] + fit.slope[..., None] * (x - fit.center)
    return (n * (np.asarray(means, float) - line) ** 2).sum(-1) / (x.size - 2)


def law_variance(fit: LineFit, lack: np.ndarray, tiers: int) -> tuple[np.ndarray, np.ndarray]:
    """(t²·s², df) of the law of N at CONFIDENCE: of the pure error and the lack of fit, the one with the larger
    t-scaled half-width (`ablate.power.law_error`). The slope's half-width is √(t²s²/Sxx); the crossing's Fieller
    set with it is the union of the two errors' sets (a larger t²s² gives a set that holds the smaller one's)."""
    s2, df = law_error(fit.s2, fit.df, lack, tiers, CONFIDENCE)
    with np.errstate(invalid="ignore"):
        return stdtrit(df, 0.5 + CONFIDENCE / 2) ** 2 * s2, df


def law_interval(fit: LineFit, log_sizes: np.ndarray, counts: np.ndarray, means: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, df, two-sided p) of the slope *as a law of N*: the tiers as draws around a line in log N, the
    tier means scattering about it by a tier-level τ besides the seeds' noise. Two errors can carry it: the pure
    (within-tier) error on Σ(n_t − 1) df and the lack-of-fit mean square Σ n_t (d̄_t − line_t)²/(T − 2) on T − 2;
    the interval is the one of the larger *t-scaled half-width* (`law_variance`), with that one's df, so it is
    never narrower than the recipe interval (`slope_interval`). Its p is the larger of the two t tests' p: the
    interval at level 1 − α excludes 0 exactly when both reject, so p < α and "the 1 − α interval excludes 0"
    agree at every α. NaN with fewer than three tiers (no lack-of-fit df: a law through two points has no error
    estimate). Vectorised like `fit_lines` (means: (..., T))."""
    tiers = np.asarray(log_sizes).size
    recipe_low, recipe_high, recipe_p = slope_interval(fit)
    if tiers < 3:
        nan = np.full(np.shape(fit.slope), np.nan)
        return nan, nan, nan, nan
    lack = lack_mean_square(fit, log_sizes, counts, means)
    _, df = law_variance(fit, lack, tiers)
    with np.errstate(divide="ignore", invalid="ignore"):
        lack_se = np.sqrt(lack / fit.sxx)
        lack_half = stdtrit(tiers - 2, 0.5 + CONFIDENCE / 2) * lack_se
        lack_p = np.where(lack_se > 0, 2.0 * stdtr(tiers - 2, -np.abs(fit.slope / lack_se)), np.nan)
    half = np.fmax(lack_half, (recipe_high - recipe_low) / 2)  # the larger t-scaled half-width
    return fit.slope - half, fit.slope + half, df, np.fmax(lack_p, recipe_p)


def fieller(fit: LineFit, scaled_variance: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(root, low, high, bounded) in log10 parameters: the root of the line and Fieller's 95% set for it,
    low/high NaN where the set is not one bounded interval (the slope not significant, or no spread).
    `scaled_variance`: t²·s² of the error the set is built on; default the pure error's (the recipe set),
    `law_variance`'s for the law of N."""
    k = fit.t_quantile() ** 2 * fit.s2 if scaled_variance is None else np.asarray(scaled_variance, float)
    level, slope = fit.level, fit.slope
    with np.errstate(divide="ignore", invalid="ignore"):
        root = fit.center - level / slope
        a = slope**2 - k / fit.sxx
        b = 2.0 * level * slope
        c = level**2 - k / fit.weight
        bounded = (a > 0) & np.isfinite(a) & (k > 0)
        half = np.sqrt(np.where(bounded, b * b - 4 * a * c, np.nan)) / (2 * a)
        middle = fit.center - b / (2 * a)
    return root, np.where(bounded, middle - half, np.nan), np.where(bounded, middle + half, np.nan), bounded


def replicated_bracket(log_sizes: np.ndarray, counts: np.ndarray, root: np.ndarray) -> np.ndarray:
    """Whether the root lies between two adjacent tiers that both have two or more seeds (not beyond the
    measured range, not next to a tier with one seed): the crossing's identification rule besides a
    bounded Fieller set."""
    x, n = np.asarray(log_sizes, float), np.asarray(counts)
    inside = np.zeros(np.shape(root), bool)
    for k in range(len(x) - 1):
        if n[k] >= 2 and n[k + 1] >= 2:
            inside |= (root >= x[k]) & (root <= x[k + 1])
    return inside


def identified_crossings(fit: LineFit, log_sizes: np.ndarray, counts: np.ndarray, means: np.ndarray | None = None):
    """(root, low, high, identified) of the line's crossing: Fieller's set bounded and the root between two
    adjacent tiers that both have two or more seeds (vectorised like `fieller`). With the tier `means` (three or
    more tiers) the set is the law of N's (`law_variance`: Fieller with the law error), else the recipe one's."""
    variance = None
    if means is not None and np.asarray(log_sizes).size < 3:  # no law of N through two tiers
        root = fieller(fit)[0]
        nan = np.full(np.shape(root), np.nan)
        return root, nan, nan, np.zeros(np.shape(root), bool)
    if means is not None:
        variance = law_variance(fit, lack_mean_square(fit, log_sizes, counts, means), np.asarray(log_sizes).size)[0]
    root, low, high, bounded = fieller(fit, variance)
    return root, low, high, bounded & replicated_bracket(log_sizes, counts, root)
