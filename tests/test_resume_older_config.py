"""An older config.json without a key added later reads it as unset, as the fingerprints do: the run resumes
(minor item); a real difference is still refused, named."""

import json

import pytest

from ablate.config import resolve_config
from ablate.errors import AblateError
from ablate.experiment import Experiment
from ablate.ranks import prepare_run_dir

pytestmark = pytest.mark.unit


def a_started_run(tmp_path, **edits):
    spec = Experiment(name="old", tiers=("smoke",), arms=("baseline",), seeds=1).runs()[0]
    config = resolve_config(spec, data_dir="data/sample")
    folder = spec.folder(tmp_path)
    folder.mkdir(parents=True)
    older = {k: v for k, v in config.to_dict().items() if k != "loss_chunk"}  # written before loss_chunk existed
    (folder / "config.json").write_text(json.dumps({**older, **edits}))
    (folder / "summary.json").write_text(json.dumps({"status": "running", "steps": 3, "tier": "smoke"}))
    return folder, config


def test_an_older_config_without_a_later_key_resumes(tmp_path):
    folder, config = a_started_run(tmp_path)
    assert config.loss_chunk is None
    assert prepare_run_dir(folder, config, force=False) == "resume"


def test_a_real_difference_is_still_refused_naming_it(tmp_path):
    folder, config = a_started_run(tmp_path, steps=7)
    with pytest.raises(AblateError, match=r"a different config \(differs in: steps\)"):
        prepare_run_dir(folder, config, force=False)
