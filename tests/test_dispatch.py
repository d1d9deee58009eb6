"""Experiments and dispatch, against the real single-node SLURM cluster of slurm/local-cluster.sh."""

import json
import time
from pathlib import Path

import pytest

from ablate.dispatch import Submission, submit
from ablate.profiles import load_profile
from ablate.status import status
from ablate.store import read_ledger
from ablate.experiment import load_experiment
from ablate.store import read_json, read_metrics, run_dir
from conftest import STRAIGHT_ARM, STRAIGHT_STEPS
from datafix import ablate_cli

EXPERIMENT = '''
import os
from pathlib import Path

import torch

from ablate.arms import Arm, register_arm
from ablate.experiment import Experiment


@register_arm("flaky", replace=True)
class Flaky(Arm):
    """Fails while the marker file exists: a run made to fail, then fixed."""

    def value_gate(self, v, x):
        if v.dtype != torch.float64 and Path({marker!r}).exists():  # in training, not in submit's float64 check
            raise RuntimeError("flaky arm: marker file present")
        return torch.ones_like(v[..., :1])


EXPERIMENT = Experiment(name={name!r}, tiers=("smoke",), arms={arms!r}, seeds={seeds},
                        overrides={{"max_steps": {steps}, "data_dir": {data!r}{evaluation}}})
'''

SHORT_EVALUATION = ', "val_tokens": 512, "final_val_tokens": 512'  # 8 windows: a test about dispatch, not the loss


def write_experiment(folder: Path, name: str, arms, seeds: int, steps: int, data: Path,
                     evaluation: str = SHORT_EVALUATION) -> Path:
    path = folder / f"{name}.py"
    path.write_text(EXPERIMENT.format(name=name, arms=tuple(arms), seeds=seeds, steps=steps, data=str(data),
                                      marker=str(folder / "FAIL"), evaluation=evaluation))
    return path


def wait_until_settled(experiment, results, timeout=420, done=("completed", "diverged", "failed")):
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = status(experiment, results)
        if all(r.state in done for r in rows):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"grid did not settle in {timeout} s: {json.dumps([r.to_dict() for r in rows], indent=1)}")


@pytest.mark.unit
def test_experiment_files_define_the_grids():
    study = load_experiment("sink_vs_filter")
    assert study.tiers == ("10M", "50M", "124M", "350M") and len(study.arm_names()) == 9
    assert [study.seed_count(t) for t in study.tiers] == [3, 3, 3, 1] and len(study.runs()) == 90
    gated = load_experiment("experiments/gated_attention.py")
    assert set(gated.arm_names()) == {"baseline", "g1-elementwise", "g1-headwise", "g2-value"}
    demo = load_experiment("demo")
    from ablate.arms import study_arms
    from ablate.arms.names import BUILTIN_ARMS

    # "all": every registered arm but the examples outside the study (qk-norm, temperature, alibi)
    from ablate.arms import get_arm

    # (an arm a test module registered in this process joins "all" too: only the package's arms are compared)
    assert demo.arm_names() == study_arms() and demo.seed_count("smoke") == 2
    assert [a for a in demo.arm_names() if get_arm(a).__module__.startswith("ablate.")] == list(BUILTIN_ARMS)


@pytest.mark.unit
def test_bad_input_is_refused_before_anything_is_queued(tmp_path):
    cases = [
        (["submit", "nope"], "unknown experiment 'nope'; valid experiments: demo"),
        (["submit", "demo", "--arms", "nope"], "arm 'nope' is not in experiment 'demo'"),
        (["submit", "demo", "--tier", "10M"], "tier '10M' is not in experiment 'demo'; its tiers: smoke"),
        (["submit", "demo", "--profile", "nope"], "unknown profile 'nope'; valid profiles: example, local"),
        (["submit", "demo", "--executor", "cloud"], "unknown executor 'cloud'; valid executors: local, slurm"),
        (["status", "nope"], "unknown experiment 'nope'"),
    ]
    for args, message in cases:
        result = ablate_cli(*args, "--results", tmp_path, check=False)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    assert not any(tmp_path.iterdir())  # nothing queued, nothing written


@pytest.mark.unit
def test_profile_is_checked():
    profile = load_profile("local")
    assert profile.partition == "debug" and profile.cpus_per_run >= 1
    assert load_profile("example").gpus_per_run == 1


@pytest.mark.system
@pytest.mark.slurm
def test_dry_run_prints_runs_resources_and_gpu_hours(tmp_path, sample_data, slurm_cluster):
    out = ablate_cli("submit", "sink_vs_filter", "--dry-run", "--profile", "example", "--data", sample_data,
                     "--results", tmp_path).stdout
    assert "90 of 90 runs would be submitted" in out and "GPU-hours" in out and '"gpus_per_run": 1' in out
    assert "350M/combo2/seed0" in out and not any(tmp_path.iterdir())


@pytest.mark.system
def test_local_executor_runs_the_grid_and_status_reports_it(tmp_path, sample_data):
    file = write_experiment(tmp_path, "local_grid", ["baseline", "sink-logit"], 1, 3, sample_data)
    results = tmp_path / "results"
    # submit in this process (its worker processes are the claim; test_status_interrupt.py types `ablate submit`)
    result = ablate_cli("submit", file, "--executor", "local", "--parallel", "2", "--results", results)
    assert "ran 2 runs here, 0 failed" in result.stdout
    out = json.loads(ablate_cli("status", file, "--results", results, "--json", process=True).stdout)  # as typed
    assert out["counts"]["completed"] == 2 and all(r["steps"] == 3 for r in out["runs"])
    again = ablate_cli("submit", file, "--executor", "local", "--results", results)
    assert "nothing to submit (2 completed)" in again.stdout


@pytest.mark.system
@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_slurm_grid_completes_failed_run_is_reported_and_resubmitted_alone(tmp_path, sample_data, slurm_cluster):
    file = write_experiment(tmp_path, "grid", ["baseline", "combo2", "flaky"], 1, 3, sample_data)
    (tmp_path / "FAIL").touch()
    experiment, results = load_experiment(file), tmp_path / "results"
    out = ablate_cli("submit", file, "--executor", "slurm", "--profile", "local", "--results", results).stdout
    assert "queued 3 runs" in out
    # submitting again while the grid is queued or running queues nothing twice
    again = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
    assert again["to_submit"] == [] and again["jobs"] == {}
    rows = wait_until_settled(experiment, results)
    states = {(r.arm, r.seed): r.state for r in rows}
    assert [k for k, s in states.items() if s != "completed"] == [("flaky", 0)], states
    failed = [r for r in rows if r.arm == "flaky"]
    assert all("marker file present" in r.error for r in failed)
    shown = ablate_cli("status", file, "--results", results).stdout
    assert "completed: 2" in shown and "failed: 1" in shown and "marker file present" in shown
    completed_ids = {k: v.job_id for k, v in read_ledger(results / "grid").runs.items()}
    # the fix, then a second submit reruns the failed runs alone
    (tmp_path / "FAIL").unlink()
    second = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
    assert sorted(second["to_submit"]) == ["smoke/flaky/seed0"]
    rows = wait_until_settled(experiment, results)
    assert all(r.state == "completed" for r in rows)
    ledger = read_ledger(results / "grid").runs
    assert all(ledger[k].job_id == completed_ids[k] for k in completed_ids if "flaky" not in k)
    summaries = [read_json(run_dir(results, "grid", "smoke", a, 0) / "summary.json") for a in ("baseline", "combo2")]
    assert summaries[0]["init_fingerprint"] == summaries[1]["init_fingerprint"]


@pytest.mark.system
@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_simulated_time_out_resumes_from_the_checkpoint_to_the_same_loss(tmp_path, sample_data, slurm_cluster,
                                                                        straight_run):
    """USR2 (SLURM's time-out warning) mid-way: the job checkpoints, SLURM requeues it, it resumes from the
    checkpoint and ends where the session's straight run of the same settings (tests/conftest.py) ended."""
    import submitit

    file = write_experiment(tmp_path, "timeout", [STRAIGHT_ARM], 1, STRAIGHT_STEPS, sample_data, evaluation="")
    experiment, results = load_experiment(file), tmp_path / "results"
    report = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
    key = f"smoke/{STRAIGHT_ARM}/seed0"
    entry = read_ledger(results / "timeout").runs[key]
    metrics = run_dir(results, "timeout", "smoke", STRAIGHT_ARM, 0) / "metrics.jsonl"
    deadline = time.time() + 300
    while not [r for r in read_metrics(metrics) if r.get("step", 0) >= 3]:
        assert time.time() < deadline, "the job did not start training"
        time.sleep(0.5)
    job = submitit.SlurmJob(folder=entry.folder, job_id=report["jobs"][key])
    job._interrupt(timeout=True)  # USR2, as SLURM sends before the time limit
    rows = wait_until_settled(experiment, results)
    assert rows[0].state == "completed"
    log = Path(job.paths.stderr).read_text() + Path(job.paths.stdout).read_text()
    resumed_at = [int(line.split("resuming at step", 1)[1].split()[0]) for line in log.splitlines()
                  if "resuming at step" in line]
    assert resumed_at and 3 <= resumed_at[0] < STRAIGHT_STEPS, log[-3000:]  # restarted from the signal's checkpoint
    summary = read_json(run_dir(results, "timeout", "smoke", STRAIGHT_ARM, 0) / "summary.json")
    assert summary["val_loss"] == straight_run["val_loss"]  # bitwise
    assert summary["data_fingerprint"] == straight_run["data_fingerprint"]


@pytest.mark.unit
def test_pending_array_rows_of_sacct_are_expanded():
    from ablate.status import _expand_array

    assert _expand_array("41_[2-4,7%8]") == ["41_2", "41_3", "41_4", "41_7"]
    assert _expand_array("41_3") == ["41_3"] and _expand_array("40") == ["40"]


@pytest.mark.unit
def test_the_micro_batch_follows_the_profiles_gpu():
    from ablate.dispatch import gpu_run_options
    from ablate.runconfig import RunOptions
    from ablate.experiment import RunSpec
    from ablate.profiles import Profile
    from ablate.tiers import get_tier

    spec, a100, h200 = RunSpec("e", "124M", "baseline", 0, {}), Profile("a", gpu="a100"), Profile("h", gpu="h200")
    small = gpu_run_options(RunOptions(), spec, get_tier("124M"), a100).micro_batch
    large = gpu_run_options(RunOptions(), spec, get_tier("124M"), h200).micro_batch
    assert small < large and get_tier("124M").global_batch % small == 0
    chosen = RunSpec("e", "10M", "baseline", 0, {"micro_batch": 8})  # an experiment's own choice wins
    assert gpu_run_options(RunOptions(), chosen, get_tier("10M"), a100).micro_batch == 8


@pytest.mark.system
def test_status_shows_not_submitted_and_a_failed_local_run_with_its_one_line_error(tmp_path, sample_data):
    file = tmp_path / "partial.py"
    file.write_text(
        "from ablate.experiment import Experiment\n"
        "EXPERIMENT = Experiment(name='partial', tiers=['smoke'], arms=['baseline', 'sink-logit', 'combo'], seeds=1,\n"
        f"    overrides={{'max_steps': 2, 'data_dir': {str(sample_data)!r}{SHORT_EVALUATION}}})\n")
    results = tmp_path / "results"
    ablate_cli("submit", file, "--executor", "local", "--arms", "baseline", "--results", results)
    rows = {r["arm"]: r for r in json.loads(ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]}
    assert rows["baseline"]["state"] == "completed" and rows["baseline"]["steps"] == 2
    assert rows["baseline"]["total_steps"] == 2 and rows["baseline"]["elapsed_s"] is not None
    assert rows["sink-logit"]["state"] == rows["combo"]["state"] == "not-submitted"
    # a run that fails inside its process (a damaged checkpoint planted in its folder)
    folder = run_dir(results, "partial", "smoke", "combo", 0)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "state.pt").write_bytes(b"junk")
    (folder / "config.json").write_text((run_dir(results, "partial", "smoke", "baseline", 0) / "config.json")
                                        .read_text().replace('"arm": "baseline"', '"arm": "combo"')
                                        .replace('"arm": "baseline"', '"arm": "combo"'))
    failed = ablate_cli("submit", file, "--executor", "local", "--arms", "combo", "--results", results, check=False)
    assert failed.returncode == 1 and "1 failed" in failed.stdout
    text = ablate_cli("status", file, "--results", results).stdout
    row = {r["arm"]: r for r in json.loads(ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]}
    assert row["combo"]["state"] == "failed" and "cannot be loaded safely" in row["combo"]["error"]
    assert "\n" not in row["combo"]["error"] and "Traceback" not in text
    assert "not-submitted: 1" in text and "completed: 1" in text and "failed: 1" in text
    assert f"--results {results}" in text  # the hint keeps the user's options


@pytest.mark.system
def test_a_run_that_kills_its_worker_fails_alone_and_a_diverged_one_is_counted(tmp_path, sample_data):
    file = tmp_path / "crashy.py"
    file.write_text(
        "import os\n"
        "import torch\n"
        "from ablate.arms import Arm, register_arm\n"
        "from ablate.experiment import Experiment\n\n"
        "@register_arm('test-crash')\n"
        "class Crash(Arm):\n"
        "    description = 'kills its process in the first forward pass of training'\n"
        "    def value_gate(self, v, x):\n"
        "        if v.dtype != torch.float64:  # not in the float64 check that submit runs on it first\n"
        "            os._exit(9)\n"
        "        return torch.ones_like(v)\n\n"
        "@register_arm('test-nan')\n"
        "class Nan(Arm):\n"
        "    description = 'a NaN gate in training: the run diverges at its first step'\n"
        "    def value_gate(self, v, x):\n"
        "        if v.dtype != torch.float64:  # finite in the float64 check that submit runs on it first\n"
        "            return v[..., :1] * float('nan')\n"
        "        return torch.ones_like(v[..., :1])\n\n"
        "EXPERIMENT = Experiment(name='crashy', tiers=['smoke'], arms=['test-crash', 'baseline', 'test-nan'],\n"
        f"    seeds=1, overrides={{'max_steps': 2, 'data_dir': {str(sample_data)!r}{SHORT_EVALUATION}}})\n")
    results = tmp_path / "results"
    out = ablate_cli("submit", file, "--executor", "local", "--parallel", "1", "--results", results, check=False)
    assert out.returncode == 1 and ("ran 3 runs here, 1 failed (smoke/test-crash/seed0), 1 diverged "
                                    "(smoke/test-nan/seed0)") in out.stdout  # a diverged run is counted, apart
    rows = {r["arm"]: r for r in json.loads(ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]}
    assert rows["baseline"]["state"] == "completed" and rows["test-nan"]["state"] == "diverged"
    assert (rows["test-crash"]["state"] == "failed"
            and "worker process died (exit code 9)" in rows["test-crash"]["error"])
