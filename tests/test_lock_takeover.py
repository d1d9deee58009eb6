"""A holder whose lock was judged dead and taken over while it was stopped (SIGSTOP, `scontrol suspend`) writes
nothing more once it goes on: it checks that it still holds its lock at every step boundary and before every
checkpoint, metrics and summary write, its refresh stops touching the lock, and it stops in one line (issue 54,
item 8). The takeover is made as another host's breaker makes it: the lock file replaced by the new holder's (a
new file), the run then written by that holder."""

from __future__ import annotations

import json
import os
import time

import pytest

import ablate.taskrun
import ablate.train
from ablate.experiment import RunSpec
from ablate.lock import FileLock, LockLost, read_lock
from ablate.store import run_lock_path
from ablate.train import run

OTHER = {"host": "another-node", "pid": 4242, "start_time": None, "id": "new", "token_sha256": "f" * 64,
         "started": "2026-01-01T00:00:00+0000"}


def take_over(lock_path, folder=None) -> dict:
    """Replace the lock by another holder's, as a breaker does (a new file), and (with `folder`) leave the run as that
    holder finished it; what each file of the folder then holds, byte for byte."""
    replacement = lock_path.with_name(lock_path.name + ".new")
    replacement.write_text(json.dumps(OTHER))
    os.replace(replacement, lock_path)
    os.utime(lock_path, (1e9, 1e9))  # an mtime no refresh of this process would leave
    if folder is None:
        return {}
    for name in ("summary.json", "metrics.jsonl"):
        (folder / name).write_text(f"the new holder's {name}\n")
    return files_of(folder)


def files_of(folder) -> dict:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file()}


@pytest.mark.unit
def test_a_taken_over_lock_is_not_refreshed_and_its_holder_is_told_in_one_line(tmp_path):
    lock = FileLock(tmp_path / ".seed0.lock", what="run x", refresh_s=0.02).acquire()
    assert lock.held()
    lock.check_held()  # still its own: goes on
    take_over(lock.path)
    time.sleep(0.3)  # fifteen refresh periods
    assert lock.path.stat().st_mtime == 1e9  # the new holder's lock is never touched
    with pytest.raises(LockLost, match="was taken over while it was stopped.*host another-node, pid 4242") as err:
        lock.check_held()
    assert "\n" not in str(err.value) and "writes nothing" in str(err.value)
    lock.release()
    assert read_lock(lock.path)[0] == OTHER  # released without removing the new holder's lock


def stop_and_take_over_at(monkeypatch, module, name: str, at_step: int, folder, step_at: int = 0) -> dict:
    """Call `module.name` (called once per step, with the step as argument `step_at`) as before, and take the run
    over at `at_step`: what the folder then holds."""
    original, taken = getattr(module, name), {}

    def hooked(*args):
        if args[step_at] == at_step and not taken:
            taken.update(take_over(run_lock_path(folder), folder))
        return original(*args)

    monkeypatch.setattr(module, name, hooked)
    return taken


@pytest.mark.run
def test_a_task_run_taken_over_mid_way_writes_nothing_more(tmp_path, monkeypatch):
    spec = RunSpec("lockx", "filter-norm", "baseline", 0, {"max_steps": 6})
    folder = spec.folder(tmp_path)
    taken = stop_and_take_over_at(monkeypatch, ablate.taskrun, "training_seed", 3, folder, step_at=1)
    with pytest.raises(LockLost, match="taken over"):
        run(spec, tmp_path, data_dir=None, progress=False, threads=1)
    assert taken and files_of(folder) == taken  # no row, no summary, no weights, no eval.json after the takeover
    assert read_lock(run_lock_path(folder))[0] == OTHER


@pytest.mark.run
def test_a_corpus_run_taken_over_mid_way_writes_no_checkpoint_metrics_or_summary(tmp_path, monkeypatch,
                                                                                 sample_data):
    spec = RunSpec("lockx", "smoke", "baseline", 0, {"max_steps": 3, "checkpoint_interval": 1})
    folder = spec.folder(tmp_path)
    taken = stop_and_take_over_at(monkeypatch, ablate.train, "lr_at", 1, folder)  # in step 2
    with pytest.raises(LockLost, match="taken over"):
        run(spec, tmp_path, data_dir=str(sample_data), progress=False, threads=1)
    assert taken and files_of(folder) == taken  # step 2's checkpoint and rows: never written
    assert read_lock(run_lock_path(folder))[0] == OTHER
