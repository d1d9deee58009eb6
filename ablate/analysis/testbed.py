"""The mechanism testbed's section: each task tier's signature per arm with its seeds (a table and a figure).

Read from the counted runs' summaries (`signature`, `val_accuracy`, `val_loss_auc`, written by
`ablate.taskrun`); the paired tests of these quantities are the metric tables (`--metric abstain/NAME`,
`--metric filter/NAME`), and
the declared predictions are decided on the loss in the declared table. Why a figure of dots and not of bars:
with five seeds, each seed is worth seeing, and a mechanism that only some seeds build shows as a split.
"""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

import polars as pl

from ablate.analysis.plots import _save, arm_styles, figure
from ablate.store_summary import RunSummary, read_summary
from ablate.tiers import TASKS, TIERS, stream_absent_share, task_ceiling

LEARNED_ACCURACY = 0.95  # a run learned its task when its answer accuracy reaches this (docs/method.md)
SIGNATURE = (("first_key", "mass on key 0 (BOS, a sink token, or the first pair)"),
             ("phantom", "mass on the phantom key"), ("output_norm", "norm of the head's read"))
CASES = ("absent", "present")
# Filter's signature: per panel its title and, per case (junk read, clean read), the summary key (None: no such case)
FILTER_PANELS = (("attention mass at answers", ("junk_mass", "clean_mass")),
                 ("value gate on the read", ("gate_junk", "gate_clean")),
                 ("junk's weight after the gate", ("junk_weight", None)),
                 ("norm of the head's read", ("output_norm", None)))
FILTER_CASES = ("junk reads", "clean reads")
# Each panel's y-axis: what its dots measure, by the panel's title
Y_LABELS = {"attention mass at answers": "attention mass (fraction)", "value gate on the read": "gate (0 to 1)",
            "junk's weight after the gate": "weight (attention × gate)", "norm of the head's read": "L2 norm",
            "mass on key 0 (BOS, a sink token, or the first pair)": "attention mass (fraction)",
            "mass on the phantom key": "attention mass (fraction)"}
TITLE_WIDTH = 30  # characters per line of a panel's title: a 4-inch panel's at 10 points, so titles never overlap


def _panels(tier: str) -> tuple[tuple, tuple[str, ...]]:
    """The tier's task's signature as ((title, (key per case, …)), …) and its case labels."""
    if {"mark", "junk"} & set(TASKS.get(TIERS[tier].task, {})):  # the first Filter task, or the value-junk one
        return FILTER_PANELS, FILTER_CASES
    return tuple((title, tuple(f"{key}_{case}" for case in CASES)) for key, title in SIGNATURE), (
        "key absent", "key present")


def task_runs(runs) -> dict[str, dict[str, list[RunSummary]]]:
    """{task tier: {arm: [summary, …] in seed order}} of the counted runs of task tiers."""
    counted = runs.completed.filter(pl.col("tier").map_elements(
        lambda t: t in TIERS and TIERS[t].task is not None, return_dtype=pl.Boolean))
    out: dict[str, dict[str, list[RunSummary]]] = {}
    for row in counted.sort("seed").iter_rows(named=True):
        summary = read_summary(Path(row["path"]))
        if isinstance(summary.signature, dict):
            out.setdefault(row["tier"], {}).setdefault(row["arm"], []).append(summary)
    return {tier: {arm: by_arm[arm] for arm in runs.arm_order if arm in by_arm} for tier, by_arm in out.items()}


def _mean_sd(values: list[float | None], signed: bool = False) -> str:
    values = [v for v in values if v is not None]  # None: a quantity the arm has not (no value gate)
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{statistics.fmean(values):{'+' if signed else ''}.3f}" + ("" if math.isnan(sd) else f" ± {sd:.3f}")


def testbed_markdown(tier: str, by_arm: dict[str, list[RunSummary]]) -> str:
    """Per arm: seeds learned, loss at the budget, area under the curve, and the signature (mean ± sd)."""
    panels, _ = _panels(tier)
    keys = [key for _, per_case in panels for key in per_case if key is not None]
    # Filter's as eval.json names them; Abstain's as "first_key absent"
    names = [key if panels is FILTER_PANELS else " ".join(key.rsplit("_", 1)) for key in keys]
    head = ["arm", "seeds learned", "val_loss", "val_loss_auc"] + names
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, summaries in by_arm.items():
        learned = sum(s.val_accuracy >= LEARNED_ACCURACY for s in summaries)
        cells = [arm, f"{learned}/{len(summaries)}", _mean_sd([s.val_loss for s in summaries]),
                 _mean_sd([s.val_loss_auc for s in summaries])]
        cells += [_mean_sd([s.signature.get(key) for s in summaries]) for key in keys]
        lines.append("| " + " | ".join(cells) + " |")
    where = ("junk: reads of a queried key that carry a decoy value; the gate is measured on the reads themselves, "
             "the rest at answer positions; – for an arm without a value gate" if panels is FILTER_PANELS
             else "absent: queries whose key was never stored")
    return (f"Task {TIERS[tier].task} (tier {tier}): a run learned the task when its answer accuracy on the fixed "
            f"validation set is at least {LEARNED_ACCURACY}. The signature is measured in the last layer, mean over "
            f"heads; {where}. Mean ± sd over seeds.\n\n" + "\n".join(lines))


def plot_testbed(tier: str, by_arm: dict[str, list[RunSummary]], path: Path):
    """The declared quantity (the loss at the budget), then one panel per signature quantity; per arm its seeds
    as dots (at absent and present keys, or at junk and clean reads). Each panel's title wrapped to its width and
    its y-axis labelled; one legend, under the figure. Returns the figure (also written to `path`)."""
    # Colour and marker: a custom arm (oracle-gate) may share a built-in arm's colour, never both
    styles = {arm: {"color": style["color"], "marker": "o" if arm == "baseline" else style["marker"]}
              for arm, style in arm_styles(list(by_arm)).items()}
    panels, labels = _panels(tier)
    fig = figure(figsize=(4 * (len(panels) + 1), 4))
    axes = fig.subplots(1, len(panels) + 1)
    width = 0.8 / max(len(by_arm), 1)
    declared = axes[0]
    for k, (arm, summaries) in enumerate(by_arm.items()):
        losses = [s.val_loss for s in summaries if s.val_loss is not None]
        declared.scatter([k] * len(losses), losses, s=14, **styles[arm])
    declared.set_xticks(range(len(by_arm)), labels=list(by_arm), rotation=30, fontsize=8)
    declared.set_title(textwrap.fill("declared quantity: val_loss at the budget", TITLE_WIDTH), fontsize=10)
    declared.set_ylabel("validation loss (nats)")
    declared.grid(axis="y", alpha=0.3)
    axes = axes[1:]
    for ax, (title, per_case) in zip(axes, panels):
        for k, (arm, summaries) in enumerate(by_arm.items()):
            for i, key in enumerate(per_case):
                x = i + (k - (len(by_arm) - 1) / 2) * width
                values = [v for v in (s.signature.get(key) for s in summaries) if key and v is not None]
                ax.scatter([x] * len(values), values, s=14, **styles[arm], label=arm if i == 0 else None)
        shown = [label for label, key in zip(labels, per_case) if key is not None]
        ax.set_xticks(range(len(shown)), labels=shown)
        ax.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=10)
        ax.set_ylabel(Y_LABELS.get(title, title))
        ax.grid(axis="y", alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    fig.subplots_adjust(wspace=0.45, top=0.8, bottom=0.25)
    fig.legend(handles, names, loc="lower center", ncols=min(len(names), 6), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"Mechanism testbed, task {TIERS[tier].task}: the last layer, one dot per seed",
                 fontsize=10)
    _save(fig, path)
    return fig


# The graded testbed (experiments/testbed_dose.py): each mechanism at a graded dose, one task tier per dose.
INSIDE_MARGIN = 0.01  # a loss within 1% of the span of the floor or the ceiling is at it (`pick_dose`)
DOSE_FIELDS = {"absent": "share of queries with nothing to read", "dose": "junk marker size ε"}


def tier_dose(tier: str) -> tuple[str, float] | None:
    """(what the dose is, its value) of a graded task tier: the stream task's share of queries with nothing to
    read, the content-marked value-junk task's ε; None for another tier."""
    fields = TASKS.get(TIERS[tier].task or "", {}) if tier in TIERS else {}
    if "absent" in fields:
        return DOSE_FIELDS["absent"], stream_absent_share(fields)
    if fields.get("junk") == "content":
        return DOSE_FIELDS["dose"], float(fields["dose"])
    return None


def tier_ceiling(tier: str) -> float:
    """The loss of a model that cannot do the mechanism's job on the tier's task (`ablate.tiers.task_ceiling`)."""
    return task_ceiling(TASKS[TIERS[tier].task])


def pick_dose(pilot: dict[float, list[float]], ceilings: dict[float, float], floor: float = 0.0) -> float:
    """The graded testbed's rule, on the baseline alone: of the pilot's doses whose every baseline seed lies
    strictly between the floor and that dose's ceiling (off each by more than `INSIDE_MARGIN` of the span: a loss of
    1e-7 is at the floor), the one whose mean loss lies nearest the middle of the two,
    as a share of the span (most room on both sides: an arm can be seen to remove part of the loss, all of it, or
    none). `pilot`: {dose: baseline val_loss per seed}; `ceilings`: {dose: the task's ceiling there}."""
    def strictly_inside(x: float, ceiling: float) -> bool:  # off each end by more than 1% of the span
        margin = INSIDE_MARGIN * (ceiling - floor)
        return floor + margin < x < ceiling - margin

    inside = {dose: losses for dose, losses in pilot.items()
              if losses and all(strictly_inside(x, ceilings[dose]) for x in losses)}
    if not inside:
        raise ValueError(f"no pilot dose of {sorted(pilot)} has its baseline strictly between the floor and the "
                         "ceiling")

    def off_middle(dose: float) -> float:
        return abs((statistics.fmean(inside[dose]) - floor) / (ceilings[dose] - floor) - 0.5)

    return min(inside, key=lambda dose: (off_middle(dose), dose))


def graded_families(tiers) -> dict[str, list[str]]:
    """{what the dose is: [tier, …] by dose} of the graded tiers among `tiers` (two or more of one kind)."""
    families: dict[str, list[tuple[float, str]]] = {}
    for tier in tiers:
        dose = tier_dose(tier)
        if dose is not None:
            families.setdefault(dose[0], []).append((dose[1], tier))
    return {kind: [t for _, t in sorted(pairs)] for kind, pairs in families.items() if len(pairs) > 1}


def dose_response_markdown(losses: dict[str, dict[str, list[float]]], tiers=()) -> str:
    """The dose–response table of the graded tiers among `losses` ({tier: {arm: [val_loss per seed]}}; `tiers`:
    only these): per tier its dose, the baseline's place between floor (0) and the task's ceiling, and each arm's
    val_loss, mean ± sd over seeds, with its Δ from the baseline (baseline − arm, paired by seed) below."""
    parts = []
    for kind, family in graded_families([t for t in losses if not tiers or t in tiers]).items():
        arms = list(dict.fromkeys(arm for tier in family for arm in losses[tier]))
        head = ["tier", kind, "ceiling", *arms]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for tier in family:
            base = losses[tier].get("baseline", [])
            cells = [tier, f"{tier_dose(tier)[1]:.3g}", f"{tier_ceiling(tier):.3f}"]
            for arm in arms:
                mine = losses[tier].get(arm, [])
                cell = _mean_sd(mine)
                if arm != "baseline" and base and len(mine) == len(base):
                    cell += f"<br>Δ {_mean_sd([b - a for b, a in zip(base, mine)], signed=True)}"
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
        parts.append(f"Dose–response ({kind}): val_loss at the budget, mean ± sd over seeds; Δ = baseline − arm "
                     "paired by seed (positive: the arm is better); floor 0, ceiling the loss of a model that cannot "
                     "do the mechanism's job.\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def plot_dose_response(losses: dict[str, dict[str, list[float]]], path: Path) -> bool:
    """val_loss against the dose per arm (mean ± sd over seeds), one panel per graded family; False if none."""
    families = graded_families(list(losses))
    if not families:
        return False
    arms = list(dict.fromkeys(arm for by_arm in losses.values() for arm in by_arm))
    styles = arm_styles(arms)
    fig = figure(figsize=(5 * len(families), 4))
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, (kind, family) in zip(axes, families.items()):
        doses = [tier_dose(tier)[1] for tier in family]
        for arm in arms:
            points = [(d, statistics.fmean(losses[t][arm]), statistics.stdev(losses[t][arm])
                       if len(losses[t][arm]) > 1 else 0.0) for d, t in zip(doses, family) if losses[t].get(arm)]
            if points:
                xs, ys, sds = zip(*points)
                ax.errorbar(xs, ys, yerr=sds, label=arm, capsize=3, color=styles[arm]["color"],
                            marker=styles[arm]["marker"])
        ax.plot(doses, [tier_ceiling(t) for t in family], color="grey", linestyle=":", label="ceiling")
        ax.set_xlabel(kind)
        ax.set_ylabel("val_loss at the budget")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Graded testbed: dose–response, mean ± sd over seeds", fontsize=10)
    _save(fig, path)
    return True
