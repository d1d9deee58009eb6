"""`ablate submit --eval`: evaluation follows training, recorded in the ledger and shown by status."""

import json

from datafix import ablate_cli
from test_eval import write_task_data
import pytest

pytestmark = pytest.mark.system


def test_local_submit_with_eval_trains_then_evaluates_and_status_shows_it(tmp_path, sample_data):
    experiment = tmp_path / "evalgrid.py"
    experiment.write_text(
        "from ablate.experiment import Experiment\n"
        "EXPERIMENT = Experiment(name='evalgrid', tiers=['smoke'], arms=['baseline'], seeds=1,\n"
        f"    overrides={{'max_steps': 2, 'data_dir': {str(sample_data)!r}, 'val_tokens': 512,\n"
        "    'final_val_tokens': 512})\n")
    data = write_task_data(tmp_path / "tasks")
    results = tmp_path / "results"
    out = ablate_cli("submit", experiment, "--executor", "local", "--results", results, "--eval", "hellaswag",
                     "--task-data", data).stdout
    assert "ran 1 runs here, 0 failed" in out and "evaluation done for 1 runs" in out
    folder = results / "evalgrid" / "smoke" / "baseline" / "seed0"
    assert "acc_norm" in json.loads((folder / "eval.json").read_text())["tasks"]["hellaswag"]["metrics"]
    rows = json.loads(ablate_cli("status", experiment, "--results", results, "--json").stdout)["runs"]
    assert rows[0]["state"] == "completed" and rows[0]["eval"] == "evaluated"
    again = ablate_cli("submit", experiment, "--executor", "local", "--results", results).stdout
    assert "nothing to submit (1 completed)" in again
