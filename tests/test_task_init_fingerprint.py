"""A task run records `init_fingerprint_common` of its initial weights, as a corpus run does, so that the runs of
an LR sweep on a task tier (one seed, several learning rates) share it and can be tabled (issue 54, item 15)."""

from __future__ import annotations

import json

import torch

from ablate.data.filter import task_from_fields
from ablate.experiment import RunSpec
from ablate.model import GPTConfig, common_fingerprint
from ablate.runconfig import RunConfig
from ablate.store_summary import read_summary
from ablate.taskmodel import task_model
from ablate.train import run
import pytest

pytestmark = pytest.mark.run


def test_task_runs_at_two_learning_rates_record_the_common_fingerprint_of_their_initial_weights(tmp_path):
    summaries = []
    for factor in (1.0, 4.0):  # as `Experiment.sweep_runs` names and sets them
        spec = RunSpec("lrtask", "filter-norm", "baseline", 0, {"max_steps": 2, "lr": 3e-3 * factor}, factor)
        run(spec, tmp_path, data_dir=None, progress=False, threads=1)
        summaries.append(read_summary(spec.folder(tmp_path)))
    assert all(s.completed for s in summaries) and summaries[0].weights_sha256 != summaries[1].weights_sha256
    assert summaries[0].init_fingerprint_common == summaries[1].init_fingerprint_common  # one seed: one start
    config = RunConfig.from_dict(json.loads((spec.folder(tmp_path) / "config.json").read_text()))
    torch.manual_seed(config.seed)
    model = task_model(GPTConfig(**config.model_fields()), task_from_fields(config.synthetic_task))
    model.init_weights(config.seed)
    assert summaries[1].init_fingerprint_common == common_fingerprint(model)  # the initial weights', untrained
