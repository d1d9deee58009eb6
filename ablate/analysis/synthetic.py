"""The synthetic task's part of `ablate report`: synthetic.json → a table and synthetic.png. Torch-free.

`ablate synthetic --out EXPERIMENT_DIR` writes EXPERIMENT_DIR/synthetic/synthetic.json (`ablate.store.synthetic_results_path`):
per arm and seed the validation loss and accuracies, the task's loss floor, and where the retrieval
(last) layer's attention goes at answer positions, split by whether the queried key was stored.
The figure shows the mechanism the study is about: where the key is absent nothing is worth reading,
so the baseline parks the mass on the first key and sink-logit on its phantom key.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ablate.store import read_json, synthetic_results_path
from ablate.analysis.numerics import numerics_label
from ablate.analysis.plots import _save, arm_colours, figure

# (key in the attention dicts, label): where the mass of an answer position goes.
TARGETS = (
    ("first_key", "first key (BOS)"),
    ("queried_pair", "the queried pair"),
    ("other_pairs", "other pairs"),
    ("queries", "query tokens"),
    ("phantom", "phantom key"),
)
CASES = (("absent", "answers whose key is absent"), ("present", "answers whose key is stored"))


def load_synthetic(experiment_dir) -> dict | None:
    path = synthetic_results_path(experiment_dir)
    return read_json(path) if path.is_file() else None


def _by_arm(data: dict) -> dict[str, list[dict]]:
    arms: dict[str, list[dict]] = {}
    for run in data["runs"]:
        arms.setdefault(run["arm"], []).append(run)
    return arms


def _mean(values) -> tuple[float | None, float | None, float | None]:
    values = [v for v in values if v is not None]
    return (statistics.fmean(values), min(values), max(values)) if values else (None, None, None)


def synthetic_markdown(data: dict) -> str:
    """One row per arm: loss (and the floor), accuracies, and the retrieval layer's mass at absent-key answers."""
    loss_floor, accuracy_ceiling = data["floor"]["loss"], data["floor"]["accuracy"]
    lines = [
        f"Recall task where half the queries ask for a key that was never stored (answer NONE); {data['steps']} "
        "training steps per run. " + (
            f"No model can beat the loss floor {loss_floor:.4f} nats or the accuracy {accuracy_ceiling:.1%}: "
            f"{data['task']['answer_noise']:.0%} of stored-key answers are drawn at random. "
            if data["task"].get("answer_noise") else
            "The answers are exact (loss floor 0, accuracy 100%), so a loss above 0 measures how far an arm still is "
            "from the task. ")
        + "Attention: the last (retrieval) layer at answer positions, mean over heads and seeds"
        + f"{_made_on(data)}. At this budget the split is chaotic: another seed or another CPU kernel set can reverse "
        "which arm parks its mass where (docs/method.md, \"Numerics\").",
        "",
        "| arm | seeds | val loss | accuracy | NONE accuracy | absent key: first key | absent key: phantom "
        "| stored key: queried pair |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, runs in _by_arm(data).items():
        cell = lambda values, fmt: "–" if _mean(values)[0] is None else format(_mean(values)[0], fmt)  # noqa: E731
        lines.append(" | ".join([
            f"| {arm}", str(len(runs)), cell([r["val_loss"] for r in runs], ".4f"),
            cell([r["val_accuracy"] for r in runs], ".1%"), cell([r["absent_accuracy"] for r in runs], ".1%"),
            cell([r["attention"]["absent"]["first_key"] for r in runs], ".1%"),
            cell([r["attention"]["absent"]["phantom"] for r in runs], ".1%"),
            cell([r["attention"]["present"]["queried_pair"] for r in runs], ".1%"),
        ]) + " |")
    return "\n".join(lines)


def _made_on(data: dict) -> str:
    """", cpu AVX512" for results that record what computed them (older ones do not)."""
    label = numerics_label({"numerics": data.get("numerics")})
    return f", {label}" if label else ""


def plot_synthetic(data: dict, path: Path) -> None:
    """Two panels (absent / stored key), bars per place the mass goes, one bar per arm in its report colour;
    whiskers span the seeds when there are several."""
    arms = _by_arm(data)
    colours = arm_colours(list(arms))
    fig = figure(figsize=(10, 4.2))
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.8 / max(len(arms), 1)
    for ax, (case, title) in zip(axes, CASES):
        for k, (arm, runs) in enumerate(arms.items()):
            xs, heights, low, high = [], [], [], []
            for i, (key, _) in enumerate(TARGETS):
                mean, lo, hi = _mean([r["attention"][case][key] for r in runs])
                if mean is None:
                    continue
                xs.append(i + (k - (len(arms) - 1) / 2) * width)
                heights.append(mean)
                low.append(mean - lo)
                high.append(hi - mean)
            ax.bar(xs, heights, width=width, color=colours[arm], label=f"{arm} ({len(runs)} seed{'s' * (len(runs) > 1)})",
                   yerr=[low, high] if len(runs) > 1 else None, capsize=2)
        ax.set_xticks(range(len(TARGETS)), labels=[label for _, label in TARGETS], rotation=20, ha="right")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("attention mass (last layer, mean over heads)")
    axes[0].set_ylim(0.0, 1.0)
    axes[1].legend(fontsize=8)
    fig.suptitle("Synthetic abstention task: where the retrieval layer's attention goes at answer positions\n"
                 f"{data['steps']} steps{_made_on(data)}; at a short budget which arm parks it where depends on the seed "
                 "and the CPU's kernels", fontsize=10, y=1.04)
    _save(fig, path)
