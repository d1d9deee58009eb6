"""`--logger wandb` across an interruption: one W&B run id for every segment, no step logged twice.

W&B runs offline here (WANDB_MODE=offline, no account, no network). Offline, W&B ignores `resume` and writes
one folder per segment (`offline-run-<time>-<id>`), which `wandb sync` uploads into the run of that id. The
test reads each segment's `.wandb` file, W&B's own record log: wandb 0.31 has no Python reader for it any
more (its Go core reads it), so `wandb_records` below reads the log framing (LevelDB's log format: 32 KiB
blocks, records with a CRC-32 of their type and data, checked) and parses every record with W&B's own
protobuf, `wandb.proto.wandb_internal_pb2.Record`.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

from wandb.proto.wandb_internal_pb2 import Record

from ablate.store import read_json, read_metrics, run_dir
from datafix import REPO
import pytest

pytestmark = pytest.mark.system

BLOCK, HEADER = 32768, 7  # the log's block size; the file header (":W&B", magic, version) and a record header


def wandb_records(path: Path):
    """Every record of a `.wandb` file, each checked against its CRC-32."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B record log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # a block's tail too short for a header is padding
            pos += room
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += room
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        assert zlib.crc32(bytes([kind]) + chunk) == checksum, f"{path}: a damaged record at byte {pos}"
        pos += HEADER + length
        pending += chunk
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def segments(wandb_dir: Path) -> list[dict]:
    """Per offline segment, in order: its folder, the run id and name it logged under, and its logged steps."""
    found = []
    for folder in sorted(wandb_dir.glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        runs, steps = [], []
        for record in wandb_records(log):
            if record.HasField("run"):
                runs.append((record.run.run_id, record.run.display_name, record.run.project))
            elif record.HasField("history"):
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                steps.append(items["trainer/global_step"])
        found.append({"folder": folder.name, "runs": runs, "steps": steps})
    return found


def start(args, env, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(metrics: Path, step: int, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r.get("step", 0) >= step and "train_loss" in r for r in read_metrics(metrics)):
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.stderr.read()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError("timed out waiting for training progress")


def wandb_env(tmp_path: Path, wandb_dir: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    if wandb_dir is not None:
        env["WANDB_DIR"] = str(wandb_dir)
    return env


def interrupted_then_resumed(tmp_path, sample_data, steps, kill_at, how, wandb_dir, *extra) -> tuple[Path, dict, int]:
    """A smoke run logging to W&B, stopped by `how` once step `kill_at` is logged, then run again to the end.
    Returns the run folder, its summary and the last step metrics.jsonl held when the run was stopped."""
    results, cwd = tmp_path / "results", tmp_path / "cwd"
    cwd.mkdir()
    args = ["run", "--tier", "smoke", "--arm", "sink-logit", "--max-steps", steps, "--data", sample_data,
            "--no-progress", "--threads", "1", "--logger", "wandb", "--results", results, *extra]
    env = wandb_env(tmp_path, wandb_dir)
    folder = run_dir(results, "adhoc", "smoke", "sink-logit", 0)
    process = start(args, env, cwd)
    wait_for_step(folder / "metrics.jsonl", kill_at, process)
    process.send_signal(how)
    process.communicate(timeout=300)
    assert read_json(folder / "summary.json")["status"] == "running"  # stopped, not finished
    stopped_at = max(r["step"] for r in read_metrics(folder / "metrics.jsonl"))
    resumed = subprocess.run([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    assert not (cwd / "wandb").exists()  # nothing written into the working folder
    return folder, read_json(folder / "summary.json"), stopped_at


def test_sigterm_requeue_path_logs_both_segments_into_one_run_id_and_force_a_new_one(tmp_path, sample_data):
    """SIGTERM (like SLURM's warning signal): checkpoint at the step boundary, stop; the rerun resumes. Then
    `ablate run --force` starts a different run in the same folder: one id for both would merge them."""
    folder, summary, _ = interrupted_then_resumed(tmp_path, sample_data, 16, 4, signal.SIGTERM, tmp_path / "wb")
    assert summary["status"] == "completed" and summary["logger_run_id"]
    parts = segments(tmp_path / "wb" / "wandb")
    assert len(parts) == 2, parts  # offline: one folder per segment
    for part in parts:
        assert part["folder"].endswith("-" + summary["logger_run_id"])
        assert part["runs"] == [(summary["logger_run_id"], folder.as_posix(), "ablate")]
    first, second = parts[0]["steps"], parts[1]["steps"]
    assert first and second and max(first) < min(second)
    assert first + second == list(range(0, 17))  # every step once, in order, step 0's validation included
    logged = [r["step"] for r in read_metrics(folder / "metrics.jsonl")]
    assert logged == first + second  # the same rows as metrics.jsonl, the source of truth

    args = ["run", "--tier", "smoke", "--arm", "sink-logit", "--max-steps", "2", "--data", sample_data,
            "--no-progress", "--threads", "1", "--logger", "wandb", "--results", tmp_path / "results", "--force"]
    done = subprocess.run([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=tmp_path / "cwd",
                          env=wandb_env(tmp_path, tmp_path / "wb"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (aside,) = folder.parent.glob("seed0.old-*")
    old, new = read_json(aside / "summary.json")["logger_run_id"], read_json(folder / "summary.json")["logger_run_id"]
    assert old == summary["logger_run_id"] and new and old != new
    runs = [part["runs"] for part in segments(tmp_path / "wb" / "wandb") if part["folder"] not in
            {p["folder"] for p in parts}]
    assert runs == [[(new, folder.as_posix(), "ablate")]]  # the new run logged under its own id, once


def test_sigkill_after_a_checkpoint_sends_no_step_twice(tmp_path, sample_data):
    """SIGKILL two steps past the checkpoint at 8: the resumed run computes 9 and 10 again, and the logger,
    which was sent them, is not sent them a second time. Without WANDB_DIR, W&B's files go to the run folder.

    What W&B kept of the killed segment is up to W&B (offline, its core had not always flushed: the killed
    segment's log held only its header in one of our tries); metrics.jsonl holds every step.
    """
    folder, summary, stopped_at = interrupted_then_resumed(tmp_path, sample_data, 20, 10, signal.SIGKILL, None,
                                                           "--checkpoint-interval", "4")
    assert summary["status"] == "completed" and stopped_at >= 10
    parts = segments(folder / "wandb")
    assert len(parts) == 2, parts
    first, second = parts[0]["steps"], parts[1]["steps"]
    assert parts[1]["runs"] == [(summary["logger_run_id"], folder.as_posix(), "ablate")]
    assert parts[0]["runs"] in ([], parts[1]["runs"])  # the killed segment: the same id, if W&B wrote it down
    assert second == list(range(stopped_at + 1, 21))  # steps 9..stopped_at were sent before the kill
    assert set(first) <= set(range(0, stopped_at + 1)) and len(set(first)) == len(first)
    assert [r["step"] for r in read_metrics(folder / "metrics.jsonl")] == list(range(0, 21))
