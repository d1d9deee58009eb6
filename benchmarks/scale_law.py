"""The scale law's intervals at full size: the slope's law interval and the crossing's law interval (docs/method.md,
"Scale model", "Crossover"), simulated at the study's four tiers.

    python benchmarks/scale_law.py [--studies 100000]

Slope: per cell of τ ∈ {0, ½, 1, 2} × the seed sd and seeds 3/3/3/1, 5/5/5/3, 5/5/5/5, the coverage of the law's
slope by the recipe interval, by the law interval (the larger t-scaled half-width, `ablate.analysis.scale`) and by
the rule it replaced (the larger variance), each with its median width. Crossing: per gap (the seed-weighted line
through the reference means, each tier's mean scattering about it by τ), seed sd and design, the share of
identified intervals and their coverage of the line's root, recipe and law. tests/test_scale_law.py and
tests/test_analysis_scale.py run the same simulations at 20,000 studies.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.special import stdtrit

from ablate.analysis.scale import fit_lines, identified_crossings, lack_mean_square, law_interval, slope_interval

LOG_SIZES = np.log10([10e6, 50e6, 124e6, 350e6])
DESIGNS = ((3, 3, 3, 1), (5, 5, 5, 3), (5, 5, 5, 5))
TAUS = (0.0, 0.5, 1.0, 2.0)
ZERO = np.array([0.0185, 0.0068, 0.0052, 0.0013])
GAPS = {"gap_proj": np.array([0.0036, 0.0065, 0.0054, 0.0114]) - ZERO,
        "gap_norm": np.array([-0.0008, 0.0030, 0.0036, 0.0074]) - ZERO}


def _draw(rng, line: np.ndarray, seeds, tau: float, sd: float, studies: int):
    counts = np.array(seeds)
    truth = line + rng.normal(0.0, tau * sd, (studies, len(seeds)))
    per_seed = np.repeat(truth, counts, axis=1) + rng.normal(0.0, sd, (studies, counts.sum()))
    groups = np.split(per_seed, np.cumsum(counts)[:-1], axis=1)
    means = np.stack([g.mean(axis=1) for g in groups], axis=-1)
    within = sum(((g - g.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) for g in groups)
    return counts, means, fit_lines(LOG_SIZES, counts, means, within)


def slopes(studies: int) -> None:
    slope = -0.01
    print("slope: seeds, τ/sd, coverage recipe / law / variance rule, median width law / variance rule")
    for seeds in DESIGNS:
        for tau in TAUS:
            rng = np.random.default_rng(20261204)
            counts, means, fit = _draw(rng, 0.02 + slope * LOG_SIZES, seeds, tau, 1.0, studies)
            low, high, _ = slope_interval(fit)
            law_low, law_high, _, _ = law_interval(fit, LOG_SIZES, counts, means)
            lack = lack_mean_square(fit, LOG_SIZES, counts, means)
            use = lack >= fit.s2
            s2, df = np.where(use, lack, fit.s2), np.where(use, 2.0, float(fit.df))
            old = np.fmax(stdtrit(df, 0.975) * np.sqrt(s2 / fit.sxx), (high - low) / 2)
            cover = [np.mean((a <= slope) & (slope <= b)) for a, b in
                     ((low, high), (law_low, law_high), (fit.slope - old, fit.slope + old))]
            width = np.median(law_high - law_low) / np.median(2 * old)
            print(f"  {'/'.join(map(str, seeds))}  τ {tau:<3}  {cover[0]:.4f} / {cover[1]:.4f} / {cover[2]:.4f}  "
                  f"width {width:.3f}×")


def crossings(studies: int) -> None:
    print("crossing: gap, seeds, seed sd, τ/sd, identified and coverage of the law's root: recipe | law")
    for gap, reference in GAPS.items():
        for seeds in DESIGNS:
            b, a = np.polyfit(LOG_SIZES, reference, 1, w=np.sqrt(seeds))
            root = -a / b
            for sd in (0.002, 0.004):
                for tau in TAUS[:3]:
                    rng = np.random.default_rng(20261206)
                    counts, means, fit = _draw(rng, a + b * LOG_SIZES, seeds, tau, sd, studies)
                    cells = []
                    for law in (None, means):
                        _, low, high, identified = identified_crossings(fit, LOG_SIZES, counts, law)
                        covered = ((low <= root) & (root <= high))[identified].mean()
                        cells.append(f"{identified.mean():.3f}, {covered:.3f}")
                    print(f"  {gap} (root {10 ** root / 1e6:.0f}M)  {'/'.join(map(str, seeds))}  sd {sd}  τ {tau:<3}  "
                          f"{cells[0]} | {cells[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=100_000)
    args = parser.parse_args()
    start = time.perf_counter()
    slopes(args.studies)
    crossings(args.studies)
    print(f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
