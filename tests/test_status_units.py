"""Unit tests of status: SLURM's output text, the state rules, elapsed time and ETA, damaged folders."""

import datetime as dt
import json
import math
import subprocess
import sys
import time
from dataclasses import replace

from ablate.experiment import Experiment, RunSpec
from ablate.lock import FileLock
from ablate.status import SlurmView, parse_sacct, parse_squeue, progress_of, run_status, slurm_job_state
from ablate.store import Ledger, LedgerEntry, atomic_write_json, run_dir, run_lock_path
from ablate.store_summary import RunSummary
from ablate.tiers import get_tier
import pytest

OLD = (dt.datetime.now() - dt.timedelta(hours=1)).isoformat(timespec="seconds")
ENTRY = LedgerEntry("slurm", "54_1", "/nowhere/%j", submitted=OLD)
EMPTY_LEDGER = Ledger({}, ())


@pytest.mark.unit
def test_sacct_and_squeue_text_is_read_per_task():
    assert parse_sacct("54_[0-3%4]|PENDING\n") == {f"54_{i}": "PENDING" for i in range(4)}
    assert parse_sacct("18_19|CANCELLED by 0\n18_2|COMPLETED\n") == {"18_19": "CANCELLED", "18_2": "COMPLETED"}
    assert parse_squeue("54_0|PENDING|JobHeldUser\n54_1|RUNNING|None\n") == {
        "54_0": ("PENDING", "JobHeldUser"), "54_1": ("RUNNING", "None")}


@pytest.mark.unit
def test_the_queue_decides_first_and_silent_accounting_is_unknown_never_failed():
    def state(queue, accounting, entry=ENTRY, errors=None):
        return slurm_job_state(entry, SlurmView(queue=queue, accounting=accounting, errors=errors or {}))

    # a pending array: sacct by task id is silent, squeue holds it
    assert state({"54_1": ("PENDING", "JobHeldUser")}, {}) == ("queued", None)
    # squeue holds it whatever accounting says (lagging, or down)
    assert state({"54_1": ("RUNNING", "None")}, {"54_1": "FAILED"})[0] == "running"
    assert state({"54_1": ("PENDING", "Priority")}, None, errors={"sacct": "sacct: Connection refused"})[0] == "queued"
    assert state({}, {"54_[0-3%4]": "PENDING", **parse_sacct("54_[0-3%4]|PENDING")})[0] == "queued"
    # cancelled (also while SLURM still completes it), with the id the user knows
    job, why = state({"54_1": ("COMPLETING", "None")}, {"54_1": "CANCELLED"})
    assert job == "cancelled" and "54_1" in why and "ablate submit" in why
    # neither says anything: unknown with the reason, never failed
    job, why = state({}, {}, errors={})
    assert job == "unknown" and "54_1" in why and "sacct has no record" in why
    job, why = state({}, None, errors={"sacct": "sacct: error: Problem talking to the database: Connection refused"})
    assert job == "unknown" and "Connection refused" in why
    job, why = state(None, None, errors={"squeue": "squeue: timed out", "sacct": "sacct: down"})
    assert job == "unknown" and "does not answer" in why
    # a just-submitted job accounting has not seen yet is queued
    assert state({}, {}, entry=replace(ENTRY, submitted=dt.datetime.now().isoformat(timespec="seconds")))[0] == "queued"
    # held: submit must not queue again what squeue still holds (completing included) or when squeue is silent
    assert SlurmView(queue={"54_1": ("COMPLETING", "None")}).holds("54_1")
    assert SlurmView(queue=None).holds("54_1") and not SlurmView(queue={}).holds("54_1")


@pytest.mark.unit
def test_a_runaway_job_is_unknown_and_resubmittable_never_queued_forever(tmp_path):
    """Accounting says RUNNING (or SUSPENDED) but squeue, which answered, does not hold the job."""
    for told in ("RUNNING", "SUSPENDED"):
        view = SlurmView(queue={}, accounting={"54_1": told}, errors={})
        job, why = slurm_job_state(ENTRY, view)
        assert job == "unknown" and "54_1" in why and told in why and "ablate submit" in why
        spec = RunSpec("e", "smoke", "baseline", 0)
        ledger = Ledger({spec.key: ENTRY}, ())
        row = run_status(tmp_path, spec, ledger, view)
        assert row.state == "unknown" and row.queued is False  # `submit` queues it again
    # the controller still holding it, or silent, or a job just submitted: not a runaway
    assert slurm_job_state(ENTRY, SlurmView(queue={"54_1": ("RUNNING", "None")}, accounting={"54_1": "RUNNING"}))[0] \
        == "running"
    assert slurm_job_state(ENTRY, SlurmView(queue=None, accounting={"54_1": "RUNNING"}))[0] == "running"
    fresh = replace(ENTRY, submitted=dt.datetime.now().isoformat(timespec="seconds"))
    assert slurm_job_state(fresh, SlurmView(queue={}, accounting={"54_1": "RUNNING"}))[0] == "running"


@pytest.mark.unit
def test_elapsed_counts_training_time_once_and_eta_only_from_this_attempt():
    now = time.time()
    # an earlier attempt a day ago at 1 step/s; this attempt (from `since`) at 0.1 step/s
    metrics = [{"step": s, "train_loss": 1.0, "time": now - 86400 + s} for s in range(1, 11)]
    metrics += [{"step": 10 + s, "train_loss": 1.0, "time": now - 100 + 10 * s} for s in range(1, 11)]
    summary = RunSummary(status="running", steps=15, total_steps=100, wall_seconds=500.0)
    since, written = now - 110, now - 50  # the attempt began 110 s ago; the summary was written 50 s ago
    progress = progress_of(metrics, summary, since, written)
    assert progress["steps"] == 20 and abs(progress["elapsed_s"] - 550) < 5  # 500 + 50: not + time since start
    assert abs(progress["eta_s"] - 800) < 20  # 80 steps at this attempt's 0.1 step/s
    stopped = progress_of(metrics, summary, None, written)
    assert stopped["elapsed_s"] == 500.0 and stopped["eta_s"] is None  # a dead run's clock does not run on


def _grid(tmp_path, summary=None, metrics=None):
    spec = RunSpec("units", "smoke", "baseline", 0)
    folder = run_dir(tmp_path, "units", "smoke", "baseline", 0)
    folder.mkdir(parents=True)
    if summary is not None:
        atomic_write_json(folder / "summary.json", summary)
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return spec, folder


@pytest.mark.system
def test_a_run_whose_lock_holder_is_dead_is_not_running(tmp_path):
    now = time.time()
    spec, folder = _grid(tmp_path, {"status": "running", "steps": 5, "total_steps": 50, "wall_seconds": 60.0},
                         [{"step": s, "train_loss": 1.0, "time": now - 10 + s} for s in range(1, 6)])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = FileLock(run_lock_path(folder)).holder() | {"pid": int(dead.stdout), "start_time": "1"}
    run_lock_path(folder).write_text(json.dumps(holder))
    row = run_status(tmp_path, spec, EMPTY_LEDGER, SlurmView())
    assert row.state == "failed" and row.eta_s is None and row.elapsed_s == 60.0
    run_lock_path(folder).unlink()
    with FileLock(run_lock_path(folder)):  # a live holder: running, elapsed counted once, an ETA
        start = time.time()
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train_loss": 1.0, "time": start + s / 10})
                                                      + "\n" for s in range(1, 6)))
        row = run_status(tmp_path, spec, EMPTY_LEDGER, SlurmView())
    assert row.state == "running" and row.eta_s is not None and 60.0 <= row.elapsed_s < 70.0


@pytest.mark.unit
def test_contradictory_folders_are_damaged_not_not_submitted(tmp_path):
    cases = [({"status": "completed", "val_loss": math.nan, "steps": 3, "total_steps": 3}, None, "val_loss nan"),
             ({"status": "completed", "val_loss": 4.2, "steps": 5, "total_steps": 3}, None, "step 5 is past"),
             ({"status": "running", "steps": 2, "total_steps": 3}, [{"step": 9, "train_loss": 1.0}], "step 9 is past"),
             ({"status": "weird"}, None, "status 'weird'"),
             (None, [{"step": 1, "train_loss": 1.0}], "without a summary.json")]
    for i, (summary, metrics, why) in enumerate(cases):
        spec, _ = _grid(tmp_path / str(i), summary, metrics)
        row = run_status(tmp_path / str(i), spec, EMPTY_LEDGER, SlurmView())
        assert row.state == "damaged" and why in row.error and "--force" in row.error, (summary, row)


@pytest.mark.unit
def test_submit_leaves_a_damaged_run_alone(tmp_path):
    from ablate.dispatch import _plan_submission

    experiment = Experiment(name="units", tiers=("smoke",), arms=("baseline",), seeds=1)
    _grid(tmp_path, {"status": "completed", "val_loss": math.nan, "steps": 3, "total_steps": 3})
    plan, _ = _plan_submission(experiment, experiment.runs(), {"smoke": get_tier("smoke")}, tmp_path, None)
    assert plan["to_submit"] == [] and plan["skipped"] == {"damaged": 1}
