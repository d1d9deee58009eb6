"""The processes of one data-parallel run besides its rank 0: how a child is told from an impostor, the
guards it runs under (the same as every process), and the end of a run's process group.

A child holds no lock and writes nothing; what makes a process a child is checked in `ablate.lock`
(`launched_child`: the live process tree and a secret only its parent had). Whether or not it is one,
no process trains a run that is finished or has other settings. Two guards of a resume live here too, for
`ablate.train.prepare_run_dir` and the children alike: data that moved (`moved_data_only`) and an arm whose code
changed since the run started (`refuse_changed_arm`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ablate.arms.base import get_arm
from ablate.arms.source import arm_identity, current_scheme
from ablate.config import semantic, with_device_defaults
from ablate.errors import AblateError
from ablate.lock import claimed_rank, held_by_step_sibling
from ablate.runconfig import RunConfig
from ablate.store import CONFIG, SUMMARY, read_json, read_json_file, run_lock_path
from ablate.data.shards import TokenShards
from ablate.store_summary import RunSummary, read_summary

RANK0_WAIT_S = 600.0  # how long a SLURM task of rank > 0 waits for rank 0 to take the run


def await_step_rank0(folder: Path, config: RunConfig) -> dict | None:
    """A task of rank > 0 of a data-parallel SLURM run (srun starts all k side by side): wait until rank 0
    of this job step holds the run and has written its config (None: join it), or the run is finished
    (its summary: nothing to do, as rank 0 found too). Refused after RANK0_WAIT_S."""
    lock, deadline, problem = run_lock_path(folder), time.monotonic() + RANK0_WAIT_S, None
    while time.monotonic() < deadline:
        if read_summary(folder, "rerun it with --force").done:
            return read_json(folder / SUMMARY)
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
    parent wrote config.json before starting it, and the run is not finished. A child that finds otherwise
    is refused, so that no process, child or not, trains a finished run or one of other settings."""
    if config.devices < 2:
        raise AblateError(f"this process claims to be a data-parallel child of run {folder}, but the run has "
                          f"devices {config.devices}: only a run with devices >= 2 has children")
    way_out = "a data-parallel child trains only the run its parent started"
    if not (folder / CONFIG).is_file():
        raise AblateError(f"{folder} has no {CONFIG}: {way_out}")
    previous = semantic(with_device_defaults(read_json_file(folder / CONFIG, way_out), torch.cuda.is_available()))
    current = semantic(config)
    if previous != current and not moved_data_only(previous, current, read_summary(folder, way_out)):
        diff = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
        raise AblateError(f"{folder} holds a run of a different config (differs in: {', '.join(diff)}); {way_out}")
    summary = read_summary(folder, way_out)
    if summary.done:
        raise AblateError(f"{folder} is already {summary.status}: {way_out}, never a finished one")


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
