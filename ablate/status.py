"""The state of an experiment's runs: the ledger, SLURM's accounting, run locks and run folders.

Each run of the grid is in one of STATES. Completed and diverged are read from the run's summary; a
run whose lock is live is running (a lock, unlike a process id, cannot be reused by another process);
otherwise the ledger says whether it was submitted, and SLURM (one `sacct` call for the whole grid) or
the local submit's own lock says whether it is still queued. A failure is shown as one line (the
traceback stays in the run's run.log or SLURM's log).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

from ablate.errors import AblateError
from ablate.experiment import Experiment, RunSpec
from ablate.lock import live_holder
from ablate.store import (LEDGER, METRICS, SUBMIT_LOCK, SUMMARY, finished, read_json_file, read_metrics, run_dir,
                          run_lock_path)

ACTIVE = ("queued", "running", "requeued")
STATES = ("not-submitted", "queued", "running", "requeued", "completed", "diverged", "failed")


def experiment_dir(results: Path, experiment: Experiment) -> Path:
    return Path(results) / experiment.name


def read_ledger(folder: Path) -> dict:
    path = folder / LEDGER
    if not path.exists():
        return {"runs": {}, "submissions": []}
    ledger = read_json_file(path, "move it aside (the runs' own folders keep their results; SLURM jobs it lists "
                                  "keep running) and submit again")
    if not isinstance(ledger.get("runs"), dict) or not isinstance(ledger.get("submissions"), list):
        raise AblateError(f"{path} is damaged (no 'runs' or 'submissions'); move it aside and submit again")
    return ledger


def slurm_states(job_ids: list[str]) -> dict[str, str]:
    """One `sacct` call for many jobs: {job id: state}. (submitit's watcher caches states per process.)"""
    if not job_ids:
        return {}
    try:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(sorted(set(job_ids)))],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    states = {}
    for line in out.splitlines():
        job_id, _, state = line.partition("|")
        for one in _expand_array(job_id.strip()):
            states[one] = state.split()[0] if state.strip() else "UNKNOWN"
    return states


def _expand_array(job_id: str) -> list[str]:
    """sacct shows an array's still-pending tasks as one row: '41_[2-5,7%8]' → ['41_2', ..., '41_7']."""
    head, bracket, rest = job_id.partition("_[")
    if not bracket:
        return [job_id]
    ids = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        ids.extend(f"{head}_{i}" for i in range(int(low), int(high or low) + 1))
    return ids


def slurm_job_state(entry: dict, slurm: dict[str, str]) -> tuple[str, str | None]:
    """(queued | running | requeued | finished | failed, error line) of a SLURM ledger entry."""
    state = slurm.get(entry["job_id"], "UNKNOWN").upper()
    if state.startswith(("PENDING", "CONFIGURING")):
        return "queued", None
    if state.startswith(("RUNNING", "COMPLETING")):
        return "running", None
    if state.startswith(("REQUEUE", "RESIZING", "SUSPENDED", "PREEMPTED")):
        return "requeued", None
    if state.startswith("COMPLETED"):
        return "finished", None
    if state.startswith("UNKNOWN"):  # accounting has not seen a just-submitted job yet
        submitted = dt.datetime.fromisoformat(entry.get("submitted", "1970-01-01T00:00:00"))
        if dt.datetime.now() - submitted < dt.timedelta(minutes=2):
            return "queued", None
        return "failed", "SLURM accounting does not know this job (sacct has no record of it)"
    import submitit

    stderr = submitit.SlurmJob(folder=entry["folder"], job_id=entry["job_id"]).paths.stderr
    return "failed", error_line(read_text(stderr)) or f"SLURM state {state}"


def read_text(path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def error_line(text: str | None) -> str | None:
    """The one line that says what went wrong: `ablate: error: …` or a traceback's last `Type: message` line."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("ablate: error:"):
            return line.removeprefix("ablate: error:").strip()
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if ":" in line and head.replace(".", "").replace("_", "").isalnum() and head[:1].isupper() and " " not in head:
            return line
    return lines[-1][:300] if lines else None


def progress_of(metrics: list[dict], summary: dict) -> dict:
    """steps, total, elapsed seconds (this attempt's wall clock so far) and an ETA from the recent step rate."""
    steps = max([r.get("step", 0) for r in metrics] or [summary.get("steps") or 0])
    total = summary.get("total_steps")
    timed = [r for r in metrics if "time" in r and "train_loss" in r][-50:]
    eta = None
    if total and len(timed) >= 2 and timed[-1]["time"] > timed[0]["time"]:
        rate = (timed[-1]["step"] - timed[0]["step"]) / (timed[-1]["time"] - timed[0]["time"])
        eta = (total - steps) / rate if rate > 0 else None
    elapsed = summary.get("wall_seconds")
    if summary.get("status") == "running" and timed:
        elapsed = (summary.get("wall_seconds") or 0) + max(0.0, dt.datetime.now().timestamp() - timed[0]["time"])
    return {"steps": steps, "total_steps": total, "elapsed_s": elapsed, "eta_s": eta}


def run_status(results: Path, spec: RunSpec, ledger: dict, slurm: dict[str, str],
               submit_holder: dict | None = None) -> dict:
    """One row of `ablate status`: the run's state (STATES), progress, and the failure's one-line error."""
    folder = run_dir(results, spec.experiment, spec.tier, spec.arm, spec.seed)
    way_out = f"rerun it with `ablate run ... --force` (keeps the old folder aside) or delete {folder}"
    summary = read_json_file(folder / SUMMARY, way_out) if (folder / SUMMARY).exists() else {}
    entry = ledger["runs"].get(spec.key)
    metrics = read_metrics(folder / METRICS)
    val_rows = [r for r in metrics if "val_loss" in r]
    row = {"tier": spec.tier, "arm": spec.arm, "seed": spec.seed, "state": "not-submitted",
           "job_id": entry["job_id"] if entry else None, **progress_of(metrics, summary),
           "val_loss": summary.get("val_loss") if summary.get("status") == "completed" else (
               val_rows[-1]["val_loss"] if val_rows else None), "error": None, "queued": False}
    status = summary.get("status")
    if finished(summary):
        row["state"] = status
        row["error"] = error_line(summary.get("error")) if status == "diverged" else None
        return row
    if live_holder(run_lock_path(folder)) is not None:
        row["state"], row["queued"] = "running", True
        return row
    if entry and entry.get("executor") == "slurm":
        job, error = slurm_job_state(entry, slurm)
        if job in ACTIVE:
            row["state"], row["queued"] = ("requeued" if job == "queued" and summary else job), True
            return row
        # finished or failed in SLURM's eyes, without a result in the run folder
        row["state"] = "failed"
        row["error"] = error_line(summary.get("error")) or error or "the run stopped without finishing"
        return row
    if entry and entry.get("executor") == "local":
        if entry.get("exit_code") not in (None, 0) or status == "failed":
            row["state"] = "failed"
            row["error"] = error_line(summary.get("error")) or entry.get("error") or f"exit code {entry['exit_code']}"
            return row
        if entry.get("exit_code") is None and submit_holder and submit_holder.get("token") == entry.get("submission"):
            row["state"], row["queued"] = "queued", True
            return row
    if status in ("failed", "running") or (status == "completed" and summary.get("val_loss") is None):
        row["state"] = "failed"
        row["error"] = error_line(summary.get("error")) or "the run stopped without finishing (killed?); submit again to resume it"
    return row


def status(experiment: Experiment, results: Path, specs: list[RunSpec] | None = None) -> list[dict]:
    folder = experiment_dir(results, experiment)
    ledger = read_ledger(folder)
    specs = specs or experiment.runs()
    keys = [s.key for s in specs] + [f"eval:{s.key}" for s in specs]
    job_ids = [ledger["runs"][k]["job_id"] for k in keys
               if k in ledger["runs"] and ledger["runs"][k]["executor"] == "slurm"]
    slurm = slurm_states(job_ids)
    holder = live_holder(folder / SUBMIT_LOCK)
    rows = [run_status(results, spec, ledger, slurm, holder) for spec in specs]
    for spec, row in zip(specs, rows):
        row["eval"] = eval_state(results, spec, ledger.get("runs", {}).get(f"eval:{spec.key}"), slurm)
    return rows


def eval_state(results: Path, spec: RunSpec, entry: dict | None, slurm: dict[str, str]) -> str | None:
    """None (never evaluated nor asked), or evaluated / stale: … / queued / running / failed: … .

    Only evaluations of the run's final weights count (`ablate.evals.results.valid_evals`, as for the tables).
    """
    from ablate.evals.results import valid_evals

    valid, stale = valid_evals(run_dir(results, spec.experiment, spec.tier, spec.arm, spec.seed))
    wanted = set(entry.get("tasks", [])) if entry else set(valid) | set(stale)
    if wanted and wanted <= set(valid):
        return "evaluated"
    if entry is None:
        return _stale(stale) if stale else None
    job, error = slurm_job_state(entry, slurm) if entry.get("executor") != "local" else (None, None)
    if job in ACTIVE:
        return job
    if wanted & set(stale):
        return _stale({task: why for task, why in stale.items() if task in wanted})
    outcome = entry.get("outcome") if entry.get("executor") == "local" else None
    if outcome is not None and outcome != "evaluated":
        return outcome
    return f"failed: {error or 'no eval.json of the final weights written'}"


def _stale(stale: dict[str, str]) -> str:
    """One line: the evaluations left out because they did not score the run's final weights."""
    task, why = next(iter(sorted(stale.items())))
    more = f" (and {len(stale) - 1} more tasks)" if len(stale) > 1 else ""
    return f"stale, not counted: {task}{more}: {why}"


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def status_cli(args) -> int:
    from ablate.experiment import default_results, experiment_file, load_experiment

    experiment = load_experiment(experiment_file(args.experiment))
    results = Path(args.results) if args.results else default_results()
    rows = status(experiment, results)
    counts = {state: sum(r["state"] == state for r in rows) for state in STATES}
    if args.json:
        print(json.dumps({"experiment": experiment.name, "runs": rows, "counts": counts}, indent=2))
        return 0
    print(f"{'tier':<6} {'arm':<15} {'seed':>4}  {'state':<13} {'job':<14} {'steps':>13} {'elapsed':>9} {'eta':>9} "
          f"{'val_loss':>9}")
    for r in rows:
        loss = f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"
        steps = f"{r['steps']}/{r['total_steps']}" if r["total_steps"] else (str(r["steps"]) if r["steps"] else "-")
        print(f"{r['tier']:<6} {r['arm']:<15} {r['seed']:>4}  {r['state']:<13} {r['job_id'] or '-':<14} "
              f"{steps:>13} {_duration(r['elapsed_s']):>9} {_duration(r['eta_s']):>9} {loss:>9}")
        if r["error"]:
            print(f"        error: {r['error']}")
        if r.get("eval"):
            print(f"        eval: {r['eval']}")
    print("  ".join(f"{state}: {n}" for state, n in counts.items() if n) + f"  (total {len(rows)})")
    if counts["failed"]:
        print(f"failed runs keep their traceback in RESULTS/{experiment.name}/<tier>/<arm>/seed<k>/run.log; "
              f"`ablate submit {args.experiment}{f' --results {args.results}' if args.results else ''}` "
              "resubmits them")
    return 0
