"""Executing runs: `RunJob` (what one SLURM array task or local worker runs) and the local executor.

Local runs: `parallel` worker processes (`python -m ablate.workers`), each training its share of the grid
one run after another, reporting to the submit process by JSON lines on stdout; a bar over the grid.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor, as_completed

from tqdm.auto import tqdm

from ablate.errors import AblateError, error_line
from ablate.lock import CHILD_RUN_ENV, claimed_rank
from ablate.experiment import RunSpec, start_task
from ablate.runconfig import RunOptions
from ablate.store import RUN_LOG, LedgerEntry, Status, experiment_dir, record_ledger
from ablate.store_summary import RunSummary

log = logging.getLogger(__name__)

try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - submitit is a dependency; keep `ablate --help` alive without it
    _Checkpointable = object


class RunJob(_Checkpointable):
    """What one array task executes. Re-imports the experiment file first, so arms it registers exist.

    submitit's default `checkpoint()` resubmits this same call; `train.run` resumes from the run's
    checkpoint, which the training loop wrote when the warning signal arrived.
    """

    def __init__(self, experiment_file: str | None, results: str, options: RunOptions):
        self.experiment_file, self.results, self.options = experiment_file, results, options

    def __call__(self, spec: RunSpec) -> RunSummary:
        from ablate.train import run_as  # training code loads in the task that trains, not in `submit`

        start_task(self.experiment_file)
        summary = run_as(spec, self.results, self.options)[0]
        if summary.status == Status.FAILED:
            raise RuntimeError(summary.error)
        return summary


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


def recorded_options(options: RunOptions) -> dict:
    """What a submission's ledger record keeps of its run options, for the resume hints (`ablate status`): the
    data folder (`--data`) and `--document-mask`, which its runs must be given again to resume."""
    return {**({"data": options.data_dir} if options.data_dir else {}),
            **({"document_mask": True} if options.document_mask else {})}


def run_local(experiment, experiment_file, specs, results, parallel, options, submission: str) -> dict:
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
    parallel = max(1, min(parallel or (os.cpu_count() or 1), len(specs)))
    grid = _LocalGrid(experiment_dir(results, experiment), results, experiment_file, options)
    record_ledger(grid.folder, {s.key: LedgerEntry("local", submission=submission,
                                                   submitted=dt.datetime.now().isoformat(timespec="seconds"))
                                for s in specs},
                  {"executor": "local", "runs": [s.key for s in specs], **recorded_options(options)})
    for spec in specs:
        spec.folder(results).mkdir(parents=True, exist_ok=True)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, grid.stop_workers) if main_thread else None
    try:
        with tqdm(total=len(specs), desc=experiment.name, unit="run") as bar, ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(grid.work, slot, specs[slot::parallel], bar) for slot in range(parallel)]
            for future in as_completed(futures):
                future.result()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if grid.stop.is_set() and (grid.interrupted or set(grid.codes) < {s.key for s in specs}):
        raise Interrupted(sorted(grid.interrupted))
    if grid.stop.is_set():  # Ctrl-C after the last run ended: nothing was stopped, the grid completed
        log.warning("Ctrl-C came after the last run ended: nothing to stop; every run finished")
    return {s.key: grid.codes[s.key] for s in specs}


class _LocalGrid:
    """The worker threads of one `run_local`, each driving a worker process: the exit codes so far, the runs
    interrupted, and the Ctrl-C that stops them all (`stop`)."""

    def __init__(self, folder: Path, results, experiment_file: str | None, options: RunOptions):
        self.folder, self.results, self.experiment_file, self.options = folder, results, experiment_file, options
        self.codes, self.interrupted, self.bar_lock = {}, [], threading.Lock()
        self.stop, self.workers = threading.Event(), set()

    def stop_workers(self, signum=None, frame=None) -> None:
        if not self.stop.is_set():
            self.stop.set()
            with self.bar_lock:
                live = list(self.workers)
            for process in live:
                _interrupt(process)

    def finished_run(self, bar, key: str, code: int, error: str | None, interrupted: bool = False) -> None:
        record_ledger(self.folder, {key: LedgerEntry(exit_code=code, error=error, interrupted=interrupted)}, merge=True)
        with self.bar_lock:
            self.codes[key] = code
            if interrupted:
                self.interrupted.append(key)
            bar.set_postfix_str(f"{key} {'ok' if code == 0 else f'exit {code}'}")
            bar.update(1)

    def work(self, slot: int, share: list[RunSpec], bar) -> None:
        """One worker's share of the runs: a worker process for them, started again after one dies."""
        remaining = {s.key: s for s in share}
        worker_log = self.folder / "local" / f"worker{slot}.log"
        worker_log.parent.mkdir(parents=True, exist_ok=True)
        options = self.options.unset_to(threads=1)
        while remaining and not self.stop.is_set():
            payload = {"experiment_file": self.experiment_file, "options": options.given(),
                       "specs": [s.__dict__ | {"overrides": dict(s.overrides)} for s in remaining.values()]}
            command = [sys.executable, "-m", "ablate.workers", str(self.results), json.dumps(payload)]
            with open(worker_log, "a", encoding="utf-8") as log:
                process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                           env=cpu_training_env(), text=True, start_new_session=True)
                with self.bar_lock:
                    self.workers.add(process)
                if self.stop.is_set():  # Ctrl-C came while it was starting
                    _interrupt(process)
                current = self._follow(process, remaining, bar)
                code = process.wait()
                process.stdin.close()
                with self.bar_lock:
                    self.workers.discard(process)
            if self.stop.is_set():  # stopped by Ctrl-C: a run it was in is resumable, not failed
                if current is not None:
                    self.finished_run(bar, current, 130, STOPPED, interrupted=True)
                return
            if remaining:  # the worker died during `current` (or before its first run): that run failed
                key = current or next(iter(remaining))
                remaining.pop(key)
                self.finished_run(bar, key, code or 1, f"the worker process died (exit code {code}) during this "
                                                       f"run; see {worker_log}")

    def _follow(self, process, remaining: dict, bar) -> str | None:
        """The worker's events until it exits: each run started, done or interrupted recorded in the ledger;
        the run it was in when it exited (None between runs)."""
        current = None
        for line in process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "start":
                current = event["key"]
                record_ledger(self.folder, {current: LedgerEntry(job_id=f"local-{process.pid}", pid=process.pid)},
                              merge=True)
            elif event.get("event") in ("done", "interrupted"):
                remaining.pop(event["key"], None)
                if event["event"] == "done":
                    self.finished_run(bar, event["key"], event["code"], event.get("error"))
                else:
                    self.finished_run(bar, event["key"], 130, STOPPED, interrupted=True)
                current = None
        return current


STOPPED = "interrupted (Ctrl-C) at a step boundary, with a checkpoint; `ablate submit` resumes it"


def _interrupt(process: subprocess.Popen) -> None:
    """SIGINT to a local worker: its run checkpoints at the next step boundary and the worker stops."""
    try:
        process.send_signal(signal.SIGINT)
    except ProcessLookupError:
        pass


def worker_main(results: str, payload_json: str) -> int:
    """A local worker (`python -m ablate.workers RESULTS PAYLOAD_JSON`): its runs one after another.

    Tells the parent on stdout, one JSON line per event (start; done with the exit code and the error
    line; interrupted); each run's own log goes to its run.log, and an error before training starts is
    added there. SIGINT stops the worker: the run checkpoints at its next step boundary (the training
    loop's signal handling), no further run starts, exit code 130. The end of stdin (the parent is gone)
    is taken as that SIGINT.
    """
    payload = json.loads(payload_json)
    job = RunJob(payload["experiment_file"], results, RunOptions.of(payload["options"]))
    if claimed_rank() and os.environ.get(CHILD_RUN_ENV):  # its parent watches stdin for it (and it must exit 0)
        return child_main(job, payload, os.environ[CHILD_RUN_ENV])
    threading.Thread(target=lambda: (sys.stdin.buffer.read(), os.kill(os.getpid(), signal.SIGINT)),
                     daemon=True).start()
    current = None
    try:
        for fields in payload["specs"]:
            spec = RunSpec(**fields)
            current = spec.key
            tell({"event": "start", "key": spec.key})
            try:
                job(spec)
                code, error = 0, None
            except AblateError as err:
                code, error, text = 2, str(err), f"ablate: error: {err}\n"
            except Exception as err:  # noqa: BLE001 - one run's failure must not stop the worker's other runs
                code, error, text = 1, error_line(traceback.format_exc()) or repr(err), traceback.format_exc()
            if code:
                with open(spec.folder(results) / RUN_LOG, "a",
                          encoding="utf-8") as log:
                    log.write(text)
            tell({"event": "done", "key": spec.key, "code": code, "error": error})
            current = None
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if current is not None:
            tell({"event": "interrupted", "key": current})
        return 130
    return 0


def child_main(job: RunJob, payload: dict, key: str) -> int:
    """A data-parallel child of a worker (Lightning starts the worker's command again, with a rank): it
    trains exactly its parent's current run, `key`, beside its parent, then exits. It tells nothing (its
    stdout is its parent's: the parent reports the run), and never takes another run of the list."""
    spec = next((s for s in (RunSpec(**fields) for fields in payload["specs"]) if s.key == key), None)
    if spec is None:
        sys.stderr.write(f"ablate: error: this data-parallel child's run {key!r} is not in its worker's list\n")
        return 2
    try:
        job(spec)
    except AblateError as err:
        sys.stderr.write(f"ablate: error: {err}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def tell(event: dict) -> None:
    """One event to the parent: a JSON line on stdout (the worker's protocol, not output for a user)."""
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(worker_main(*sys.argv[1:3]))
