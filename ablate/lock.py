"""One writer at a time: a lock file created atomically, naming its holder, refreshed while it lives.

Why not `flock`: on the shared filesystems clusters use (NFS, Lustre) an advisory lock may not reach
across nodes, and a lock held by a node that died is never released. An exclusive create
(`O_CREAT | O_EXCL`, atomic on NFSv3+ and Lustre) of a small JSON file works everywhere; its holder
refreshes the file's mtime every `refresh_s` seconds from a background thread, so a lock is stale when

* its holder ran on this host and that process is gone (pid absent, or reused: the process start
  time recorded in the lock differs), or
* its holder ran on another host and the lock has not been refreshed for `stale_after_s` seconds.

A stale lock is taken over under a short-lived guard file, so two processes that find the same stale
lock cannot both take it. This module has no torch dependency.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from ablate.errors import AblateError

log = logging.getLogger(__name__)
REFRESH_S = 30.0
STALE_AFTER_S = 300.0  # another host's lock unrefreshed this long is dead (10 refreshes missed)


class LockHeld(AblateError):
    """The lock belongs to a live holder; `holder` is what its file says."""

    def __init__(self, path: Path, holder: dict, what: str):
        self.path, self.holder = Path(path), holder
        super().__init__(f"{what} is in use by {describe_holder(holder)} (lock file {path}); "
                         "wait for it to finish, or stop that process first")


def describe_holder(holder: dict) -> str:
    parts = [f"host {holder.get('host', '?')}", f"pid {holder.get('pid', '?')}"]
    if holder.get("slurm_job_id"):
        parts.append(f"SLURM job {holder['slurm_job_id']}")
    if holder.get("started"):
        parts.append(f"since {holder['started']}")
    return ", ".join(parts)


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of a process (clock ticks since boot), or None if unknown or gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def holder_alive(holder: dict, mtime: float, stale_after_s: float = STALE_AFTER_S) -> bool:
    if holder.get("host") == socket.gethostname():
        pid = holder.get("pid")
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, another user's
        except (TypeError, ValueError, OSError):
            return False
        recorded = holder.get("start_time")
        return recorded is None or process_start_time(int(pid)) in (None, recorded)
    return time.time() - mtime < stale_after_s


def read_lock(path: str | os.PathLike) -> tuple[dict, float] | None:
    """(holder, mtime) of a lock file, or None when there is none. A torn file reads as an empty holder."""
    path = Path(path)
    try:
        mtime = path.stat().st_mtime
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}
    return (holder if isinstance(holder, dict) else {}), mtime


def live_holder(path: str | os.PathLike, stale_after_s: float = STALE_AFTER_S) -> dict | None:
    """The holder of the lock at `path` if it is alive, else None."""
    found = read_lock(path)
    if found is None:
        return None
    holder, mtime = found
    if not holder:  # being written right now, or torn: young means being written
        return {} if time.time() - mtime < 60 else None
    return holder if holder_alive(holder, mtime, stale_after_s) else None


class FileLock:
    """`with FileLock(path, what="run X"):` — exclusive across processes and hosts; refreshed while held."""

    def __init__(self, path: str | os.PathLike, what: str = "", *, refresh_s: float = REFRESH_S,
                 stale_after_s: float = STALE_AFTER_S, extra: dict | None = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.refresh_s, self.stale_after_s = refresh_s, stale_after_s
        self.token = uuid.uuid4().hex
        self.extra = extra or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> dict:
        pid = os.getpid()
        return {"host": socket.gethostname(), "pid": pid, "start_time": process_start_time(pid),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "token": self.token,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **self.extra}

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self._start_refresh()
                return self
            found = read_lock(self.path)
            if found is None:
                continue  # released between our attempt and the read
            holder, mtime = found
            if not holder and time.time() - mtime < 60:
                raise LockHeld(self.path, {"host": "?", "pid": "? (lock being written)"}, self.what)
            if holder and holder_alive(holder, mtime, self.stale_after_s):
                raise LockHeld(self.path, holder, self.what)
            self._break_stale(holder)
        raise LockHeld(self.path, (read_lock(self.path) or ({}, 0))[0], self.what)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.holder()))
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _break_stale(self, stale: dict) -> None:
        """Remove a dead holder's lock; a guard file makes sure only one process judges and removes it."""
        guard = self.path.with_name(self.path.name + ".breaking")
        try:
            fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > 60:  # a breaker that died mid-way
                    guard.unlink()
            except FileNotFoundError:
                pass
            return
        os.close(fd)
        try:
            found = read_lock(self.path)
            if found is not None and found[0].get("token") == stale.get("token"):  # still the same dead lock
                log.warning("taking over the lock of %s from a holder that is gone (%s)", self.what,
                            describe_holder(stale))
                self.path.unlink()
        finally:
            guard.unlink(missing_ok=True)

    def _start_refresh(self) -> None:
        def refresh():
            while not self._stop.wait(self.refresh_s):
                try:
                    os.utime(self.path)
                except OSError as err:
                    log.warning("could not refresh lock %s: %s", self.path, err)

        self._thread = threading.Thread(target=refresh, name=f"lock-refresh {self.path.name}", daemon=True)
        self._thread.start()

    def held(self) -> bool:
        found = read_lock(self.path)
        return found is not None and found[0].get("token") == self.token

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.held():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
