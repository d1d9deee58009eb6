"""Shared test data: the shipped sample prepared once per test session (offline)."""

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def prepared_sample(root: Path) -> Path:
    """`ablate data prepare --source sample` into root/sample (a no-op when already there)."""
    from ablate.data import prepare

    return prepare("sample", root / "sample", progress_bar=False)


def ablate_cli(*args, cwd=None, env=None, check=True, timeout=600) -> subprocess.CompletedProcess:
    """Run the real `ablate` command in a fresh process (what a user types)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=cwd or REPO, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"ablate {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def ablate_on_path(root: Path, **extra) -> dict:
    """An environment whose PATH finds `ablate` (this checkout's, through root/bin/ablate), as a user's shell."""
    shim = root / "bin" / "ablate"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ablate.cli "$@"\n')
    shim.chmod(0o755)
    return {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1", **extra}
