"""Power planning and sequential seeds (ablate.power), each number checked by an independent computation.

Seed counts against scipy's noncentral t directly (not statsmodels); the pilot's sd and its upper limit
by hand; the sequential boundaries' error under the null by a simulation of its own (another generator,
whole paths at once rather than running sums), which also shows the normal approximation is wrong.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ablate.errors import AblateError
from ablate.family import Family
from ablate.power import (Pilot, look_seeds, obrien_fleming_spent, pilot_sd, pilot_warning, power_rows,
                          sd_upper_limit, seeds_needed, sequential_decision, sequential_design)

pytestmark = pytest.mark.unit

ROW_FIELDS = {"tier", "comparison", "sd", "effect", "alpha", "family_size", "target_power", "seeds",
              "seeds_conservative", "gpu_hours"}


def nct_power(n: int, d: float, level: float) -> float:
    """Two-sided power of the one-sample t with n values at `level`: P(|T| > t_crit), T ~ nct(n−1, d√n);
    the lower tail P(T < −t_crit) is taken as P(T' > t_crit), T' ~ nct(n−1, −d√n) (scipy's cdf is nan there at 1 df)."""
    critical, delta = stats.t.ppf(1 - level / 2, n - 1), d * math.sqrt(n)
    return stats.nct.sf(critical, n - 1, delta) + stats.nct.sf(critical, n - 1, -delta)


def smallest_n(d: float, level: float, target: float) -> int:
    n = 2
    while nct_power(n, d, level) < target:
        n += 1
    return n


# ---------------------------------------------------------------- seeds_needed


@pytest.mark.parametrize("effect, sd, alpha, m, power", [
    (0.0185, 0.002, 0.05, 3, 0.8),   # the study's largest effect: statsmodels' solver fails, the answer is 3
    (0.0185, 0.004, 0.05, 3, 0.8),
    (0.0050, 0.004, 0.05, 3, 0.8),
    (0.0040, 0.004, 0.05, 11, 0.9),
    (0.0013, 0.004, 0.05, 3, 0.8),   # about a hundred seeds
    (0.0013, 0.002, 0.01, 2, 0.95),
    (1.0, 1.0, 0.05, 1, 0.5),
])
def test_seeds_needed_is_the_smallest_n_with_enough_noncentral_t_power(effect, sd, alpha, m, power):
    assert seeds_needed(effect, sd, alpha, m, power) == smallest_n(effect / sd, alpha / m, power)


def test_seeds_needed_where_statsmodels_power_is_nan():
    from statsmodels.stats.power import TTestPower

    d = 0.09 / 0.002  # its power at 2 seeds is nan in statsmodels (the lower tail at 1 df), though 2 seeds do
    assert math.isnan(TTestPower().power(effect_size=d, nobs=2, alpha=0.05 / 3, alternative="two-sided"))
    assert seeds_needed(0.09, 0.002, 0.05, 3, 0.8) == smallest_n(d, 0.05 / 3, 0.8) == 2


def test_seeds_needed_is_at_least_two_and_grows_with_the_family():
    assert seeds_needed(1.0, 0.001, 0.05, 1, 0.8) == 2
    assert seeds_needed(0.002, 0.004, 0.05, 11, 0.8) > seeds_needed(0.002, 0.004, 0.05, 3, 0.8)


@pytest.mark.parametrize("kwargs, needle", [
    ({"effect": 0.0}, "effect 0.0"), ({"effect": -0.001}, "effect -0.001"), ({"sd": 0.0}, "sd 0.0"),
    ({"sd": -1.0}, "sd -1.0"), ({"sd": float("nan")}, "sd nan"), ({"alpha": 0.0}, "alpha 0.0"),
    ({"alpha": 1.0}, "alpha 1.0"), ({"target_power": 1.0}, "target power 1.0"),
    ({"target_power": 0.0}, "target power 0.0"), ({"family_size": 0}, "family size 0"),
    ({"family_size": 1.5}, "family size 1.5"),
])
def test_seeds_needed_refuses_bad_input_naming_it(kwargs, needle):
    args = {"effect": 0.002, "sd": 0.004, "alpha": 0.05, "family_size": 3, "target_power": 0.8} | kwargs
    with pytest.raises(AblateError, match=needle.replace(".", r"\.")):
        seeds_needed(**args)


def test_the_method_docs_example_table_is_what_seeds_needed_says():
    text = (Path(__file__).resolve().parents[1] / "docs" / "power.md").read_text()
    rows = re.findall(r"^\| (0\.\d+) \| (\d+) \| (\d+) \|$", text, re.MULTILINE)
    assert len(rows) == 4
    for effect, at_2, at_4 in rows:
        assert [seeds_needed(float(effect), sd, 0.05, 3, 0.8) for sd in (0.002, 0.004)] == [int(at_2), int(at_4)]


# ---------------------------------------------------------------- pilots


def test_pilot_sd_and_its_upper_limit_by_hand():
    # mean 0.001, deviations 0, 0.003, −0.003: sum of squares 1.8e-5 over 2 → sd 0.003
    assert pilot_sd([0.001, 0.004, -0.002]) == pytest.approx(0.003, rel=1e-12)
    # with 2 df the chi-square's lower 20% quantile is −2·ln 0.8 (its cdf is 1 − e^{−x/2})
    assert sd_upper_limit(0.003, 3) == pytest.approx(0.003 * math.sqrt(2 / (-2 * math.log(0.8))), rel=1e-12)
    assert sd_upper_limit(0.003, 5) == pytest.approx(0.003 * math.sqrt(4 / stats.chi2.ppf(0.2, 4)), rel=1e-12)
    assert sd_upper_limit(0.003, 5, level=0.9) > sd_upper_limit(0.003, 5) > sd_upper_limit(0.003, 50) > 0.003


def test_a_small_pilot_is_called_unreliable_and_a_larger_one_is_not():
    assert "3-seed pilot's sd is unreliable" in pilot_warning(3) and "2.1×" in pilot_warning(3)
    assert "unreliable" in pilot_warning(2)
    assert pilot_warning(4) is None


@pytest.mark.parametrize("values, needle", [([0.001], "at least 2 seeds"), ([0.001, float("nan")], "not all finite")])
def test_pilot_sd_refuses_too_few_or_broken_differences(values, needle):
    with pytest.raises(AblateError, match=needle):
        pilot_sd(values)


# ---------------------------------------------------------------- power_rows

COMPARISONS = {"small": ["zero_option", "filtering_norm", "filtering_proj"], "medium": ["zero_option"]}
GPU_HOURS = {"small": 2.5, "medium": 10.0}
DECLARED = [("zero_option", "baseline", "sink-logit"), ("filtering_norm", "sink-logit", "combo"),
            ("filtering_proj", "sink-logit", "combo2")]
AT_SMALL = {"filtering_norm": ("small",), "filtering_proj": ("small",)}


def m_per_tier(kind: str) -> dict[str, int]:
    """COMPARISONS' m per tier by the family rule's one owner, `Family`."""
    family = Family.of(DECLARED, list(COMPARISONS), kind, at=AT_SMALL)
    return {tier: family.tier_size(tier) for tier in COMPARISONS}


def test_power_rows_with_an_assumed_sd():
    rows = power_rows(COMPARISONS, effect=0.004, gpu_hours_per_seed=GPU_HOURS, sd=0.004, family=m_per_tier("tier"))
    assert [(r["tier"], r["comparison"]) for r in rows] == [("small", "zero_option"), ("small", "filtering_norm"),
                                                            ("small", "filtering_proj"), ("medium", "zero_option")]
    assert all(set(r) == ROW_FIELDS for r in rows)
    small, medium = rows[0], rows[3]
    assert small["family_size"] == 3 and medium["family_size"] == 1
    assert small["seeds"] == smallest_n(1.0, 0.05 / 3, 0.8) and medium["seeds"] == smallest_n(1.0, 0.05, 0.8)
    assert small["seeds_conservative"] is None and small["gpu_hours"] == small["seeds"] * 2.5
    whole = power_rows(COMPARISONS, effect=0.004, gpu_hours_per_seed=GPU_HOURS, sd=0.004,
                       family=m_per_tier("experiment"))
    assert {r["family_size"] for r in whole} == {4 + 5}  # the 4 declared members and the 5 slopes: Family's m


def test_power_has_no_family_rule_of_its_own():
    """Which comparisons and slopes a family holds is `Family`'s alone (ablate/family.py): power_rows takes its m
    per tier, and a family named to it ("tier", "experiment") is refused rather than sized by a rule of its own."""
    import ablate.power

    for named in ("tier", "experiment", 4):
        with pytest.raises(AblateError, match=r"m is given per tier \(tier → m, from ablate.family.Family.tier_size\)"):
            power_rows(COMPARISONS, effect=0.004, gpu_hours_per_seed=GPU_HOURS, sd=0.004, family=named)
    assert not hasattr(ablate.power, "FAMILIES")
    with pytest.raises(AblateError, match="unknown family 'arm'; valid families: tier, experiment"):
        Family.of(DECLARED, ["small"], "arm")


def test_power_rows_with_a_pilot_plan_conservatively_with_the_upper_limit(caplog):
    pilots = {("small", "zero_option"): Pilot.from_differences([0.001, 0.004, -0.002])}
    rows = power_rows({"small": ["zero_option"]}, effect=0.003, gpu_hours_per_seed=GPU_HOURS, pilots=pilots,
                      family={"small": 1})
    assert "zero_option at tier small: a 3-seed pilot's sd is unreliable" in caplog.text
    (row,) = rows
    assert row["sd"] == pytest.approx(0.003)
    assert row["seeds"] == smallest_n(1.0, 0.05, 0.8)
    upper = 0.003 * math.sqrt(2 / (-2 * math.log(0.8)))
    assert row["seeds_conservative"] == smallest_n(0.003 / upper, 0.05, 0.8) > row["seeds"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"sd": None}, "no sd for comparison 'zero_option' at tier 'small'"),
    ({"gpu_hours_per_seed": {"medium": 1.0}}, "no GPU-hours per seed for tier 'small'"),
    ({"family": {"small": 0}}, "a family of m = 0 at tier 'small' cannot hold its 1 comparisons"),
    ({"pilots": {("small", "zero_option"): Pilot(0.0, 3)}}, "all equal"),
])
def test_power_rows_refuses_what_it_cannot_plan(kwargs, needle):
    args = {"comparisons": {"small": ["zero_option"]}, "effect": 0.003, "gpu_hours_per_seed": GPU_HOURS,
            "sd": 0.004, "family": {"small": 1}} | kwargs
    with pytest.raises(AblateError, match=needle):
        power_rows(**args)


# ---------------------------------------------------------------- sequential design


def null_error(design: dict, boundaries: list[float], paths: int, seed: int) -> list[float]:
    """Cumulative share of normal-null paths whose |t| reached a boundary by each look (whole paths, own RNG)."""
    counts = [look["seeds"] for look in design["looks"]]
    x = np.random.default_rng(seed).standard_normal((paths, counts[-1]))
    crossed, cumulative = np.zeros(paths, dtype=bool), []
    for n, boundary in zip(counts, boundaries):
        sample = x[:, :n]
        crossed |= np.abs(sample.mean(axis=1)) * math.sqrt(n) / sample.std(axis=1, ddof=1) >= boundary
        cumulative.append(crossed.mean())
    return cumulative


@pytest.mark.parametrize("alpha, m, looks, max_seeds", [(0.05, 3, 3, 6), (0.05, 3, 4, 12), (0.05, 1, 2, 4),
                                                        (0.05, 1, 3, 9)])
def test_sequential_boundaries_hold_the_error_to_alpha_over_m(alpha, m, looks, max_seeds):
    design = sequential_design(alpha, m, looks, max_seeds)
    level = alpha / m
    assert design["alpha_per_comparison"] == pytest.approx(level) and design["spending"] == "obrien-fleming"
    boundaries = [look["t_boundary"] for look in design["looks"]]
    error = null_error(design, boundaries, 400_000, seed=12345)
    assert error[-1] == pytest.approx(level, rel=0.15)
    # sharper than the issue asks: within the design's 5% plus this simulation's own noise; the t quantile
    # of each look's α increment alone (no simulation, overlaps ignored) is 5–14% conservative here
    assert error[-1] == pytest.approx(level, rel=0.06)
    # the O'Brien–Fleming shape: strict early, falling, the last still above the fixed design's t quantile
    assert all(a > b for a, b in itertools.pairwise(boundaries))
    assert boundaries[-1] > stats.t.ppf(1 - level / 2, max_seeds - 1)
    spent = [look["alpha_spent"] for look in design["looks"]]
    assert all(a < b for a, b in itertools.pairwise(spent)) and spent[-1] == pytest.approx(level)
    # with so few seeds the normal approximation (O'Brien–Fleming z boundaries) is far off
    normal = [stats.norm.ppf(1 - level / 2) / math.sqrt(look["seeds"] / max_seeds) for look in design["looks"]]
    assert null_error(design, normal, 400_000, seed=54321)[-1] > 3 * level


def test_alpha_spending_is_the_lan_demets_obrien_fleming_function():
    assert obrien_fleming_spent(1.0, 0.05) == pytest.approx(0.05)
    assert obrien_fleming_spent(0.5, 0.05) == pytest.approx(2 * stats.norm.sf(stats.norm.ppf(0.975) / math.sqrt(0.5)))


def test_sequential_design_is_reproducible_and_json_shaped():
    first, second = sequential_design(0.05, 3, 3, 6), sequential_design(0.05, 3, 3, 6)
    assert first == second
    assert set(first) == {"alpha", "family_size", "alpha_per_comparison", "spending", "looks"}
    assert [set(look) for look in first["looks"]] == [{"seeds", "t_boundary", "alpha_spent"}] * 3
    assert [look["seeds"] for look in first["looks"]] == [2, 4, 6]
    assert first["looks"][0]["t_boundary"] == pytest.approx(stats.t.ppf(1 - first["looks"][0]["alpha_spent"] / 2, 1))


def test_looks_are_evenly_spaced_and_impossible_ones_are_refused():
    assert look_seeds(3, 6) == [2, 4, 6] and look_seeds(2, 5) == [3, 5] and look_seeds(1, 2) == [2]
    with pytest.raises(AblateError, match=r"--looks 4 with --max-seeds 5 .* use --max-seeds ≥ 6 or --looks ≤ 3"):
        look_seeds(4, 5)
    with pytest.raises(AblateError, match="--max-seeds 1"):
        sequential_design(0.05, 3, 1, 1)
    with pytest.raises(AblateError, match="alpha 1.5"):
        sequential_design(1.5, 3, 3, 6)
    with pytest.raises(AblateError, match="alpha per comparison 1e-05 is too small to calibrate"):
        sequential_design(0.0001, 10, 3, 6)


# ---------------------------------------------------------------- decisions

DESIGN = {"alpha": 0.05, "family_size": 1, "alpha_per_comparison": 0.05, "spending": "obrien-fleming",
          "looks": [{"seeds": 3, "t_boundary": 40.0, "alpha_spent": 0.001},
                    {"seeds": 6, "t_boundary": 3.0, "alpha_spent": 0.05}]}


def test_a_clear_effect_stops_at_the_look_that_crosses_with_its_sign_and_interval():
    differences = {0: -0.010, 1: -0.012, 2: -0.008, 3: -0.011, 4: -0.009, 5: -0.010, 6: 5.0}
    decision = sequential_decision(differences, DESIGN)
    sample = np.array([-0.010, -0.012, -0.008, -0.011, -0.009, -0.010])
    half = 3.0 * sample.std(ddof=1) / math.sqrt(6)
    assert decision["look"] == 2 and decision["decision"] == "effect" and decision["sign"] == -1
    assert decision["mean"] == pytest.approx(sample.mean())  # seed 6 came after the stop and is not used
    assert (decision["ci_low"], decision["ci_high"]) == pytest.approx((sample.mean() - half, sample.mean() + half))
    assert decision["ci_high"] < 0 and decision["next_seeds"] is None


def test_a_decision_at_the_first_look_is_kept_whatever_later_seeds_say():
    differences = [0.0100, 0.0101, 0.0099, -0.05, 0.04, -0.03]  # |t| ≈ 173 at 3 seeds, noise afterwards
    decision = sequential_decision(differences, DESIGN)
    assert (decision["look"], decision["seeds"], decision["decision"], decision["sign"]) == (1, 3, "effect", 1)
    assert decision["mean"] == pytest.approx(0.0100) and decision["ci_low"] > 0


def test_undecided_comparisons_continue_until_the_last_look():
    noisy = [0.003, -0.002, 0.001, -0.004, 0.002, 0.0005]
    early = sequential_decision(noisy[:4], DESIGN)
    assert (early["look"], early["decision"], early["next_seeds"]) == (1, "continue", 6)
    assert early["ci_low"] < 0 < early["ci_high"]
    final = sequential_decision(noisy, DESIGN)
    assert (final["look"], final["decision"], final["sign"]) == (2, "max seeds reached", None)
    before = sequential_decision(noisy[:2], DESIGN)
    assert (before["look"], before["decision"], before["ci_low"], before["next_seeds"]) == (0, "continue", None, 3)


def test_a_broken_difference_is_refused_naming_its_seed():
    with pytest.raises(AblateError, match="seed 2 is nan"):
        sequential_decision({0: 0.1, 1: 0.2, 2: float("nan")}, DESIGN)
