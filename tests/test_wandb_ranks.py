"""`WandbLog`, the W&B logger Fabric is given: W&B's SDK is called from rank 0 only, once per process, under the
run's id, with Lightning's key for the step (tests/test_wandb.py runs it for real, offline, across segments)."""

import pytest
import wandb
from lightning_fabric.utilities.rank_zero import rank_zero_only

from ablate.train import WandbLog

pytestmark = pytest.mark.unit


class FakeRun:
    def __init__(self):
        self.defined, self.logged = [], []

    def define_metric(self, name, **kwargs):
        self.defined.append((name, kwargs))

    def log(self, row):
        self.logged.append(row)


def test_rank_zero_starts_one_run_under_the_id_and_logs_each_row_at_its_step(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: started.append(kwargs) or FakeRun())
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    logger = WandbLog(name="results/adhoc/smoke/baseline/seed0", run_id="abc123", save_dir=str(tmp_path))
    logger.log_metrics({"train_loss": 3.5}, step=1)
    logger.log_metrics({"val_loss": 3.4}, step=2)
    assert started == [dict(project="ablate", name="results/adhoc/smoke/baseline/seed0", id="abc123",
                            resume="allow", dir=str(tmp_path))]
    assert logger.experiment.logged == [{"train_loss": 3.5, "trainer/global_step": 1},
                                        {"val_loss": 3.4, "trainer/global_step": 2}]
    assert ("*", {"step_metric": "trainer/global_step", "step_sync": True}) in logger.experiment.defined


def test_another_rank_never_calls_wandb(monkeypatch, tmp_path):
    def refuse(**kwargs):
        raise AssertionError("rank 1 started a W&B run")

    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = WandbLog(name="run", run_id="abc123", save_dir=str(tmp_path))
    logger.log_metrics({"train_loss": 3.5}, step=1)
    assert logger.experiment is None
