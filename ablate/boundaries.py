"""Group-sequential seeds: O'Brien–Fleming-type boundaries calibrated by simulation, the decision at a look,
and a design's power and expected seeds under an effect (`ablate plan/submit --sequential`; docs/power.md).

Torch-free (numpy). Split from `ablate.power`, which plans fixed seed counts and owns the checks and the
float-resolution rule both use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import ndtr, ndtri, stdtrit

from ablate.errors import AblateError
from ablate.power import RESOLUTION, _check_count, _check_positive, _check_unit, _is_number

SPENDING = "obrien-fleming"
MAX_LOOKS = 20  # more looks than this spend almost nothing at the early ones and only cost calibration time
MAX_SEQUENTIAL_SEEDS = 1000  # a sequential design's last look; beyond it the study runs for months
CALIBRATION_SEED = 20240521  # the numpy Generator seed the sequential boundaries are calibrated with
# Monte-Carlo paths per unit of 1/α': the calibrated error's binomial sd is √(α'/paths), so with
# paths = 4000/α' the error is within 5% of α' at 3 sd (3·√(α'²/4000) ≈ 0.047 α').
PATHS_PER_INVERSE_ALPHA = 4000
MIN_PATHS = 200_000
MAX_PATHS = 5_000_000

# ---------------------------------------------------------------- sequential seeds


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
