"""`plan --sequential` says what the design costs and does: GPU-hours, the next step, and
with --effect/--sd its power and expected seeds, checked by an independent simulation, beside the fixed design's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from ablate.cli import main

pytestmark = pytest.mark.unit


def independent(design: dict, d: float, paths: int = 20_000) -> tuple[float, float]:
    """Another generator, whole-path mean and sd per look (not running sums)."""
    rng = np.random.default_rng(7)
    values = rng.normal(d, 1.0, (paths, design["looks"][-1]["seeds"]))
    alive, found, seeds = np.ones(paths, bool), np.zeros(paths, bool), np.full(paths, values.shape[1])
    for look in design["looks"]:
        n = look["seeds"]
        t = values[:, :n].mean(axis=1) / (values[:, :n].std(axis=1, ddof=1) / math.sqrt(n))
        cross = alive & (np.abs(t) >= look["t_boundary"])
        found |= cross & (t > 0)
        seeds[cross] = n
        alive &= ~cross
    return float(found.mean()), float(seeds.mean())


@pytest.mark.parametrize("effect", [0.002, 0.004, 0.008])
def test_the_sequential_plan_gives_power_expected_seeds_and_gpu_hours(effect, capsys):
    assert main(["plan", "sink_vs_filter", "--sequential", "--looks", "3", "--max-seeds", "12", "--effect",
                 str(effect), "--sd", "0.004", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    power, seeds = independent(plan["sequential"], effect / 0.004)
    assert plan["operating"]["power"] == pytest.approx(power, abs=4 * math.sqrt(2 * 0.25 / 20_000))
    assert plan["operating"]["expected_seeds"] == pytest.approx(seeds, abs=0.1)
    level = plan["sequential"]["alpha_per_comparison"]
    for tier in plan["tiers"]:
        assert tier["expected_gpu_hours"] == pytest.approx(tier["expected_seeds"] * tier["gpu_hours_per_seed"])
        assert tier["gpu_hours_max"] == pytest.approx(12 * tier["gpu_hours_per_seed"])
        n = tier["fixed_seeds"]
        if n >= 2:
            c, lam = stats.t.ppf(1 - level / 2, n - 1), effect / 0.004 * math.sqrt(n)
            assert tier["fixed_power"] == pytest.approx(stats.nct.sf(c, n - 1, lam) + stats.nct.sf(c, n - 1, -lam),
                                                        abs=1e-9)
    assert plan["next"] == "ablate submit sink_vs_filter --sequential --looks 3 --max-seeds 12"


def test_the_text_names_the_next_step_and_an_effect_without_an_sd_is_refused(capsys):
    assert main(["plan", "sink_vs_filter", "--sequential", "--looks", "2", "--max-seeds", "6"]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours to the first look" in out and "next: ablate submit sink_vs_filter --sequential" in out
    assert main(["plan", "sink_vs_filter", "--sequential", "--looks", "2", "--max-seeds", "6", "--effect",
                 "0.004"]) == 2
    err = capsys.readouterr().err
    assert "needs --sd" in err and err.count("\n") == 1
