"""The LR table (`ablate table EXPERIMENT --kind lr`): every arm at its own learning rate.

An LR sweep's runs (`<tier>/<arm>/lr<f>/seed<k>`, with a selection split in their config) are read here and
nowhere else: the grid's tables never see them (`ablate.store.iter_lr_run_dirs`). The runs of one tier may
differ in `lr` — the one key the sweep varies — and in the arm and seed, and in nothing else; a sweep run
of another batch size (or any other setting) is refused, named.

The best LR of an arm is chosen on the *selection* loss only (a split disjoint from the validation tokens
the tables report: `ablate.data.order.selection_windows`), so that choosing it cannot bias the reported
losses of the confirmatory runs (docs/method.md). Torch-free.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ablate.analysis.load import RUN_SCHEMA, RunFolders, _exclusion_reason, refuse_twice, store_row
from ablate.analysis.lr_optimum import OPTIMUM_NOTE, optimum_rows
from ablate.analysis.matching import check_matched
from ablate.analysis.runs import Runs
from ablate.errors import AblateError
from ablate.identity import config_differences, describe_differences
from ablate.runconfig import RunConfig
from ablate.store import CONFIG, Status, run_key, run_of
from ablate.store_summary import RunSummary
from ablate.sweep import LRSweep
from ablate.tiers import tier_rank

VARIED = "lr"  # the one setting the runs of an LR sweep may differ in (besides the arm and the seed)
MARGIN, DELTA = 0.05, 0.02  # nats: an LRSweep's defaults, for a folder read without its experiment file
ROW_KEYS = ("tier", "arm", "lr", "seeds", "loss_mean", "loss_sd", "val_loss_mean", "diverged")
BEST_KEYS = ("tier", "arm", "best_lr", "vertex_lr", "max_stable_lr", "range_width_log2")
WAY_OUT = "rerun it with the sweep's settings (`ablate run ... --force` keeps the old folder aside) or move it out"


@dataclass(frozen=True)
class SweepRun:
    tier: str
    arm: str
    seed: int
    factor: float
    lr: float
    status: str | None
    selection_loss: float | None
    val_loss: float | None
    reason: str | None  # None: counted; else why not (e.g. "diverged at step 12")
    path: str
    config: dict = field(repr=False, default_factory=dict)  # config.json as written: what the fingerprints read
    summary: RunSummary = field(repr=False, default_factory=RunSummary)

    @property
    def diverged(self) -> bool:
        return self.status == Status.DIVERGED


@dataclass(frozen=True)
class LRTable:
    name: str
    rows: list[dict]
    best: list[dict]
    points: list[dict]  # one per sweep run: tier, arm, seed, lr, selection loss (None when it diverged)
    curvature: dict  # (tier, arm) → the fitted parabola's second derivative in nats per log2(lr)²
    margin: float
    delta: float
    warnings: tuple[str, ...] = ()
    optimum: list[dict] = field(default_factory=list)  # did an arm's optimum move? (`ablate.analysis.lr_optimum`)

    def best_factors(self) -> dict[str, dict[str, float]]:
        """{tier: {arm: the best LR's factor}}: what the confirmatory runs train at."""
        found: dict[str, dict[str, float]] = {}
        for row in self.best:
            if row["best_factor"] is not None:
                found.setdefault(row["tier"], {})[row["arm"]] = row["best_factor"]
        return found

    def as_json(self) -> dict:
        return {"rows": [{k: r[k] for k in ROW_KEYS} for r in self.rows],
                "best": [{k: b[k] for k in BEST_KEYS} for b in self.best], "optimum": self.optimum}


def _finite(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@dataclass(frozen=True)
class LRAt:
    """Where a run lies (`path`, its folder's lr `factor`) and the lr its config trained at."""
    path: str
    tier: str
    factor: float
    lr: float


def check_lr_factors(runs: list[LRAt]) -> None:
    """Every run's lr is its folder's factor × its tier's lr (a grid run's factor being 1): the tables read a
    run's LR from its folder, so a swapped or renamed `lr0.5`/`lr2` folder would move an arm's best LR. The tier's
    lr is the one most of its runs imply (lr / factor); a run that implies another is refused, named."""
    for tier in sorted({r.tier for r in runs}):
        group = [r for r in runs if r.tier == tier]
        implied = Counter(_rounded(r.lr / r.factor) for r in group)
        base, _ = implied.most_common(1)[0]
        odd = [r for r in group if _rounded(r.lr / r.factor) != base]
        if odd:
            agree = next(r for r in group if _rounded(r.lr / r.factor) == base)
            raise AblateError(f"run {odd[0].path} lies in the folder of lr factor {odd[0].factor:g} but its {CONFIG} "
                              f"trained at lr {odd[0].lr:g}, ×{odd[0].lr / base:g} of tier {tier}'s lr {base:g} (what "
                              f"its other runs imply, e.g. {agree.path}); a run's lr must be its folder's factor × "
                              f"the tier's lr (a swapped or renamed folder?): move it out or rerun it")


def _rounded(value: float) -> float:
    return float(f"{value:.9g}")


def sweep_runs(folder: str | Path | RunFolders) -> list[SweepRun]:
    """Every LR-sweep run of an experiment folder (runs at an lr factor whose config has a selection split):
    one per (tier, arm, factor, seed), each at its folder's factor × the tier's lr. `folder`: a path, or the
    `RunFolders` the command reads it through."""
    found, seen, reads = [], {}, RunFolders.of(folder)
    for run in reads.swept:
        way_out = "rerun that run (`ablate run ... --force` keeps the damaged folder aside) or move it out"
        summary = reads.summary(run, way_out)
        config = reads.config(run, way_out)
        if config is None:
            raise AblateError(f"sweep run {run} has no {CONFIG}: its settings cannot be compared; {WAY_OUT}")
        settings = RunConfig.from_dict(config)
        if not settings.selection_tokens:
            continue  # a confirmatory run at an arm's best LR: the tuned table's, not the sweep's
        reads.refuse_damaged(run, summary)
        name = run_of(run)
        if settings.tier != name.tier or settings.arm != name.arm:
            raise AblateError(f"{run} holds a run of {settings.tier}/{settings.arm} (a moved folder?); "
                              "move it out of the experiment folder")
        reason = _exclusion_reason(summary.status, summary.val_loss, summary)
        selection = _finite(summary.selection_loss)
        if reason is None and selection is None:
            reason = "completed without a selection loss"
        refuse_twice(seen, (name.tier, name.arm, name.lr_factor, name.seed), name.key, run)
        found.append(SweepRun(name.tier, name.arm, name.seed, name.lr_factor, float(settings.lr), summary.status,
                              selection, _finite(summary.val_loss), reason, str(run), config, summary))
    if not found:
        raise AblateError(f"no LR-sweep runs (<tier>/<arm>/lr<f>/seed<k>) under {str(reads.root)!r}; "
                          "`ablate submit EXPERIMENT --sweep` makes them")
    check_lr_factors([LRAt(r.path, r.tier, r.factor, r.lr) for r in found])
    return found


def check_sweep_matched(runs: list[SweepRun], allow_unverified: bool = False) -> None:
    """Every run of a tier shares everything but lr, the arm and the seed; runs of one seed share the initial
    weights (their common parameters) and, when both completed, the batches; all share the evaluation tokens.
    Then the grid's own rules (`ablate.analysis.matching.check_matched`), with lr left out of the settings: one
    data_id per tier, and fingerprints on every counted run unless `allow_unverified`."""
    for tier in sorted({r.tier for r in runs}):
        group = [r for r in runs if r.tier == tier]
        first = group[0]
        for other in group[1:]:
            diffs = [d for d in config_differences(first.config, other.config, across_seeds=True) if d[0] != VARIED]
            if diffs:
                raise AblateError(f"sweep runs {first.path} and {other.path} differ in {describe_differences(diffs)}; "
                                  f"the runs of an LR sweep may differ only in {VARIED} (and the arm and seed): "
                                  f"{WAY_OUT}")
        for key, only_completed in (("selection_fingerprint", True), ("val_fingerprint", True)):
            _same(group, key, only_completed, "were evaluated on other tokens")
        for seed in sorted({r.seed for r in group}):
            of_seed = [r for r in group if r.seed == seed]
            _same(of_seed, "init_fingerprint_common", False, "did not start from the same initial weights")
            _same(of_seed, "data_fingerprint", True, "were not trained on the same batches")
    rows = [{**store_row(Path(r.path), r.tier, r.arm, r.seed, r.summary, r.config, (VARIED,)), "reason": r.reason}
            for r in runs]
    root = Path(runs[0].path).parents[3]
    check_matched(Runs(name=root.name, frame=pl.DataFrame(rows, schema=RUN_SCHEMA), root=root), allow_unverified,
                  varied=(VARIED,))


def declared_only(runs: list[SweepRun], sweep: LRSweep | None) -> tuple[list[SweepRun], list[str]]:
    """(the runs every arm's best LR is chosen from, a warning per thing left out or missing).

    Every arm of a tier is tuned on one grid, so that no arm is tuned harder than another (extra factors, extra
    seeds): with the experiment's `sweep`, only its tiers × factors × seeds count, and the runs outside it are named
    and left out; without it (a folder read alone), a tier whose arms were swept on different grids is refused,
    its extra runs named."""
    if sweep is None:
        check_one_grid(runs)
        return runs, []
    inside = [r for r in runs if r.tier in sweep.tiers and r.factor in sweep.factors and r.seed in sweep.seed_list]
    outside = [r for r in runs if r not in inside]
    if not inside:
        raise AblateError(f"no LR-sweep run under {Path(runs[0].path).parents[3]} lies in the declared sweep "
                          f"({_grid_text(sweep.factors, sweep.seed_list)}); outside it: {_paths(outside)}")
    notes = [f"{len(outside)} sweep run(s) outside the declared sweep ({_grid_text(sweep.factors, sweep.seed_list)}) "
             f"are not counted: {_paths(outside)}"] if outside else []
    for tier in sorted({r.tier for r in inside}):
        arms = sorted({r.arm for r in inside if r.tier == tier})
        for arm in arms:
            have = {(r.factor, r.seed) for r in inside if (r.tier, r.arm) == (tier, arm)}
            lacking = [run_key(tier, arm, s, f) for f in sweep.factors for s in sweep.seed_list if (f, s) not in have]
            if lacking:
                notes.append(f"{tier}/{arm}: the declared sweep's runs {', '.join(lacking)} are not in the store "
                             "(not started yet?): its best LR is chosen without them")
    return inside, notes


def check_one_grid(runs: list[SweepRun]) -> None:
    """Refuse a tier whose arms were swept on different (factor, seed) grids, naming the runs beyond the grid
    every arm of it shares."""
    for tier in sorted({r.tier for r in runs}):
        group = [r for r in runs if r.tier == tier]
        grids = {arm: {(r.factor, r.seed) for r in group if r.arm == arm} for arm in {r.arm for r in group}}
        common = set.intersection(*grids.values())
        extra = [r for r in group if (r.factor, r.seed) not in common]
        if extra:
            factors, seeds = sorted({f for f, _ in common}), sorted({s for _, s in common})
            raise AblateError(f"the arms of tier {tier} were swept on different grids: {_paths(extra)} lie outside "
                              f"the grid every arm shares ({_grid_text(factors, seeds)}); one arm tuned on more LRs "
                              "or seeds than another is not a fair comparison: move them out, or read the table "
                              "with its experiment (whose LRSweep declares the grid)")


def _grid_text(factors, seeds) -> str:
    return f"factors {', '.join(f'{f:g}' for f in factors)}; seeds {', '.join(str(s) for s in seeds)}"


def _paths(runs: list[SweepRun]) -> str:
    names = [run_key(r.tier, r.arm, r.seed, r.factor) for r in runs]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _same(group: list[SweepRun], key: str, only_completed: bool, what: str) -> None:
    values = [(r, getattr(r.summary, key)) for r in group if getattr(r.summary, key) is not None
              and (not only_completed or r.reason is None)]
    for run, value in values[1:]:
        if value != values[0][1]:
            raise AblateError(f"sweep runs {values[0][0].path} and {run.path} {what} ({key} differs); {WAY_OUT}")


def lr_table(folder: str | Path | RunFolders, margin: float = MARGIN, delta: float = DELTA, *,
             sweep: LRSweep | None = None, allow_unverified: bool = False) -> LRTable:
    """Per tier and arm the loss at each LR, the best LR (on the selection loss), the vertex of a parabola
    in log2(lr) through the minimum and its neighbours, the largest stable LR and the δ-range's width.
    `sweep`: the experiment's declared LRSweep (only its factors × seeds count: `declared_only`)."""
    runs, outside = declared_only(sweep_runs(folder), sweep)
    check_sweep_matched(runs, allow_unverified)
    rows, best, curvature, warnings = [], [], {}, list(outside)
    keys = sorted({(r.tier, r.arm) for r in runs}, key=lambda k: (tier_rank(k[0]), k[0], k[1]))
    for tier, arm in keys:
        of_arm = [r for r in runs if (r.tier, r.arm) == (tier, arm)]
        arm_rows = [_row(tier, arm, [r for r in of_arm if r.factor == f]) for f in sorted({r.factor for r in of_arm})]
        rows += arm_rows
        chosen, curve, warning = _best(tier, arm, arm_rows, of_arm, margin, delta)
        best.append(chosen)
        curvature[(tier, arm)] = curve
        warnings += [warning] if warning else []
    points = [{"tier": r.tier, "arm": r.arm, "seed": r.seed, "lr": r.lr, "factor": r.factor,
               "loss": r.selection_loss if r.reason is None else None} for r in runs]
    return LRTable(RunFolders.of(folder).root.name, rows, best, points, curvature, margin, delta, tuple(warnings),
                   optimum_rows(points, best))


def _row(tier: str, arm: str, at_lr: list[SweepRun]) -> dict:
    counted = [r.selection_loss for r in at_lr if r.reason is None]
    val = [r.val_loss for r in at_lr if r.reason is None and r.val_loss is not None]
    return {"tier": tier, "arm": arm, "lr": at_lr[0].lr, "factor": at_lr[0].factor, "seeds": len(at_lr),
            "loss_mean": float(np.mean(counted)) if counted else None,
            "loss_sd": float(np.std(counted, ddof=1)) if len(counted) > 1 else None,
            "val_loss_mean": float(np.mean(val)) if val else None,
            "diverged": sum(r.diverged for r in at_lr), "not_counted": sum(r.reason is not None for r in at_lr)}


def stable(row: dict) -> bool:
    """An LR whose every seed completed with its selection loss (a diverged seed makes the LR unstable)."""
    return row["not_counted"] == 0 and row["loss_mean"] is not None


def _best(tier, arm, rows: list[dict], runs: list[SweepRun], margin: float, delta: float):
    """(the arm's best row, the parabola's curvature, a warning or None)."""
    entry = {"tier": tier, "arm": arm, "best_lr": None, "best_factor": None, "vertex_lr": None,
             "max_stable_lr": None, "range_width_log2": None}
    candidates = [i for i, r in enumerate(rows) if stable(r)]
    if not candidates:
        return entry, None, f"{tier}/{arm}: no LR of the sweep completed on every seed; no best LR"
    i = min(candidates, key=lambda k: rows[k]["loss_mean"])
    floor = rows[i]["loss_mean"]
    entry.update(best_lr=rows[i]["lr"], best_factor=rows[i]["factor"])
    entry["max_stable_lr"] = max(r["lr"] for r in rows if stable(r) and r["loss_mean"] <= floor + margin)
    low = high = i
    while low > 0 and stable(rows[low - 1]) and rows[low - 1]["loss_mean"] <= floor + delta:
        low -= 1
    while high < len(rows) - 1 and stable(rows[high + 1]) and rows[high + 1]["loss_mean"] <= floor + delta:
        high += 1
    entry["range_width_log2"] = math.log2(rows[high]["lr"]) - math.log2(rows[low]["lr"])
    vertex, curve, warning = quadratic_vertex(rows, i, runs)
    entry["vertex_lr"] = vertex
    return entry, curve, warning and f"{tier}/{arm}: {warning}"


def quadratic_vertex(rows: list[dict], i: int, runs: list[SweepRun]) -> tuple[float | None, float | None, str | None]:
    """A least-squares parabola loss = a·x² + b·x + c in x = log2(lr), through the sweep seeds' points at the
    best LR and its two neighbours: (2^vertex, curvature 2a, a warning). None at the sweep's edge (widen it)
    or where the points do not curve upwards."""
    if i == 0 or i == len(rows) - 1 or not (stable(rows[i - 1]) and stable(rows[i + 1])):
        return None, None, "the best LR lies at the edge of the stable sweep: no vertex (widen the sweep)"
    lrs = {rows[k]["lr"] for k in (i - 1, i, i + 1)}
    points = [(math.log2(r.lr), r.selection_loss) for r in runs if r.lr in lrs and r.reason is None]
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    a, b, _ = np.polyfit(x, y, 2)
    if not a > 0:
        return None, None, "the losses around the best LR do not curve upwards: no vertex"
    return float(2 ** (-b / (2 * a))), float(2 * a), None


LR_FORMATS = ("md", "csv", "json")


def render_lr(table: LRTable, fmt: str = "md") -> str:
    """The LR table as markdown (the rows, then the best LRs, with what the columns mean), CSV or JSON."""
    if fmt not in LR_FORMATS:
        raise AblateError(f"--kind lr is written as {', '.join(LR_FORMATS)}, not --format {fmt}")
    if fmt == "json":
        return json.dumps(table.as_json(), indent=2) + "\n"
    best = [{**{k: b[k] for k in BEST_KEYS}, "curvature": table.curvature[(b["tier"], b["arm"])]} for b in table.best]
    rows = [{k: r[k] for k in ROW_KEYS} for r in table.rows]
    optimum = table.optimum
    if fmt == "csv":
        return (pl.DataFrame(rows).write_csv() + "\n" + pl.DataFrame(best).write_csv()
                + ("\n" + pl.DataFrame(optimum).write_csv() if optimum else ""))
    head = (f"LR sweep of {table.name}: the selection loss (nats) at each lr, mean over the sweep's seeds; the "
            f"best LR is chosen on it (val_loss_mean: the validation loss, reported only). max_stable_lr: the "
            f"largest lr that did not diverge and ended within {table.margin:g} nats of the best; range_width_log2: "
            f"the width of the contiguous lr range within {table.delta:g} nats of the best; vertex_lr and "
            f"curvature: a parabola in log2(lr) through the best LR and its neighbours. The runs of a tier differ "
            f"only in {VARIED} (and the arm and seed).")
    notes = "".join(f"\nwarning: {w}" for w in table.warnings)
    moved = f"\n{OPTIMUM_NOTE}.\n\n{_markdown(optimum)}" if optimum else ""
    return f"{head}\n\n{_markdown(rows)}\n{_markdown(best)}{moved}{notes}\n"


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e-2 or abs(value) >= 1e3 else f"{value:.4f}"
    return str(value)


def _markdown(rows: list[dict]) -> str:
    columns = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"
