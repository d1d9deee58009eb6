"""The run store: one folder per (experiment, tier, arm, seed), written atomically.

Layout::

    RESULTS/<experiment>/<tier>/<arm>/seed<k>/
        config.json     the resolved run configuration (written before training starts)
        summary.json    status and final figures (rewritten atomically as the run progresses)
        metrics.jsonl   one JSON object per line: {"step", "tokens", ...metric: value}
        checkpoints/    resumable training state
    RESULTS/<experiment>/ledger.json   what dispatch submitted (job ids, times)
    RESULTS/<experiment>/report/       what `ablate report` writes

This module has no torch dependency: the analysis reads the store through it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

CONFIG = "config.json"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LEDGER = "ledger.json"
STATUSES = ("completed", "diverged", "failed", "running")
_UMASK = os.umask(0)
os.umask(_UMASK)


def run_dir(results: str | os.PathLike, experiment: str, tier: str, arm: str, seed: int) -> Path:
    return Path(results) / experiment / tier / arm / f"seed{int(seed)}"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; a shared run store must stay readable
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def read_json(path: str | os.PathLike) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete lines of a metrics.jsonl (a torn last line from a killed writer is skipped)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def iter_run_dirs(experiment_dir: str | os.PathLike) -> Iterator[Path]:
    """Every run folder (one holding a summary.json) under an experiment folder, sorted."""
    root = Path(experiment_dir)
    yield from sorted(p.parent for p in root.glob(f"*/*/seed*/{SUMMARY}"))
