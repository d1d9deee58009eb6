"""How many seeds: power planning for declared comparisons, and group-sequential seeds that stop early
(O'Brien–Fleming-type boundaries calibrated by simulation, the decision at a look, and a design's power and
expected seeds under an effect: `ablate plan/submit --sequential`).

Torch-free (numpy, scipy.special). Inputs are plain numbers,
mappings and sequences, outputs are dicts with the fields `ablate plan --power/--sequential --json`
prints, so the command line, the ledger and the tables only pass values through.

A comparison is a paired difference of two arms over seeds; its test is the two-sided one-sample t on
the per-seed differences. Each of a family of m comparisons is run at α/m (Bonferroni, which Holm never
does worse than), so the family's error stays ≤ α. The method is described in docs/power.md.

One room, over the 400-line habit (tests/test_house.py names it): the fixed and the sequential designs answer
one question (how many seeds) on one arithmetic: the same argument checks and float-resolution rule. The
group-sequential half lived in a module of its own (boundaries.py) only to keep this file under 400 lines,
and had to import this one's private checks to work.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import chdtri, gammaln, nctdtr, ndtr, ndtri, stdtrit

from ablate.errors import AblateError

log = logging.getLogger(__name__)

# A pilot sd at or below this many nats is float rounding of losses of a few nats (3.9 − 3.8 and 4.3 − 4.2
# differ by ~1e-16), not seed noise; the tables' RESOLUTION (1e-9 of the loss) says the same.
ROUNDING_SD = 1e-9
SD_LEVEL = 0.8  # the upper confidence limit a pilot's sd is planned with
SMALL_PILOT = 3  # a pilot of this many seeds or fewer gets a warning
# A spread of paired differences at or below this fraction of the losses' magnitude is float rounding, not
# noise (3.9 − 3.8 and 4.3 − 4.2 differ in binary by ~1e-16): no spread, so no t. The tables' rule too.
RESOLUTION = 1e-9


# ---------------------------------------------------------------- checks


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_unit(name: str, value: float) -> float:
    if not _is_number(value) or not 0 < value < 1:
        raise AblateError(f"{name} {value!r} must be strictly between 0 and 1 (e.g. 0.05 for alpha, 0.8 for power)")
    return float(value)


def _check_positive(name: str, value: float, hint: str) -> float:
    if not _is_number(value) or value <= 0:
        raise AblateError(f"{name} {value!r} must be a positive number; {hint}")
    return float(value)


def _check_count(name: str, value: int, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise AblateError(f"{name} {value!r} must be a whole number ≥ {least}")
    return int(value)


# ---------------------------------------------------------------- power


QUADRATURE_POINTS = 20_001  # Simpson points of the power integral where the closed form fails
MAX_SEEDS = 100_000  # the most seeds a plan may ask for; a larger answer means the effect is lost in the noise


def power(d, n, alpha: float):
    """Two-sided power of the paired t at level `alpha` with n seeds and standardised effect d = effect/sd:
    P(|T| ≥ t_crit), T noncentral t with n − 1 degrees of freedom and noncentrality d·√n (scipy's
    `nctdtr`, vectorised over d and n). Where the library returns nan (it has, in some versions, for a
    large noncentrality at 1 or 2 df), that point is integrated over the sample sd instead
    (`_power_by_quadrature`); a power that is still not a number raises: nan is never enough power."""
    d, n = np.broadcast_arrays(np.asarray(d, dtype=float), np.asarray(n, dtype=float))
    df = n - 1
    critical = stdtrit(df, 1 - alpha / 2)
    noncentrality = d * np.sqrt(n)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        upper = 1 - nctdtr(df, noncentrality, critical)
        lower = nctdtr(df, noncentrality, -critical)
        # The lower tail P(T ≤ −c) is at most Φ(−λ) (T < 0 needs Z + λ < 0); where the library fails on it
        # and that bound is below 1e-12, it cannot move a power near the target, and 0 is taken.
        lower = np.where(np.isnan(lower) & (ndtr(-np.abs(noncentrality)) < 1e-12), 0.0, lower)
        result = upper + lower
    scalar = np.ndim(result) == 0
    result, noncentrality, df, critical = (np.atleast_1d(np.asarray(a, dtype=float)).copy()
                                           for a in (result, noncentrality, df, critical))
    bad = ~np.isfinite(result)
    if bad.any():
        result[bad] = _power_by_quadrature(noncentrality[bad], df[bad], critical[bad])
    result = np.clip(result, 0.0, 1.0)
    return float(result[0]) if scalar else result


def _power_by_quadrature(noncentrality: np.ndarray, df: np.ndarray, critical: np.ndarray) -> np.ndarray:
    """P(|Z + λ| ≥ c·S), S = √(χ²_df/df): the same power as an integral over the density of S
    (Simpson's rule on QUADRATURE_POINTS points up to 1 + 40/√df, where the density is < 1e-300)."""
    from scipy.integrate import simpson  # only for the rare points the closed form cannot give

    s = np.linspace(0.0, 1 + 40 / np.sqrt(df.min()), QUADRATURE_POINTS)[None, :]
    k = df[:, None]
    with np.errstate(divide="ignore", under="ignore"):  # log 0 at s = 0: its density is 0 (or finite for df 1)
        log_density = ((k / 2) * np.log(k / 2) - gammaln(k / 2) + np.log(2.0) + (k - 1) * np.log(s) - k * s * s / 2)
    tails = ndtr(noncentrality[:, None] - critical[:, None] * s) + ndtr(-noncentrality[:, None] - critical[:, None] * s)
    value = simpson(tails * np.exp(log_density), x=s[0], axis=1)
    if not np.all(np.isfinite(value)):
        raise AblateError(f"the power at noncentrality {noncentrality.tolist()} is not a number; nan is never taken "
                          "as enough power: report this")
    return value


def seeds_needed(effect: float, sd: float, alpha: float = 0.05, family_size: int = 1, target_power: float = 0.8) -> int:
    """Seeds a two-sided paired t-test needs to detect a true mean difference `effect` at α/m.

    The smallest whole n ≥ 2 whose power (`power`: the noncentral t with n − 1 degrees of freedom and
    noncentrality (effect/sd)·√n) reaches `target_power`, found by doubling then bisection on whole
    numbers (power rises with n). An answer above MAX_SEEDS (effect/sd ≲ 0.01) is refused: the effect
    is lost in the noise at any budget.
    """
    effect = _check_positive("effect", effect, "give the smallest mean difference worth detecting, in nats (e.g. "
                                               "--effect 0.002)")
    sd = _check_positive("sd", sd, "give the seed-to-seed sd of the paired differences, in nats (e.g. --sd "
                                   "0.002), or a pilot")
    alpha = _check_unit("alpha", alpha)
    family_size = _check_count("family size", family_size, 1)
    target_power = _check_unit("target power", target_power)
    return int(smallest_seeds(effect / sd, alpha / family_size, target_power))


def smallest_seeds(d, level: float, target_power: float):
    """The smallest whole n ≥ 2 with power(d, n, level) ≥ target_power, vectorised over d (power rises with
    n): doubling then bisection on the points still open. Refuses an answer above MAX_SEEDS."""
    d = np.atleast_1d(np.asarray(d, dtype=float))
    worst = float(d.min())  # power rises with d: the smallest d is the one that may need too many seeds
    if power(worst, MAX_SEEDS, level) < target_power:
        raise AblateError(f"effect/sd = {worst:.3g} needs more than {MAX_SEEDS:,} seeds for power {target_power:g} at "
                          f"alpha {level:.3g} (the effect is lost in the noise): give a larger --effect or "
                          "a smaller --sd")
    # The normal approximation's n is within a seed or two of the answer; walk down, then up, from it.
    guess = np.ceil(((ndtri(1 - level / 2) + ndtri(target_power)) / d) ** 2)
    high = np.clip(guess, 2, MAX_SEEDS).astype(np.int64)
    down = high > 2
    while down.any():
        down[down] = power(d[down], high[down] - 1, level) >= target_power
        high[down] -= 1
        down &= high > 2
    up = power(d, high, level) < target_power
    while up.any():
        high[up] += 1
        up[up] = power(d[up], high[up], level) < target_power
    return high if high.size > 1 else int(high[0])


def pilot_sd(differences: Sequence[float]) -> float:
    """The sd (ddof 1) of a pilot's paired differences of one comparison, one value per seed."""
    values = np.asarray(list(differences), dtype=float)
    if values.size < 2:
        raise AblateError(f"a pilot needs at least 2 seeds of a comparison to give an sd, got {values.size}; run more "
                          "seeds or pass --sd")
    if not np.all(np.isfinite(values)):
        raise AblateError(f"pilot differences {values.tolist()} are not all finite numbers; check the "
                          "pilot's runs finished")
    return float(np.std(values, ddof=1))


def sd_upper_limit(sd: float, n0: int, level: float = SD_LEVEL) -> float:
    """The one-sided `level` upper confidence limit of a normal sd estimated from n0 seeds:
    sd·√((n0 − 1)/χ²_{1−level}(n0 − 1)), χ²_q the lower q quantile (level 0.8: the lower 20%)."""
    if not _is_number(sd) or sd < 0:
        raise AblateError(f"sd {sd!r} must be a finite number ≥ 0")
    n0 = _check_count("pilot seed count n0", n0, 2)
    level = _check_unit("confidence level", level)
    return float(sd * math.sqrt((n0 - 1) / chdtri(n0 - 1, level)))


def pilot_warning(n0: int, level: float = SD_LEVEL) -> str | None:
    """The warning a pilot of SMALL_PILOT seeds or fewer gets, None for a larger one."""
    if n0 > SMALL_PILOT:
        return None
    factor = sd_upper_limit(1.0, n0, level)
    return (f"a {n0}-seed pilot's sd is unreliable: its {level:.0%} upper limit is {factor:.1f}× the estimate, "
            f"so plan with seeds_conservative or run a larger pilot")


@dataclass(frozen=True)
class Pilot:
    """A pilot's spread of one comparison: the sd of its paired differences and the seeds it came from."""

    sd: float
    n0: int

    @classmethod
    def from_differences(cls, differences: Sequence[float]) -> Pilot:
        values = list(differences)
        return cls(pilot_sd(values), len(values))


def family_sizes(comparisons: Mapping[str, Sequence[str]], family: Mapping[str, int]) -> dict[str, int]:
    """m per tier, as given (tier → m: `ablate.family.Family.tier_size`, the family rule's one owner), checked: every
    tier has one, and it holds the comparisons planned there. Which comparisons and slopes a family holds is not
    decided here."""
    if not isinstance(family, Mapping):
        raise AblateError(f"the family's m is given per tier (tier → m, from ablate.family.Family.tier_size), not "
                          f"{family!r}")
    for tier, names in comparisons.items():
        if family.get(tier, 0) < len(names):
            raise AblateError(f"a family of m = {family.get(tier, 0)} at tier {tier!r} cannot hold its "
                              f"{len(names)} comparisons")
    return {tier: int(family[tier]) for tier in comparisons}


def power_rows(comparisons: Mapping[str, Sequence[str]], effect: float, gpu_hours_per_seed: Mapping[str, float],
               sd: float | None = None, pilots: Mapping[tuple[str, str], Pilot] | None = None, alpha: float = 0.05,
               target_power: float = 0.8, *, family: Mapping[str, int]) -> list[dict]:
    """One `plan --power --json` row per (tier, declared comparison), in the order given.

    `comparisons` maps a tier to its declared comparisons, `family` a tier to the m its comparisons are planned at
    (`ablate.family.Family.tier_size`: `Experiment.declared_family()`); `gpu_hours_per_seed[tier]` is what one more
    seed costs at that tier (every arm the experiment runs there), and `gpu_hours` = seeds × that.
    The sd is the pilot's for that (tier, comparison) when `pilots` has it, else `sd`; with a pilot,
    `seeds_conservative` is planned with the sd's 80% upper limit (else None). A pilot of SMALL_PILOT
    seeds or fewer is logged as a warning (`pilot_warning`).
    """
    pilots = pilots or {}
    rows = []
    for tier, m in family_sizes(comparisons, family).items():
        if tier not in gpu_hours_per_seed:
            raise AblateError(f"no GPU-hours per seed for tier {tier!r}; known tiers: "
                              f"{', '.join(map(str, gpu_hours_per_seed))}")
        for name in comparisons[tier]:
            pilot = pilots.get((tier, name))
            spread = pilot.sd if pilot else sd
            if spread is None:
                raise AblateError(f"no sd for comparison {name!r} at tier {tier!r}: the pilot lacks it; pass --sd or a "
                                  "pilot that ran it")
            if pilot and pilot_warning(pilot.n0):
                log.warning("%s at tier %s: %s", name, tier, pilot_warning(pilot.n0))
            if pilot and pilot.sd <= ROUNDING_SD:
                raise AblateError(f"the pilot's {pilot.n0} differences of {name!r} at tier {tier!r} spread by "
                                  f"{pilot.sd:.2g} nats, float rounding (≤ {ROUNDING_SD:g}), not seed "
                                  "noise: they are all "
                                  "equal; pass --sd")
            seeds = seeds_needed(effect, spread, alpha, m, target_power)
            conservative = (seeds_needed(effect, sd_upper_limit(pilot.sd, pilot.n0), alpha, m, target_power)
                            if pilot else None)
            rows.append({"tier": tier, "comparison": name, "sd": spread, "effect": effect, "alpha": alpha,
                         "family_size": m, "target_power": target_power, "seeds": seeds,
                         "seeds_conservative": conservative, "gpu_hours": seeds * float(gpu_hours_per_seed[tier])})
    return rows


# ---------------------------------------------------------------- scale slopes: two estimands
SLOPE_STUDIES = 20_000  # simulated studies behind a law-of-N power (its Monte Carlo se ≤ 0.0036)
SLOPE_SEED = 20261204  # a fixed generator seed: the same plan prints the same power


def law_error(pure: np.ndarray, pure_df: int, lack: np.ndarray, tiers: int, confidence: float = 0.95
              ) -> tuple[np.ndarray, np.ndarray]:
    """s² and df of a slope *as a law of N* (tiers as draws around a line in log N): of the pure (within-tier)
    error and the lack-of-fit mean square of the tier means about the line (df T − 2), the one whose *t-scaled
    half-width* t_df(½ + confidence/2)·√s² is the larger, with its df. Comparing variances instead took the pure
    error on many df when it was only a little larger than the lack of fit on 2 df (t 4.30 against 2.45 at 6 df):
    an interval too narrow by up to 1.8×, and coverage 0.934–0.940 at 5 seeds per tier with the tiers scattering
    by one seed sd. The analysis's law interval and the planner's law power both use it."""
    pure, lack = np.asarray(pure, float), np.asarray(lack, float)
    tail = 0.5 + confidence / 2
    with np.errstate(invalid="ignore"):
        pure_half = stdtrit(pure_df, tail) * np.sqrt(pure) if pure_df > 0 else np.full(pure.shape, np.nan)
        use_lack = ~(pure_half > stdtrit(max(tiers - 2, 1), tail) * np.sqrt(lack))  # no pure error: the lack of fit
    return np.where(use_lack, lack, pure), np.where(use_lack, float(tiers - 2), float(pure_df))


def slope_power(log_sizes: Sequence[float], counts: Sequence[int], slope: float, sd: float, tier_sd: float,
                alpha: float) -> dict:
    """The power of a two-sided test at level `alpha` of a scale slope of `slope` (per decade) at a design of tiers
    (log10 sizes) × seed counts, seed sd `sd` of one paired difference, for both estimands:

    * recipe: the slope of the weighted line through these tiers' means, tested with the pooled within-tier error
      (df = Σ(n_t − 1)): a noncentral t, λ = slope·√Sxx/sd (exact);
    * law of N: the tier means scatter about the line by `tier_sd` besides the seeds' noise, tested with
      `law_error` (never narrower than the recipe test): simulated, SLOPE_STUDIES studies at a fixed seed.
    None where a test does not exist (fewer than two tiers, no within-tier df; fewer than three tiers for the law)."""
    x, n = np.asarray(log_sizes, float), np.asarray(counts, float)
    tiers, pure_df = x.size, int((n - 1).sum())
    out = {"recipe_df": pure_df, "recipe_power": None, "law_df": None, "law_power": None}
    if tiers < 2 or pure_df < 1:
        return out
    center = float((n * x).sum() / n.sum())
    sxx = float((n * (x - center) ** 2).sum())
    noncentrality = slope * math.sqrt(sxx) / sd
    out["recipe_power"] = float(power(noncentrality / math.sqrt(pure_df + 1), pure_df + 1, alpha))
    if tiers < 3:
        return out
    rng = np.random.default_rng(SLOPE_SEED)
    means = slope * (x - center) + rng.normal(0.0, tier_sd, (SLOPE_STUDIES, tiers)) + rng.normal(
        0.0, 1.0, (SLOPE_STUDIES, tiers)) * sd / np.sqrt(n)
    pure = sd ** 2 * rng.chisquare(pure_df, SLOPE_STUDIES) / pure_df
    level = (means * n).sum(-1) / n.sum()
    fitted = (means * n * (x - center)).sum(-1) / sxx
    line = level[:, None] + fitted[:, None] * (x - center)
    lack = (n * (means - line) ** 2).sum(-1) / (tiers - 2)
    # The law test rejects when the interval of the larger t-scaled half-width (`law_error`) at level 1 − α excludes
    # 0, i.e. when both t tests reject: the one on the lack of fit (df T − 2) and the one on the pure error.
    lack_t = np.abs(fitted) / np.sqrt(lack / sxx)
    recipe_t = np.abs(fitted) / np.sqrt(pure / sxx)
    rejected = (lack_t >= stdtrit(tiers - 2, 1 - alpha / 2)) & (recipe_t >= stdtrit(pure_df, 1 - alpha / 2))
    out.update(law_df=tiers - 2, law_power=float(rejected.mean()))
    return out


# ---------------------------------------------------------------- group-sequential seeds
SPENDING = "obrien-fleming"
MAX_LOOKS = 20  # more looks than this spend almost nothing at the early ones and only cost calibration time
MAX_SEQUENTIAL_SEEDS = 1000  # a sequential design's last look; beyond it the study runs for months
CALIBRATION_SEED = 20240521  # the numpy Generator seed the sequential boundaries are calibrated with
# Monte-Carlo paths per unit of 1/α': the calibrated error's binomial sd is √(α'/paths), so with
# paths = 4000/α' the error is within 5% of α' at 3 sd (3·√(α'²/4000) ≈ 0.047 α').
PATHS_PER_INVERSE_ALPHA = 4000
MIN_PATHS = 200_000
MAX_PATHS = 5_000_000

def look_seeds(looks: int, max_seeds: int) -> list[int]:
    """Seed counts of `looks` evenly spaced looks ending at `max_seeds` (k·N/K rounded half up), each ≥ 2."""
    looks = _check_count("--looks", looks, 1)
    max_seeds = _check_count("--max-seeds", max_seeds, 2)
    if looks > MAX_LOOKS:
        raise AblateError(f"--looks {looks} is more than the {MAX_LOOKS} looks a sequential design may take; "
                          f"use --looks 1 to {MAX_LOOKS}")
    if max_seeds > MAX_SEQUENTIAL_SEEDS:
        raise AblateError(f"--max-seeds {max_seeds} is more than the {MAX_SEQUENTIAL_SEEDS} seeds a sequential design "
                          f"may plan; use --max-seeds 2 to {MAX_SEQUENTIAL_SEEDS}")
    counts = [math.floor(k * max_seeds / looks + 0.5) for k in range(1, looks + 1)]
    if counts[0] < 2:
        raise AblateError(f"--looks {looks} with --max-seeds {max_seeds} puts {counts[0]} seed(s) at the first look, "
                          f"and a paired t needs ≥ 2: use --max-seeds ≥ {math.ceil(1.5 * looks)} "
                          f"or --looks ≤ {2 * max_seeds // 3}")
    return counts


def obrien_fleming_spent(fraction: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type cumulative α spent at information fraction t: 2·(1 − Φ(z_{1−α/2}/√t))."""
    return float(2 * (1 - ndtr(ndtri(1 - alpha / 2) / math.sqrt(fraction))))


def default_paths(alpha_per_comparison: float) -> int:
    """Enough paths that the calibrated error over all looks is within 5% of α' (see PATHS_PER_INVERSE_ALPHA)."""
    paths = max(MIN_PATHS, math.ceil(PATHS_PER_INVERSE_ALPHA / alpha_per_comparison))
    if paths > MAX_PATHS:
        raise AblateError(f"alpha per comparison {alpha_per_comparison:.3g} is too small to calibrate by simulation "
                          f"(it needs {paths} paths, more than {MAX_PATHS}); use a larger --alpha or fewer comparisons")
    return paths


def sequential_design(alpha: float, family_size: int, looks: int, max_seeds: int, paths: int | None = None,
                      seed: int = CALIBRATION_SEED) -> dict:
    """A group-sequential design for each comparison of a family: the `plan --sequential --json` object.

    Each comparison is tested at α' = α/m. The cumulative α spent by look k, at information fraction
    t_k = n_k/N, is the O'Brien–Fleming-type α'(t_k); `alpha_spent` is that cumulative value (the last
    look's equals α'). The |t| boundary of look k is calibrated by simulation: the paired t statistic
    is pivotal under a normal null, so `paths` sequences of N standard normal differences (numpy
    Generator `seed`) stand for any sd; the first boundary is the exact Student-t quantile, each later
    one the |t| that makes the simulated paths crossing by that look (never earlier) α'(t_k) of all.
    """
    alpha = _check_unit("alpha", alpha)
    family_size = _check_count("family size", family_size, 1)
    counts = look_seeds(looks, max_seeds)
    level = alpha / family_size
    spent = [obrien_fleming_spent(n / counts[-1], level) for n in counts]
    paths = default_paths(level) if paths is None else _check_count("paths", paths, 1000)
    boundaries = _calibrate(counts, spent, paths, seed)
    return {"alpha": alpha, "family_size": family_size, "alpha_per_comparison": level, "spending": SPENDING,
            "looks": [{"seeds": n, "t_boundary": c, "alpha_spent": a} for n, c, a in zip(counts, boundaries, spent)]}


def t_statistics(total: np.ndarray, squares: np.ndarray, n: int) -> np.ndarray:
    """|t| of paired differences from their running sum and sum of squares after n seeds."""
    mean = total / n
    variance = np.maximum(squares - n * mean * mean, 0.0) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(mean) * math.sqrt(n) / np.sqrt(variance)


def _calibrate(counts: Sequence[int], spent: Sequence[float], paths: int, seed: int) -> list[float]:
    """The |t| boundaries: look 1 exact, later looks by the simulated crossing counts (see sequential_design)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    total, squares = np.zeros(paths), np.zeros(paths)
    alive = np.ones(paths, dtype=bool)
    boundaries, previous = [], 0
    for k, (n, cumulative) in enumerate(zip(counts, spent)):
        for _ in range(n - previous):  # one seed at a time: memory stays a few vectors of `paths`
            draw = rng.standard_normal(paths)
            total += draw
            squares += draw * draw
        previous = n
        t = t_statistics(total, squares, n)
        if k == 0:
            boundary = float(stdtrit(n - 1, 1 - cumulative / 2))
        else:
            boundary = _boundary(t[alive], round(cumulative * paths) - (paths - int(alive.sum())))
        boundaries.append(boundary)
        alive &= ~(t >= boundary)
    return boundaries


def _boundary(t: np.ndarray, crossings: int) -> float:
    """The |t| above which exactly `crossings` of the surviving paths lie (midway between order statistics)."""
    if crossings <= 0:
        return float(np.max(t)) if t.size else math.inf
    if crossings >= t.size:
        return 0.0
    ordered = np.sort(t)
    return float((ordered[-crossings - 1] + ordered[-crossings]) / 2)


def sequential_decision(differences_by_seed: Mapping[int, float] | Sequence[float], design: Mapping,
                        scale: float | None = None) -> dict:
    """Where a comparison stands in a `sequential_design`, from its paired differences so far.

    `differences_by_seed` maps seed → difference (taken in seed order) or is a sequence in seed order.
    Looks are taken in order on the first n_k differences; the first whose |t| reaches its boundary
    decides "effect" (`sign` +1 or −1, the sign of the mean) and later seeds are not used. Otherwise
    the decision is "continue" (`next_seeds` says how many the next look needs) or, once the last
    look is passed, "max seeds reached". The interval is the repeated confidence interval
    mean ± t_boundary·sd/√n at the look reached: since the boundaries hold the chance of any null
    crossing to α', these intervals cover the true mean at every look at once with probability
    ≥ 1 − α', so the one at the look where the design stopped is valid whatever stopped it (and it
    excludes 0 exactly when the decision is "effect"). Before the first look there is no interval.

    A spread at float resolution is no spread (sd ≤ RESOLUTION × `scale`, the losses' magnitude, else the
    largest |difference|): t and the interval are then None, and t never crosses a boundary (equal differences would
    give |t| = ∞, differences equal up to rounding |t| ≈ 4e14, and either would read "effect" on no evidence).
    """
    values = _ordered_values(differences_by_seed)
    floor = RESOLUTION * (float(np.max(np.abs(values))) if scale is None and values.size else float(scale or 0.0))
    looks = list(design["looks"])
    result = {"look": 0, "seeds": 0, "decision": "continue", "sign": None, "mean": None, "t": None,
              "t_boundary": None, "ci_low": None, "ci_high": None, "next_seeds": looks[0]["seeds"],
              "alpha_per_comparison": design["alpha_per_comparison"]}
    for k, look in enumerate(looks, start=1):
        n = int(look["seeds"])
        if values.size < n:
            break
        sample = values[:n]
        mean, half = float(sample.mean()), float(look["t_boundary"]) * float(sample.std(ddof=1)) / math.sqrt(n)
        t = _signed_t(sample, floor)
        crossed = t is not None and abs(t) >= float(look["t_boundary"])
        last = k == len(looks)
        result.update(look=k, seeds=n, mean=mean, t=t, t_boundary=float(look["t_boundary"]),
                      ci_low=None if t is None else mean - half, ci_high=None if t is None else mean + half,
                      next_seeds=None if crossed or last else int(looks[k]["seeds"]),
                      decision="effect" if crossed else ("max seeds reached" if last else "continue"),
                      sign=int(np.sign(mean)) if crossed else None)
        if crossed:
            break
    return result


def _ordered_values(differences_by_seed: Mapping[int, float] | Sequence[float]) -> np.ndarray:
    if isinstance(differences_by_seed, Mapping):
        pairs = sorted(differences_by_seed.items())
    else:
        pairs = list(enumerate(differences_by_seed))
    for seed, value in pairs:
        if not _is_number(value):
            raise AblateError(f"the difference of seed {seed} is {value!r}, not a finite number; check "
                              "that run finished")
    return np.asarray([value for _, value in pairs], dtype=float)


def _signed_t(sample: np.ndarray, floor: float = 0.0) -> float | None:
    """The one-sample t of the differences; None when their sd is at or below `floor` (no spread: no t)."""
    mean, sd = float(sample.mean()), float(sample.std(ddof=1))
    if sd <= floor:
        return None
    return mean * math.sqrt(sample.size) / sd


OPERATING_PATHS = 20_000  # simulated studies behind a sequential design's power and expected seeds
OPERATING_SEED = 20261201


def sequential_operating(design: Mapping, d: float, paths: int = OPERATING_PATHS, seed: int = OPERATING_SEED) -> dict:
    """A sequential design's power and expected seeds when the true standardised effect is d = effect/sd.

    `paths` studies of N normal differences (mean d, sd 1; numpy Generator `seed`, all paths at once) run
    the design's looks: a study stops at the first look whose |t| reaches its boundary, and it found the
    effect when that t has the sign of d. Power is the fraction that found it; expected seeds the mean
    seed count at which studies stopped (N for those that never did). The t statistic is pivotal, so
    d alone decides both. Monte-Carlo error: ±√(p(1−p)/paths), under 0.004 at 20,000 paths.
    """
    d = _check_positive("effect/sd", d, "give --effect and --sd")
    counts = [int(look["seeds"]) for look in design["looks"]]
    bounds = [float(look["t_boundary"]) for look in design["looks"]]
    rng = np.random.Generator(np.random.PCG64(seed))
    values = rng.standard_normal((paths, counts[-1])) + d
    total, squares = np.cumsum(values, axis=1), np.cumsum(values * values, axis=1)
    stopped, found, seeds = np.zeros(paths, dtype=bool), np.zeros(paths, dtype=bool), np.full(paths, counts[-1])
    for n, boundary in zip(counts, bounds):
        mean = total[:, n - 1] / n
        t = np.sign(mean) * t_statistics(total[:, n - 1], squares[:, n - 1], n)
        crossing = ~stopped & (np.abs(t) >= boundary)
        found |= crossing & (t > 0)
        seeds[crossing] = n
        stopped |= crossing
    return {"effect_over_sd": d, "power": float(found.mean()), "expected_seeds": float(seeds.mean()),
            "paths": paths, "seed": seed}
