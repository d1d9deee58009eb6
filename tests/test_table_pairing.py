"""Every run counted in one row of a table shares every setting but arm and seed."""

from __future__ import annotations

import pytest
import torch
from analysis_fixtures import write_run
from datafix import ablate_cli

from ablate.analysis.load import load_runs
from ablate.analysis.build import build_table
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.train import run

torch.set_num_threads(1)


def _pair(results, seed, **options):
    for arm, loss in (("baseline", 4.0 + 0.01 * seed), ("sink-logit", 3.9 + 0.01 * seed)):
        write_run(results, "study", "10M", arm, seed, loss, curve_points=2, **options)


@pytest.mark.unit
def test_seeds_trained_for_other_step_counts_are_not_averaged_into_one_row(tmp_path):
    _pair(tmp_path, 0)
    _pair(tmp_path, 1)
    assert build_table(load_runs(tmp_path / "study"), "paired").frame["n"].to_list() == [2]
    _pair(tmp_path, 1, settings={"steps": 3})  # each pair matched within its seed, the seeds not
    with pytest.raises(AblateError) as err:
        load_runs(tmp_path / "study")
    message = str(err.value)
    assert "steps: 1000 vs 3" in message
    assert "10M/baseline/seed0" in message and "10M/baseline/seed1" in message
    assert "differ only in the arm and the seed" in message and "--force" in message
    # The fingerprints agree within each seed, so only the settings can say what differs.
    with pytest.raises(AblateError, match="steps: 1000 vs 3"):
        load_runs(tmp_path / "study", allow_unverified=True)


@pytest.mark.unit
def test_the_seeds_themselves_may_differ(tmp_path):
    _pair(tmp_path, 0)
    _pair(tmp_path, 1, settings={"data_seed": 7})  # the seed of the batch order is a seed too
    assert build_table(load_runs(tmp_path / "study"), "paired").frame["n"].to_list() == [2]


@pytest.mark.unit
def test_a_run_without_config_json_is_unverified(tmp_path):
    _pair(tmp_path, 0)
    (tmp_path / "study" / "10M" / "sink-logit" / "seed0" / "config.json").unlink()
    with pytest.raises(AblateError, match=r"sink-logit/seed0 has no config.json.*--allow-unverified"):
        load_runs(tmp_path / "study")
    runs = load_runs(tmp_path / "study", allow_unverified=True)
    assert any("pairing NOT verified for 10M/sink-logit/seed0" in n for n in runs.notes_for(["sink-logit"]))


@pytest.mark.unit
def test_a_row_of_other_validation_tokens_across_seeds_is_refused(tmp_path):
    _pair(tmp_path, 0)
    _pair(tmp_path, 1, val_fingerprint="1" * 16)
    with pytest.raises(AblateError, match=r"seed0 and .*seed1 are not matched: their val_fingerprint differs.*"
                                          r"different validation tokens"):
        load_runs(tmp_path / "study")


def _train(results, data, arm, seed, steps, **options):
    # a final val_loss over 512 tokens, the same for every run: the claims are on the step count
    spec = RunSpec("study", "smoke", arm, seed, {"max_steps": steps, "final_val_tokens": 512})
    return run(spec, results, data_dir=str(data), progress=False, **options)


@pytest.mark.run
def test_real_runs_name_the_step_count_within_and_across_seeds(tmp_path, sample_data):
    for arm in ("baseline", "sink-logit"):
        _train(tmp_path, sample_data, arm, 0, 2)
        _train(tmp_path, sample_data, arm, 1, 3)
    result = ablate_cli("table", tmp_path / "study", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "steps: 2 vs 3" in result.stderr and "smoke/baseline/seed0" in result.stderr
    assert "smoke/baseline/seed1" in result.stderr
    # Within one seed: the step count is named, not the batches it changed (data_fingerprint).
    _train(tmp_path, sample_data, "sink-logit", 1, 2, force=True)
    with pytest.raises(AblateError) as err:
        load_runs(tmp_path / "study")
    message = str(err.value)
    assert "smoke/baseline/seed1" in message and "smoke/sink-logit/seed1" in message
    assert "steps: 3 vs 2" in message and "data_fingerprint" not in message
    assert "differ only in the arm" in message
