"""The run lock: damaged lock paths are one line naming the file, a torn lock is taken over by one process only,
and only a real child of a lock's holder can show its token."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import ablate.lock
from ablate.errors import AblateError
from ablate.lock import TOKEN_ENV, FileLock, LockHeld, live_holder, read_lock
from ablate.store import run_dir, run_lock_path
from datafix import REPO, ablate_cli


def _damage(path, kind):
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "directory":
        path.mkdir()
        (path / "inside").write_text("kept")
    elif kind == "pid 10^12":
        path.write_text(json.dumps({"host": socket.gethostname(), "pid": 10 ** 12, "token": "forged"}))
    else:  # a dangling symbolic link
        path.symlink_to(path.parent / "nowhere")


def _snapshot(path):
    if path.is_symlink():
        return "link", os.readlink(path)
    if path.is_dir():
        return "dir", sorted((p.name, p.read_text()) for p in path.iterdir())
    return "file", path.read_text()


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["directory", "pid 10^12", "dangling symlink"])
def test_a_damaged_lock_is_one_line_naming_it_and_the_way_out(tmp_path, kind):
    path = tmp_path / ".seed0.lock"
    _damage(path, kind)
    before = _snapshot(path)
    for attempt in (lambda: FileLock(path, "run").acquire(), lambda: live_holder(path), lambda: read_lock(path)):
        with pytest.raises(AblateError, match="delete it") as caught:
            attempt()
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
        assert not isinstance(caught.value, LockHeld)  # not "in use by host ?, pid ?"
    assert _snapshot(path) == before  # never judged or removed


@pytest.mark.run
@pytest.mark.parametrize("kind", ["directory", "pid 10^12", "dangling symlink"])
def test_ablate_run_on_a_damaged_lock_is_one_line_and_touches_nothing(tmp_path, kind):
    lock = run_lock_path(run_dir(tmp_path, "adhoc", "smoke", "baseline", 0))
    _damage(lock, kind)
    before = _snapshot(lock)
    result = ablate_cli("run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "2", "--data", tmp_path / "d",
                        "--no-progress", "--results", tmp_path, check=False, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert "Traceback" not in result.stderr and str(lock) in result.stderr and "delete it" in result.stderr
    assert _snapshot(lock) == before
    assert not (lock.parent / "seed0").exists()


@pytest.mark.unit
def test_an_old_torn_lock_is_taken_over_and_a_young_one_is_not(tmp_path):
    path = tmp_path / ".seed0.lock"
    path.write_text('{"host": "no')  # cut short while it was written
    with pytest.raises(LockHeld, match="being written"):
        FileLock(path, "run").acquire()
    old = time.time() - 3600
    os.utime(path, (old, old))
    with FileLock(path, "run") as lock:
        assert lock.held()
    assert not path.exists()


@pytest.mark.unit
def test_two_takers_of_the_same_torn_lock_do_not_both_get_it(tmp_path, monkeypatch):
    """A takes over the dead torn lock and writes its own slowly (0.5 s, a slow network filesystem); B judged
    the dead lock just before and breaks it just after: it must not remove A's lock that is being written."""
    path = tmp_path / ".seed0.lock"
    path.write_text("")  # torn, token-less
    old = time.time() - 3600
    os.utime(path, (old, old))
    write = FileLock._write_holder

    def slow_write(self, handle):
        time.sleep(0.5)
        write(self, handle)

    read = ablate.lock.read_lock_file
    judged = threading.Event()

    def read_then_pause(p):  # B: reads the dead lock, then is descheduled while A takes it over
        found = read(p)
        if threading.current_thread().name == "B" and not judged.is_set():
            judged.set()
            time.sleep(0.25)
        return found

    monkeypatch.setattr(FileLock, "_write_holder", slow_write)
    monkeypatch.setattr(ablate.lock, "read_lock_file", read_then_pause)
    won, refused = [], []

    def take(name):
        if name == "A":
            judged.wait(5)
        lock = FileLock(path, f"run ({name})")
        try:
            lock.acquire()
            won.append(lock)
        except LockHeld as err:
            refused.append(str(err))

    threads = [threading.Thread(target=take, args=(n,), name=n) for n in ("B", "A")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    try:
        assert len(won) == 1 and len(refused) == 1, (won, refused)
        assert won[0].held() and json.loads(path.read_text())["id"] == won[0].lock_id
    finally:
        for lock in won:
            lock.release()


CHECK = "import sys; from ablate.lock import held_by_parent; print(held_by_parent(sys.argv[1]))"


@pytest.mark.system
def test_only_a_child_of_the_holder_with_its_token_is_taken_for_a_child(tmp_path):
    path = tmp_path / ".seed0.lock"
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}

    def ask(*prefix, extra=None):
        command = [*prefix, sys.executable, "-c", CHECK, str(path)]
        out = subprocess.run(command, cwd=REPO, env={**env, **(extra or {})}, capture_output=True, text=True)
        return out.stdout.strip()

    with FileLock(path, "run") as lock:
        with lock.handed_down():
            assert os.environ[TOKEN_ENV] == lock.token
            assert ask(extra={TOKEN_ENV: lock.token}) == "True"  # a child, shown the token
            # a grandchild (not started by the holder), even shown the right token
            grandchild = subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" "$1"; true', CHECK, str(path)],
                                        cwd=REPO, env={**env, TOKEN_ENV: lock.token}, capture_output=True, text=True)
            assert grandchild.stdout.strip() == "False"
        assert TOKEN_ENV not in os.environ  # handed down only while inside
        assert ask() == "False"  # a child without the token
        assert ask(extra={TOKEN_ENV: "forged"}) == "False"
    assert ask(extra={TOKEN_ENV: lock.token}) == "False"  # released: nobody holds it


@pytest.mark.unit
def test_another_hosts_lock_is_dead_only_when_unchanged_over_the_contenders_own_clock(tmp_path, monkeypatch):
    """Item 11: a contender whose clock runs 600 s ahead of a live holder's called its lock dead. Staleness is
    the lock file unchanged over 300 s of the contender's own clock, never the file's mtime against it."""
    import types

    import ablate.lock as lock_module

    monkeypatch.setenv("ABLATE_LOCK_SEEN_DIR", str(tmp_path / "seen"))
    path = tmp_path / "run.lock"
    path.write_text(json.dumps({"host": "node-b-elsewhere", "pid": 4242, "started": "2026-01-01T00:00:00"}))
    behind = time.time() - 600  # the holder refreshed it just now, by a clock 600 s behind ours
    os.utime(path, (behind, behind))
    now = [time.time()]
    monkeypatch.setattr(lock_module, "time", types.SimpleNamespace(time=lambda: now[0], strftime=time.strftime))
    with pytest.raises(LockHeld, match="node-b-elsewhere"):
        FileLock(path, "run X").acquire()  # the first look: alive, whatever the clocks say
    now[0] += 299
    assert live_holder(path) is not None  # unchanged for 299 s of our clock: still alive
    os.utime(path, (behind + 300, behind + 300))  # the holder refreshes it
    now[0] += 10
    with pytest.raises(LockHeld):
        FileLock(path, "run X").acquire()  # changed: its watch starts again
    now[0] += 299
    assert live_holder(path) is not None
    now[0] += 2  # 301 s of our clock without a change: the holder is gone
    assert live_holder(path) is None
    taken = FileLock(path, "run X").acquire()
    try:
        assert taken.held()
    finally:
        taken.release()
