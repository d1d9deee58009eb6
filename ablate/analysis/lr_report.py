"""The report's LR section: the LR table, its U-curves (lr.png), whether each arm's optimum moved (the sweep seeds'
vertices), and the tuned paired table beside the shared-LR one with whether the picked LRs changed each declared
comparison (a difference-in-differences t over the seeds). Empty when the experiment has no LR-sweep runs."""

from __future__ import annotations

import math
from pathlib import Path

from ablate.analysis.lr import lr_table, render_lr, stable
from ablate.analysis.lr_optimum import OPTIMUM_NOTE, optimum_text
from ablate.analysis.plots import _save, arm_colours, figure, tier_title
from ablate.analysis.kinds import kind_where
from ablate.analysis.tuned import TUNING_NOTE, tuned_tables, tuning_text
from ablate.errors import AblateError
from ablate.store import iter_lr_run_dirs


def plot_lr(table, path: Path) -> None:
    """Selection loss against lr (log2 axis), one panel per tier: each arm's mean over the sweep's seeds as a
    line, every seed a dot, a diverged LR an ✕ on the panel's top edge, the best LR a star."""
    tiers = list(dict.fromkeys(r["tier"] for r in table.rows))
    arms = list(dict.fromkeys(r["arm"] for r in table.rows))
    colours = arm_colours(arms)
    fig = figure(figsize=(5.5 * len(tiers), 4.2))
    for i, tier in enumerate(tiers):
        ax = fig.add_subplot(1, len(tiers), i + 1)
        for arm in arms:
            rows = [r for r in table.rows if r["tier"] == tier and r["arm"] == arm]
            kept = [r for r in rows if stable(r)]
            ax.plot([r["lr"] for r in kept], [r["loss_mean"] for r in kept], "-", color=colours[arm], label=arm)
            points = [p for p in table.points if p["tier"] == tier and p["arm"] == arm and p["loss"] is not None]
            ax.plot([p["lr"] for p in points], [p["loss"] for p in points], "o", color=colours[arm], ms=3, alpha=0.6)
            for r in rows:
                if r["diverged"]:
                    ax.plot([r["lr"]], [1.0], "x", color=colours[arm], ms=8, transform=ax.get_xaxis_transform())
            best = [b for b in table.best if b["tier"] == tier and b["arm"] == arm and b["best_lr"] is not None]
            for b in best:
                loss = [r["loss_mean"] for r in rows if r["lr"] == b["best_lr"]][0]
                ax.plot([b["best_lr"]], [loss], "*", color=colours[arm], ms=12, markeredgecolor="black")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate (log2 axis)")
        ax.set_ylabel("selection loss (nats)")
        ax.set_title(tier_title(tier) + " — ✕ diverged, ★ best")
        ax.legend(fontsize=7)
    _save(fig, path)


def lr_section(ctx) -> str:
    """## Learning rates: lr.md/lr.json/lr.png, and tuned.md when confirmatory runs exist."""
    root = ctx.runs.root
    if root is None or next(iter_lr_run_dirs(root), None) is None:
        return ""
    try:
        table = lr_table(root, *((ctx.lr_sweep.margin, ctx.lr_sweep.delta) if ctx.lr_sweep else ()),
                         sweep=ctx.lr_sweep, allow_unverified=ctx.allow_unverified)
    except AblateError as err:  # runs at an lr factor but no sweep among them, or unmatched: say so, go on
        return f"## Learning rates\n\nNo LR table: {err}"
    ctx.write("lr.md", render_lr(table, "md"))
    ctx.write("lr.json", render_lr(table, "json"))
    plot_lr(table, ctx.record("lr.png"))
    lines = ["## Learning rates", "", "[lr.md](lr.md) ([json](lr.json)): every arm's selection loss at each LR of the "
             "sweep; the best LR is chosen on the selection split, never on the validation tokens the tables report.",
             ""]
    for best in table.best:
        width = best["range_width_log2"]
        lines.append(f"- {best['tier']} {best['arm']}: best lr {_lr(best['best_lr'])}, vertex "
                     f"{_lr(best['vertex_lr'])}, "
                     f"largest stable {_lr(best['max_stable_lr'])}, range within δ "
                     f"{'–' if width is None else f'{width:g}'} octaves")
    lines += [f"- warning: {w}" for w in table.warnings]
    if table.optimum:
        lines += ["", OPTIMUM_NOTE + ".", "", optimum_text(table.optimum).rstrip()]
    lines += ["", "![lr](lr.png)"]
    paired = kind_where("forest")  # the report's paired table, at the shared and the tuned LRs
    try:
        shared, tuned, survived, key = tuned_tables(root, table.best_factors(), paired, _reference(ctx),
                                                    getattr(ctx, "declared", None), ctx.allow_unverified)
    except AblateError as err:
        return "\n".join(lines + ["", f"No tuned table yet: {err}"])
    ctx.write("tuned.md", f"# Shared LR\n\n{paired.render(shared, 'md')}\n\n# Each arm at its own best LR\n\n"
                          f"{paired.render(tuned, 'md')}\n")
    lines += ["", "[tuned.md](tuned.md): the paired table at each arm's own best LR (the confirmatory runs, seeds the "
              "sweep did not use) beside the shared-LR one. " + TUNING_NOTE + ".", "",
              tuning_text(survived, key).rstrip()]
    return "\n".join(lines)


def _reference(ctx) -> str:
    arms = ctx.runs.arm_order
    return "baseline" if "baseline" in arms else arms[0]


def _lr(value) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.3g}"
