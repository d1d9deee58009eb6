"""Did an arm's optimum move? The LR sweep's second test (the tuned table's asks whether the picked LRs changed a
comparison, `ablate.analysis.tuned`; this one whether an arm's best LR differs from the reference's).

Per sweep seed, the vertex in log2(lr) of the parabola through that seed's selection losses at the arm's best LR
(the lowest mean over the sweep's seeds among the stable LRs, as the LR table chooses it) and its two
neighbours; per seed the shift d_s = vertex_arm,s − vertex_reference,s in octaves (the seeds pair: one seed's runs
share the initial weights and the batches); the paired t of the d_s on n − 1 df, its t interval, its p
Holm-adjusted over the arms of a tier against the reference, and the decision "optimum moved" (p_holm < α) or
"no move detected". One sweep seed gives no interval (no test); a seed whose parabola does not curve upwards,
or a best LR at the sweep's edge, gives no vertex. Vectorised over leading axes, so that the simulation in
tests/test_tuning_did.py (and benchmarks/lr_optimum.py) runs this very code, selection included. Torch-free.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import stdtr, stdtrit

from ablate.analysis.stats import holm

ALPHA = 0.05
CONFIDENCE = 0.95
MOVED, NOT_MOVED, NO_TEST = "optimum moved", "no move detected", "no test"
OPTIMUM_NOTE = ("Did an arm's optimum move? Per sweep seed the vertex in log2(lr) of the parabola through its "
                "selection losses at the arm's best LR and its two neighbours; the paired t of the shift against the "
                "reference's vertex (octaves) over the sweep seeds, its 95% t interval, p Holm-adjusted over the arms "
                "of a tier; one sweep seed gives no test")


def best_index(losses: np.ndarray) -> np.ndarray:
    """The best LR's index per leading element of `losses` (..., seeds, lrs): the lowest mean over the seeds among
    the stable LRs (every seed finite), the first of a tie (as `ablate.analysis.lr` chooses it); -1 where none."""
    means = np.where(np.isfinite(losses).all(axis=-2), losses.mean(axis=-2), np.inf)
    return np.where(np.isfinite(means).any(axis=-1), means.argmin(axis=-1), -1)


def seed_vertices(x: np.ndarray, losses: np.ndarray, best: np.ndarray | None = None) -> np.ndarray:
    """Per seed, the vertex (in the units of `x`, log2 lr) of the parabola through its losses at the best LR and
    its two neighbours: (..., seeds), NaN where the best is at the edge (or none), a point is not finite, or the
    parabola does not curve upwards. `x` (lrs,) ascending; `losses` (..., seeds, lrs); `best` (...) or chosen."""
    losses = np.asarray(losses, float)
    best = best_index(losses) if best is None else np.asarray(best)
    inside = (best >= 1) & (best <= losses.shape[-1] - 2)
    index = np.clip(best, 1, losses.shape[-1] - 2)[..., None, None] + np.arange(-1, 2)
    y = np.take_along_axis(losses, np.broadcast_to(index, (*losses.shape[:-1], 3)), axis=-1)
    x3 = np.asarray(x, float)[index[..., 0, :]][..., None, :]
    (x1, x2, xx3), (y1, y2, y3) = np.moveaxis(x3, -1, 0), np.moveaxis(y, -1, 0)
    denom = (x1 - x2) * (x1 - xx3) * (x2 - xx3)
    a = (xx3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / denom
    b = (xx3 ** 2 * (y1 - y2) + x2 ** 2 * (y3 - y1) + x1 ** 2 * (y2 - y3)) / denom
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = -b / (2 * a)
    return np.where(inside[..., None] & (a > 0) & np.isfinite(vertex), vertex, np.nan)


def shift_statistics(arm: np.ndarray, reference: np.ndarray, confidence: float = CONFIDENCE) -> dict[str, np.ndarray]:
    """The paired t of d_s = arm_s − reference_s over the seeds where both are finite, vectorised over leading
    axes: n, mean, se, df = n − 1, t, the two-sided p and the t interval (NaN below two seeds or with no spread)."""
    d = np.asarray(arm, float) - np.asarray(reference, float)
    valid = np.isfinite(d)
    n = valid.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(valid, d, 0.0).sum(axis=-1) / n
        var = np.where(valid, (d - mean[..., None]) ** 2, 0.0).sum(axis=-1) / (n - 1)
        se = np.where((n >= 2) & (var > 0), np.sqrt(var / n), np.nan)
        df = np.maximum(n - 1, 1)
        t = mean / se
        p = 2.0 * stdtr(df, -np.abs(t))
        half = stdtrit(df, 0.5 + confidence / 2) * se
    return {"n": n, "mean": mean, "se": se, "df": n - 1, "t": t, "p": p, "low": mean - half, "high": mean + half}


def optimum_shift(x, arm_losses, reference_losses, best_arm=None, best_reference=None) -> dict[str, np.ndarray]:
    """`shift_statistics` of the per-seed vertices of an arm and its reference (`seed_vertices`, each at its own
    best LR), over the seeds both have: the shift of the arm's optimum in octaves of lr."""
    return shift_statistics(seed_vertices(x, arm_losses, best_arm), seed_vertices(x, reference_losses,
                                                                                  best_reference))


def decision(p_holm: float | None, alpha: float = ALPHA) -> str:
    """"optimum moved" where p_holm < α; "no move detected" (not evidence of no move: the interval says how far
    it allows); "no test" with fewer than two sweep seeds with a vertex."""
    if p_holm is None:
        return NO_TEST
    return MOVED if p_holm < alpha else NOT_MOVED


def optimum_rows(points: list[dict], best: list[dict]) -> list[dict]:
    """The test of each arm of each tier against the tier's reference (baseline, else the first arm), from the
    LR table's points (tier, arm, seed, factor, loss: None where not counted) and best rows (tier, arm,
    best_factor: the LR table's choice, so both tests read the same best LR)."""
    found = []
    for tier in dict.fromkeys(p["tier"] for p in points):
        of_tier = [p for p in points if p["tier"] == tier]
        lrs, seeds = sorted({p["factor"] for p in of_tier}), sorted({p["seed"] for p in of_tier})
        arms = list(dict.fromkeys(b["arm"] for b in best if b["tier"] == tier))
        if len(arms) < 2:
            continue
        reference = "baseline" if "baseline" in arms else arms[0]
        grids = {arm: _grid(of_tier, arm, lrs, seeds) for arm in arms}
        chosen = {b["arm"]: (lrs.index(b["best_factor"]) if b["best_factor"] in lrs else -1) for b in best
                  if b["tier"] == tier}
        x = np.log2(np.array(lrs))
        rows = [_row(tier, arm, reference, x, grids, chosen) for arm in arms if arm != reference]
        for row, p_holm in zip(rows, holm([r["p"] for r in rows])):
            row.update(p_holm=p_holm, decision=decision(p_holm))
        found += rows
    return found


def _grid(points: list[dict], arm: str, lrs: list[float], seeds: list[int]) -> np.ndarray:
    grid = np.full((len(seeds), len(lrs)), np.nan)
    for p in points:
        if p["arm"] == arm and p["loss"] is not None:
            grid[seeds.index(p["seed"]), lrs.index(p["factor"])] = p["loss"]
    return grid


def _row(tier: str, arm: str, reference: str, x: np.ndarray, grids: dict, chosen: dict) -> dict:
    v_arm, v_ref = (seed_vertices(x, grids[a], np.array(chosen[a])) for a in (arm, reference))
    test = shift_statistics(v_arm, v_ref)
    value = {k: _float(v) for k, v in test.items()}
    tested = value["p"] is not None
    return {"tier": tier, "arm": arm, "reference": reference, "seeds": int(test["n"]),
            "vertex_factor": _float(2 ** np.nanmean(v_arm)) if np.isfinite(v_arm).any() else None,
            "reference_vertex_factor": _float(2 ** np.nanmean(v_ref)) if np.isfinite(v_ref).any() else None,
            "shift_octaves": value["mean"], "se": value["se"] if tested else None,
            "low": value["low"] if tested else None, "high": value["high"] if tested else None,
            "df": int(test["df"]) if tested else None, "p": value["p"]}


def _float(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def optimum_text(rows: list[dict]) -> str:
    """One line per arm: the shift of its optimum against the reference's, its interval and the decision."""
    lines = []
    for r in rows:
        if r["p"] is None:
            why = (f"{r['seeds']} sweep seed(s) with a vertex at both arms: fewer than two give no interval (declare "
                   "LRSweep(seeds=2) or more)")
            lines.append(f"- {r['tier']} {r['arm']} vs {r['reference']}: {NO_TEST} ({why})")
            continue
        lines.append(f"- {r['tier']} {r['arm']} vs {r['reference']}: optimum shift {r['shift_octaves']:+.2f} octaves "
                     f"(95% interval {r['low']:+.2f} to {r['high']:+.2f}, t on {r['df']} df, {r['seeds']} sweep "
                     f"seeds), p {r['p']:.3g}, p_holm {r['p_holm']:.3g}: {r['decision']}")
    return "\n".join(lines) + ("\n" if lines else "")
