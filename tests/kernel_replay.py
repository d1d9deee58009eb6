"""Replay the recorded smoke run (tests/recorded_smoke_run.json) in this process, under whatever kernel set
`ATEN_CPU_CAPABILITY` chose before torch loaded; print or record what it gives.

Why a script: torch picks its CPU kernel set once, at import, so each kernel set needs its own process
(`tests/test_kernel_sets.py` replays the machine's own set in the test's process, `replay_here`, and starts one
per other set). Usage (from the repository root):

    ATEN_CPU_CAPABILITY=avx2 .venv/bin/python tests/kernel_replay.py DATA_DIR OUT.json   # one replay
    .venv/bin/python tests/kernel_replay.py --record DATA_DIR       # re-record every set this CPU offers

`--record` rewrites tests/recorded_smoke_run.json's entries for the kernel sets this machine offers (and keeps
the others): do it only when a change is meant to change the numbers, and say so in the commit.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "tests" / "recorded_smoke_run.json"
FINGERPRINTS = ("init_fingerprint", "data_fingerprint", "val_fingerprint", "config_fingerprint")


def machine_kind() -> str:
    """Architecture and CPU vendor ("x86_64 GenuineIntel"): the same kernel set rounds differently on another
    vendor's CPU (measured: AVX2 on an AMD EPYC and on an Intel Xeon part at the second step), so a bitwise
    record is kept per (kernel set, machine kind)."""
    vendor = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("vendor_id", "CPU implementer")):
                vendor = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {vendor}"


def recorded_numbers(kernel_set: str) -> dict | None:
    """The record's numbers for `kernel_set` ("AVX2") on this machine kind, or None when none were recorded."""
    return json.loads(RECORD.read_text())["kernel_sets"].get(kernel_set, {}).get(machine_kind())


def kernel_sets_offered() -> list[str]:
    """The `ATEN_CPU_CAPABILITY` values this CPU can run, lowest first (x86-64: default, avx2, avx512)."""
    flags = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    except OSError:
        pass
    offered = ["default"]
    if platform.machine() in ("x86_64", "AMD64"):
        if {"avx2", "fma"} <= flags:
            offered.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            offered.append("avx512")
    return offered


def replay(data_dir: Path, results: Path) -> dict:
    """Train every recorded arm for the recorded steps (one thread unless OMP_NUM_THREADS says otherwise) and
    return, per arm, the numbers the record holds, with the kernel set torch ran them on."""
    import torch

    from ablate.experiment import RunSpec
    from ablate.store import read_metrics, run_dir
    from ablate.train import run

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    recorded = json.loads(RECORD.read_text())
    out = {"kernel_set": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(), "runs": {}}
    for arm in recorded["arms"]:
        spec = RunSpec("adhoc", recorded["tier"], arm, recorded["seed"], {"max_steps": recorded["steps"]})
        summary = run(spec, results, data_dir=str(data_dir), progress=False)
        rows = read_metrics(run_dir(results, "adhoc", recorded["tier"], arm, recorded["seed"]) / "metrics.jsonl")
        out["runs"][arm] = {
            **{key: getattr(summary, key) for key in FINGERPRINTS}, "val_loss": summary.val_loss,
            "train_loss": [r["train_loss"] for r in rows if "train_loss" in r],
            "grad_norm": [r["grad_norm"] for r in rows if "grad_norm" in r],
            "curve": [[r["step"], r["val_loss"]] for r in rows if "val_loss" in r],
            "summary_kernel_set": summary.versions["numerics"]["cpu_capability"],
        }
    return out


def replay_here(data_dir: Path, workdir: Path) -> dict:
    """`replay` in this process, on one thread, under the kernel set this process's torch runs (with no
    ATEN_CPU_CAPABILITY, the machine's own): its number of threads put back afterwards."""
    import torch

    threads, saved = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with tempfile.TemporaryDirectory(dir=workdir) as results:
            return replay(data_dir, Path(results))
    finally:
        torch.set_num_threads(threads)
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def replay_in_subprocess(kernel_set: str, data_dir: Path, workdir: Path, threads: int = 1) -> dict:
    """`replay` in a fresh process with ATEN_CPU_CAPABILITY=kernel_set (torch reads it once, at import)."""
    out = workdir / f"{kernel_set}-{threads}.json"
    from ablate.workers import cpu_training_env  # a training process's environment, as a local worker's

    env = {**cpu_training_env(), "ATEN_CPU_CAPABILITY": kernel_set, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, str(data_dir), str(out)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise AssertionError(f"replay under {kernel_set} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def record(data_dir: Path) -> None:
    """Replay under every kernel set offered here and write their numbers into the record."""
    recorded = json.loads(RECORD.read_text())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    from ablate.provenance import cpu_model

    with tempfile.TemporaryDirectory() as work:
        for kernel_set in kernel_sets_offered():
            result = replay_in_subprocess(kernel_set, data_dir, Path(work))
            recorded["kernel_sets"].setdefault(result["kernel_set"], {})[machine_kind()] = {
                "commit": commit, "cpu": cpu_model(),
                "runs": {arm: {k: v for k, v in numbers.items() if k != "summary_kernel_set"}
                         for arm, numbers in result["runs"].items()}}
    RECORD.write_text(json.dumps(recorded, indent=1) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if sys.argv[1] == "--record":
        record(Path(sys.argv[2]))
    else:
        with tempfile.TemporaryDirectory() as results:
            Path(sys.argv[2]).write_text(json.dumps(replay(Path(sys.argv[1]), Path(results))))
