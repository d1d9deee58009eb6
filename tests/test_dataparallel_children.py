"""Data-parallel children run exactly their parent's current run: a local `devices: 2` grid, run by one worker,
trains each run once, in two processes, to the loss one process reaches."""

import json

from ablate.experiment import RunSpec
from ablate.store import read_json, read_ledger, run_dir
from ablate.train import run
from datafix import ablate_cli, sample_data  # noqa: F401  (fixture)

EXPERIMENT = '''
from ablate.experiment import Experiment

EXPERIMENT = Experiment(name="dp_grid", tiers=("smoke",), arms=("baseline",), seeds=2,
                        overrides={{"max_steps": 3, "devices": 2, "data_dir": {data!r}}})
'''


def test_a_local_two_process_grid_trains_each_run_once_to_the_one_process_loss(tmp_path, sample_data):
    file = tmp_path / "dp_grid.py"
    file.write_text(EXPERIMENT.format(data=str(sample_data)))
    results = tmp_path / "results"
    out = ablate_cli("submit", file, "--executor", "local", "--parallel", "1", "--results", results, timeout=900)
    assert "ran 2 runs here, 0 failed" in out.stdout, out.stdout + out.stderr
    worker_log = (results / "dp_grid" / "local" / "worker0.log").read_text()
    assert "in use by" not in worker_log + out.stderr
    assert "2/2" in out.stderr and "3/2" not in out.stderr and "4/2" not in out.stderr  # the bar counts 2 runs
    ledger = read_ledger(results / "dp_grid")
    assert all(ledger["runs"][f"smoke/baseline/seed{k}"]["exit_code"] == 0 for k in (0, 1))
    for seed in (0, 1):
        two = read_json(run_dir(results, "dp_grid", "smoke", "baseline", seed) / "summary.json")
        one = run(RunSpec("dp_grid", "smoke", "baseline", seed, {"max_steps": 3}), tmp_path / "one",
                  data_dir=str(sample_data), progress=False, threads=1)
        assert two["status"] == "completed" and two["steps"] == 3, json.dumps(two)[:500]
        assert abs(one["val_loss"] - two["val_loss"]) < 1e-4, (seed, one["val_loss"], two["val_loss"])
