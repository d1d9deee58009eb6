"""One run folder's life, owned here (`RunFolder`): its lock, the data-parallel child check, the resume check
(`resumable`, the one place a folder's config is compared with a run's), and the summary and metrics writes; and the
processes of one data-parallel run besides its rank 0: how a child is told from an impostor, the guards it runs
under (the same as every process), and the end of a run's process group.

A child holds no lock and writes nothing; what makes a process a child is checked in `ablate.lock`
(`launched_child`: the live process tree and a secret only its parent had). Whether or not it is one,
no process trains a run that is finished or has other settings (`resumable`). Two guards of a resume live here too,
for the holder and the children alike: data that moved (`moved_data_only`) and an arm whose code changed since the
run started (`refuse_changed_arm`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ablate.arms.base import get_arm
from ablate.arms.source import arm_identity, current_scheme
from ablate.config import semantic, with_device_defaults
from ablate.data.shards import TokenShards, check_data_folder
from ablate.errors import AblateError
from ablate.lock import FileLock, claimed_rank, held_by_step_sibling, launched_child
from ablate.loop import MetricsLog
from ablate.runconfig import RunConfig
from ablate.store import (CHECKPOINTS, CONFIG, METRICS, SUMMARY, atomic_write_json, keep_aside, read_json_file,
                          read_metrics, remove_stray_temporaries, run_lock_path)
from ablate.store_summary import RunSummary, read_summary, update_summary, write_summary
from ablate.tiers import get_tier

log = logging.getLogger(__name__)

RANK0_WAIT_S = 600.0  # how long a SLURM task of rank > 0 waits for rank 0 to take the run
OTHER_FOLDER = "use another --results folder or --force to keep the old run aside and start again"
FORCE = "use --force to keep the old run aside and start again"
CHILD = "a data-parallel child trains only the run its parent started"


class ConfigDiffers(AblateError):
    """A run folder holds a run of other settings than the config given (`resumable`): `keys` are those that differ."""

    def __init__(self, folder: Path, keys: list[str], way_out: str):
        super().__init__(f"{folder} holds a run of a different config (differs in: {', '.join(keys)}); {way_out}")
        self.keys = keys


def resumable(folder: Path, config: RunConfig, child: bool = False) -> RunSummary:
    """The summary of the run `folder` holds, when `config` may go on with it: the same settings but how it is
    watched (`semantic`), or, unfinished, only its data moved (`moved_data_only`). Else `ConfigDiffers`, naming the
    keys and the way out (a `child`'s: it trains only its parent's run). The one comparison of a folder's
    config.json with a run's config: the holder's before it trains (`prepare_run_dir`), a data-parallel child's
    (`check_child_run_dir`)."""
    way_out, other = (CHILD, CHILD) if child else (FORCE, OTHER_FOLDER)
    previous = semantic(with_device_defaults(read_json_file(folder / CONFIG, way_out), torch.cuda.is_available()))
    current = semantic(config)
    summary = read_summary(folder, way_out)
    if previous != current and (summary.done or not moved_data_only(previous, current, summary)):
        raise ConfigDiffers(folder, sorted(k for k in set(previous) | set(current)
                                           if previous.get(k) != current.get(k)), other)
    return summary


def prepare_run_dir(folder: Path, config: RunConfig, force: bool) -> str:
    """'fresh' | 'resume' | 'done'. Never deletes: --force moves the old folder aside (the store ignores it).

    A folder holding results (a summary, metrics, checkpoints) but no config.json is damaged: refused,
    never retrained in place. A run of other settings is refused (`resumable`), unless it never took a step
    (nothing of it would be lost): then it starts again with the new settings. An unfinished run whose data moved
    (the same data_id elsewhere) resumes from there; one whose arm's code changed since it started is refused.
    """
    if force and folder.exists():
        log.warning("kept the previous run aside in %s", keep_aside(folder))
    if not (folder / CONFIG).exists():
        held = [name for name in (SUMMARY, METRICS, CHECKPOINTS) if (folder / name).exists()]
        if held:
            raise AblateError(f"{folder} is damaged: it holds {', '.join(held)} but no {CONFIG}; {FORCE}")
        return "fresh"
    try:
        summary = resumable(folder, config)
    except ConfigDiffers as differs:
        if took_a_step(folder, read_summary(folder, FORCE)):
            raise
        log.warning("%s never took a step: starting it again with the new settings (they differ in: %s)",
                    folder, ", ".join(differs.keys))
        (folder / SUMMARY).unlink(missing_ok=True)  # the record of an attempt that produced nothing
        return "fresh"
    if summary.done:
        return "done"
    if get_tier(config.tier).task is None and took_a_step(folder, summary):  # a task run starts again from step 0
        refuse_changed_arm(folder, config, summary)
    return "resume"


def took_a_step(folder: Path, summary: RunSummary) -> bool:
    """Whether a run folder holds anything of a training step: a checkpoint, weights, a step's metrics."""
    checkpoints = folder / CHECKPOINTS
    if summary.done or summary.steps or (checkpoints.is_dir() and any(checkpoints.iterdir())):
        return True
    return any(row.get("step") for row in read_metrics(folder / METRICS) if isinstance(row, dict))


class RunFolder:
    """One run's folder for its whole life, the one owner of what enters it: its lock (`held`), the check that
    a process is a data-parallel child and may join (`child`, `join`), the resume check (`prepare_run_dir`),
    and the writes of its summary and metrics (each after `holding()`: the lock is still this process's).
    A data-parallel child holds no lock (`holding` is a no-op there) and its rank writes nothing."""

    def __init__(self, path: str | os.PathLike, config: RunConfig):
        self.path, self.config = Path(path), config
        self._lock: FileLock | None = None

    def holding(self) -> None:
        """Raises once the run's lock is another's (`FileLock.check_held`); nothing before it is taken."""
        if self._lock is not None:
            self._lock.check_held()

    @property
    def child(self) -> bool:
        """Whether this process is a data-parallel child of the run's holder: a SLURM task of rank > 0 (srun starts
        all k side by side), or a process the holder started (`launched_child`)."""
        return bool(self.config.devices > 1 and claimed_rank() and os.environ.get("SLURM_STEP_ID")) \
            or launched_child(run_lock_path(self.path))

    def join(self) -> RunSummary | None:
        """A child's guards before it trains beside its parent (None), or the finished run's summary (nothing to
        do: its rank 0 found that too)."""
        if self.config.devices > 1 and claimed_rank() and os.environ.get("SLURM_STEP_ID"):
            return await_step_rank0(self.path, self.config)
        check_child_run_dir(self.path, self.config)
        return None

    @contextlib.contextmanager
    def held(self, force: bool, what: str) -> Iterator[tuple[str, FileLock]]:
        """The run's lock for the whole run (a second process on it is refused at once, naming the holder, before
        it touches anything), and inside it the folder prepared (`prepare_run_dir`): ('fresh' | 'resume' |
        'done', the lock). A fresh run's config.json is written here: the one place a run writes it."""
        with FileLock(run_lock_path(self.path), what=what) as lock:
            self._lock = lock
            try:
                state = prepare_run_dir(self.path, self.config, force)
                if state != "done":
                    self._ready(state)
                yield state, lock
            finally:
                self._lock = None

    def _ready(self, state: str) -> None:
        if self.config.data_dir is not None:
            check_data_folder(self.config.data_dir)
        self.path.mkdir(parents=True, exist_ok=True)
        for stray in remove_stray_temporaries(self.path) + remove_stray_temporaries(self.path / CHECKPOINTS):
            log.info("removed %s, left by an interrupted write", stray)
        if state == "fresh":
            atomic_write_json(self.path / CONFIG, self.config.to_dict())

    def summary(self) -> RunSummary:
        return read_summary(self.path)

    def update_summary(self, **fields) -> None:
        """summary.json with `fields` set (`ablate.store_summary.update_summary`)."""
        self.holding()
        update_summary(self.path, **fields)

    def write_summary(self, summary: dict) -> None:
        """The whole summary.json (`ablate.store_summary.write_summary`)."""
        self.holding()
        write_summary(self.path, summary)

    def metrics(self, log_dict: Callable[..., None] | None = None) -> MetricsLog:
        """metrics.jsonl, each row written after `holding()`."""
        return MetricsLog(self.path / METRICS, log_dict, self.holding)


def await_step_rank0(folder: Path, config: RunConfig) -> RunSummary | None:
    """A task of rank > 0 of a data-parallel SLURM run (srun starts all k side by side): wait until rank 0
    of this job step holds the run and has written its config (None: join it), or the run is finished
    (its summary: nothing to do, as rank 0 found too). Refused after RANK0_WAIT_S."""
    lock, deadline, problem = run_lock_path(folder), time.monotonic() + RANK0_WAIT_S, None
    while time.monotonic() < deadline:
        summary = read_summary(folder, "rerun it with --force")
        if summary.done:
            return summary
        if held_by_step_sibling(lock):
            try:
                check_child_run_dir(folder, config)
                return None
            except AblateError as err:  # e.g. rank 0 has not written config.json yet
                problem = err
        time.sleep(0.5)
    raise AblateError(f"task {claimed_rank()} of SLURM job {os.environ.get('SLURM_JOB_ID')} waited "
                      f"{RANK0_WAIT_S:.0f} s "
                      f"for its rank 0 to start run {folder}" + (f" ({problem})" if problem else ""))


def check_child_run_dir(folder: Path, config: RunConfig) -> None:
    """The guards of `prepare_run_dir` for a data-parallel child, which holds no lock and changes nothing: its
    parent wrote config.json before starting it, and the run is not finished (`resumable`). A child that finds
    otherwise is refused, so that no process, child or not, trains a finished run or one of other settings."""
    if config.devices < 2:
        raise AblateError(f"this process claims to be a data-parallel child of run {folder}, but the run has "
                          f"devices {config.devices}: only a run with devices >= 2 has children")
    if not (folder / CONFIG).is_file():
        raise AblateError(f"{folder} has no {CONFIG}: {CHILD}")
    summary = resumable(folder, config, child=True)
    if summary.done:
        raise AblateError(f"{folder} is already {summary.status}: {CHILD}, never a finished one")


def moved_data_only(previous: dict, current: dict, summary: RunSummary) -> bool:
    """Whether a run's config (`semantic`) differs from the one it started with only in where its data lies, and the
    data there is the data it trained on (the same `data_id`: the shards' checksums, whatever folder holds them).
    Such a run, unfinished, resumes from the data's new place, which its summary then records (`data_dir`); a
    finished one is still refused other settings (nothing is trained, and nothing says the folder is whole)."""
    differing = {k for k in set(previous) | set(current) if previous.get(k) != current.get(k)}
    if differing != {"data_dir"} or not summary.data_id or not current.get("data_dir"):
        return False
    try:
        return TokenShards(current["data_dir"], verify=False).fingerprint == summary.data_id
    except (AblateError, OSError, KeyError, ValueError):
        return False


def refuse_changed_arm(folder: Path, config: RunConfig, summary: RunSummary) -> None:
    """A resume continues the code the run started under: an arm whose identity (`ablate.arms.source`) is not the
    one the run last trained under is refused, so that no run is trained half by one version of an arm and half by
    another. A run recorded under an older identity scheme is not compared (and resumes, recording both)."""
    recorded = [a for a in (summary.arm_sources or [summary.arm_source]) if current_scheme(a)]
    now_ = arm_identity(get_arm(config.arm))
    if recorded and recorded[-1] != now_:
        raise AblateError(f"{folder}: the arm's code changed since this run started (arm {config.arm!r}: "
                          f"{recorded[-1][:15]}… then, {now_[:15]}… now): restore it, or --force to keep the old "
                          "run aside and start again")


LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")  # set by Lightning's launch


def end_process_group(before: dict) -> None:
    """After a data-parallel run: its process group destroyed and the environment Lightning's launcher set
    (LOCAL_RANK=0 above all, which would make the next launch think its processes exist) as it was."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
