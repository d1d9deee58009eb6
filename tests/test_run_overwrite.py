"""Runs that cannot be overwritten: a claimed rank is not a licence, a folder without its config is damaged,
and a mistyped --data leaves nothing that refuses the corrected command."""

import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from ablate.lock import TOKEN_ENV
from ablate.store import read_json, run_dir, run_lock_path
from datafix import REPO, ablate_cli

torch.set_num_threads(1)


def _args(results, data, steps=3):
    return ["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", str(steps), "--data", data,
            "--no-progress", "--threads", "1", "--results", results]


def _completed(results, finished_runs, steps=3):
    """A completed run of `_args` (a copy of the session's: the tests here are about what comes after it)."""
    folder = run_dir(finished_runs(results, ("baseline", 0), experiment="adhoc", steps=steps), "adhoc", "smoke",
                     "baseline", 0)
    assert read_json(folder / "summary.json")["status"] == "completed"
    return folder


def _snapshot(root):
    """Every file under root (and the lock beside it): name, bytes and mtime."""
    files = [p for p in sorted(root.parent.rglob("*")) if p.is_file()]
    return [(str(p.relative_to(root.parent)), hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in files]


@pytest.fixture(scope="module")
def completed(tmp_path_factory, finished_runs):
    results = tmp_path_factory.mktemp("done")
    return results, _completed(results, finished_runs)


def _without_token():
    return {k: v for k, v in os.environ.items() if k != TOKEN_ENV}


@pytest.mark.system
@pytest.mark.parametrize("variable", ["LOCAL_RANK", "RANK"])
def test_a_claimed_rank_on_a_completed_run_is_a_no_op_like_rank_0(completed, sample_data, variable):
    results, folder = completed
    before = _snapshot(folder)
    rank0 = subprocess.run([sys.executable, "-m", "ablate.cli", *map(str, _args(results, sample_data))], cwd=REPO,
                           env={**_without_token(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    claimed = subprocess.run([sys.executable, "-m", "ablate.cli", *map(str, _args(results, sample_data))], cwd=REPO,
                             env={**_without_token(), "OMP_NUM_THREADS": "1", variable: "1"}, capture_output=True,
                             text=True, timeout=300)
    assert rank0.returncode == claimed.returncode == 0, claimed.stderr
    assert claimed.stdout == rank0.stdout and json.loads(claimed.stdout)["status"] == "completed"
    assert "nothing to do" in claimed.stderr and "Traceback" not in claimed.stderr
    assert _snapshot(folder) == before  # bitwise untouched, not one mtime changed


@pytest.mark.system
def test_a_claimed_rank_with_a_copied_token_is_refused_while_another_process_holds_the_run(completed, sample_data):
    results, folder = completed
    lock = run_lock_path(folder)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from ablate.lock import FileLock\n"
         "with FileLock(sys.argv[1], 'run', refresh_s=3600):\n    print('held', flush=True); time.sleep(120)",
         str(lock)],
        cwd=REPO, env=_without_token(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _snapshot(folder)
        token = json.loads(lock.read_text())["token_sha256"]  # all a world-readable lock shows: no proof
        out = ablate_cli(*_args(results, sample_data), env={"LOCAL_RANK": "1", TOKEN_ENV: token}, check=False,
                         process=True,
                         timeout=300)
        assert out.returncode == 2, out.stderr
        assert f"pid {holder.pid}" in out.stderr and "Traceback" not in out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith("ablate: error:")
        assert _snapshot(folder) == before
    finally:
        holder.kill()
        holder.wait()


def _forge_lock(lock, pid: int, token: str) -> None:
    """A lock file as an attacker writes it: a live pid that is this process's ancestor, its real start time,
    and a token of its choosing (plainly, and as the digest a genuine lock keeps)."""
    from ablate.lock import process_start_time, token_digest

    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "start_time": process_start_time(pid),
                                "token": token, "token_sha256": token_digest(token), "id": "forged"}))


@pytest.mark.system
def test_a_forged_child_never_retrains_a_completed_run(completed, sample_data, tmp_path):
    """The lock file names the shell (the parent of `ablate run`) and a chosen token: the run is refused
    and stays as it was, byte for byte, mtime for mtime."""
    results, folder = completed
    lock = run_lock_path(folder)
    lock.unlink(missing_ok=True)  # a dead holder's lock an earlier test may leave (its holder killed)
    before = _snapshot(folder)
    command = " ".join(map(shlex.quote, [sys.executable, "-m", "ablate.cli",
                                         *map(str, _args(results, sample_data, 1))]))
    script = (f"{shlex.quote(sys.executable)} -c 'import json, sys; sys.path.insert(0, \"tests\"); "
              f"from test_run_overwrite import _forge_lock; from pathlib import Path; "
              f"_forge_lock(Path(sys.argv[1]), int(sys.argv[2]), \"chosen\")' {shlex.quote(str(lock))} $$; "
              f"LOCAL_RANK=1 {TOKEN_ENV}=chosen {command}; echo exit=$?")
    try:
        out = subprocess.run(["bash", "-c", script], cwd=REPO, env={**_without_token(), "OMP_NUM_THREADS": "1"},
                             capture_output=True, text=True, timeout=300)
        assert "exit=0" in out.stdout or "exit=2" in out.stdout, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
        assert json.loads(lock.read_text())["id"] == "forged"  # the forger's file, never taken over or trained under
    finally:
        lock.unlink(missing_ok=True)
    assert _snapshot(folder) == before  # bitwise untouched, not one mtime changed


@pytest.mark.run
def test_a_run_folder_with_results_but_no_config_is_refused_naming_it_and_force(tmp_path, sample_data,
                                                                                   finished_runs):
    folder = _completed(tmp_path, finished_runs)
    (folder / "config.json").unlink()
    before = _snapshot(folder)
    out = ablate_cli(*_args(tmp_path, sample_data), check=False, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert str(folder) in out.stderr and "no config.json" in out.stderr and "--force" in out.stderr
    assert _snapshot(folder) == before  # not retrained in place
    forced = ablate_cli(*_args(tmp_path, sample_data), "--force", timeout=300)
    assert json.loads(forced.stdout)["status"] == "completed"
    aside = [p for p in folder.parent.iterdir() if p.name.startswith("seed0.old-")]
    assert len(aside) == 1 and (aside[0] / "summary.json").exists()  # the damaged run kept, not lost


@pytest.mark.run
def test_a_mistyped_data_folder_is_one_line_and_the_corrected_command_runs(tmp_path, sample_data):
    wrong = tmp_path / "smaple"
    out = ablate_cli(*_args(tmp_path / "r", wrong), check=False, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert str(wrong) in out.stderr and "--data" in out.stderr
    assert not run_dir(tmp_path / "r", "adhoc", "smoke", "baseline", 0).exists()  # nothing left behind
    fixed = ablate_cli(*_args(tmp_path / "r", sample_data), timeout=300)
    assert json.loads(fixed.stdout)["status"] == "completed"


@pytest.mark.run
def test_a_run_that_never_took_a_step_starts_again_with_other_settings(tmp_path, sample_data):
    broken = tmp_path / "broken"
    shutil.copytree(sample_data, broken)
    manifest = read_json(broken / "manifest.json")
    (broken / manifest["splits"]["train"]["shards"][0]["file"]).unlink()  # a valid folder, a shard gone
    out = ablate_cli(*_args(tmp_path / "r", broken), check=False, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    folder = run_dir(tmp_path / "r", "adhoc", "smoke", "baseline", 0)
    assert read_json(folder / "summary.json")["status"] == "failed"  # the attempt is recorded, one line
    assert "is missing" in read_json(folder / "summary.json")["error"]
    fixed = ablate_cli(*_args(tmp_path / "r", sample_data), timeout=300)  # other data, no --force
    assert json.loads(fixed.stdout)["status"] == "completed"
    assert read_json(folder / "config.json")["data_dir"] == str(sample_data.resolve())
    assert read_json(folder / "summary.json")["error"] is None
    # a run that took steps is still never replaced by other settings
    before = _snapshot(folder)
    again = ablate_cli(*_args(tmp_path / "r", broken), check=False, timeout=300)
    assert again.returncode == 2 and "different config (differs in: data_dir)" in again.stderr
    assert _snapshot(folder) == before
