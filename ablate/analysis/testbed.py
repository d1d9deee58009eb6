"""The mechanism testbed's section: each task tier's signature per arm with its seeds (a table and a figure).

Read from the counted runs' summaries (`signature`, `val_accuracy`, `val_loss_auc`, written by
`ablate.taskrun`); the paired tests of these quantities are the metric tables (`--metric abstain/NAME`), and
the declared predictions are decided on the loss in the declared table. Why a figure of dots and not of bars:
with five seeds, each seed is worth seeing, and a mechanism that only some seeds build shows as a split.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import polars as pl

from ablate.analysis.plots import _save, arm_colours, figure
from ablate.store import SUMMARY, read_json
from ablate.tiers import TIERS

LEARNED_ACCURACY = 0.95  # a run learned its task when its answer accuracy reaches this (docs/method.md)
SIGNATURE = (("first_key", "mass on the first key (BOS)"), ("phantom", "mass on the phantom key"),
             ("output_norm", "norm of the head's read"))
CASES = ("absent", "present")


def task_runs(runs) -> dict[str, dict[str, list[dict]]]:
    """{task tier: {arm: [summary, …] in seed order}} of the counted runs of task tiers."""
    counted = runs.completed.filter(pl.col("tier").map_elements(
        lambda t: t in TIERS and TIERS[t].task is not None, return_dtype=pl.Boolean))
    out: dict[str, dict[str, list[dict]]] = {}
    for row in counted.sort("seed").iter_rows(named=True):
        summary = read_json(Path(row["path"]) / SUMMARY)
        if isinstance(summary.get("signature"), dict):
            out.setdefault(row["tier"], {}).setdefault(row["arm"], []).append(summary)
    return {tier: {arm: by_arm[arm] for arm in runs.arm_order if arm in by_arm} for tier, by_arm in out.items()}


def _mean_sd(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{statistics.fmean(values):.3f}" + ("" if math.isnan(sd) else f" ± {sd:.3f}")


def testbed_markdown(tier: str, by_arm: dict[str, list[dict]]) -> str:
    """Per arm: seeds learned, loss at the budget, area under the curve, and the signature (mean ± sd)."""
    head = ["arm", "seeds learned", "val_loss", "val_loss_auc"] + [f"{key} {case}" for key, _ in SIGNATURE
                                                                   for case in CASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, summaries in by_arm.items():
        learned = sum(s["val_accuracy"] >= LEARNED_ACCURACY for s in summaries)
        cells = [arm, f"{learned}/{len(summaries)}", _mean_sd([s["val_loss"] for s in summaries]),
                 _mean_sd([s["val_loss_auc"] for s in summaries])]
        cells += [_mean_sd([s["signature"][f"{key}_{case}"] for s in summaries]) for key, _ in SIGNATURE
                  for case in CASES]
        lines.append("| " + " | ".join(cells) + " |")
    return (f"Task {TIERS[tier].task} (tier {tier}): a run learned the task when its answer accuracy on the fixed "
            f"validation set is at least {LEARNED_ACCURACY}. The signature is measured at answer positions of the last "
            "layer, mean over heads; absent: queries whose key was never stored. Mean ± sd over seeds.\n\n"
            + "\n".join(lines))


def plot_testbed(tier: str, by_arm: dict[str, list[dict]], path: Path) -> None:
    """One panel per signature quantity; per arm its seeds as dots at absent and present keys."""
    colours = arm_colours(list(by_arm))
    fig = figure(figsize=(12, 4))
    axes = fig.subplots(1, len(SIGNATURE))
    width = 0.8 / max(len(by_arm), 1)
    for ax, (key, title) in zip(axes, SIGNATURE):
        for k, (arm, summaries) in enumerate(by_arm.items()):
            for i, case in enumerate(CASES):
                x = i + (k - (len(by_arm) - 1) / 2) * width
                values = [s["signature"][f"{key}_{case}"] for s in summaries]
                ax.scatter([x] * len(values), values, s=14, color=colours[arm], label=arm if i == 0 else None)
        ax.set_xticks(range(len(CASES)), labels=["key absent", "key present"])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"Mechanism testbed, task {TIERS[tier].task}: the last layer at answer positions, one dot per seed",
                 fontsize=10)
    _save(fig, path)
