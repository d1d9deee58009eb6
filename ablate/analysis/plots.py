"""The report's figures: the forest plot of the paired table, the increments with their crossover, the
validation curves; and the one style per arm (colour, marker, line style) that all of them share.

Figures are drawn on a bare `Figure` with the Agg canvas (no pyplot), so that drawing them changes
no global matplotlib state and needs no display.
"""

from __future__ import annotations

import io
from pathlib import Path

import polars as pl

from ablate.analysis.crossover import Crossover, find_crossover, format_params, sized  # noqa: F401
from ablate.increments import DESCRIPTIONS, FILTERING, INCREMENTS
from ablate.analysis.tables import Table, is_pipeline_check
from ablate.arms.names import BUILTIN_ARMS
from ablate.store import atomic_write_bytes
from ablate.tiers import tier_rank

# One fixed style per arm in every figure of every report, derived from the arm's place in BUILTIN_ARMS (the order
# ablate/arms/builtin.py registers them in, read from that file: a new built-in arm is one edit, its class there,
# and its style follows; no list of colours by arm to keep in step): baseline black, solid, drawn on top; the
# others a colour, a marker and a line style, cycling at coprime lengths (11 colours, 7 markers) so that no two of
# the first 77 arms share colour and marker, each of the eleven built-in arms besides the baseline has a colour of
# its own (a figure of dots tells them apart by colour alone), and arms that share a colour differ in line style.
# Custom arms follow the built-ins in their order.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#000080")
MARKERS = ("o", "s", "^", "v", "D", "P", "X")
LINESTYLES = ("-", "--", ":")
BASELINE_STYLE = {"color": "#000000", "marker": ".", "linestyle": "-", "zorder": 10, "lw": 2.0}
# One colour per increment, by its place in `ablate.increments.INCREMENTS` (the increments' one owner).
QUANTITY_PALETTE = ("#1f77b4", "#d62728", "#9467bd", "#2ca02c", "#ff7f0e")
QUANTITY_COLOURS = {q: QUANTITY_PALETTE[i % len(QUANTITY_PALETTE)] for i, q in enumerate(INCREMENTS)}


def arm_styles(arm_order: list[str]) -> dict[str, dict]:
    """Each arm's line style (matplotlib keywords: color, marker, linestyle, zorder, lw): the baseline's, else
    the one of its index among the other arms (built-ins by their registry place, then the custom arms)."""
    others = [a for a in BUILTIN_ARMS if a != "baseline"]
    others += [a for a in dict.fromkeys(arm_order) if a not in BUILTIN_ARMS]
    styles = {}
    for arm in arm_order:
        if arm == "baseline":
            styles[arm] = dict(BASELINE_STYLE)
            continue
        i = others.index(arm)
        styles[arm] = {"color": COLOURS[i % len(COLOURS)], "marker": MARKERS[i % len(MARKERS)],
                       "linestyle": LINESTYLES[(i // len(COLOURS)) % len(LINESTYLES)], "zorder": 2, "lw": 1.1}
    return styles


def arm_colours(arm_order: list[str]) -> dict[str, str]:
    """Each arm's colour (`arm_styles`), for the figures that mark an arm by colour alone (dots, bands)."""
    return {arm: style["color"] for arm, style in arm_styles(arm_order).items()}


def tier_title(tier: str) -> str:
    return f"{tier} (pipeline check: no evidence)" if is_pipeline_check(tier) else tier


def _save(fig, path: Path) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")  # keep titles and legends whole
    atomic_write_bytes(path, buffer.getvalue())


def figure(**kwargs):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads only when a figure is drawn
    from matplotlib.figure import Figure  # matplotlib loads only when a figure is drawn (a table needs none)

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def starred_arms(paired: Table, supported: set[tuple[str, str]] | None = None) -> set[tuple[str, str]]:
    """(tier, arm) the forest plot marks `*`: `supported` when given (the declared comparisons whose decision is
    "supported", as the report lists them), else the rows with p_holm < 0.05; never a pipeline-check tier."""
    if supported is None:
        supported = {(r["tier"], r["arm"]) for r in paired.frame.iter_rows(named=True)
                     if r.get("p_holm") is not None and r["p_holm"] < 0.05}
    return {(tier, arm) for tier, arm in supported if not is_pipeline_check(tier)}


def plot_paired(paired: Table, arm_order: list[str], path: Path,
                supported: set[tuple[str, str]] | None = None) -> None:
    """Forest plot of the paired table: one panel per tier, arms down the side, each seed's difference
    as a dot, the mean with its 95% interval (hollow mean, no bar, at n = 1), zero marked; a star
    marks the arms supported (`starred_arms`: the report's decision, or p_holm < 0.05 without declarations)."""
    starred = starred_arms(paired, supported)
    frame, diffs = paired.frame, paired.differences
    tiers = sorted(frame["tier"].unique().to_list(), key=lambda t: (tier_rank(t), t))
    arms = [a for a in arm_order if a in set(frame["arm"].to_list())]
    styles = arm_styles(arm_order)
    fig = figure(figsize=(max(6.0, 4.2 * max(len(tiers), 1)), 1.2 + 0.42 * max(len(arms), 1)))
    axes = fig.subplots(1, max(len(tiers), 1), squeeze=False, sharey=True)[0]
    position = {arm: len(arms) - 1 - i for i, arm in enumerate(arms)}
    for ax, tier in zip(axes, tiers):
        for row in frame.filter(tier=tier).iter_rows(named=True):
            y, colour, marker = position[row["arm"]], styles[row["arm"]]["color"], styles[row["arm"]]["marker"]
            if diffs is not None:
                seeds = diffs.filter(tier=tier, arm=row["arm"]).sort("seed")["diff"].to_list()
                offsets = [0.18 * (k - (len(seeds) - 1) / 2) / max(len(seeds) - 1, 1) for k in range(len(seeds))]
                ax.plot(seeds, [y + o for o in offsets], "o", ms=3.5, color=colour, alpha=0.45, mec="none")
            if row["ci_low"] is not None:
                ax.errorbar([row["mean"]], [y], xerr=[[row["mean"] - row["ci_low"]], [row["ci_high"] - row["mean"]]],
                            fmt=marker, ms=6, color=colour, capsize=3)
            else:
                ax.plot([row["mean"]], [y], marker, ms=6, mfc="white", color=colour)
            if (tier, row["arm"]) in starred:
                ax.annotate("*", (1.0, y), xycoords=("axes fraction", "data"), ha="left", va="center", fontsize=12)
        ax.axvline(0.0, color="grey", lw=0.9)
        ax.set_title(tier_title(tier), fontsize=10)
        ax.set_xlabel(f"L_{paired.reference} − L_arm (nats)")
        ax.grid(axis="x", alpha=0.3)
    if not tiers:
        axes[0].text(0.5, 0.5, "no paired differences", ha="center", va="center", transform=axes[0].transAxes)
    axes[0].set_yticks(list(position.values()), labels=list(position))
    axes[0].set_ylim(-0.7, len(arms) - 0.3)
    fig.suptitle(f"{paired.name}: paired differences against {paired.reference}, positive = lower loss\n"
                 "dots: seeds; the arm's marker and bar: mean, 95% t interval (hollow: 1 seed); *: "
                 + ("supported, as declared" if supported is not None else "p_holm < 0.05"),
                 fontsize=10, y=1.0 + 0.5 / fig.get_figheight())
    _save(fig, path)


def plot_increments(increments: Table, crossovers: list[Crossover], path: Path) -> bool:
    """Increments against nominal tier size (log x), 95% t intervals; n = 1 points hollow, without a bar;
    each crossover (the scale model's fitted line) dashed, its Fieller interval shaded when identified. Returns False
    (and draws
    nothing) when no tier has a known size."""
    frame = increments.frame.filter(pl.col("tier").map_elements(sized, return_dtype=pl.Boolean))
    if frame.is_empty():
        return False
    fig = figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    if frame["tier"].n_unique() == 1:  # no size axis to draw: the quantities side by side at the one tier
        _increments_at_one_tier(ax, frame, increments.name)
        _save(fig, path)
        return True
    for k, quantity in enumerate(INCREMENTS):
        rows = frame.filter(pl.col("quantity") == quantity).to_dicts()
        if not rows:
            continue
        colour = QUANTITY_COLOURS[quantity]
        dodge = 10 ** (0.015 * (k - 1))  # side by side, so that the bars do not hide each other
        xs = [tier_rank(r["tier"]) * dodge for r in rows]
        ax.plot(xs, [r["mean"] for r in rows], "-", color=colour, alpha=0.6)
        spread = [(x, r) for x, r in zip(xs, rows) if r["ci_low"] is not None]
        if spread:
            ax.errorbar([x for x, _ in spread], [r["mean"] for _, r in spread],
                        yerr=[[r["mean"] - r["ci_low"] for _, r in spread],
                              [r["ci_high"] - r["mean"] for _, r in spread]],
                        fmt="o", color=colour, capsize=3)
        single = [(x, r) for x, r in zip(xs, rows) if r["ci_low"] is None]
        if single:
            ax.plot([x for x, _ in single], [r["mean"] for _, r in single], "o", mfc="white", color=colour)
        ax.plot([], [], "o-", color=colour, label=f"{quantity} ({DESCRIPTIONS[quantity]})")
    for crossover in crossovers:
        colour = QUANTITY_COLOURS[crossover.form]
        form = FILTERING[crossover.form]
        if crossover.params is None:
            continue
        ax.axvline(crossover.params, ls="--", color=colour, alpha=0.8,
                   label=f"crossover, {form} form ≈ {format_params(crossover.params)} (fitted line)")
        if crossover.identified:
            ax.axvspan(crossover.low, crossover.high, color=colour, alpha=0.12,
                       label=f"{form}: 95% Fieller {format_params(crossover.low)}–{format_params(crossover.high)}")
        else:
            ax.plot([], [], " ", label=f"{form}: crossover interval not identified")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    tiers = sorted(frame["tier"].unique().to_list(), key=tier_rank)
    ax.set_xticks([tier_rank(t) for t in tiers], labels=[t + ("\n(pipeline check)" if is_pipeline_check(t) else "")
                                                        for t in tiers])
    ax.minorticks_off()
    ax.set_xlabel("tier (nominal non-embedding parameters, log scale)")
    ax.set_ylabel("increment, nats (positive: lowers the loss)")
    ax.set_title(f"{increments.name}: increments with 95% t intervals (hollow: 1 seed)")
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def _increments_at_one_tier(ax, frame: pl.DataFrame, name: str) -> None:
    """One tier's increments as points with their 95% t intervals (hollow: 1 seed), one per quantity."""
    tier = frame["tier"][0]
    shown = [q for q in INCREMENTS if q in set(frame["quantity"].to_list())]
    for x, quantity in enumerate(shown):
        row = frame.filter(pl.col("quantity") == quantity).row(0, named=True)
        colour = QUANTITY_COLOURS[quantity]
        if row["ci_low"] is not None:
            ax.errorbar([x], [row["mean"]], yerr=[[row["mean"] - row["ci_low"]], [row["ci_high"] - row["mean"]]],
                        fmt="o", color=colour, capsize=4, ms=7)
        else:
            ax.plot([x], [row["mean"]], "o", mfc="white", color=colour, ms=7)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(shown)), labels=[f"{q}\n({DESCRIPTIONS[q]})" for q in shown], fontsize=8)
    ax.set_xlim(-0.6, len(shown) - 0.4)
    ax.set_xlabel(f"quantity, at the one tier {tier_title(tier)}")
    ax.set_ylabel("increment, nats (positive: lowers the loss)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"{name}: increments at {tier} with 95% t intervals (hollow: 1 seed); "
                 "a crossover needs two tiers or more", fontsize=9)


LATE_FRACTION = 0.5  # curves.png's second row: the tokens from this fraction of the run on, zoomed


def _one_legend(fig, axes, arm_order: list[str]) -> None:
    """One legend under the figure for every arm drawn in any panel, in the arms' order."""
    legend = {}
    for ax in axes.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = [arm for arm in arm_order if arm in legend]
    if labels:
        fig.legend([legend[a] for a in labels], labels, loc="lower center", ncols=min(len(labels), 9), fontsize=8,
                   bbox_to_anchor=(0.5, 0.0))


def plot_curves(curves: pl.DataFrame, tiers: list[str], arm_order: list[str], path: Path, name: str,
                reference: str | None = None):
    """Validation loss against tokens: the mean over seeds as a line, the seeds' range (min to max) as a
    band, one column per tier, each arm in its fixed colour. Returns the figure (also written to `path`).

    Row 1 is the whole run on a scale that holds every point; row 2 the second half of the run
    (`LATE_FRACTION`), its axes fitted to it, where the arms differ. With a `reference` arm, a third row
    shows the paired gap L_reference − L_arm per step (per seed, then mean and range over the seeds
    both ran): the arms differ by thousandths of a nat, invisible on the loss scale.
    """
    spread = [pl.col("val_loss").mean().alias("mean"), pl.col("val_loss").min().alias("low"),
              pl.col("val_loss").max().alias("high")]
    mean = curves.group_by("tier", "arm", "step").agg(pl.col("tokens").mean(), *spread)
    tiers = [t for t in tiers if t in set(mean["tier"].to_list())]
    gap = None
    if reference is not None and tiers:
        ref = curves.filter(arm=reference).select("tier", "seed", "step", ref_loss="val_loss")
        gap = (
            curves.filter(pl.col("arm") != reference).join(ref, on=["tier", "seed", "step"])
            .with_columns(val_loss=pl.col("ref_loss") - pl.col("val_loss"))
            .group_by("tier", "arm", "step").agg(pl.col("tokens").mean(), *spread)
        )
    rows = 3 if gap is not None and gap.height else 2
    columns = max(len(tiers), 1)
    fig = figure(figsize=(max(8.0, 4.0 * columns), 3.0 * rows + 1.0))
    axes = fig.subplots(rows, columns, squeeze=False)
    fig.subplots_adjust(left=0.07 if columns > 1 else 0.15, right=0.98, top=0.9, bottom=0.12, wspace=0.35, hspace=0.45)
    styles = arm_styles(arm_order)
    for column, tier in enumerate(tiers):
        whole, late_ax = axes[0][column], axes[1][column]
        panel = mean.filter(tier=tier)
        _draw_lines(whole, panel, arm_order, styles)
        _fit(whole, panel)
        whole.set_title(f"{tier_title(tier)}: whole run")
        start = LATE_FRACTION * panel["tokens"].max()
        late = panel.filter(pl.col("tokens") >= start)
        _draw_lines(late_ax, late, arm_order, styles)
        _fit(late_ax, late)
        late_ax.set_title(f"second half (from {start:,.0f} tokens)", fontsize=9)
        for ax in (whole, late_ax):
            ax.set_ylabel("validation loss (nats)")
        if rows == 3:
            bottom = axes[2][column]
            _draw_lines(bottom, gap.filter(tier=tier), arm_order, styles)
            bottom.axhline(0.0, color="grey", lw=0.8)
            bottom.set_ylabel(f"L_{reference} − L_arm (nats)")
        axes[-1][column].set_xlabel("tokens")
    if not tiers:
        axes[0][0].text(0.5, 0.5, "no validation curves in metrics.jsonl", ha="center", va="center")
    _one_legend(fig, axes, arm_order)
    fig.suptitle(f"{name}: validation loss, line = mean over seeds, band = min to max over seeds;\n"
                 "top: the whole run, middle: its second half zoomed"
                 + (f"; bottom: gap to {reference}, positive = lower loss" if rows == 3 else ""), fontsize=10)
    _save(fig, path)
    return fig


def _fit(ax, frame: pl.DataFrame) -> None:
    """Axes that hold every band and line of `frame` (with a 5% margin), in its token range only."""
    if frame.is_empty():
        return
    low, high = frame["low"].min(), frame["high"].max()
    margin = 0.05 * (high - low) or 0.01
    ax.set_ylim(low - margin, high + margin)
    first, last = frame["tokens"].min(), frame["tokens"].max()
    if last > first:
        ax.set_xlim(first, last)


def _draw_lines(ax, frame: pl.DataFrame, arm_order: list[str], styles: dict) -> None:
    """Each arm's mean as a line in its style (a marker at every evaluation), its band in its colour; the
    baseline last and on top."""
    lines = frame.sort("step").partition_by("arm", as_dict=True)
    for arm in sorted(arm_order, key=lambda a: a == "baseline"):
        line = lines.get((arm,))
        if line is not None:
            tokens, style = line["tokens"].to_numpy(), styles[arm]
            ax.fill_between(tokens, line["low"].to_numpy(), line["high"].to_numpy(), color=style["color"],
                            alpha=0.12, lw=0, zorder=style["zorder"] - 1)
            ax.plot(tokens, line["mean"].to_numpy(), ms=3.5, label=arm, **style)
    ax.grid(alpha=0.3)
