"""One writer at a time: a lock file created atomically, naming its holder, refreshed while it lives.

Why not `flock`: on the shared filesystems clusters use (NFS, Lustre) an advisory lock may not reach
across nodes, and a lock held by a node that died is never released. An exclusive create
(`O_CREAT | O_EXCL`, atomic on NFSv3+ and Lustre) of a small JSON file works everywhere; its holder
refreshes the file's mtime every `refresh_s` seconds from a background thread, so a lock is stale when

* its holder ran on this host and that process is gone (pid absent, or reused: the process start
  time recorded in the lock differs), or
* its holder ran on another host and the lock file has not changed (its mtime, inode) over `stale_after_s`
  seconds of *this* host's clock (`unchanged_for`): the mtime itself is the holder's clock (or the file
  server's), and comparing it with ours would call a live lock dead whenever the two clocks disagree by more
  than `stale_after_s` (NFS clients' clocks do). So the first look at another host's lock finds it alive; a
  look `stale_after_s` later that finds the very same file unchanged finds it dead.

A stale lock is taken over under a short-lived guard file, and the breaker judges it again under the
guard (the very same file, by inode and mtime, and still dead): a lock that another breaker already
replaced, even one whose holder is still writing it, is never removed, so two processes that find the
same stale lock cannot both take it. A lock path that is not a plain file (a directory, a symbolic
link) or a file naming an impossible holder was not written by this module: it is refused with one
line naming the file, never judged or removed. This module has no torch dependency.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from ablate.errors import AblateError, writing

log = logging.getLogger(__name__)
REFRESH_S = 30.0
STALE_AFTER_S = 300.0  # another host's lock unrefreshed this long is dead (10 refreshes missed)
TORN_AFTER_S = 60.0  # a lock without a holder (torn, or being written) this old was left by a writer that died
TOKEN_ENV = "ABLATE_LOCK_TOKEN"  # a holder's secret token, handed down (only) to the child processes it starts
CHILD_RUN_ENV = "ABLATE_CHILD_OF_RUN"  # the key of the run whose data-parallel children a process starts
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no process anywhere has a larger id


class LockHeld(AblateError):
    """The lock belongs to a live holder; `holder` is what its file says."""

    def __init__(self, path: Path, holder: dict, what: str):
        self.path, self.holder = Path(path), holder
        super().__init__(f"{what} is in use by {describe_holder(holder)} (lock file {path}); "
                         "wait for it to finish, or stop that process first")


class LockLost(AblateError):
    """This process's lock was judged dead and taken over (it was stopped, e.g. `scontrol suspend`, or cut off
    from the filesystem past `stale_after_s`): what it guarded is another holder's now, so it stops, writing
    nothing more."""

    def __init__(self, path: Path, what: str, holder: dict | None):
        self.path = Path(path)
        now = f"held by {describe_holder(holder)}" if holder else "gone"
        super().__init__(f"{what}: this process's lock {path} was taken over while it was stopped (the lock is "
                         f"{now}): it stops here and writes nothing; the run is the new holder's")


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


def seen_dir() -> Path:
    """Where this host remembers when it first saw each lock file as it is (`unchanged_for`): a per-user cache
    (ABLATE_LOCK_SEEN_DIR, else $XDG_CACHE_HOME/ablate/locks-seen, else ~/.cache/...). Files are per host, so
    a home directory shared over NFS keeps each host's own observations."""
    if os.environ.get("ABLATE_LOCK_SEEN_DIR"):
        return Path(os.environ["ABLATE_LOCK_SEEN_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ablate" / "locks-seen"


def unchanged_for(path: Path, identity: tuple) -> float:
    """Seconds of this host's clock since it first saw the lock file at `path` as it is now (`identity`: device,
    inode, mtime in ns); 0 on the first look, or when the file changed since (a refresh, a new holder)."""
    key = hashlib.sha256(f"{socket.gethostname()}|{Path(path).resolve()}".encode()).hexdigest()[:32]
    record_path = seen_dir() / f"{socket.gethostname()[:64]}-{key}.json"
    now = time.time()
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record.get("identity") == list(identity) and 0 <= now - float(record["first_seen"]):
            return now - float(record["first_seen"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    try:
        record_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = record_path.with_name(f"{record_path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"identity": list(identity), "first_seen": now, "lock": str(path)}))
        os.replace(temporary, record_path)
    except OSError as err:  # no cache: every look is a first look, so another host's lock is never broken
        log.warning("cannot record when lock %s was seen (%s): another host's lock there is taken as alive", path,
                    err)
    return 0.0


def holder_alive(holder: dict, mtime: float, stale_after_s: float = STALE_AFTER_S, path: Path | None = None,
                 identity: tuple | None = None) -> bool:
    """Whether the holder lives: on this host by its pid and start time; on another, while its lock file at
    `path` (as `identity`) has changed within `stale_after_s` seconds of this host's clock. `mtime` is not
    compared with this host's clock (it is kept for the callers' sake)."""
    if holder.get("host") == socket.gethostname():
        pid = holder.get("pid")
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, another user's
        except (TypeError, ValueError, OverflowError, OSError):
            return False
        recorded = holder.get("start_time")
        return recorded is None or process_start_time(int(pid)) in (None, recorded)
    if path is None or identity is None:
        return True  # no file to watch: never judged dead on another host's clock
    return unchanged_for(path, identity) < stale_after_s


def damaged_lock(path: Path, what: str) -> AblateError:
    return AblateError(f"lock file {path} {what}, not a lock ablate wrote; if no ablate process is using it, "
                       f"delete it (rm -r {str(path)!r}) and run the command again")


def _identity(stat: os.stat_result) -> tuple:
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def read_lock_file(path: str | os.PathLike) -> tuple[dict, float, tuple] | None:
    """(holder, mtime, the file's identity) of a lock file, or None when there is none.

    A torn file (cut short while it was written) reads as an empty holder; a path that is a directory
    or a symbolic link (dangling or not), or a file naming an impossible holder, is an AblateError.
    """
    path = Path(path)
    try:
        stat = path.lstat()
    except FileNotFoundError:
        return None
    if path.is_symlink():
        raise damaged_lock(path, f"is a symbolic link (to {os.readlink(path)!r})")
    if path.is_dir():
        raise damaged_lock(path, "is a directory")
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(1 << 16)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise damaged_lock(path, f"cannot be read ({err.strerror or err})") from None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = {}
    holder = holder if isinstance(holder, dict) else {}
    if holder:
        _check_holder(path, holder)
    return holder, stat.st_mtime, _identity(stat)


def _check_holder(path: Path, holder: dict) -> None:
    pid = holder.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        raise damaged_lock(path, f"names pid {pid!r}, which no process can have")
    if not isinstance(holder.get("host"), str) or not holder["host"]:
        raise damaged_lock(path, f"names no host ({holder.get('host')!r})")


def read_lock(path: str | os.PathLike) -> tuple[dict, float] | None:
    """(holder, mtime) of a lock file, or None when there is none (see `read_lock_file`)."""
    found = read_lock_file(path)
    return None if found is None else found[:2]


def lock_alive(holder: dict, mtime: float, stale_after_s: float = STALE_AFTER_S, path: Path | None = None,
               identity: tuple | None = None) -> bool:
    """Whether a lock read as (holder, mtime) at `path` (as `identity`) still belongs to someone: a live holder
    (`holder_alive`), or a writer still writing."""
    if not holder:
        return time.time() - mtime < TORN_AFTER_S
    return holder_alive(holder, mtime, stale_after_s, path, identity)


def live_holder(path: str | os.PathLike, stale_after_s: float = STALE_AFTER_S) -> dict | None:
    """The holder of the lock at `path` if it is alive, else None."""
    found = read_lock_file(path)
    if found is None:
        return None
    holder, mtime, identity = found
    alive = lock_alive(holder, mtime, stale_after_s, Path(path), identity)
    return holder if alive else None  # a young torn lock is being written


def token_digest(token: str) -> str:
    """What a lock file keeps of its holder's token: its SHA-256, so the file (world-readable) never shows it."""
    return hashlib.sha256(token.encode()).hexdigest()


def parent_pid(pid: int) -> int | None:
    """The parent of a live process (from /proc), or None if unknown or gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def held_by_parent(path: str | os.PathLike) -> bool:
    """Whether the lock at `path` is held by this process's live parent, which handed its token down.

    Two things an outside process cannot arrange: the holder is this process's parent in the live process
    tree (by pid and kernel start time, read from /proc, not from the lock file), and this process was given
    the holder's secret token (TOKEN_ENV), of which the lock file keeps only the SHA-256.
    """
    token, found = os.environ.get(TOKEN_ENV), read_lock(path)
    holder = found[0] if found else {}
    if not token or holder.get("token_sha256") != token_digest(token) or holder.get("host") != socket.gethostname():
        return False
    parent = os.getppid()
    return holder.get("pid") == parent == parent_pid(os.getpid()) and holder.get("start_time") is not None \
        and holder.get("start_time") == process_start_time(parent)


class FileLock:
    """`with FileLock(path, what="run X"):` — exclusive across processes and hosts; refreshed while held."""

    def __init__(self, path: str | os.PathLike, what: str = "", *, refresh_s: float = REFRESH_S,
                 stale_after_s: float = STALE_AFTER_S, extra: dict | None = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.refresh_s, self.stale_after_s = refresh_s, stale_after_s
        self.token = uuid.uuid4().hex  # secret: handed down to children (`handed_down`), never written
        self.lock_id = uuid.uuid4().hex  # public: names this holding (e.g. a submission in the ledger)
        self.extra = extra or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holder(self) -> dict:
        pid = os.getpid()
        return {"host": socket.gethostname(), "pid": pid, "start_time": process_start_time(pid),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "slurm_step_id": os.environ.get("SLURM_STEP_ID"),
                "id": self.lock_id,
                "token_sha256": token_digest(self.token),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **self.extra}

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            if self._create():
                self._start_refresh()
                return self
            found = read_lock_file(self.path)
            if found is None:
                continue  # released between our attempt and the read
            holder, mtime, identity = found
            if lock_alive(holder, mtime, self.stale_after_s, self.path, identity):
                raise LockHeld(self.path, holder or {"host": "?", "pid": "? (lock being written)"}, self.what)
            self._break_stale(found)
        raise LockHeld(self.path, (read_lock(self.path) or ({}, 0))[0], self.what)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            return False
        try:
            with writing(self.path), os.fdopen(fd, "w", encoding="utf-8") as handle:
                self._write_holder(handle)
        except BaseException:  # e.g. a full disk: leave no torn lock that refuses the next attempt
            self.path.unlink(missing_ok=True)
            raise
        return True

    def _write_holder(self, handle) -> None:
        """Write and sync the holder (on a network filesystem this can take a while: others see it torn)."""
        handle.write(json.dumps(self.holder()))
        handle.flush()
        os.fsync(handle.fileno())

    def _break_stale(self, judged: tuple[dict, float, tuple]) -> None:
        """Remove the dead lock `judged` (holder, mtime, identity), under a guard file: one breaker at a time.

        Under the guard the lock is read and judged again, and removed only if it is the very file that was
        judged (same inode and mtime) and is still dead: another breaker may have replaced it meanwhile with
        its own lock, which reads as torn while it is being written (on a slow filesystem, for a while).
        """
        guard = self.path.with_name(self.path.name + ".breaking")
        try:
            fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > TORN_AFTER_S:  # a breaker that died mid-way
                    guard.unlink()
            except FileNotFoundError:
                pass
            return
        os.close(fd)
        try:
            found = read_lock_file(self.path)
            if found is None or found[2] != judged[2] or lock_alive(found[0], found[1], self.stale_after_s, self.path,
                                                                    found[2]):
                return  # gone, replaced, or alive after all: the caller looks again
            log.warning("taking over the lock of %s from a holder that is gone (%s)", self.what,
                        describe_holder(found[0]) if found[0] else "a torn lock file")
            self.path.unlink()
        finally:
            guard.unlink(missing_ok=True)

    def _start_refresh(self) -> None:
        def refresh():
            while not self._stop.wait(self.refresh_s):
                try:
                    if not self.held():  # taken over while this process was stopped: never touch another's lock
                        log.warning("lock %s is no longer this process's: it is not refreshed", self.path)
                        return
                    os.utime(self.path)
                except (OSError, AblateError) as err:
                    log.warning("could not refresh lock %s: %s", self.path, err)

        self._thread = threading.Thread(target=refresh, name=f"lock-refresh {self.path.name}", daemon=True)
        self._thread.start()

    def held(self) -> bool:
        found = read_lock(self.path)
        return found is not None and found[0].get("token_sha256") == token_digest(self.token)

    def check_held(self) -> None:
        """Refuse to go on (`LockLost`) once the lock is not this process's any more: what a holder calls at every
        step boundary and before every write into what it guards. Its refresh stops too."""
        try:
            found = read_lock(self.path)
        except AblateError:
            found = None  # the path is no lock of ours any more (replaced by a directory, a link)
        if found is None or found[0].get("token_sha256") != token_digest(self.token):
            self._stop.set()
            raise LockLost(self.path, self.what, found[0] if found else None)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.held():
            self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def handed_down(self, **environment: str):
        """While inside: the child processes started get this lock's token (`held_by_parent` checks it), and
        the other `environment` variables given (e.g. which run they are children of)."""
        settings = {TOKEN_ENV: self.token, **environment}
        before = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            yield self
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


RANK_VARIABLES = ("LOCAL_RANK", "RANK", "SLURM_PROCID")


def claimed_rank() -> int:
    """The non-zero process rank the environment claims (LOCAL_RANK, else RANK), or 0."""
    for name in RANK_VARIABLES:
        try:
            rank = int(os.environ.get(name) or 0)
        except ValueError:
            continue
        if rank:
            return rank
    return 0


def held_by_step_sibling(path: str | os.PathLike) -> bool:
    """Whether the lock at `path` is held by rank 0 of this process's own SLURM job step, on this node.

    `srun` starts the k tasks of a data-parallel run side by side, so rank 0 cannot hand its token down
    to the others. What shows them to be its siblings is the live process tree: the holder (by pid and
    kernel start time) and this process have the same parent, the step's slurmstepd, and the lock names
    this job and step. (The guards that keep a finished or different run from being trained hold for
    every process anyway: see `ablate.ranks.check_child_run_dir`.)
    """
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    found = read_lock(path)
    holder = found[0] if found else {}
    if not job or not step or holder.get("slurm_job_id") != job or holder.get("slurm_step_id") != step \
            or holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    pid = holder["pid"]
    return pid != os.getpid() and parent_pid(pid) == os.getppid() == parent_pid(os.getpid()) \
        and holder.get("start_time") is not None and holder.get("start_time") == process_start_time(pid)


def launched_child(lock_path: Path) -> bool:
    """True only in a data-parallel child of the process that holds the run: one it started (it handed down
    the run lock's token, `FileLock.handed_down`), or a task of its own SLURM job step. Anything else that
    claims a rank is an ordinary run, with every guard."""
    if not claimed_rank():
        return False
    if held_by_parent(lock_path) or held_by_step_sibling(lock_path):
        return True
    log.warning("the environment claims rank %d, but this process's parent does not hold %s: running it as an "
                "ordinary run", claimed_rank(), lock_path)
    return False
