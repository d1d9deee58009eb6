"""Dispatch an experiment's grid (submitit: SLURM job arrays, or this machine) and track its state.

* SLURM: one job array per tier, resources from a cluster profile `slurm/NAME.toml`; returns as soon as
  the arrays are queued. Each task runs `RunJob`, a submitit Checkpointable: on SLURM's warning signal
  the training loop checkpoints at the next step boundary and hands the signal to submitit, which
  requeues the task; the requeued task resumes from the checkpoint (same result as uninterrupted).
* local: the grid runs here, at most `--parallel` runs at a time, each in its own `ablate run` process
  (its output kept in the run folder's `run.log`), with one progress bar over the grid.

The ledger (`RESULTS/<experiment>/ledger.json`) records every job submitted, so a second `submit`
skips runs that are completed, queued or running, and `status` can ask the scheduler about them. A
submit holds the experiment's submit lock while it decides what to queue and writes the ledger (a
local grid: while it runs), so two submits at once never queue a run twice; a running run is known by
its run lock (`ablate.lock`), which a reused process id cannot fake.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ablate.errors import AblateError
from ablate.experiment import Experiment, RunSpec, experiment_file, load_experiment
from ablate.paths import default_results
from ablate.lock import FileLock
from ablate.profiles import load_profile
from ablate.status import error_line, experiment_dir, read_ledger, status, status_cli
from ablate.store import (LEDGER, RUN_LOG, SUBMIT_LOCK, atomic_write_json, run_dir)

def executor_parameters(profile: dict, name: str) -> dict:
    """submitit parameters for one run per array task (GPUs run data-parallel inside the task)."""
    params = {"name": name, "timeout_min": profile["time_min"], "cpus_per_task": profile["cpus_per_run"],
              "mem_gb": profile["mem_gb"], "slurm_array_parallelism": profile["array_parallelism"],
              "slurm_signal_delay_s": profile["signal_delay_s"], "tasks_per_node": 1, "nodes": 1}
    if profile["gpus_per_run"]:
        params["gpus_per_node"] = profile["gpus_per_run"]
    for key in ("partition", "account", "qos", "constraint"):
        if profile[key]:
            params[f"slurm_{key}"] = profile[key]
    extra = {}
    for line in profile["extra_sbatch"]:
        option = line.removeprefix("#SBATCH").strip().removeprefix("--")
        key, _, value = option.partition("=")
        extra[key] = value or True
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


# ---------------------------------------------------------------------------------------------- the job
try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - submitit is a dependency; keep `ablate --help` alive without it
    _Checkpointable = object


class RunJob(_Checkpointable):
    """What one array task executes. Re-imports the experiment file first, so arms it registers exist.

    submitit's default `checkpoint()` resubmits this same call; `train.run` resumes from the run's
    checkpoint, which the training loop wrote when the warning signal arrived.
    """

    def __init__(self, experiment_file: str | None, results: str, options: dict):
        self.experiment_file, self.results, self.options = experiment_file, results, options

    def __call__(self, spec: RunSpec) -> dict:
        import logging

        from ablate.train import run

        if not logging.getLogger().handlers:  # a SLURM task: send ablate's log lines to the job's log
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        if self.experiment_file:
            load_experiment(self.experiment_file)
        summary = run(spec, self.results, **self.options)
        if summary.get("status") == "failed":
            raise RuntimeError(summary.get("error"))
        return summary


# ---------------------------------------------------------------------------------------------- submit
def preflight(experiment: Experiment, specs: list[RunSpec], executor: str, options: dict) -> None:
    """Everything that would make a queued run die on the cluster, checked before anything is queued."""
    from ablate.data.shards import read_manifest
    from ablate.tiers import get_tier
    from ablate.config import resolve_config

    checked = set()
    for spec in specs:
        config = resolve_config(spec, options.get("data_dir"), **{k: v for k, v in options.items() if k != "data_dir"})
        key = (spec.tier, config["data_dir"])
        if key in checked:
            continue
        checked.add(key)
        tier = get_tier(spec.tier)
        try:
            manifest = read_manifest(config["data_dir"])
        except AblateError as err:
            raise AblateError(f"tier {spec.tier}: {err}; prepare it with `ablate data prepare` "
                              "(or give another folder with `data_dir` in the experiment's overrides)") from None
        if manifest.get("tokenizer") != tier.tokenizer or manifest.get("vocab_size") != config["model"]["vocab_size"]:
            raise AblateError(
                f"tier {spec.tier}: data folder {config['data_dir']} holds {manifest.get('tokenizer')!r} tokens "
                f"(vocabulary {manifest.get('vocab_size')}); the tier expects {tier.tokenizer!r} "
                f"(vocabulary {config['model']['vocab_size']})")
    if executor == "slurm":
        check_slurm()


def check_slurm() -> None:
    """SLURM answers here (sinfo), or a one-line error that suggests the local executor."""
    try:
        answer = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise AblateError("SLURM is not installed here (no `sinfo` on PATH); run the grid on this machine with "
                          "`--executor local`") from None
    except subprocess.TimeoutExpired:
        raise AblateError("SLURM does not answer (sinfo timed out after 30 s); try again later, or run the grid "
                          "on this machine with `--executor local`") from None
    if answer.returncode != 0:
        raise AblateError(f"SLURM does not answer (sinfo: {error_line(answer.stderr) or answer.returncode}); "
                          "run the grid on this machine with `--executor local`")


def submit(experiment: Experiment, experiment_file: str | None, *, results: Path, executor: str = "slurm",
           profile: str = "local", tiers=None, arms=None, seeds=None, parallel: int | None = None,
           dry_run: bool = False, options: dict | None = None, eval_tasks=None, eval_options: dict | None = None) -> dict:
    """Submit the grid's runs that are neither completed nor queued/running. Returns what was done.

    With `eval_tasks`, evaluation jobs follow (`ablate.evals.run.EvalJob`): on SLURM one array per tier,
    after that tier's training array when one was queued now; locally once the grid has run.

    Checked first, before anything is queued: the executor, the profile, the data folders and their
    tokenizer, every override key, and (for SLURM) that the scheduler answers.
    """
    if executor not in ("slurm", "local"):
        raise AblateError(f"unknown executor {executor!r}; valid executors: local, slurm")
    if parallel is not None and (isinstance(parallel, bool) or parallel <= 0):
        raise AblateError(f"--parallel must be a positive integer, not {parallel}")
    specs = experiment.runs(tiers, arms, seeds)
    resources = load_profile(profile) if executor == "slurm" else None
    options = {"progress": False, **(options or {})}
    preflight(experiment, specs, executor, options)
    folder = experiment_dir(results, experiment)
    if dry_run:
        return _plan_submission(experiment, specs, results, resources)
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / SUBMIT_LOCK, what=f"experiment {experiment.name!r} (another `ablate submit`)")
    with lock:
        report = _plan_submission(experiment, specs, results, resources)
        todo = [s for s in specs if s.key in set(report["to_submit"])]
        if not todo and not eval_tasks:
            return report
        if todo and executor == "slurm":
            report["jobs"] = _submit_slurm(experiment, experiment_file, todo, results, resources, options)
        elif todo:
            report["jobs"] = _run_local(experiment, experiment_file, todo, results, parallel, options, lock.token)
        if eval_tasks:
            report["evals"] = _submit_evals(experiment, experiment_file, specs, results, executor, resources,
                                            list(eval_tasks), eval_options or {}, report["jobs"])
    return report


def _submit_evals(experiment, experiment_file, specs, results, executor, profile, tasks, eval_options,
                  training_jobs) -> dict:
    """Evaluation of every run of `specs` that is completed or was just queued; {key: job id or outcome}."""
    from ablate.evals.run import EvalJob

    folder = experiment_dir(results, experiment)
    job = EvalJob(str(Path(experiment_file).resolve()) if experiment_file else None, str(Path(results).resolve()),
                  tasks, eval_options)
    states = {s.key: row["state"] for s, row in zip(specs, status(experiment, results, specs))}
    outcomes = {}
    if executor == "local":  # the grid has run: evaluate what completed
        for spec in [s for s in specs if states[s.key] == "completed"]:
            try:
                job(spec)
                outcomes[spec.key] = "evaluated"
            except Exception as err:  # one run's failure must not stop the others
                outcomes[spec.key] = f"failed: {error_line(str(err)) or err.__class__.__name__}"
        _record(folder, {f"eval:{k}": {"executor": "local", "tasks": tasks, "outcome": v} for k, v in outcomes.items()})
        return outcomes
    import submitit

    chosen = [s for s in specs if states[s.key] == "completed" or s.key in training_jobs]
    for tier in dict.fromkeys(s.tier for s in chosen):
        tier_specs = [s for s in chosen if s.tier == tier]
        logs = folder / "slurm" / f"eval-{tier}"
        executor_ = submitit.AutoExecutor(folder=logs / "%j", cluster="slurm")
        params = executor_parameters(profile, f"ablate-eval-{experiment.name}-{tier}")
        after = sorted({training_jobs[s.key].split("_")[0] for s in tier_specs if s.key in training_jobs})
        if after:  # after the training array: runs that failed are refused by the evaluation itself
            params.setdefault("slurm_additional_parameters", {})["dependency"] = "afterany:" + ":".join(after)
        executor_.update_parameters(**params)
        submitted = executor_.map_array(job, tier_specs)
        entries = {f"eval:{s.key}": {"executor": "slurm", "job_id": j.job_id, "folder": str(logs / "%j"),
                                     "tasks": tasks, "submitted": dt.datetime.now().isoformat(timespec="seconds")}
                   for s, j in zip(tier_specs, submitted)}
        _record(folder, entries, {"tier": tier, "executor": "slurm", "kind": "eval", "tasks": tasks,
                                  "array": submitted[0].job_id.split("_")[0], "runs": [s.key for s in tier_specs]})
        outcomes.update({k.removeprefix("eval:"): v["job_id"] for k, v in entries.items()})
    return outcomes



LEFT_ALONE = ("completed", "diverged", "damaged")  # never queued again (damaged: `ablate run --force` decides)


def _plan_submission(experiment, specs, results, resources) -> dict:
    rows = status(experiment, results, specs)
    todo = [spec for spec, row in zip(specs, rows) if row["state"] not in LEFT_ALONE and not row["queued"]]
    skipped: dict[str, int] = {}
    for row in rows:
        if row["state"] in LEFT_ALONE or row["queued"]:
            skipped[row["state"]] = skipped.get(row["state"], 0) + 1
    return {"experiment": experiment.name, "runs": len(specs), "to_submit": [s.key for s in todo],
            "skipped": skipped, "gpu_hours": _gpu_hours(todo), "resources": resources, "jobs": {}}


def _gpu_hours(specs: list[RunSpec]) -> float:
    from ablate.plan import plan_rows

    total = 0.0
    for tier in sorted({s.tier for s in specs}):
        per_arm = {r["arm"]: r["gpu_hours_per_run"] for r in plan_rows(tier, sorted({s.arm for s in specs if s.tier == tier}), 1)["runs"]}
        total += sum(per_arm[s.arm] for s in specs if s.tier == tier)
    return total


_LEDGER_LOCK = threading.Lock()  # local runs start from several threads: one read-modify-write at a time


def _record(folder: Path, entries: dict, submission: dict | None = None, merge: bool = False) -> None:
    """Update the ledger (the caller holds the experiment's submit lock; threads take turns here).

    Each entry replaces the run's entry, or with `merge` adds its fields to it."""
    with _LEDGER_LOCK:
        ledger = read_ledger(folder)
        for key, entry in entries.items():
            ledger["runs"][key] = {**ledger["runs"].get(key, {}), **entry} if merge else entry
        if submission is not None:
            ledger["submissions"].append(submission)
        atomic_write_json(folder / LEDGER, ledger)


def _submit_slurm(experiment, experiment_file, specs, results, profile, options) -> dict:
    import submitit

    folder = experiment_dir(results, experiment)
    job = RunJob(str(Path(experiment_file).resolve()) if experiment_file else None, str(Path(results).resolve()),
                 {**options, "threads": options.get("threads") or profile["cpus_per_run"]})
    jobs = {}
    for tier in dict.fromkeys(s.tier for s in specs):
        tier_specs = [s for s in specs if s.tier == tier]
        logs = folder / "slurm" / tier
        executor = submitit.AutoExecutor(folder=logs / "%j", cluster="slurm")
        executor.update_parameters(**executor_parameters(profile, f"ablate-{experiment.name}-{tier}"))
        tier_job = job
        if profile.get("gpu") and "micro_batch" not in options:
            tier_job = RunJob(job.experiment_file, job.results, {**job.options, "micro_batch": gpu_micro_batch(
                tier, profile["gpu"], profile["gpus_per_run"] or 1, tier_specs[0].overrides.get("micro_batch"))})
        submitted = executor.map_array(tier_job, tier_specs)
        entries = {s.key: {"executor": "slurm", "job_id": j.job_id, "folder": str(logs / "%j"),
                           "submitted": dt.datetime.now().isoformat(timespec="seconds")}
                   for s, j in zip(tier_specs, submitted)}
        _record(folder, entries, {"tier": tier, "executor": "slurm", "profile": profile["name"],
                                  "array": submitted[0].job_id.split("_")[0], "runs": list(entries)})
        jobs.update({k: v["job_id"] for k, v in entries.items()})
    return jobs


def gpu_micro_batch(tier: str, gpu: str, world_size: int, chosen: int | None = None) -> int:
    """The micro-batch for the profile's GPU (`ablate.tiers.micro_batch_for`: the largest that fits, dividing
    the per-rank batch; gradient accumulation keeps the global batch), unless the experiment sets one."""
    from ablate.sizing import micro_batch_for
    from ablate.tiers import get_gpu
    from ablate.train import LOSS_CHUNK

    fit = micro_batch_for(tier, get_gpu(gpu).memory_gb, world_size=world_size, loss_chunk=LOSS_CHUNK)
    return int(chosen) if chosen else fit


def cpu_training_env() -> dict:
    """The environment of a CPU training process: glibc keeps freed memory instead of unmapping it.

    By default every large CPU tensor (above 128 KiB, e.g. the logits) is mmap'd and returned to the
    OS when freed, so each step page-faults it in again: a third of a smoke run's time went to the
    kernel (18.2 s → 12.3 s for 40 steps when this is set). The user's own settings win.
    """
    return {"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "1073741824", **os.environ}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a local grid: `keys` are the runs stopped at a step boundary (with a checkpoint)."""

    def __init__(self, keys: list[str]):
        super().__init__(", ".join(keys))
        self.keys = keys


def _run_local(experiment, experiment_file, specs, results, parallel, options, submission: str) -> dict:
    """The runs on this machine: `parallel` worker processes, each training its share of the runs one after
    another (a process per run would pay the ~6 s of imports every time); a bar over the grid.

    Every run is recorded as queued by this submission first (the submit lock's token), so `status`
    shows it queued until a worker takes its run lock, and failed with its one-line error after. A run
    that fails never stops the others: an exception is caught by the worker, and a worker that dies
    (killed, out of memory) marks its current run failed and is started again for the rest.

    Ctrl-C (SIGINT to this process, or to its process group from a terminal) stops the grid: each worker
    (in a process group of its own, so it is told exactly once) checkpoints its run at the next step
    boundary and stops; those runs are recorded as interrupted (`cancelled` in status, resumed by the
    next submit), no further run starts, and `Interrupted` is raised once every worker has stopped.
    """
    from tqdm.auto import tqdm

    parallel = max(1, min(parallel or (os.cpu_count() or 1), len(specs)))
    folder = experiment_dir(results, experiment)
    _record(folder, {s.key: {"executor": "local", "job_id": None, "submission": submission,
                             "submitted": dt.datetime.now().isoformat(timespec="seconds")} for s in specs},
            {"executor": "local", "runs": [s.key for s in specs]})
    for spec in specs:
        run_dir(results, spec.experiment, spec.tier, spec.arm, spec.seed).mkdir(parents=True, exist_ok=True)
    codes, interrupted, bar_lock = {}, [], threading.Lock()
    stop, workers = threading.Event(), set()

    def stop_workers(signum=None, frame=None) -> None:
        if not stop.is_set():
            stop.set()
            with bar_lock:
                live = list(workers)
            for process in live:
                _interrupt(process)

    def finished_run(bar, key: str, code: int, error: str | None, **extra) -> None:
        _record(folder, {key: {"exit_code": code, "error": error, **extra}}, merge=True)
        with bar_lock:
            codes[key] = code
            if extra.get("interrupted"):
                interrupted.append(key)
            bar.set_postfix_str(f"{key} {'ok' if code == 0 else f'exit {code}'}")
            bar.update(1)

    def work(slot: int, share: list[RunSpec], bar) -> None:
        remaining = {s.key: s for s in share}
        worker_log = folder / "local" / f"worker{slot}.log"
        worker_log.parent.mkdir(parents=True, exist_ok=True)
        while remaining and not stop.is_set():
            payload = {"experiment_file": experiment_file, "options": {**options, "threads": options.get("threads") or 1},
                       "specs": [s.__dict__ | {"overrides": dict(s.overrides)} for s in remaining.values()]}
            command = [sys.executable, "-m", "ablate.dispatch", "--results", str(results), "--worker", json.dumps(payload),
                       "--stop-on-eof"]
            with open(worker_log, "a", encoding="utf-8") as log:
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                           env=cpu_training_env(), text=True, start_new_session=True)
                with bar_lock:
                    workers.add(process)
                if stop.is_set():  # Ctrl-C came while it was starting
                    _interrupt(process)
                current = None
                for line in process.stdout:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if event.get("event") == "start":
                        current = event["key"]
                        _record(folder, {current: {"job_id": f"local-{process.pid}", "pid": process.pid}}, merge=True)
                    elif event.get("event") in ("done", "interrupted"):
                        remaining.pop(event["key"], None)
                        if event["event"] == "done":
                            finished_run(bar, event["key"], event["code"], event.get("error"))
                        else:
                            finished_run(bar, event["key"], 130, STOPPED, interrupted=True)
                        current = None
                code = process.wait()
                process.stdin.close()
                with bar_lock:
                    workers.discard(process)
            if stop.is_set():  # stopped by Ctrl-C: a run it was in is resumable, not failed
                if current is not None:
                    finished_run(bar, current, 130, STOPPED, interrupted=True)
                return
            if remaining:  # the worker died during `current` (or before its first run): that run failed
                key = current or next(iter(remaining))
                remaining.pop(key)
                finished_run(bar, key, code or 1, f"the worker process died (exit code {code}) during this run; "
                                                  f"see {worker_log}")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, stop_workers) if main_thread else None
    try:
        with tqdm(total=len(specs), desc=experiment.name, unit="run") as bar, ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(work, slot, specs[slot::parallel], bar) for slot in range(parallel)]
            for future in as_completed(futures):
                future.result()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if stop.is_set():
        raise Interrupted(sorted(interrupted))
    return {s.key: codes[s.key] for s in specs}


STOPPED = "interrupted (Ctrl-C) at a step boundary, with a checkpoint; `ablate submit` resumes it"


def _interrupt(process: subprocess.Popen) -> None:
    """SIGINT to a local worker: its run checkpoints at the next step boundary and the worker stops."""
    try:
        process.send_signal(signal.SIGINT)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------------- CLI
def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("submit", help="submit an experiment's grid (SLURM job arrays, or this machine)")
    parser.add_argument("experiment", help="an experiments/*.py file or its name")
    parser.add_argument("--tier", nargs="+", dest="tiers", metavar="TIER", help="only these tiers (default: all)")
    parser.add_argument("--arms", nargs="+", metavar="ARM", help="only these arms (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="K", help="only these seed indices (default: all)")
    parser.add_argument("--executor", default="slurm", help="slurm (default): job arrays; local: run here")
    parser.add_argument("--profile", default="local", help="cluster profile slurm/NAME.toml (default: local)")
    parser.add_argument("--parallel", type=int, help="local executor: runs at a time (default: CPU count)")
    parser.add_argument("--data", help="prepared data folder for every run (default: each tier's data_dir)")
    parser.add_argument("--match-params", dest="match_params", action="store_true", default=None,
                        help="narrow the MLP of arms that add parameters to the baseline's count")
    parser.add_argument("--no-match-params", dest="match_params", action="store_false",
                        help="run arms that add parameters unmatched (overrides the experiment)")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS or ./results)")
    parser.add_argument("--dry-run", action="store_true", help="print runs, resources and GPU-hours; submit nothing")
    parser.add_argument("--eval", nargs="+", metavar="TASK", dest="eval_tasks",
                        help="also evaluate the runs with lm-evaluation-harness (lambada_openai hellaswag wikitext): "
                             "after training, or now for completed runs")
    parser.add_argument("--eval-limit", type=int, help="--eval: documents per task (default: all)")
    parser.add_argument("--task-data", help="--eval: folder of local task files (see `ablate eval --help`)")
    parser.set_defaults(func=_submit_cli)

    parser = subparsers.add_parser("status", help="one row per run of an experiment, and the counts per state")
    parser.add_argument("experiment", help="an experiments/*.py file or its name")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS or ./results)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=status_cli)


def _resolve(args) -> tuple[Experiment, str, Path]:
    file = experiment_file(args.experiment)
    return load_experiment(file), str(file), Path(args.results) if args.results else default_results()


def _hint(args) -> str:
    """The status command for what the user just did, with the options they gave."""
    return "ablate status " + args.experiment + (f" --results {args.results}" if args.results else "")


def _submit_cli(args) -> int:
    try:
        return _submit_and_tell(args)
    except KeyboardInterrupt as err:  # Ctrl-C: one line, exit 130 (the runs it stopped resume on the next submit)
        stopped = getattr(err, "keys", [])
        again = (f"ablate submit {args.experiment} --executor {args.executor}"
                 + (f" --results {args.results}" if args.results else ""))
        what = (f"{len(stopped)} run(s) stopped at a step boundary with a checkpoint ({', '.join(stopped)}), no further "
                f"run started; `{again}` resumes the grid") if stopped else f"see `{_hint(args)}`"
        print(f"ablate: interrupted: {what}", file=sys.stderr)
        return 130


def _submit_and_tell(args) -> int:
    experiment, file, results = _resolve(args)
    report = submit(experiment, file, results=results, executor=args.executor, profile=args.profile,
                    tiers=args.tiers, arms=args.arms, seeds=args.seeds, parallel=args.parallel, dry_run=args.dry_run,
                    options={**({"data_dir": str(Path(args.data).resolve())} if args.data else {}),
                             **({"match_params": args.match_params} if args.match_params is not None else {})},
                    eval_tasks=args.eval_tasks,
                    eval_options={k: v for k, v in {"limit": args.eval_limit, "task_data": args.task_data}.items()
                                  if v is not None})
    skipped = ", ".join(f"{n} {k}" for k, n in report["skipped"].items() if n) or "none"
    if args.dry_run:
        print(f"{experiment.name}: {len(report['to_submit'])} of {report['runs']} runs would be submitted "
              f"(skipped: {skipped}); estimated {report['gpu_hours']:.1f} GPU-hours")
        if report["resources"]:
            print("resources per run: " + json.dumps({k: v for k, v in report["resources"].items() if v not in ("", [])}))
        for key in report["to_submit"]:
            print(f"  {key}")
        return 0
    evals = report.get("evals") or {}
    if evals:
        failed_evals = [k for k, v in evals.items() if str(v).startswith("failed")]
        print(f"{experiment.name}: evaluation {'queued' if args.executor == 'slurm' else 'done'} for {len(evals)} runs"
              + (f", {len(failed_evals)} failed ({', '.join(failed_evals)})" if failed_evals else ""))
    if not report["to_submit"]:
        print(f"{experiment.name}: nothing to submit ({skipped}); see `{_hint(args)}`")
        return 1 if any(str(v).startswith("failed") for v in evals.values()) else 0
    if args.executor == "slurm":
        print(f"{experiment.name}: queued {len(report['jobs'])} runs (skipped: {skipped}); "
              f"follow with `{_hint(args)}`")
        return 0
    failed = [k for k, code in report["jobs"].items() if code != 0]
    print(f"{experiment.name}: ran {len(report['jobs'])} runs here, {len(failed)} failed"
          + (f" ({', '.join(failed)}; see `{_hint(args)}`)" if failed else ""))
    return 1 if failed else 0


def _local_main(argv=None) -> int:
    """A local worker (`python -m ablate.dispatch --worker JSON`): its runs one after another.

    Tells the parent on stdout, one JSON line per event (start; done with the exit code and the error
    line; interrupted); each run's own log goes to its run.log, and an error before training starts is
    added there. SIGINT stops the worker: the run checkpoints at its next step boundary (the training
    loop's signal handling), no further run starts, exit code 130. With `--stop-on-eof` the end of stdin
    (the parent is gone) is taken as that SIGINT.
    """
    import traceback

    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--stop-on-eof", action="store_true")
    args = parser.parse_args(argv)
    if args.stop_on_eof:
        threading.Thread(target=lambda: (sys.stdin.buffer.read(), os.kill(os.getpid(), signal.SIGINT)),
                         daemon=True).start()
    payload = json.loads(args.worker)
    job = RunJob(payload["experiment_file"], args.results, payload["options"])
    current = None
    try:
        for fields in payload["specs"]:
            spec = RunSpec(**fields)
            current = spec.key
            print(json.dumps({"event": "start", "key": spec.key}), flush=True)
            try:
                job(spec)
                code, error = 0, None
            except AblateError as err:
                code, error, text = 2, str(err), f"ablate: error: {err}\n"
            except Exception as err:  # noqa: BLE001 - one run's failure must not stop the worker's other runs
                code, error, text = 1, error_line(traceback.format_exc()) or repr(err), traceback.format_exc()
            if code:
                with open(run_dir(args.results, spec.experiment, spec.tier, spec.arm, spec.seed) / RUN_LOG, "a",
                          encoding="utf-8") as log:
                    log.write(text)
            print(json.dumps({"event": "done", "key": spec.key, "code": code, "error": error}), flush=True)
            current = None
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if current is not None:
            print(json.dumps({"event": "interrupted", "key": current}), flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(_local_main())
