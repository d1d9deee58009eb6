"""The single-node SLURM test cluster works with plain submitit.

These tests use no ablate code: they prove that slurm/local-cluster.sh brings up a cluster on
which submitit jobs complete, fail, run as arrays and requeue from a checkpoint, and that
accounting (sacct, which submitit reads job states from) works.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = [pytest.mark.system, pytest.mark.slurm, pytest.mark.timeout(300)]

# The functions below live in this test module, which the job cannot import on the node
# (tests/ is not a package): ship them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------ helpers


def make_executor(cluster, folder: Path, **overrides) -> submitit.AutoExecutor:
    """An executor configured from slurm/local.toml, as the dispatch code would build it."""
    p = cluster.profile
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params = dict(
        slurm_partition=p["partition"],
        timeout_min=p["time_min"],
        cpus_per_task=p["cpus_per_run"],
        mem_gb=p["mem_gb"],
        slurm_signal_delay_s=p["signal_delay_s"],
        slurm_array_parallelism=p["array_parallelism"],
        name="ablate-test",
    )
    params.update(overrides)
    executor.update_parameters(**params)
    return executor


def _diagnostics(job) -> str:
    def sh(*cmd):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}"

    parts = [sh("squeue", "-a"), sh("sacct", "-D", "-j", str(job.job_id), "-o", "JobID,State,ExitCode,Reason%30")]
    parts.append(f"--- stdout\n{job.stdout() or ''}\n--- stderr\n{(job.stderr() or '')[-4000:]}")
    return "\n".join(parts)


def wait_done(job, timeout: float):
    """Wait for a submitit job to finish, failing with queue/accounting/log details on timeout."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            diag = _diagnostics(job)
            subprocess.run(["scancel", str(job.job_id)], check=False)
            pytest.fail(f"job {job.job_id} not done after {timeout:.0f} s\n{diag}", pytrace=False)
        time.sleep(0.5)


def sacct_states(job_id: str, duplicates: bool = False) -> list[str]:
    cmd = ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"]
    if duplicates:
        cmd.insert(1, "-D")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def wait_sacct_state(job_id: str, state: str, timeout: float = 30) -> list[str]:
    """Accounting reaches slurmdbd asynchronously: poll until sacct shows `state`."""
    deadline = time.monotonic() + timeout
    while True:
        states = sacct_states(job_id)
        if state in states or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


# ------------------------------------------------------------------ job functions


def add(a: int, b: int) -> dict:
    return {
        "sum": a + b,
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
        "cpus": os.environ.get("SLURM_CPUS_PER_TASK"),
    }


def timed_sleep(i: int, seconds: float = 3.0) -> tuple[int, float, float]:
    start = time.time()
    time.sleep(seconds)
    return i, start, time.time()


def fail(message: str) -> None:
    raise ValueError(message)


class CountSteps(submitit.helpers.Checkpointable):
    """Sums 0..n_steps-1, one step per `step_s` seconds, keeping its progress in `workdir`.

    On SLURM's USR2, submitit calls `checkpoint()` (inherited: resubmit with the same arguments)
    and requeues the job; the requeued job resumes from the progress file, not from zero.
    """

    def __call__(self, workdir: str, n_steps: int, step_s: float) -> dict:
        wd = Path(workdir)
        state_file = wd / "state.txt"
        step, total = 0, 0
        if state_file.exists():
            step, total = map(int, state_file.read_text().split())
        with open(wd / "starts.txt", "a") as f:
            f.write(f"{step} {os.environ.get('SLURM_RESTART_COUNT', '0')} {time.time()}\n")
        while step < n_steps:
            time.sleep(step_s)
            total += step
            step += 1
            tmp = wd / "state.tmp"
            tmp.write_text(f"{step} {total}")
            tmp.replace(state_file)  # atomic: a signal between steps never leaves half a file
        return {"total": total, "starts": (wd / "starts.txt").read_text().splitlines()}


# ------------------------------------------------------------------ tests


def test_status_reports_the_node_and_accounting(slurm_cluster):
    assert "sacct      ok" in slurm_cluster.status
    info = subprocess.run(
        ["sinfo", "-h", "-p", slurm_cluster.partition, "-o", "%a %c %m"], capture_output=True, text=True, check=True
    ).stdout.split()
    avail, cpus, mem_mb = info[0], int(info[1]), int(info[2].rstrip("+"))
    assert avail == "up"
    assert cpus >= 2 * slurm_cluster.profile["cpus_per_run"]  # two one-CPU runs fit side by side
    assert mem_mb >= 2 * slurm_cluster.profile["mem_gb"] * 1024


def test_function_job_returns_its_value_and_sacct_says_completed(slurm_cluster, submitit_folder):
    t0 = time.monotonic()
    job = make_executor(slurm_cluster, submitit_folder).submit(add, 2, 3)
    wait_done(job, timeout=60)
    result = job.result()
    assert result["sum"] == 5
    assert result["job_id"] == str(job.job_id)
    assert result["partition"] == slurm_cluster.partition
    assert wait_sacct_state(job.job_id, "COMPLETED") == ["COMPLETED"]
    assert job.get_info(mode="force").get("State") == "COMPLETED"  # what submitit reads from sacct
    print(f"function job {job.job_id}: {time.monotonic() - t0:.1f} s from submit to COMPLETED")


def test_job_array_of_three_completes(slurm_cluster, submitit_folder):
    t0 = time.monotonic()
    executor = make_executor(slurm_cluster, submitit_folder)
    jobs = executor.map_array(timed_sleep, [0, 1, 2])
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1, "expected a single job array"
    for job in jobs:
        wait_done(job, timeout=90)
    results = sorted(job.result() for job in jobs)
    assert [r[0] for r in results] == [0, 1, 2]
    for job in jobs:
        assert wait_sacct_state(job.job_id, "COMPLETED") == ["COMPLETED"]
    # how many ran at once: the node declares >= 4 CPUs, so the 1-CPU tasks should overlap
    events = sorted([(s, 1) for _, s, _ in results] + [(e, -1) for _, _, e in results])
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    print(f"array {jobs[0].job_id.split('_')[0]}: {most} of 3 tasks at once, {time.monotonic() - t0:.1f} s")
    assert most >= 2, f"array tasks ran one at a time: {results}"


def test_failing_job_is_reported_failed_with_its_error(slurm_cluster, submitit_folder):
    t0 = time.monotonic()
    job = make_executor(slurm_cluster, submitit_folder).submit(fail, "deliberate failure 4711")
    wait_done(job, timeout=60)
    with pytest.raises(submitit.core.utils.FailedJobError) as excinfo:
        job.result()
    assert "ValueError: deliberate failure 4711" in str(excinfo.value)
    assert wait_sacct_state(job.job_id, "FAILED") == ["FAILED"]
    assert job.get_info(mode="force").get("State") == "FAILED"
    print(f"failing job {job.job_id}: {time.monotonic() - t0:.1f} s from submit to FAILED")


def test_checkpointable_job_requeues_on_usr2_and_resumes(slurm_cluster, submitit_folder, tmp_path):
    n_steps, step_s = 40, 0.1  # 4 s of work: interrupted at step 8 or later, requeued, resumed from there
    workdir = tmp_path / "work"
    workdir.mkdir()
    executor = make_executor(slurm_cluster, submitit_folder)
    t0 = time.monotonic()
    job = executor.submit(CountSteps(), str(workdir), n_steps, step_s)

    # interrupt once the job is well under way
    deadline = time.monotonic() + 60
    state_file = workdir / "state.txt"
    while not (state_file.exists() and int(state_file.read_text().split()[0]) >= 8):
        if time.monotonic() > deadline:
            pytest.fail(f"job never made progress\n{_diagnostics(job)}", pytrace=False)
        time.sleep(0.2)
    t_interrupt, t_interrupt_wall = time.monotonic(), time.time()
    job._interrupt(timeout=True)  # USR2 alone, as SLURM sends signal_delay_s before the time limit

    wait_done(job, timeout=120)
    t_done = time.monotonic()
    result = job.result()
    assert result["total"] == sum(range(n_steps))
    starts = [line.split() for line in result["starts"]]
    assert len(starts) == 2, f"expected one requeue, got starts {starts}"
    first, second = starts
    assert int(first[0]) == 0 and int(first[1]) == 0
    assert int(second[0]) >= 8, "the requeued job did not resume from its checkpoint"
    assert int(second[1]) == 1  # SLURM_RESTART_COUNT
    assert "REQUEUED" in sacct_states(job.job_id, duplicates=True)
    assert wait_sacct_state(job.job_id, "COMPLETED") == ["COMPLETED"]
    print(
        f"checkpointed job {job.job_id}: USR2 at step >= 8, resumed at step {second[0]}/{n_steps} "
        f"{float(second[2]) - t_interrupt_wall:.1f} s after USR2; done {t_done - t_interrupt:.1f} s after USR2, "
        f"{t_done - t0:.1f} s in all"
    )
