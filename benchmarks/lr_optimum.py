"""Did an arm's optimum move? The optimum test's error and power at full size (`ablate.analysis.lr_optimum`).

    python benchmarks/lr_optimum.py [--studies 20000]

Simulates the study's sweep (factors ×0.25 … ×8, octave-spaced) with each arm's selection loss a parabola in
log2(lr) of curvature c (nats per octave²) plus independent noise of sd σ per point, every arm's best LR selected
on its own sweep, and runs the library's test on it: the false "optimum moved" with identical curves, 1, 2, 3 and 5
sweep seeds; the power for a shift of ½, 1 and 2 octaves at 2 and 3 sweep seeds, alone (m = 1) and as one of the
study's 8 arms against the baseline at 10M (Holm over 8, the other 7 unmoved; an arm with no test counts as p = 1
there, which only makes it more conservative). Prints markdown tables (docs/lr-sweeps.md quotes the power's).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ablate.analysis.lr_optimum import ALPHA, optimum_shift, seed_vertices, shift_statistics

FACTORS = np.log2([0.25, 0.5, 1, 2, 4, 8])
CELLS = [(0.02, 0.001), (0.02, 0.003), (0.02, 0.01), (0.005, 0.003)]
ARMS = 8  # the study's arms against the baseline at 10M


def losses(rng, shape, curvature, sd, vertex):
    return curvature * (FACTORS - vertex) ** 2 + rng.normal(0.0, sd, (*shape, FACTORS.size))


def holm_first(p: np.ndarray) -> np.ndarray:
    """Holm over the last axis, vectorised: the adjusted p of column 0 (the moved arm)."""
    p = np.nan_to_num(p, nan=1.0)
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1) * (p.shape[-1] - np.arange(p.shape[-1]))
    adjusted = np.minimum(1.0, np.maximum.accumulate(ranked, axis=-1))
    return np.take_along_axis(adjusted, np.argsort(order, axis=-1), axis=-1)[..., 0]


def false_rate(studies, seeds, curvature, sd, rng) -> float:
    test = optimum_shift(FACTORS, losses(rng, (studies, seeds), curvature, sd, 0.3),
                         losses(rng, (studies, seeds), curvature, sd, 0.3))
    return float((np.nan_to_num(test["p"], nan=1.0) < ALPHA).mean())


def power(studies, seeds, curvature, sd, shift, rng) -> tuple[float, float]:
    reference = seed_vertices(FACTORS, losses(rng, (studies, seeds), curvature, sd, 0.3))
    vertices = [seed_vertices(FACTORS, losses(rng, (studies, seeds), curvature, sd, 0.3 + (shift if k == 0 else 0)))
                for k in range(ARMS)]
    p = np.stack([shift_statistics(v, reference)["p"] for v in vertices], axis=-1)
    alone = float((np.nan_to_num(p[:, 0], nan=1.0) < ALPHA).mean())
    return alone, float((holm_first(p) < ALPHA).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=20000)
    args = parser.parse_args()
    rng, clock = np.random.default_rng(20261206), time.time()
    bound = ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / args.studies)
    print(f"False 'optimum moved', identical curves ({args.studies:,} studies per cell, bound {bound:.4f}):\n")
    print("| c (nats/octave²) | σ (nats) | 1 seed | 2 seeds | 3 seeds | 5 seeds |\n|---|---|---|---|---|---|")
    for c, sd in CELLS:
        rates = [false_rate(args.studies, s, c, sd, rng) for s in (1, 2, 3, 5)]
        print(f"| {c:g} | {sd:g} | " + " | ".join(f"{r:.4f}" for r in rates) + " |")
    print(f"\nPower (m = 1 / Holm over the study's {ARMS} arms at 10M):\n")
    print("| c (nats/octave²) | σ (nats) | sweep seeds | shift ½ octave | 1 octave | 2 octaves |\n"
          "|---|---|---|---|---|---|")
    for c, sd in CELLS:
        for seeds in (2, 3):
            cells = [power(args.studies, seeds, c, sd, shift, rng) for shift in (0.5, 1.0, 2.0)]
            print(f"| {c:g} | {sd:g} | {seeds} | " + " | ".join(f"{a:.2f} / {h:.2f}" for a, h in cells) + " |")
    print(f"\n{time.time() - clock:.0f} s")


if __name__ == "__main__":
    main()
