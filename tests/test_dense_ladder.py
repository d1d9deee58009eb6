"""A ladder a scale law can be decided on (issue 57, item 1): intermediate tiers built by the ladder's own rules,
a way to run any ladder at one tokens-per-parameter ratio, the dense study as its own experiment (the study's stays
as it is), and `plan --power --slope` pricing the ladders that reach the law's power (seeds do not; tiers do)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from ablate.cli import main
from ablate.experiment import load_experiment
from ablate.plan import _meta_counts, plan_grid
from ablate.plan_ladder import SlopeInput, ladder_plan
from ablate.power import slope_power
from ablate.sizing import micro_batch_for, model_config
from ablate.tiers import (DENSE_LADDER, LADDER, TIER_ORDER, TIERS, at_tokens_per_param, interpolated_batch,
                          interpolated_lr, tier_rank)

pytestmark = pytest.mark.unit

DENSE = ("20M", "35M", "80M", "200M")
QUANTITIES = ("zero_option", "filtering_norm", "filtering_proj", "gap_norm", "gap_proj")


@pytest.mark.parametrize("name", DENSE)
def test_each_dense_tier_is_built_by_the_ladders_rules(name):
    tier = TIERS[name]
    baseline = _meta_counts(model_config(tier, "baseline"))["non_embedding"]
    assert abs(baseline / tier.nominal_params - 1) <= 0.05  # the baseline within ±5% of the name
    assert tier.d_model // tier.n_head == 64 and tier.n_kv_head == tier.n_head  # head dim 64
    assert tier.tokens == 20 * tier.nominal_params and tier.seq_len == 1024  # 20 tokens per parameter
    assert tier.lr == interpolated_lr(tier.nominal_params) and tier.global_batch == interpolated_batch(
        tier.nominal_params)
    assert tier.warmup_steps == round(0.02 * tier.steps) and tier.micro_batch == micro_batch_for(name, 80)
    assert tier.task is None and tier.seeds == 3


def test_the_interpolation_rules_are_the_stated_ones_and_hit_the_study_tiers():
    assert [interpolated_lr(TIERS[t].nominal_params) for t in LADDER] == [TIERS[t].lr for t in LADDER]
    assert [interpolated_batch(TIERS[t].nominal_params) for t in LADDER] == [TIERS[t].global_batch for t in LADDER]
    assert [TIERS[t].lr for t in DENSE] == [1.26e-3, 1.09e-3, 7.68e-4, 4.36e-4]  # as ablate/tiers.py states
    assert [TIERS[t].global_batch for t in DENSE] == [128, 256, 512, 512]
    assert [t for t in TIER_ORDER if t in DENSE_LADDER] == list(DENSE_LADDER)  # they join the tier order by size


def test_the_study_ladder_and_experiment_stay_as_they_are():
    assert {t: (TIERS[t].tokens, TIERS[t].lr, TIERS[t].global_batch, TIERS[t].n_layer, TIERS[t].d_model)
            for t in LADDER} == {"10M": (200_000_000, 1.5e-3, 128, 8, 320), "50M": (950_000_000, 1e-3, 256, 16, 512),
                                 "124M": (1_600_000_000, 6e-4, 512, 18, 768),
                                 "350M": (5_800_000_000, 3e-4, 512, 28, 1024)}
    study = load_experiment("sink_vs_filter")
    assert study.tiers == LADDER and study.seeds == {"10M": 3, "50M": 3, "124M": 3, "350M": 1}
    assert not study.overrides and study.family == "tier"


def test_any_ladder_runs_at_one_tokens_per_parameter_ratio():
    dense = load_experiment("sink_vs_filter_dense")
    assert dense.tiers == DENSE_LADDER and dense.family == "experiment"
    assert dense.overrides == at_tokens_per_param(DENSE_LADDER, 20)
    grid = plan_grid(dense)  # `plan` prices it
    for tier in grid["tiers"]:
        ratio = tier["runs"][0]["tokens"] / tier_rank(tier["tier"])
        assert ratio == pytest.approx(20, abs=0.01), (tier["tier"], ratio)
    assert grid["total_runs"] == 144
    power = " ".join((Path(__file__).resolve().parents[1] / "docs" / "power.md").read_text().split())
    assert f"prices it at 144 runs, {grid['total_gpu_hours']:.1f} GPU-hours" in power
    study = plan_grid(load_experiment("sink_vs_filter"))
    assert f"{study['total_runs']} runs, {study['total_gpu_hours']:.1f} GPU-hours for the study's 3/3/3/1" in power
    with pytest.raises(ValueError, match="tokens per parameter -1"):
        at_tokens_per_param(LADDER, -1)


def test_docs_power_states_that_seeds_do_not_buy_a_law_and_tiers_do():
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "power.md").read_text().split())
    table = re.findall(r"\| (\d) \| ([\d/]+) \| (\d+) \| (\d) \| (0\.\d{3}) \| (\d\.\d{3}) \|", text)
    assert len(table) == 8
    found = {}
    for tiers, seeds, m, df, law, recipe in table:
        ladder = {"4": LADDER, "6": ("10M", "20M", "50M", "124M", "200M", "350M"), "8": DENSE_LADDER}[tiers]
        counts = [int(s) for s in seeds.split("/")]
        planned = slope_power(np.log10([tier_rank(t) for t in ladder]), counts, 0.016, 0.003, 0.0025, 0.05 / int(m))
        assert int(m) == 3 * len(ladder) + 5 and int(df) == planned["law_df"]
        assert (law, recipe) == (f"{planned['law_power']:.3f}", f"{planned['recipe_power']:.3f}")
        found[(tiers, seeds)] = planned["law_power"]
    assert max(v for (t, _), v in found.items() if t == "4") < 0.2  # ten seeds per tier do not buy the law
    assert found[("8", "2/2/2/2/2/2/2/2")] >= 0.8  # eight tiers with two seeds do


@pytest.fixture(scope="module")
def small():
    """The study's declared family with four of its arms (the ladder's costs are priced on the real models)."""
    study = load_experiment("sink_vs_filter")
    return dataclasses.replace(study, arms=("baseline", "sink-logit", "combo", "combo2"), family="experiment",
                               lr_sweep=None)


def test_the_ladder_plan_proposes_the_cheapest_ladder_that_reaches_the_law(small):
    inputs = [SlopeInput(q, 0.016, 0.003, 0.0025, "--slope") for q in QUANTITIES]
    plan = ladder_plan(small, inputs)
    study = [c for c in plan["candidates"] if c["ladder"].startswith("study")]
    assert all(c["weakest"] < 0.2 for c in study)  # more seeds at four tiers never reach it
    proposal = plan["proposal"]
    assert proposal is not None and proposal["tiers"] == list(DENSE_LADDER) and proposal["seeds"] == 2
    assert proposal["weakest"] >= 0.8 and proposal["family_size"] == 29
    cheaper = [c for c in plan["candidates"] if c["gpu_hours"] < proposal["gpu_hours"]]
    assert cheaper and all(c["weakest"] < 0.8 for c in cheaper)
    assert [r["law_power"] for r in plan["design"]["slopes"]][0] < 0.2 and plan["design"]["family_size"] == 17
    assert "more tiers cannot cure a curve that bends" in plan["caveat"]


def test_the_pilots_effects_and_lack_of_fit_plan_the_ladder(tmp_path, capsys, small):
    from ablate.analysis.load import load_runs
    from ablate.analysis.scale import scale_table
    from ablate.analysis.scale_pilot import pilot_slopes
    from analysis_fixtures import write_store

    folder = write_store(tmp_path / "results")
    runs = load_runs(folder)
    pilot = pilot_slopes(runs)
    scale = {r["quantity"]: r for r in scale_table(runs).rows.iter_rows(named=True)}
    zero = pilot["zero_option"]
    assert zero.slope == pytest.approx(scale["zero_option"]["slope_per_decade"], rel=1e-12)
    assert zero.seeds == (3, 3, 3, 1) and zero.tier_sd is not None and zero.tier_sd > 0  # the reference means bend
    # τ̂² = (lack − s²)/n̄: the lack-of-fit mean square it came from is σ̂² + n̄τ̂²
    from ablate.analysis.scale import fit_quantity, lack_mean_square, quantities
    from ablate.analysis.tables import increments_table
    fitted = fit_quantity(quantities(increments_table(runs).differences, None)["zero_option"])
    lack = float(lack_mean_square(fitted.fit, fitted.log_sizes, fitted.counts, fitted.means))
    assert zero.sd ** 2 + 2.5 * zero.tier_sd ** 2 == pytest.approx(lack, rel=1e-9)
    assert main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", "--pilot", str(folder), "--slope", "0.01",
                 "--tier", "10M", "--json"]) == 0
    ladder = json.loads(capsys.readouterr().out)["ladder"]
    rows = {r["quantity"]: r for r in ladder["design"]["slopes"]}
    assert rows["zero_option"]["slope"] == pytest.approx(zero.slope) and rows["zero_option"]["source"].startswith(
        "pilot (10M, 50M, 124M, 350M with 3/3/3/1 seeds")
    assert math.isclose(rows["zero_option"]["tier_sd"], zero.tier_sd)
