"""Figures a researcher would keep: every arm told apart (colour plus marker or line style), the baseline on top,
the demo's curves with ≥ 10 points, one tier's increments side by side, heatmaps scaled to their data."""

from __future__ import annotations

import itertools

from matplotlib.colors import to_hex

from ablate.analysis.build import build_table
from ablate.analysis.load import load_curves, load_runs
from ablate.analysis.plots import arm_styles, plot_curves, plot_increments
from ablate.arms.names import BUILTIN_ARMS
from ablate.experiment import load_experiment
from ablate.probes.diagnostics import plot_first_key_mass
from ablate.config import resolve_config
from analysis_fixtures import reference_losses, write_store
import pytest

pytestmark = pytest.mark.unit

CUSTOM = ["my-gate", "my-bias", "my-norm"]


def test_every_arm_has_a_style_of_its_own_and_the_baseline_stands_apart():
    styles = arm_styles(list(BUILTIN_ARMS) + CUSTOM)
    for a, b in itertools.combinations(styles, 2):
        same_colour = styles[a]["color"] == styles[b]["color"]
        assert not same_colour or (styles[a]["marker"] != styles[b]["marker"]
                                   and styles[a]["linestyle"] != styles[b]["linestyle"]), (a, b)
    assert styles["g1-elementwise"]["color"] != styles["g2-value"]["color"]  # the pair the first hour mixed up
    assert styles["baseline"]["color"] == "#000000"
    assert all(styles["baseline"]["zorder"] > s["zorder"] for arm, s in styles.items() if arm != "baseline")
    # fixed per arm: a figure of a few arms draws each as the whole demo does
    few = arm_styles(["baseline", "g2-value", "my-norm", "my-gate"])
    assert few["g2-value"] == styles["g2-value"] and few["my-gate"] != few["my-norm"]


def test_curves_draw_each_arm_in_its_style_with_the_baseline_on_top(tmp_path):
    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M"}
    runs = load_runs(write_store(tmp_path, losses=losses, curve_points=12))
    fig = plot_curves(load_curves(runs), runs.tiers, runs.arm_order, tmp_path / "curves.png", runs.name, "baseline")
    styles = arm_styles(runs.arm_order)
    whole = fig.axes[0]
    lines = {line.get_label(): line for line in whole.get_lines()}
    assert set(lines) == set(runs.arm_order)
    for arm, line in lines.items():
        assert (to_hex(line.get_color()), line.get_marker(), line.get_linestyle()) == (
            styles[arm]["color"], styles[arm]["marker"], styles[arm]["linestyle"]), arm
        assert len(line.get_xdata()) >= 10
    assert whole.get_lines()[-1].get_label() == "baseline"  # drawn last, and above every other line
    assert all(lines["baseline"].get_zorder() > line.get_zorder() for arm, line in lines.items() if arm != "baseline")


def test_every_demo_curve_has_at_least_ten_points():
    demo = load_experiment("demo")
    for spec in demo.runs():
        config = resolve_config(spec).to_dict()
        points = [s for s in range(config["steps"] + 1) if s % config["val_interval"] == 0 or s == config["steps"]]
        assert len(points) >= 10, (spec.key, config["steps"], config["val_interval"])


def test_increments_of_one_tier_stand_side_by_side_not_on_a_size_axis(tmp_path, monkeypatch):
    import ablate.analysis.plots as plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M"}
    assert plot_increments(build_table(load_runs(write_store(tmp_path, losses=losses)), "increments"), [],
                           tmp_path / "increments.png")
    ax = drawn[0].axes[0]
    labels = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
    assert labels == ["zero_option", "filtering_norm", "filtering_proj"] and ax.get_xscale() == "linear"
    assert "10M" in ax.get_xlabel() and "nominal" not in ax.get_xlabel()
    two = {k: v for k, v in reference_losses().items() if k[0] in ("10M", "50M")}  # two tiers: the size axis
    assert plot_increments(build_table(load_runs(write_store(tmp_path / "two", losses=two)), "increments"), [],
                           tmp_path / "two.png")
    sized = drawn[1].axes[0]
    assert sized.get_xscale() == "log" and [t.get_text() for t in sized.get_xticklabels()] == ["10M", "50M"]


def test_a_heatmap_is_scaled_to_its_data_and_prints_its_scale(tmp_path):
    masses = [[0.041, 0.052, 0.063], [0.047, 0.058, 0.049]]
    probe = {"arm": "baseline", "layers": [{"first_key_mass": row} for row in masses]}
    fig = plot_first_key_mass(probe, tmp_path / "heat.png", title="first-key mass")
    ax = fig.axes[0]
    assert ax.images[0].get_clim() == (0.041, 0.063)  # not 0–1: the heads' differences are visible
    assert "colour scale 0.041 to 0.063" in ax.get_title()
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:.3f}" for row in masses for v in row)
    assert (tmp_path / "heat.png").stat().st_size > 1000
    flat = plot_first_key_mass({"arm": "x", "layers": [{"first_key_mass": [0.5, 0.5]}]}, tmp_path / "flat.png")
    low, high = flat.axes[0].images[0].get_clim()
    assert low < 0.5 < high


def test_each_built_in_arm_has_a_colour_of_its_own_and_no_two_arms_share_colour_and_marker():
    """Issue 58: sink-token and g2-value were one green, told apart by dash only. A figure of dots (the testbed's,
    the paired seeds) tells arms apart by colour and marker, so no two of the built-ins and 60 more share both."""
    styles = arm_styles(list(BUILTIN_ARMS) + [f"my-arm-{i}" for i in range(60)])
    builtin = [styles[a]["color"] for a in BUILTIN_ARMS]
    assert len(set(builtin)) == len(builtin)
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == len(styles)


def test_the_testbed_figure_has_titles_apart_labelled_axes_and_one_legend(tmp_path):
    from ablate.analysis.testbed import plot_testbed
    from ablate.store_summary import RunSummary

    signature = {f"{name}_{case}": 0.1 for name in ("phantom", "first_key", "output_norm")
                 for case in ("absent", "present")}
    by_arm = {arm: [RunSummary(val_loss=0.09 + seed / 100, signature=signature) for seed in range(3)]
              for arm in ("baseline", "sink-logit", "sink-token", "off-by-one")}
    fig = plot_testbed("abstain-stream", by_arm, tmp_path / "testbed.png")
    renderer = fig.canvas.get_renderer()
    titles = sorted((ax.title.get_window_extent(renderer) for ax in fig.axes), key=lambda box: box.x0)
    gaps = [right.x0 - left.x1 for left, right in itertools.pairwise(titles)]
    assert min(gaps) >= 20, gaps  # pixels between neighbouring titles (they ran into each other: 5)
    assert all(ax.get_ylabel() for ax in fig.axes)
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(by_arm)
