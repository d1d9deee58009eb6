"""`ablate status` and `submit` against the real single-node SLURM cluster: pending arrays, cancelled tasks,
accounting that does not answer."""

import datetime as dt
import os
import json
import subprocess
import time
from pathlib import Path

import pytest

from ablate.dispatch import Submission, submit
from ablate.status import status
from ablate.store import read_ledger
from ablate.experiment import load_experiment
from ablate.store import LEDGER, atomic_write_json, read_json, read_metrics, run_dir
from datafix import ablate_cli

pytestmark = [pytest.mark.system, pytest.mark.slurm, pytest.mark.timeout(900)]


def held_profile(folder: Path, cluster) -> Path:
    """slurm/local.toml, with every array submitted held (`sbatch --hold`): it stays pending."""
    path = folder / "held.toml"
    path.write_text(cluster.profile_path.read_text().replace("extra_sbatch = []", 'extra_sbatch = ["--hold"]'))
    assert '"--hold"' in path.read_text()
    return path


def broken_accounting(folder: Path) -> Path:
    """A copy of this cluster's slurm.conf whose accounting port nobody listens on: the real `sacct` fails
    ("Connection refused"), while squeue still talks to the controller."""
    conf = Path(subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
                .split("SLURM_CONF", 1)[1].split("=", 1)[1].split()[0])
    text = "\n".join("AccountingStoragePort=1" if line.startswith("AccountingStoragePort") else line
                     for line in conf.read_text().splitlines())
    path = folder / "slurm.conf"
    path.write_text(text + "\n")
    return path


def sacct(*ids: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)], capture_output=True,
                          text=True, timeout=60, env=env)


def poll(what, condition, timeout=300, every=1.0):
    deadline = time.time() + timeout
    while True:
        value = what()
        if condition(value):
            return value
        assert time.time() < deadline, f"timed out; last: {json.dumps(value, indent=1, default=str)[:4000]}"
        time.sleep(every)


def backdate(results: Path, name: str) -> None:
    """Make the ledger's jobs an hour old: accounting's grace for a just-submitted job no longer hides anything."""
    ledger = read_json(results / name / LEDGER)  # the file as it is, edited by hand
    old = (dt.datetime.now() - dt.timedelta(hours=1)).isoformat(timespec="seconds")
    for entry in ledger["runs"].values():
        entry["submitted"] = old
    atomic_write_json(results / name / LEDGER, ledger)


def test_a_pending_array_is_queued_and_never_submitted_twice_whatever_sacct_says(
        tmp_path, sample_data, slurm_cluster, monkeypatch):
    file = tmp_path / "held.py"
    file.write_text(
        "from ablate.experiment import Experiment\n"
        "EXPERIMENT = Experiment(name='held', tiers=['smoke'], arms=['baseline', 'sink-logit', 'combo'], seeds=1,\n"
        f"    overrides={{'max_steps': 3, 'data_dir': {str(sample_data)!r}}})\n")
    experiment, results = load_experiment(file), tmp_path / "results"
    held = str(held_profile(tmp_path, slurm_cluster))
    report = submit(experiment, str(file), Submission(results=results, executor="slurm", profile=held))
    array = next(iter(report["jobs"].values())).split("_")[0]
    try:
        backdate(results, "held")
        # the fault SLURM really has: a pending array's tasks are unknown to `sacct -j ID_T`, known to `sacct -j ID`
        poll(lambda: sacct(array).stdout, lambda out: "PENDING" in out, timeout=60)
        assert sacct(f"{array}_0", f"{array}_1").stdout.strip() == ""
        rows = status(experiment, results)
        assert [r.state for r in rows] == ["queued"] * 3, rows
        assert sorted(r.job_id for r in rows) == [f"{array}_{i}" for i in range(3)]
        again = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
        assert again["to_submit"] == [] and again["skipped"] == {"queued": 3}
        shown = ablate_cli("status", file, "--results", results).stdout
        assert "queued: 3" in shown and "failed" not in shown and "resubmits" not in shown

        # accounting down (the real sacct, pointed at a port nobody listens on): squeue still holds the runs
        env = {"SLURM_CONF": str(broken_accounting(tmp_path))}
        monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
        down = sacct(array, env={**os.environ, **env})
        assert down.returncode != 0 and "Connection refused" in down.stderr
        assert [r.state for r in status(experiment, results)] == ["queued"] * 3
        again = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
        assert again["to_submit"] == []
        monkeypatch.delenv("SLURM_CONF")
        assert len(read_ledger(results / "held").submissions) == 1  # nothing was ever queued twice
    finally:
        subprocess.run(["scancel", array], check=False)


def held_arm(metrics: Path, release: Path) -> str:
    """Python registering the arm `held`: the baseline, held from its third step (once `metrics` holds two steps'
    rows) until `release` exists, so that a task cancelled after two steps is cancelled before its last one however
    loaded the machine is; once `release` exists, the plain baseline."""
    return ("import time\nfrom pathlib import Path\n\nfrom ablate.arms import Arm, register_arm\n\n"
            f"METRICS, RELEASE = Path({str(metrics)!r}), Path({str(release)!r})\n\n\n"
            "@register_arm('held', replace=True)\nclass Held(Arm):\n"
            "    def output_gate(self, o, x):\n"
            "        deadline = time.time() + 120\n"
            "        while (not RELEASE.exists() and METRICS.exists()\n"
            "               and METRICS.read_text().count('train_loss') >= 2 and time.time() < deadline):\n"
            "            time.sleep(0.01)\n"
            "        return o\n\n\n")


def test_a_cancelled_task_is_cancelled_under_its_array_id_and_resubmitting_resumes_it(
        tmp_path, sample_data, slurm_cluster, monkeypatch):
    file, results, release = tmp_path / "cancel.py", tmp_path / "results", tmp_path / "scancel-sent"
    metrics = run_dir(results, "cancel", "smoke", "held", 0) / "metrics.jsonl"
    file.write_text(held_arm(metrics, release) +
                    "from ablate.experiment import Experiment\n"
                    "EXPERIMENT = Experiment(name='cancel', tiers=['smoke'], arms=['baseline', 'held'], seeds=1,\n"
                    f"    overrides={{'max_steps': 8, 'data_dir': {str(sample_data)!r}, 'val_tokens': 512,\n"
                    "    'final_val_tokens': 512})\n")
    experiment = load_experiment(file)
    held = str(held_profile(tmp_path, slurm_cluster))
    report = submit(experiment, str(file), Submission(results=results, executor="slurm", profile=held))
    task = report["jobs"]["smoke/held/seed0"]
    array = task.split("_")[0]
    try:
        backdate(results, "cancel")
        subprocess.run(["scontrol", "release", task], check=True)  # this task runs; the other stays held
        poll(lambda: {r.arm: r.state for r in status(experiment, results)},
             lambda s: s["held"] == "running" and [r for r in read_metrics(metrics) if r.get("step", 0) >= 2],
             every=0.5)
        running = {r.arm: r for r in status(experiment, results)}["held"]
        assert running.elapsed_s is not None and running.elapsed_s < 600
        subprocess.run(["scancel", task], check=True)
        release.touch()  # the held step ends: the run stops at its boundary, before its last step
        poll(lambda: sacct(array).stdout, lambda out: f"{task}|CANCELLED" in out, timeout=120)
        # running while its process still holds the run lock (it checkpoints on SIGTERM), then cancelled
        stopped = poll(lambda: {r.arm: r for r in status(experiment, results)}["held"],
                       lambda r: r.state != "running", timeout=120, every=0.5)
        assert stopped.state == "cancelled", stopped
        poll(lambda: subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", array], capture_output=True,
                                    text=True).stdout.split(), lambda ids: task not in ids, timeout=120)
        rows = {r.arm: r for r in status(experiment, results)}
        cancelled = rows["held"]
        assert cancelled.state == "cancelled" and cancelled.job_id == task, cancelled
        assert task in cancelled.error and "StepId" not in cancelled.error and cancelled.eta_s is None
        assert rows["baseline"].state == "queued"
        shown = ablate_cli("status", file, "--results", results).stdout
        assert "cancelled: 1" in shown and "queued: 1" in shown and task in shown

        # accounting down and the job gone from the queue: unknown, with the reason; never failed
        monkeypatch.setenv("SLURM_CONF", str(broken_accounting(tmp_path)))
        lost = {r.arm: r for r in status(experiment, results)}["held"]
        assert lost.state == "unknown" and "Connection refused" in lost.error and task in lost.error, lost
        monkeypatch.delenv("SLURM_CONF")

        # resubmitting queues the cancelled run alone and it resumes from its checkpoint
        again = submit(experiment, str(file), Submission(results=results, executor="slurm", profile="local"))
        assert again["to_submit"] == ["smoke/held/seed0"]
        done = poll(lambda: {r.arm: r for r in status(experiment, results)},
                    lambda s: s["held"].state in ("completed", "failed", "diverged", "unknown"), timeout=600)
        assert done["held"].state == "completed", done
        log = (run_dir(results, "cancel", "smoke", "held", 0) / "run.log").read_text()
        assert "resuming at step" in log
    finally:
        subprocess.run(["scancel", array], check=False)
