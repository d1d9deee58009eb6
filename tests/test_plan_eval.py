"""`ablate plan --eval`: a downstream evaluation wants at least three seeds per tier (issue 57 item 5), because the
by-item interval at two seeds is 2.5–5.2× an oracle's width (1.0–2.0× at three): simulated here on the variance
mixes of tests/test_items_coverage.py, through the library's interval."""

import json

import numpy as np
import pytest

from ablate.analysis.items import crossed_intervals
from ablate.cli import main
from ablate.plan import EVAL_MIN_SEEDS, EVAL_WIDTH
from test_items_coverage import ITEMS, MIXES

pytestmark = pytest.mark.unit

STUDIES = 400


def width_ratios(seeds: int, rng) -> list[float]:
    """Per variance mix and item count, the median width of the reported interval over the oracle's (the normal
    interval with the true variance of the mean: σ_seed²/n + σ_item²/m + σ²/(nm))."""
    ratios = []
    for items in ITEMS:
        for sa, sb, se in MIXES:
            y = (rng.normal(0, sa, (STUDIES, seeds, 1)) + rng.normal(0, sb, (STUDIES, 1, items))
                 + rng.normal(0, se, (STUDIES, seeds, items)))
            low, high, _ = crossed_intervals(y)
            oracle = 2 * 1.959964 * np.sqrt(sa ** 2 / seeds + sb ** 2 / items + se ** 2 / (seeds * items))
            ratios.append(float(np.median(high - low) / oracle))
    return ratios


@pytest.mark.parametrize("seeds", [2, 3])
def test_the_plan_s_width_figures_are_the_simulated_ones(seeds):
    ratios = width_ratios(seeds, np.random.default_rng(57 + seeds))
    low, high = EVAL_WIDTH[seeds]
    assert min(ratios) == pytest.approx(low, abs=0.15) and max(ratios) == pytest.approx(high, abs=0.35), ratios


def test_plan_recommends_three_seeds_for_a_downstream_evaluation(capsys):
    assert EVAL_MIN_SEEDS == 3
    assert main(["plan", "sink_vs_filter", "--eval", "hellaswag"]) == 0
    out = capsys.readouterr().out
    assert "downstream evaluation (hellaswag): a downstream evaluation wants at least 3 seeds per tier" in out
    assert "warning: tier 350M has one seed: its by-item interval is items-only" in out
    assert "warning: tier 10M" not in out  # three seeds: enough
    assert main(["plan", "sink_vs_filter", "--eval", "hellaswag", "--seed-count", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("two seeds: by-item intervals are 2.5–5.2× an oracle's width (1–2× at three)") == 4
    assert main(["plan", "sink_vs_filter", "--eval", "lambada_openai", "--seed-count", "3", "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)["downstream"]
    assert advice["min_seeds"] == 3 and all(t["enough"] for t in advice["tiers"])
    assert main(["plan", "sink_vs_filter", "--eval", "hellaswagg"]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'hellaswagg' for --eval; valid tasks:" in err and err.count("\n") == 1
