"""Data-parallel children run exactly their parent's current run: a local `devices: 2` grid, run by one worker,
trains each run once, in two processes, to the loss one process reaches."""

import json
import time

import pytest

from ablate.experiment import RunSpec
from ablate.store import read_json, read_ledger, run_dir
from ablate.train import run
from datafix import ablate_cli

pytestmark = pytest.mark.system

EXPERIMENT = '''
from ablate.experiment import Experiment

EXPERIMENT = Experiment(name="dp_grid", tiers=("smoke",), arms=("baseline",), seeds=2,
                        overrides={{"max_steps": 3, "devices": 2, "data_dir": {data!r}, "val_tokens": 512,
                                   "final_val_tokens": 512}})
'''
EVALUATION = {"val_tokens": 512, "final_val_tokens": 512}  # 8 windows: the one-process loss is evaluated alike


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
    assert all(ledger.runs[f"smoke/baseline/seed{k}"].exit_code == 0 for k in (0, 1))
    for seed in (0, 1):
        two = read_json(run_dir(results, "dp_grid", "smoke", "baseline", seed) / "summary.json")
        one = run(RunSpec("dp_grid", "smoke", "baseline", seed, {"max_steps": 3, **EVALUATION}), tmp_path / "one",
                  data_dir=str(sample_data), progress=False, threads=1)
        assert two["status"] == "completed" and two["steps"] == 3, json.dumps(two)[:500]
        assert abs(one.val_loss - two["val_loss"]) < 1e-4, (seed, one.val_loss, two["val_loss"])


PROFILE = '''partition = "debug"
gpus_per_run = 0
processes_per_run = 2
cpus_per_run = 2
mem_gb = 2
time_min = 20
signal_delay_s = 30
array_parallelism = 2
'''


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_a_two_process_run_on_slurm_is_two_tasks_that_lightning_joins(tmp_path, sample_data, slurm_cluster):
    """processes_per_run = 2 (as gpus_per_run = 2 would be on GPUs): --ntasks-per-node=2 and devices 2, one run
    trained by two gloo processes, to the loss of one process."""
    import dataclasses

    from ablate.dispatch import executor_parameters
    from ablate.profiles import load_profile
    from ablate.status import status

    profile_path = tmp_path / "two.toml"
    profile_path.write_text(PROFILE)
    profile = load_profile(str(profile_path))
    params = executor_parameters(profile, "x")
    assert params["tasks_per_node"] == 2 and params["cpus_per_task"] == 1
    assert executor_parameters(dataclasses.replace(profile, gpus_per_run=2), "x")["gpus_per_node"] == 2
    file = tmp_path / "dp_slurm.py"
    file.write_text(EXPERIMENT.format(data=str(sample_data)).replace('"dp_grid"', '"dp_slurm"')
                    .replace("seeds=2", "seeds=1").replace('"devices": 2, ', ""))
    results = tmp_path / "results"
    ablate_cli("submit", file, "--executor", "slurm", "--profile", profile_path, "--results", results)
    deadline = time.time() + 600
    while time.time() < deadline:
        (row,) = status("dp_slurm", results, [RunSpec("dp_slurm", "smoke", "baseline", 0)])
        if row.state in ("completed", "failed", "diverged", "damaged"):
            break
        time.sleep(3)
    folder = run_dir(results, "dp_slurm", "smoke", "baseline", 0)
    logs = "".join(p.read_text(errors="replace") for p in (results / "dp_slurm" / "slurm").rglob("*_log.*"))
    assert row.state == "completed", (row, logs[-4000:])
    assert read_json(folder / "config.json")["devices"] == 2
    assert "MEMBER: 1/2" in logs and "MEMBER: 2/2" in logs  # two processes of one world, not two runs
    assert "in use by" not in logs
    one = run(RunSpec("dp_slurm", "smoke", "baseline", 0, {"max_steps": 3, **EVALUATION}), tmp_path / "one",
              data_dir=str(sample_data), progress=False, threads=1)
    assert abs(one.val_loss - read_json(folder / "summary.json")["val_loss"]) < 1e-4
