"""A task run that diverges ends `diverged` with its step, as a corpus run does: shown as an outcome, never
"failed" and resubmitted, and counted by the tables as a diverged seed (item 8)."""

import json

from ablate.analysis.load import load_runs
from ablate.experiment import Experiment
from ablate.status import status
from ablate.train import run
import pytest

pytestmark = pytest.mark.run


def test_a_diverging_task_run_ends_diverged_with_its_step(tmp_path, monkeypatch):
    import ablate.taskrun as taskrun

    schedule = taskrun.lr_at
    monkeypatch.setattr(taskrun, "lr_at", lambda k, config: float("nan") if k >= 2 else schedule(k, config))
    experiment = Experiment(name="tdiv", tiers=("synthetic",), arms=("baseline",), seeds=1,
                            overrides={"steps": 6, "val_interval": 3})
    spec = experiment.runs()[0]
    summary = run(spec, tmp_path)  # returns, as a corpus run's divergence does: an outcome, not an error
    assert summary.status == "diverged" and summary.diverged_step == 3
    assert summary.val_loss is None and "non-finite training loss nan at step 3" in summary.error
    assert "after the optimiser's update" in summary.error  # where it came from: the NaN learning rate
    assert "(replayed steps 1–3 from the initial weights with checks on)" in summary.error
    on_disk = json.loads((spec.folder(tmp_path) / "summary.json").read_text())
    assert on_disk["status"] == "diverged" and on_disk["diverged_step"] == 3
    [row] = status(experiment, tmp_path)
    assert row.state == "diverged"  # not "failed": `ablate submit` leaves it alone
    runs = load_runs(tmp_path / "tdiv")
    assert runs.frame["reason"].to_list() == ["diverged at step 3"]
    monkeypatch.setattr(taskrun, "lr_at", schedule)
    assert run(spec, tmp_path).status == "diverged"  # a finished run: run again, it is not retrained
