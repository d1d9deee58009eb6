"""Every table is captioned by its quantity and its direction; a source's notes stand on their own lines."""


import pytest

from ablate.analysis.load import load_runs
from ablate.analysis.render import PADDED_VOCAB, REAL_VOCAB, VAL_LOSS_FOOTER, render
from ablate.analysis.report import write_report
from ablate.analysis.build import build_table
from ablate.analysis.tables import losses_table
from analysis_fixtures import write_csv, write_store
from test_eval_table import write_evaluated_study

pytestmark = pytest.mark.unit

LOSS_CAPTION = "Validation loss in nats"


@pytest.fixture
def evaluated(tmp_path):
    return write_evaluated_study(tmp_path)


def caption_of(markdown: str) -> str:
    return markdown.split("\n")[2]  # title, blank, caption


def test_a_higher_is_better_metric_table_names_its_metric_and_direction(evaluated):
    md = render(build_table(load_runs(evaluated, metric="hellaswag/acc_norm"), "paired"), "md")
    caption = caption_of(md)
    assert LOSS_CAPTION not in md and "L_baseline" not in md
    assert "hellaswag/acc_norm" in caption and "higher is better" in caption
    assert "Δ = acc_norm_arm − acc_norm_baseline" in caption and "positive: the arm is better" in caption
    assert VAL_LOSS_FOOTER not in md  # a metric is not val_loss: no padded-softmax footer


def test_a_lower_is_better_metric_table_differences_reference_minus_arm(evaluated):
    for kind in ("paired", "increments", "overlap"):
        md = render(build_table(load_runs(evaluated, metric="wikitext/word_perplexity"), kind), "md")
        caption = caption_of(md)
        assert "wikitext/word_perplexity" in caption and "lower is better" in caption and "nats" not in caption
    paired = render(build_table(load_runs(evaluated, metric="wikitext/word_perplexity"), "paired"), "md")
    assert "Δ = word_perplexity_baseline − word_perplexity_arm" in caption_of(paired)
    latex = render(build_table(load_runs(evaluated, metric="hellaswag/acc_norm"), "paired"), "latex")
    assert "hellaswag/acc\\_norm" in latex.splitlines()[0] and "nats" not in latex.splitlines()[0]


def test_the_report_s_downstream_tables_are_captioned_by_their_metric(evaluated):
    downstream = (write_report(evaluated) / "downstream.md").read_text()
    assert LOSS_CAPTION not in downstream
    assert ("Downstream metric hellaswag/acc_norm" in downstream
            and "Downstream metric wikitext/word_perplexity" in downstream)


def test_a_loss_table_says_nats_lower_is_better_and_the_val_loss_convention(tmp_path):
    runs = load_runs(write_store(tmp_path, curve_points=2))
    for table in (*(build_table(runs, kind) for kind in ("paired", "increments", "overlap")), losses_table(runs)):
        md = render(table, "md")
        assert caption_of(md).startswith("Validation loss in nats (lower is better).")
        assert VAL_LOSS_FOOTER in md
    assert f"{PADDED_VOCAB:,}" in VAL_LOSS_FOOTER and f"{PADDED_VOCAB - REAL_VOCAB} padding rows" in VAL_LOSS_FOOTER
    assert "never below the real-vocabulary loss" in VAL_LOSS_FOOTER and "ablate eval" in VAL_LOSS_FOOTER
    assert "padding" in render(build_table(runs, "paired"), "latex")


def test_a_csv_source_s_unverified_pairing_has_its_own_line_not_under_skipped(tmp_path):
    md = render(build_table(load_runs(write_csv(tmp_path / "runs.csv")), "paired"), "md")
    lines = md.splitlines()
    note = next(i for i, line in enumerate(lines) if "pairing NOT verified" in line)
    assert lines[note].startswith("Note: pairing NOT verified") and note < lines.index("| tier | arm | n | mean ± sd "
                                                                                      "| se | 95% CI | min "
                                                                                      "| max | agree "
                                                                                      "| p | p_holm | marks |")
    assert md.count("pairing NOT verified") == 1 and "Skipped:" not in md


def test_skipped_quantities_stay_under_skipped_beside_a_source_note(tmp_path):
    losses = {("10M", "baseline", s): 4.0 + s / 100 for s in range(2)}
    losses.update({("10M", "sink-logit", s): 3.99 + s / 100 for s in range(2)})
    md = render(build_table(load_runs(write_csv(tmp_path / "runs.csv", losses)), "increments"), "md")
    skipped = md.split("Skipped:", 1)[1]
    assert "filtering_norm skipped" in skipped and "pairing NOT verified" not in skipped
    assert "Note: pairing NOT verified" in md.split("Skipped:", 1)[0]


def test_curves_png_shows_the_whole_run_and_its_late_part_and_names_its_band(tmp_path):
    from ablate.analysis.load import load_curves
    from ablate.analysis.plots import LATE_FRACTION, plot_curves

    runs = load_runs(write_store(tmp_path, curve_points=12))
    fig = plot_curves(load_curves(runs), runs.tiers, runs.arm_order, tmp_path / "curves.png", runs.name, "baseline")
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert "band = min to max over seeds" in fig._suptitle.get_text()
    axes = fig.axes
    assert len(axes) == 3 * len(runs.tiers)  # whole run, second half, gap: one column per tier
    for ax in axes:  # no line runs off its panel: every point inside the x range lies inside the y range
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        for line in ax.get_lines():
            for x, y in zip(*line.get_data()):
                if x0 <= x <= x1:
                    assert y0 <= y <= y1, (ax.get_title(), x, y)
    whole, late = axes[0], axes[len(runs.tiers)]
    assert whole.get_title().endswith("whole run") and whole.get_xlim()[0] == min(whole.get_lines()[0].get_xdata())
    assert late.get_xlim()[0] >= LATE_FRACTION * max(whole.get_lines()[0].get_xdata())
    late_span, whole_span = late.get_ylim()[1] - late.get_ylim()[0], whole.get_ylim()[1] - whole.get_ylim()[0]
    assert late_span < whole_span / 5  # the late part zoomed, where the arms differ
