"""`ablate plan --power / --sequential`: seeds against an independent scipy noncentral-t computation, GPU-hours
at the grid's per-seed cost, a pilot's sd and its upper limit, the sequential design, and the docs' figures."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ablate.cli import main
from ablate.experiment import load_experiment
from ablate.plan import plan_grid, power_plan
from ablate.power import power_rows
from analysis_fixtures import reference_losses, write_store

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
FIELDS = {"tier", "comparison", "sd", "effect", "alpha", "family_size", "target_power", "seeds",
          "seeds_conservative", "sd_source", "pilot_seeds"}  # GPU-hours are the tier's, not a row's


def smallest_n(effect, sd, level, target=0.8):
    """Independent: the smallest n whose two-sided one-sample t power (scipy's noncentral t) reaches target."""
    n, d = 2, effect / sd
    while True:
        critical, delta = stats.t.ppf(1 - level / 2, n - 1), d * math.sqrt(n)
        if stats.nct.sf(critical, n - 1, delta) + stats.nct.sf(critical, n - 1, -delta) >= target:
            return n
        n += 1


def plan_json(capsys, *args):
    assert main(["plan", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def per_seed():
    """One seed of the study's grid per tier, GPU-hours (every arm, one run each)."""
    grid = plan_grid(load_experiment("sink_vs_filter"), seed_count=1)
    return {t["tier"]: t["total_gpu_hours"] for t in grid["tiers"]}


def test_power_rows_per_tier_and_declared_comparison(capsys, per_seed):
    out = plan_json(capsys, "sink_vs_filter", "--power", "--effect", "0.005", "--sd", "0.004", "--tier", "10M", "124M")
    rows = out["power"]
    assert [(r["tier"], r["comparison"]) for r in rows] == [
        (t, c) for t in ("10M", "124M") for c in ("zero_option", "filtering_norm", "filtering_proj")]
    assert all(set(r) == FIELDS for r in rows) and all(r["seeds_conservative"] is None for r in rows)
    expected = smallest_n(0.005, 0.004, 0.05 / 3)
    for r in rows:
        assert r["family_size"] == 3 and r["seeds"] == expected and r["sd_source"] == "--sd"
    for t in out["tiers"]:
        assert t["gpu_hours"] == pytest.approx(expected * per_seed[t["tier"]], rel=1e-9) and t["sd_sources"] == "--sd"
    assert [t["fixed_seeds"] for t in out["tiers"]] == [3, 3] and "every arm" in out["gpu_hours_basis"]
    assert out["warnings"] == [] and out["notes"] == []


def test_a_pilot_gives_each_comparison_its_own_sd_and_a_conservative_plan(tmp_path, capsys):
    pilot = write_store(tmp_path / "results", "pilot")
    out = plan_json(capsys, "sink_vs_filter", "--power", "--effect", "0.003", "--pilot", pilot, "--tier", "10M")
    losses = reference_losses()
    for row in out["power"]:
        minuend, subtrahend = {"zero_option": ("baseline", "sink-logit"), "filtering_norm": ("sink-logit", "combo"),
                               "filtering_proj": ("sink-logit", "combo2")}[row["comparison"]]
        diffs = [losses[("10M", minuend, s)] - losses[("10M", subtrahend, s)] for s in range(3)]
        sd = float(np.std(diffs, ddof=1))
        upper = sd * math.sqrt(2 / stats.chi2.ppf(0.2, 2))  # the 80% upper limit from 3 seeds
        assert row["sd"] == pytest.approx(sd, rel=1e-9)
        assert row["seeds"] == smallest_n(0.003, sd, 0.05 / 3)
        assert row["seeds_conservative"] == smallest_n(0.003, upper, 0.05 / 3) > row["seeds"]
    assert any("3-seed pilot's sd is unreliable" in w for w in out["warnings"])
    # its one 350M seed has no sd: refused, naming the way out; --sd covers what the pilot lacks
    assert main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", "--pilot", str(pilot)]) == 2
    assert "at tier '350M'" in capsys.readouterr().err
    assert main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", "--pilot", str(pilot), "--sd", "0.004"]) == 0
    out = capsys.readouterr().out
    assert "unreliable" in out and re.search(r"350M\s+zero_option\s+0\.00400", out)


def test_the_experiment_family_plan_counts_the_scale_slopes_holm_adjusts_over(capsys):
    """With family="experiment" the report's Holm also adjusts over the declared comparisons' and the gaps' scale
    slopes, so the plan splits α over them too: it never promises power that the larger m takes away."""
    experiment = dataclasses.replace(load_experiment("sink_vs_filter"), family="experiment")
    assert experiment.family_size() == 12  # what a sequential design splits α over (slopes exploratory there)
    assert experiment.planned_family_size() == 12 + 3 + 2  # + each declared comparison's slope + gap_norm, gap_proj
    plan = power_plan(experiment, 0.005, sd=0.004, tiers=["10M"])
    assert {row["family_size"] for row in plan["power"]} == {17}
    assert plan["power"][0]["seeds"] == smallest_n(0.005, 0.004, 0.05 / 17)
    assert any(n.startswith("m = 17: the 12 declared comparisons at every tier and the 5 scale slopes") for n in
               plan["notes"])
    assert power_plan(load_experiment("sink_vs_filter"), 0.005, sd=0.004, tiers=["10M"])["notes"] == []
    # the gaps need the zero option and a filtering form: without combo2 there is no gap_proj, nor its slope
    fewer = dataclasses.replace(experiment, arms=("baseline", "sink-logit", "combo"),
                                hypotheses=experiment.hypotheses[:2])
    assert fewer.planned_family_size() == 2 * 4 + 2 + 1


def test_the_sequential_design_for_the_declared_family(capsys):
    design = plan_json(capsys, "sink_vs_filter", "--sequential", "--looks", "3", "--max-seeds", "12")["sequential"]
    assert design["family_size"] == 3 and design["alpha_per_comparison"] == pytest.approx(0.05 / 3)
    assert design["spending"] == "obrien-fleming" and [look["seeds"] for look in design["looks"]] == [4, 8, 12]
    bounds = [look["t_boundary"] for look in design["looks"]]
    assert bounds == sorted(bounds, reverse=True) and design["looks"][-1]["alpha_spent"] == pytest.approx(0.05 / 3)


@pytest.mark.parametrize("args, needle", [
    (["demo", "--power", "--effect", "0.002", "--sd", "0.004"], "declares no comparisons"),
    (["sink_vs_filter", "--power", "--sd", "0.004"], "--power needs --effect"),
    (["sink_vs_filter", "--power", "--effect", "0.002"], "--sd S"),
    (["sink_vs_filter", "--sequential", "--looks", "3"], "needs --max-seeds"),
    (["sink_vs_filter", "--power", "--effect", "-1", "--sd", "0.004", "--tier", "10M"], "effect -1.0"),
])
def test_what_cannot_be_planned_is_one_line_naming_the_way_out(args, needle, capsys):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def docs_table(path: Path) -> list[list[str]]:
    lines = path.read_text().split("<!-- power-plan", 1)[1].splitlines()[1:]
    table = lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:]]


def test_the_docs_figures_are_what_plan_power_computes(per_seed):
    """docs/power.md and docs/method.md quote `plan sink_vs_filter --power` at two effects × two sds."""
    study = load_experiment("sink_vs_filter")
    first = power_plan(study, 0.0013, sd=0.002)  # the command's own function once; power_rows for the rest
    assert {t["tier"]: t["gpu_hours_per_seed"] for t in first["tiers"]} == pytest.approx(per_seed)
    names = {t: ["zero_option", "filtering_norm", "filtering_proj"] for t in study.tiers}
    family = {t: study.declared_family().tier_size(t) for t in study.tiers}
    for path in (REPO / "docs" / "power.md", REPO / "docs" / "method.md"):
        rows = docs_table(path)
        assert len(rows) == 5, path
        for row in rows[:4]:
            effect, sd = float(row[0]), float(row[1])
            planned = power_rows(names, effect, per_seed, sd=sd, family=family)
            seeds = {r["seeds"] for r in planned}
            assert seeds == {int(row[2])} == {smallest_n(effect, sd, 0.05 / 3)}, (path, row)
            hours = [int(row[2]) * per_seed[t] for t in study.tiers]
            assert [float(c) for c in row[3:7]] == pytest.approx([round(h, 1) for h in hours], abs=1e-9), (path, row)
            assert float(row[7]) == pytest.approx(round(sum(hours), 1), abs=1e-9)
        fixed = rows[4]
        assert fixed[2] == "/".join(str(study.seed_count(t)) for t in study.tiers)
        hours = [study.seed_count(t) * per_seed[t] for t in study.tiers]
        assert [float(c) for c in fixed[3:7]] == pytest.approx([round(h, 1) for h in hours], abs=1e-9)
        assert float(fixed[7]) == pytest.approx(round(sum(hours), 1), abs=1e-9)
    assert re.search(r"m = 3", (REPO / "docs" / "method.md").read_text())
