"""The state of an experiment's runs: the ledger, SLURM's queue and accounting, run locks and run folders.

Each run of the grid is in one of STATES. Completed and diverged are read from the run's summary (a
folder whose records contradict themselves is `damaged`); a run whose lock is live is running (a lock,
unlike a process id, cannot be reused by another process); otherwise the ledger says whether it was
submitted, and SLURM (one `squeue` and one `sacct` call for the whole grid, by array job id) or the
local submit's own lock says whether it is still queued. Silence of accounting is `unknown`, never a
failure. A failure is shown as one line (the traceback stays in the run's run.log or SLURM's log).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import subprocess
import time
from pathlib import Path

import submitit

from ablate.evals.results import valid_evals
from ablate.experiment import Experiment, RunSpec
from ablate.errors import AblateError
from ablate.lock import live_holder
from ablate.errors import error_line
from ablate.sequential import recorded_design
from ablate.store import (
    CONFIG,
    METRICS,
    STATUSES,
    SUBMIT_LOCK,
    SUMMARY,
    Ledger,
    LedgerEntry,
    Status,
    config_disagreement,
    check_results_folder,
    experiment_dir,
    iter_run_dirs,
    read_ledger,
    read_metrics,
    run_lock_path,
    run_of,
)
from ablate.store_summary import RunSummary, read_summary
from ablate.arms.source import is_stale

ACTIVE = ("queued", "running", "requeued")  # SLURM (or the local submit) still holds the run
STATES = ("not-submitted", "queued", "running", "requeued", "completed", "diverged", "cancelled", "failed",
          "damaged", "unknown")
JUST_SUBMITTED = dt.timedelta(minutes=2)  # accounting may not have seen a job this young yet


def with_queued_seeds(experiment: Experiment, results: Path) -> Experiment:
    """The experiment with every seed its ledger's sequential design queued: `submit --sequential` goes past
    the declared seed count look by look, and status, clean, eval and the resume hints must see those runs
    too (else they count 6 of 12 completed runs). No recorded design: the experiment as declared."""
    folder = experiment_dir(results, experiment)
    try:
        if recorded_design(folder) is None:
            return experiment
    except AblateError:
        pass  # a damaged design record: the ledger's runs still say which seeds were queued, and status shows them
    queued: dict[str, int] = {}
    for key in read_ledger(folder).runs:
        tier, _, seed = key.removeprefix("eval:").rpartition("/seed")
        tier = tier.split("/")[0]
        if tier in experiment.tiers and seed.isdigit():
            queued[tier] = max(queued.get(tier, 0), int(seed) + 1)
    counts = {tier: max(experiment.seed_count(tier), queued.get(tier, 0)) for tier in experiment.tiers}
    return dataclasses.replace(experiment, seeds=counts)


@dataclasses.dataclass
class SlurmView:
    """What SLURM says about some jobs: the queue (squeue) and accounting (sacct), each None when it did
    not answer, with the reason in `errors`. Ids are those the user knows: `54_3` for an array task."""

    queue: dict[str, tuple[str, str]] | None = dataclasses.field(default_factory=dict)  # id: (state, reason)
    accounting: dict[str, str] | None = dataclasses.field(default_factory=dict)  # id: state
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # "squeue" / "sacct": one line

    def holds(self, job_id: str) -> bool:
        """squeue still shows the job unfinished (completing included: its processes may still live), or
        cannot say: `submit` must not queue its run again."""
        if self.queue is None:
            return True
        held = self.queue.get(job_id)
        return held is not None and held[0] not in ENDED


def _ask(command: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None), or (None, the one-line reason) when the command failed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{command[0]}: {err.__class__.__name__}: {err}"
    if done.returncode != 0:
        return None, f"{command[0]}: {error_line(done.stderr) or f'exit code {done.returncode}'}"
    return done.stdout, None


def slurm_states(job_ids: list[str]) -> SlurmView:
    """One `squeue` and one `sacct` call for many jobs, asked by their array job ids.

    sacct knows a pending array only by its array id (`sacct -j 54` shows `54_[0-3%4] PENDING`; `sacct -j
    54_0` shows nothing), and accounting can be down or lag behind the controller: squeue says what is
    queued or running. (submitit's own watcher also asks sacct by the array id and expands the ranges.)
    """
    view = SlurmView()
    arrays = sorted({str(j).split("_")[0] for j in job_ids if j})
    if not arrays:
        return view
    out, error = _ask(["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(arrays)])
    if out is None and "Invalid job id" in (error or ""):  # none of them is known to the controller any more
        out, error = "", None
    view.queue = None if out is None else parse_squeue(out)
    out, sacct_error = _ask(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(arrays)])
    view.accounting = None if out is None else parse_sacct(out)
    view.errors = {k: v for k, v in (("squeue", error), ("sacct", sacct_error)) if v}
    return view


def parse_squeue(text: str) -> dict[str, tuple[str, str]]:
    """`squeue -h -r -o '%i|%T|%r'` lines → {task id: (STATE, reason)}."""
    queue = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            for one in _expand_array(parts[0]):
                queue[one] = (parts[1].upper(), parts[2] if len(parts) > 2 else "")
    return queue


def parse_sacct(text: str) -> dict[str, str]:
    """`sacct -X -n -P -o JobID,State` lines → {task id: STATE} (`CANCELLED by 0` → CANCELLED)."""
    states = {}
    for line in text.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            for one in _expand_array(job_id):
                states[one] = state.split()[0].upper() if state.strip() else "UNKNOWN"
    return states


def _expand_array(job_id: str) -> list[str]:
    """An array's still-pending tasks as one row: '41_[2-5,7%8]' → ['41_2', ..., '41_7']."""
    head, bracket, rest = job_id.partition("_[")
    if not bracket:
        return [job_id]
    ids = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        ids.extend(f"{head}_{i}" for i in range(int(low), int(high or low) + 1))
    return ids


QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING")
RUNNING = ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT")
PAUSED = ("SUSPENDED", "PREEMPTED", "STOPPED")
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
         "REVOKED", "SPECIAL_EXIT")


def slurm_job_state(entry: LedgerEntry, slurm: SlurmView) -> tuple[str, str | None]:
    """(queued | running | requeued | finished | cancelled | failed | unknown, reason) of a SLURM ledger entry.

    The queue decides first: a job squeue holds is queued or running, whatever accounting says. Then
    accounting. Silence of both is never a failure: `unknown`, with the reason.
    """
    job_id = entry.job_id
    held = (slurm.queue or {}).get(job_id)
    told = (slurm.accounting or {}).get(job_id, "")
    state = held[0] if held else told
    if not held and slurm.queue is not None and told in RUNNING + PAUSED and not _just_submitted(entry):
        # a runaway: accounting still says it is active, but the controller (which squeue asks) has no such job
        return "unknown", (f"SLURM's accounting says job {job_id} is {told}, but the controller no longer holds it "
                           "(a runaway job record); `ablate submit` queues the run again")
    if state == "COMPLETING" and told in ENDED:  # it has ended (its processes are being cleaned up): say how
        state = told
    if state in QUEUED:
        return "queued", None
    if state in RUNNING:
        return "running", None
    if state in PAUSED:
        return "requeued", None
    if held and state not in ENDED:  # a state squeue shows that is none of the above: accounting says how
        state = told
    if state == "COMPLETED":
        return "finished", None
    if state == "CANCELLED":
        return "cancelled", f"SLURM job {job_id} was cancelled (scancel); `ablate submit` resumes the run"
    if state and state != "UNKNOWN":

        stderr = submitit.SlurmJob(folder=entry.folder, job_id=job_id).paths.stderr
        return "failed", error_line(read_text(stderr)) or f"SLURM job {job_id}: {state}"
    if slurm.queue is None:
        return "unknown", f"SLURM does not answer about job {job_id} ({'; '.join(slurm.errors.values())})"
    if _just_submitted(entry):
        return "queued", None
    why = slurm.errors.get("sacct") or "sacct has no record of it"
    return "unknown", f"SLURM no longer holds job {job_id} and its accounting is silent ({why})"


def _just_submitted(entry: LedgerEntry) -> bool:
    """Submitted so recently that the controller and accounting may not agree about the job yet."""
    return dt.datetime.now() - entry.submitted_at < JUST_SUBMITTED


def read_text(path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def progress_of(metrics: list[dict], summary: RunSummary, running_since: float | None,
                written_at: float | None) -> dict:
    """steps, total, elapsed (training time so far, over every attempt, counted once) and, for a running
    run, an ETA from the step rate of this attempt (rows of earlier attempts are minutes or days apart).

    The summary's `wall_seconds` is the training time up to when it was written (the attempt's start or
    its last checkpoint); a running run adds the time since then, a stopped one adds nothing.
    """
    steps = max([r.get("step", 0) for r in metrics if isinstance(r.get("step"), int)] or [summary.steps or 0])
    total = summary.total_steps
    elapsed, eta = summary.wall_seconds, None
    if running_since is not None:
        now = time.time()
        if isinstance(elapsed, (int, float)):
            elapsed = elapsed + max(0.0, now - max(written_at or running_since, running_since))
        timed = [r for r in metrics if isinstance(r.get("time"), (int, float)) and "train_loss" in r
                 and r["time"] >= running_since - 1][-50:]
        if total and len(timed) >= 2 and timed[-1]["time"] > timed[0]["time"]:
            rate = (timed[-1]["step"] - timed[0]["step"]) / (timed[-1]["time"] - timed[0]["time"])
            eta = max(0.0, total - steps) / rate if rate > 0 else None
    return {"steps": steps, "total_steps": total, "elapsed_s": elapsed, "eta_s": eta}


def holder_since(holder: dict | None) -> float | None:
    """When the live holder of a run lock took it (the start of the run's current attempt), or None."""
    if holder is None:
        return None
    try:
        return dt.datetime.strptime(str(holder.get("started")), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return time.time()


def damage(summary: RunSummary, steps: int, has_metrics: bool) -> str | None:
    """Why a run folder contradicts itself (its records cannot be trusted, nor resumed over), or None."""
    status, total, loss = summary.status, summary.total_steps, summary.val_loss
    if summary.empty:
        return "metrics.jsonl without a summary.json" if has_metrics else None
    if status not in STATUSES:
        return f"summary.json has status {status!r} (valid: {', '.join(STATUSES)})"
    if isinstance(total, int) and steps > total:
        return f"step {steps} is past the run's total of {total} steps"
    if status == Status.COMPLETED and isinstance(loss, float) and not math.isfinite(loss):
        return f"summary.json says completed with val_loss {loss}"
    return None


@dataclasses.dataclass(frozen=True)
class StatusRow:
    """One row of `ablate status` (`run_status`): a run's state (STATES), its progress and the reason in one line;
    `to_dict` is what `ablate status --json` writes of it."""

    tier: str
    arm: str
    seed: int
    state: str = "not-submitted"  # one of STATES
    lr_factor: float | None = None  # a run of the LR sweep: its factor
    job_id: str | None = None  # the ledger's
    steps: int = 0
    total_steps: int | None = None
    elapsed_s: float | None = None  # training time so far, over every attempt
    eta_s: float | None = None  # a running run's
    val_loss: float | None = None  # final when `val_loss_final`, else the last mid-run evaluation
    error: str | None = None  # why, in one line
    queued: bool = False  # something still holds the run (SLURM, the local submit, a live run lock)
    val_loss_final: bool = False
    stale: bool = False  # completed by another version of its arm's code (`ablate.arms.source.is_stale`)
    eval: str | None = None  # its evaluation's state (`eval_state`), filled in by `status`

    def to_dict(self) -> dict:
        """The row as `ablate status --json` writes it (`lr_factor` only for a run of the LR sweep)."""
        row = dataclasses.asdict(self)
        if self.lr_factor is None:
            del row["lr_factor"]
        return row


def run_status(results: Path, spec: RunSpec, ledger: Ledger, slurm: SlurmView,
               submit_holder: dict | None = None) -> StatusRow:
    """One row of `ablate status`: the run's state (STATES), progress, and the reason in one line.

    `queued` in the row means: something still holds the run (SLURM, the local submit, or a run lock
    that is not provably dead), so `submit` must not queue it again. `stale`: a completed run whose recorded arm
    identity is not the code of the arm registered in this process now (`ablate.arms.source.is_stale`).
    """
    folder = spec.folder(results)
    way_out = f"rerun it with `ablate run ... --force` (keeps the old folder aside) or delete {folder}"
    summary = read_summary(folder, way_out)
    entry = ledger.runs.get(spec.key)
    metrics = read_metrics(folder / METRICS)
    holder = live_holder(run_lock_path(folder))
    progress = progress_of(metrics, summary, holder_since(holder),
                           (folder / SUMMARY).stat().st_mtime if not summary.empty else None)
    val_rows = [r for r in metrics if "val_loss" in r]
    state, error, queued = _state(summary, entry, holder, slurm, submit_holder,
                                  damage(summary, progress["steps"], bool(metrics))
                                  or config_disagreement(folder, summary), way_out)
    stale = state == Status.COMPLETED and is_stale(summary.arm_source, spec.arm)
    if stale:
        error = (f"stale: arm {spec.arm!r}'s code changed since it trained (`ablate.arms.source`); "
                 "`ablate submit ... --rerun-stale` retrains it")
    final = summary.status == Status.COMPLETED  # else: the last mid-run evaluation
    return StatusRow(spec.tier, spec.arm, spec.seed, state, spec.lr_factor, entry.job_id if entry else None,
                     progress["steps"], progress["total_steps"], progress["elapsed_s"],
                     progress["eta_s"] if state == "running" else None,
                     summary.val_loss if final else (val_rows[-1]["val_loss"] if val_rows else None),
                     error, queued, final, stale)


def _state(summary, entry: LedgerEntry | None, holder, slurm, submit_holder, damaged,
           way_out) -> tuple[str, str | None, bool]:
    """(state, reason, still held) from the run folder, its lock, the ledger entry and SLURM."""
    status = summary.status
    if damaged:
        return "damaged", f"{damaged}; submit leaves it alone: {way_out}", False
    if summary.done:
        return status, error_line(summary.error) if status == Status.DIVERGED else None, False
    if holder is not None:
        return "running", None, True
    if entry and entry.executor == "slurm":
        job, reason = slurm_job_state(entry, slurm)
        if job in ACTIVE:  # SLURM holds it; running needs the run's own live lock too (else it is starting)
            return ("requeued" if not summary.empty or job == "requeued" else "queued"), None, True
        held = slurm.holds(entry.job_id)
        if job in ("cancelled", "unknown"):
            return job, reason, held
        # finished or failed in SLURM's eyes, without a result in the run folder
        return "failed", error_line(summary.error) or reason or "the run stopped without finishing", held
    if entry and entry.executor == "local":
        if entry.interrupted:
            return "cancelled", entry.error or "interrupted; `ablate submit` resumes it", False
        if entry.exit_code not in (None, 0) or status == Status.FAILED:
            why = error_line(summary.error) or entry.error or f"exit code {entry.exit_code}"
            return "failed", why, False
        if entry.exit_code is None and submit_holder and submit_holder.get("id") == entry.submission:
            return "queued", None, True
    if status in (Status.FAILED, Status.RUNNING, Status.COMPLETED):  # completed without its final loss: resumes
        return "failed", error_line(summary.error) or ("the run stopped without finishing (killed?); "
                                                              "submit again to resume it"), False
    return "not-submitted", None, False


def status(experiment: Experiment | str, results: Path, specs: list[RunSpec] | None = None) -> list[StatusRow]:
    """One row per run (`run_status`): of the experiment's grid (or `specs`, a part of it); given a name
    instead of an Experiment (ad-hoc runs), of `specs`, which the caller lists (`folder_runs`)."""
    name = experiment if isinstance(experiment, str) else experiment.name
    folder = check_results_folder(results) / name
    ledger = read_ledger(folder)
    specs = specs if specs is not None or isinstance(experiment, str) else experiment.runs()
    keys = [s.key for s in specs] + [f"eval:{s.key}" for s in specs]
    job_ids = [ledger.runs[k].job_id for k in keys if k in ledger.runs and ledger.runs[k].executor == "slurm"]
    slurm = slurm_states(job_ids)
    holder = live_holder(folder / SUBMIT_LOCK)
    return [dataclasses.replace(run_status(results, spec, ledger, slurm, holder),
                                eval=eval_state(results, spec, ledger.runs.get(f"eval:{spec.key}"), slurm))
            for spec in specs]


def folder_runs(results: Path, name: str, tiers=None, arms=None, seeds=None) -> list[RunSpec]:
    """The runs found in RESULTS/<name> without an experiment file (`ablate run`'s ad-hoc runs, or any
    `--experiment NAME` of it): every run folder with its config.json (written as a run starts), filtered."""
    specs = []
    for folder in iter_run_dirs(check_results_folder(results) / name, holding=CONFIG):
        run = run_of(folder)
        if (not tiers or run.tier in tiers) and (not arms or run.arm in arms) and (seeds is None or run.seed in seeds):
            specs.append(RunSpec(name, run.tier, run.arm, run.seed))
    return specs


def eval_state(results: Path, spec: RunSpec, entry: LedgerEntry | None, slurm: SlurmView) -> str | None:
    """None (never evaluated nor asked), or evaluated / stale: … / queued / running / cancelled: … /
    unknown: … / failed: … .

    Only evaluations of the run's final weights count (`ablate.evals.results.valid_evals`, as for the tables).
    """
    valid, stale = valid_evals(spec.folder(results))
    wanted = set(entry.tasks or ()) if entry else set(valid) | set(stale)
    if wanted and wanted <= set(valid):
        return "evaluated"
    if entry is None:
        return _stale(stale) if stale else None
    job, error = slurm_job_state(entry, slurm) if entry.executor != "local" else (None, None)
    if job in ACTIVE:
        return job
    if wanted & set(stale):
        return _stale({task: why for task, why in stale.items() if task in wanted})
    outcome = entry.outcome if entry.executor == "local" else None
    if outcome is not None and outcome != "evaluated":
        return outcome
    if job in ("cancelled", "unknown"):
        return f"{job}: {error}"
    return f"failed: {error or 'no eval.json of the final weights written'}"


def _stale(stale: dict[str, str]) -> str:
    """One line: the evaluations left out because they did not score the run's final weights."""
    task, why = next(iter(sorted(stale.items())))
    more = f" (and {len(stale) - 1} more tasks)" if len(stale) > 1 else ""
    return f"stale, not counted: {task}{more}: {why}"
