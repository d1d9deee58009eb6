"""The crossover of the filtering and zero-option increments, and the report's two figures.

Figures are drawn on a bare `Figure` with the Agg canvas (no pyplot), so that drawing them changes
no global matplotlib state and needs no display.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ablate.analysis.tables import DESCRIPTIONS, INCREMENTS, Table
from ablate.store import atomic_write_bytes
from ablate.tiers import tier_rank

FILTERING_FORMS = ("filtering_proj", "filtering_norm")
ZERO_OPTION = "zero_option"


@dataclass(frozen=True)
class Crossover:
    """Where `form` (a filtering increment) first overtakes the zero-option increment.

    `params` is the crossing interpolated linearly in log10(nominal parameters) between the tiers
    `below` and `above`, where the sign of (filtering − zero_option) flips from ≤ 0 to > 0; None when
    there is no such flip. `message` says which case it is in words.
    """

    form: str
    params: float | None
    below: str | None
    above: str | None
    message: str


def format_params(count: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return f"{count:.3g}"


def _sized(tier: str) -> bool:
    rank = tier_rank(tier)
    return math.isfinite(rank) and rank > 0


def find_crossover(increments: Table, form: str) -> Crossover:
    """The crossover of one filtering form, from the per-tier means of the increments table."""
    means = {
        (row["tier"], row["quantity"]): row["mean"] for row in increments.frame.iter_rows(named=True)
    }
    tiers = sorted({t for t, _ in means if _sized(t)}, key=tier_rank)
    tiers = [t for t in tiers if (t, form) in means and (t, ZERO_OPTION) in means]
    label = f"{form} ({DESCRIPTIONS[form]})"
    if len(tiers) < 2:
        return Crossover(form, None, None, None,
                         f"{label}: not enough tiers to place a crossover (needs both increments at two or more "
                         f"tiers of known size; have {', '.join(tiers) or 'none'})")
    gaps = [means[(t, form)] - means[(t, ZERO_OPTION)] for t in tiers]
    if gaps[0] > 0:
        return Crossover(form, None, None, None,
                         f"{label}: no crossover in range; filtering already exceeds the zero option at the "
                         f"smallest tier, {tiers[0]}")
    for i in range(len(tiers) - 1):
        if gaps[i] <= 0 < gaps[i + 1]:
            lo, hi = math.log10(tier_rank(tiers[i])), math.log10(tier_rank(tiers[i + 1]))
            params = 10 ** (lo + (hi - lo) * (-gaps[i]) / (gaps[i + 1] - gaps[i]))
            later = [t for t, g in zip(tiers[i + 2:], gaps[i + 2:]) if g <= 0]
            tail = f"; it falls back to or below the zero option at {', '.join(later)}" if later else ""
            return Crossover(form, params, tiers[i], tiers[i + 1],
                             f"{label}: overtakes the zero option between {tiers[i]} and {tiers[i + 1]}, at "
                             f"≈ {format_params(params)} parameters (interpolated on a log scale from the means){tail}")
    return Crossover(form, None, None, None,
                     f"{label}: no crossover in range; the zero option stays at least as large up to {tiers[-1]}")


def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")  # keep titles and legends whole
    atomic_write_bytes(path, buffer.getvalue())


def _figure(**kwargs):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def plot_increments(increments: Table, crossovers: list[Crossover], path: Path) -> None:
    """Increments against nominal tier size (log x), 95% t intervals; n = 1 points hollow, without a bar."""
    fig = _figure(figsize=(7, 4.5))
    fig.subplots_adjust(left=0.12, right=0.97, top=0.92, bottom=0.12)
    ax = fig.add_subplot()
    sized = [t for t in increments.frame["tier"].unique().to_list() if _sized(t)]
    frame = increments.frame.filter(pl.col("tier").is_in(sized))
    colours = {"zero_option": "tab:blue", "filtering_norm": "tab:orange", "filtering_proj": "tab:green"}
    for k, quantity in enumerate(INCREMENTS):
        rows = frame.filter(pl.col("quantity") == quantity).to_dicts()
        if not rows:
            continue
        dodge = 10 ** (0.015 * (k - 1))  # side by side, so that the bars do not hide each other
        xs = [tier_rank(r["tier"]) * dodge for r in rows]
        ys = [r["mean"] for r in rows]
        ax.plot(xs, ys, "-", color=colours[quantity], alpha=0.6)
        spread = [(x, r) for x, r in zip(xs, rows) if r["ci_low"] is not None]
        if spread:
            ax.errorbar([x for x, _ in spread], [r["mean"] for _, r in spread],
                        yerr=[[r["mean"] - r["ci_low"] for _, r in spread], [r["ci_high"] - r["mean"] for _, r in spread]],
                        fmt="o", color=colours[quantity], capsize=3)
        single = [(x, r) for x, r in zip(xs, rows) if r["ci_low"] is None]
        if single:
            ax.plot([x for x, _ in single], [r["mean"] for _, r in single], "o", mfc="white",
                    color=colours[quantity])
        ax.plot([], [], "o-", color=colours[quantity], label=f"{quantity} ({DESCRIPTIONS[quantity]})")
    for crossover in crossovers:
        if crossover.params is not None:
            ax.axvline(crossover.params, ls="--", color=colours[crossover.form], alpha=0.8,
                       label=f"crossover, {crossover.form.split('_')[1]} form ≈ {format_params(crossover.params)}")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    tiers = sorted(frame["tier"].unique().to_list(), key=tier_rank)
    ax.set_xticks([tier_rank(t) for t in tiers], labels=tiers)
    ax.minorticks_off()
    ax.set_xlabel("tier (nominal non-embedding parameters, log scale)")
    ax.set_ylabel("increment, nats (positive: lowers the loss)")
    ax.set_title(f"{increments.name}: increments with 95% t intervals (hollow: 1 seed)")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_curves(curves: pl.DataFrame, tiers: list[str], arm_order: list[str], path: Path, name: str,
                reference: str | None = None) -> None:
    """Validation loss against tokens, mean over seeds, one column per tier, one colour per arm.

    With a `reference` arm, a second row shows the paired gap L_reference − L_arm per step (mean over
    the seeds both ran): the arms differ by thousandths of a nat, invisible on the loss scale.
    """
    import matplotlib

    mean = curves.group_by("tier", "arm", "step").agg(pl.col("tokens").mean(), pl.col("val_loss").mean())
    tiers = [t for t in tiers if t in set(mean["tier"].to_list())]
    gap = None
    if reference is not None and tiers:
        ref = curves.filter(arm=reference).select("tier", "seed", "step", ref_loss="val_loss")
        gap = (
            curves.filter(pl.col("arm") != reference).join(ref, on=["tier", "seed", "step"])
            .group_by("tier", "arm", "step").agg(pl.col("tokens").mean(), (pl.col("ref_loss") - pl.col("val_loss")).mean().alias("val_loss"))
        )
    rows = 2 if gap is not None and gap.height else 1
    columns = max(len(tiers), 1)
    fig = _figure(figsize=(max(8.0, 4.0 * columns), 3.2 * rows + 1.0))
    axes = fig.subplots(rows, columns, squeeze=False)
    fig.subplots_adjust(left=0.07 if columns > 1 else 0.15, right=0.98, top=0.88, bottom=0.15 if rows == 2 else 0.28,
                        wspace=0.35, hspace=0.4)
    palette = matplotlib.colormaps["tab20" if len(arm_order) > 10 else "tab10"]
    colours = {arm: palette(i % palette.N) for i, arm in enumerate(arm_order)}
    for column, tier in enumerate(tiers):
        top = axes[0][column]
        panel = mean.filter(tier=tier)
        _draw_lines(top, panel, arm_order, colours)
        late = panel.filter(pl.col("tokens") >= 0.2 * panel["tokens"].max())["val_loss"]
        margin = 0.05 * (late.max() - late.min()) or 0.01
        top.set_ylim(late.min() - margin, late.max() + margin)  # the end of training, where the arms differ
        top.set_title(tier)
        top.set_ylabel("validation loss (nats)")
        if rows == 2:
            bottom = axes[1][column]
            _draw_lines(bottom, gap.filter(tier=tier), arm_order, colours)
            bottom.axhline(0.0, color="grey", lw=0.8)
            bottom.set_ylabel(f"L_{reference} − L_arm (nats)")
        axes[-1][column].set_xlabel("tokens")
    if not tiers:
        axes[0][0].text(0.5, 0.5, "no validation curves in metrics.jsonl", ha="center", va="center")
    legend = {}
    for ax in axes.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = [arm for arm in arm_order if arm in legend]
    if labels:
        fig.legend([legend[a] for a in labels], labels, loc="lower center", ncols=min(len(labels), 9), fontsize=8)
    fig.suptitle(f"{name}: validation loss, mean over seeds (last 80% of tokens)"
                 + (f"; below: gap to {reference}, positive = lower loss" if rows == 2 else ""))
    _save(fig, path)


def _draw_lines(ax, frame: pl.DataFrame, arm_order: list[str], colours: dict) -> None:
    lines = frame.sort("step").partition_by("arm", as_dict=True)
    for arm in arm_order:
        line = lines.get((arm,))
        if line is not None:
            ax.plot(line["tokens"].to_numpy(), line["val_loss"].to_numpy(), color=colours[arm], lw=1.1, label=arm)
    ax.grid(alpha=0.3)
