"""`plan --power --slope B`: each declared slope's power at the design, for both estimands (across these tier
recipes; as a law of N with tier-level scatter), checked against the analysis's own tests simulated at the same
design (another generator seed: the planner's figures are not its own simulation's echo)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from ablate.analysis.scale import fit_lines, law_interval, slope_interval
from ablate.cli import main
from ablate.experiment import load_experiment
from ablate.plan import slope_powers
from ablate.power import slope_power
from ablate.tiers import tier_rank

pytestmark = pytest.mark.unit

TIERS = ("10M", "50M", "124M", "350M")
SIZES = np.log10([tier_rank(t) for t in TIERS])
SEEDS = np.array([3, 3, 3, 1])
STUDIES = 20000


def _analysis_rejections(slope, sd, tier_sd, alpha):
    rng = np.random.default_rng(7)
    scatter = rng.normal(0.0, tier_sd, (STUDIES, len(SEEDS)))
    groups = [slope * SIZES[k] + scatter[:, k:k + 1] + rng.normal(0.0, sd, (STUDIES, n)) for k, n in enumerate(SEEDS)]
    means = np.stack([g.mean(axis=1) for g in groups], axis=-1)
    within = sum(((g - g.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) for g in groups)
    fit = fit_lines(SIZES, SEEDS, means, within)
    return (float(np.mean(slope_interval(fit)[2] < alpha)),
            float(np.mean(law_interval(fit, SIZES, SEEDS, means)[3] < alpha)))


@pytest.mark.parametrize("slope, tier_sd", [(-0.005, 0.0), (-0.005, 0.002), (-0.01, 0.004)])
def test_both_powers_are_the_analysis_tests_rejection_rates(slope, tier_sd):
    sd, alpha = 0.004, 0.05 / 17
    planned = slope_power(SIZES, SEEDS, slope, sd, tier_sd, alpha)
    recipe_at_no_scatter, law = _analysis_rejections(slope, sd, tier_sd, alpha)
    bound = 3 * np.sqrt(0.25 / STUDIES) * 2  # two simulations' Monte Carlo error, at most
    assert planned["law_power"] == pytest.approx(law, abs=bound)
    if tier_sd == 0.0:  # the recipe power is exact for the recipe slope (the tier means on the line)
        assert planned["recipe_power"] == pytest.approx(recipe_at_no_scatter, abs=bound)
    else:
        assert planned["law_power"] < planned["recipe_power"]  # scatter costs the law test power
    assert planned["recipe_df"] == 6 and planned["law_df"] == 2


def test_plan_power_gives_each_declared_slope_in_the_family(capsys):
    experiment = dataclasses.replace(load_experiment("sink_vs_filter"), family="experiment")
    rows = slope_powers(experiment, -0.005, 0.004, None, 0.05)
    assert [r["quantity"] for r in rows] == ["zero_option", "filtering_norm", "filtering_proj", "gap_norm", "gap_proj"]
    assert all(r["family_size"] == 17 and r["in_family"] and r["tier_sd"] == 0.002 for r in rows)
    assert rows[0]["seeds"] == [3, 3, 3, 1] and rows[0]["alpha_per_test"] == pytest.approx(0.05 / 17)
    assert main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", "--sd", "0.004", "--slope", "-0.005",
                 "--tier", "10M", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [r["quantity"] for r in plan["slopes"]] == [r["quantity"] for r in rows]
    assert all(not r["in_family"] and r["alpha_per_test"] == 0.05 for r in plan["slopes"])  # family="tier"
    assert main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", "--sd", "0.004", "--slope", "-0.005",
                 "--tier", "10M"]) == 0
    assert "power across these tier recipes 0." in capsys.readouterr().out


def test_a_bad_tier_sd_is_refused_naming_it():
    with pytest.raises(Exception, match="--tier-sd -1"):
        slope_powers(load_experiment("sink_vs_filter"), -0.005, 0.004, -1.0)


def test_docs_power_states_the_computed_figures():
    from pathlib import Path

    planned = slope_power(SIZES, SEEDS, -0.005, 0.004, 0.002, 0.05 / 17)
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "power.md").read_text().split())
    assert f"it is {planned['law_power']:.3f} against {planned['recipe_power']:.3f}" in text
