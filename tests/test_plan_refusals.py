"""What `plan --power`, `plan/submit --sequential` cannot plan is refused in one line."""

from __future__ import annotations

import pytest

from ablate.cli import main
from analysis_fixtures import reference_losses, write_store

pytestmark = pytest.mark.unit


def refused(capsys, *args) -> str:
    assert main(list(map(str, args))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("effect", ["1e-12", "1e-10", "1e-6"])
def test_an_effect_lost_in_the_noise_is_refused_naming_the_limit(effect, capsys):
    err = refused(capsys, "plan", "sink_vs_filter", "--power", "--effect", effect, "--sd", "0.004", "--tier", "10M")
    assert "more than 100,000 seeds" in err and "--effect" in err


@pytest.mark.parametrize("command", [["plan", "sink_vs_filter"], ["submit", "sink_vs_filter", "--dry-run"]])
@pytest.mark.parametrize("looks, max_seeds, needle", [
    (3, 10**8, "--max-seeds 100000000 is more than the 1000 seeds"),
    (50, 200, "--looks 50 is more than the 20 looks"),
])
def test_a_sequential_design_is_bounded(command, looks, max_seeds, needle, capsys, tmp_path):
    err = refused(capsys, *command, "--sequential", "--looks", looks, "--max-seeds", max_seeds,
                  "--results", tmp_path / "results")
    assert needle in err


def test_a_pilot_whose_spread_is_float_rounding_is_refused(tmp_path, capsys):
    losses = reference_losses()
    for (tier, arm, seed), loss in list(losses.items()):  # sink-logit = baseline − 0.1, in binary: rounding only
        if arm == "sink-logit":
            losses[(tier, arm, seed)] = losses[(tier, "baseline", seed)] - 0.1
    pilot = write_store(tmp_path / "results", "pilot", losses)
    err = refused(capsys, "plan", "sink_vs_filter", "--power", "--effect", "0.003", "--pilot", pilot, "--tier", "10M")
    assert "zero_option" in err and "float rounding" in err and "--sd" in err
