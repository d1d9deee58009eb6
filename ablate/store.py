"""The run store: one folder per (experiment, tier, arm, seed), written atomically.

Layout::

    RESULTS/<experiment>/<tier>/<arm>/seed<k>/
        config.json     the resolved run configuration (written before training starts)
        summary.json    status and final figures (rewritten atomically as the run progresses)
        metrics.jsonl   one JSON object per line: {"step", "tokens", ...metric: value}
        run.log         the training log
        checkpoints/    resumable training state (state.pt) and the final weights (model.pt)
    RESULTS/<experiment>/<tier>/<arm>/.seed<k>.lock   held by the one process writing that run
    RESULTS/<experiment>/ledger.json   what dispatch submitted (job ids, times)
    RESULTS/<experiment>/report/       what `ablate report` writes

This module has no torch dependency: the analysis reads the store through it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from ablate.errors import AblateError

CONFIG = "config.json"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
FINAL_WEIGHTS = "model.pt"  # in RUN_DIR/checkpoints/: the weights at the end of training
LEDGER = "ledger.json"
RUN_LOG = "run.log"
STATE = "state.pt"  # in RUN_DIR/checkpoints/: everything needed to resume (removed once the run completes)
PROBE_FILE = "probe.json"  # `ablate probe`: sink diagnostics of the final weights
HEATMAP_FILE = "probe_first_key_mass.png"
INJECT_FILE = "inject.json"  # `ablate inject`: junk injection into quiet reads
EVAL_FILE = "eval.json"  # `ablate eval`: downstream scores of the final weights
EVAL_ITEMS_DIR = "eval_items"  # RUN_DIR/eval_items/<task>.jsonl: `ablate eval`'s per-item results
REPORT_DIR = "report"  # RESULTS/<experiment>/report/: what `ablate report` writes
SYNTHETIC_DIR = "synthetic"  # RESULTS/<experiment>/synthetic/: `ablate synthetic --out`
SYNTHETIC_FILE = "synthetic.json"
SUBMIT_LOCK = ".submit.lock"  # in RESULTS/<experiment>/: one submit (and ledger writer) at a time
STATUSES = ("completed", "diverged", "failed", "running")
_UMASK = os.umask(0)
os.umask(_UMASK)


# A name that becomes one path component: no separators, no `..`, nothing hidden.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SEED_DIR = re.compile(r"seed(0|[1-9][0-9]*)")  # exactly seed<k>: folders kept aside (seed0.old-…) never count


def check_name(kind: str, name: object) -> str:
    """`name` if it is safe as one folder name (letters, digits, . _ + -, not starting with . and no `..`)."""
    text = str(name)
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(text) or ".." in text:
        raise AblateError(f"invalid {kind} name {text!r}: use letters, digits and . _ + - (no path separators, "
                          "no '..', not starting with '.')")
    return text


def experiment_dir(results: str | os.PathLike, experiment) -> Path:
    """RESULTS/<experiment>: the folder of an experiment's runs, its ledger and its report."""
    return Path(results) / check_name("experiment", experiment.name)


def run_key(tier: str, arm: str, seed: int) -> str:
    """<tier>/<arm>/seed<k>: a run's name within its experiment (the ledger's key, the path under its folder)."""
    return f"{tier}/{arm}/seed{int(seed)}"


def run_dir_of(results: str | os.PathLike, spec) -> Path:
    """The run folder of a `RunSpec` (its experiment, tier, arm and seed) under RESULTS (`run_dir`)."""
    return run_dir(results, spec.experiment, spec.tier, spec.arm, spec.seed)


def run_dir(results: str | os.PathLike, experiment: str, tier: str, arm: str, seed: int) -> Path:
    """RESULTS/<experiment>/<tier>/<arm>/seed<k>; every part is checked, so the folder lies inside RESULTS."""
    if isinstance(seed, bool) or int(seed) != seed or int(seed) < 0:
        raise AblateError(f"invalid seed {seed!r}: seeds are integers >= 0")
    check_name("tier", tier), check_name("arm", arm)
    return Path(results) / check_name("experiment", experiment) / run_key(tier, arm, seed)


def run_lock_path(folder: str | os.PathLike) -> Path:
    """The lock of a run folder lies beside it, so that `--force` can move the folder while holding it."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


def remove_stray_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files an interrupted `atomic_write_bytes` left in `folder` (not recursive)."""
    removed = []
    for stray in Path(folder).glob(".*.tmp"):
        stray.unlink(missing_ok=True)
        removed.append(stray)
    return removed


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


def read_json_file(path: str | os.PathLike, way_out: str, kind: type = dict) -> Any:
    """read_json for files the harness wrote: a damaged file is an AblateError naming it and the way out."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:
        raise AblateError(f"{path} is damaged ({err.__class__.__name__}: {err}); {way_out}") from None
    if not isinstance(value, kind):
        raise AblateError(f"{path} is damaged (it holds a {type(value).__name__}, not a {kind.__name__}); {way_out}")
    return value


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


def completed(summary: dict) -> bool:
    """Completed *with* its final loss: the one kind of run a table counts and `ablate eval` scores."""
    loss = summary.get("val_loss")
    return summary.get("status") == "completed" and isinstance(loss, (int, float)) and not isinstance(loss, bool) \
        and math.isfinite(loss)


def finished(summary: dict) -> bool:
    """A run is done when it diverged, or completed with its final loss (a run completed without one
    resumes and evaluates)."""
    return summary.get("status") == "diverged" or completed(summary)


def is_run_dir(folder: str | os.PathLike) -> bool:
    """Whether `folder` is named as a run of the grid, `<tier>/<arm>/seed<k>`, with no hidden part.

    Only folders named exactly `seed<k>` count: a run kept aside by `--force` (`seed0.old-…`) or a copy
    under another name is not a run of the grid and must never be counted as one.
    """
    folder = Path(folder)
    return (bool(SEED_DIR.fullmatch(folder.name)) and not folder.parent.name.startswith(".")
            and not folder.parent.parent.name.startswith("."))


def iter_run_dirs(experiment_dir: str | os.PathLike, holding: str = SUMMARY) -> Iterator[Path]:
    """Every run folder (`<tier>/<arm>/seed<k>`, `is_run_dir`) under an experiment folder holding the file
    `holding` (its summary.json by default; a probe's or an evaluation's file for their readers), sorted.

    Every reader of the store finds runs through this function, so that all of them count the same runs.
    """
    root = Path(experiment_dir)
    yield from sorted(p.parent for p in root.glob(f"*/*/seed*/{holding}") if is_run_dir(p.parent) and p.is_file())


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


_HASHED: dict[tuple, str] = {}  # (path, inode, size, mtime) → sha256 of the weights of runs without a kept hash


def final_weights_sha256(folder: str | os.PathLike) -> str | None:
    """The SHA-256 of a completed run's final weights, None when the run has not completed with them.

    Training keeps it in summary.json (`weights_sha256`) when the run completes, so readers need not hash
    the weights. A run completed before it was kept, or weights saved by hand (a folder without a
    summary, as `ablate eval` accepts): checkpoints/model.pt is hashed when first read (once per process
    while the file is unchanged).
    """
    folder = Path(folder)
    path = folder / SUMMARY
    summary = read_json_file(path, "rerun that run (`ablate run ... --force` keeps the damaged folder aside)") \
        if path.is_file() else None
    if summary is not None and summary.get("status") != "completed":
        return None
    if summary is not None and isinstance(summary.get("weights_sha256"), str):
        return summary["weights_sha256"]
    weights = folder / CHECKPOINTS / FINAL_WEIGHTS
    try:
        stat = weights.stat()
    except FileNotFoundError:
        return None
    key = (str(weights.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = file_sha256(weights)
    return _HASHED[key]


# ---------------------------------------------------------------------------------------------- the ledger
def read_ledger(folder: Path) -> dict:
    """RESULTS/<experiment>/ledger.json: what was submitted (job ids, times); empty when nothing was."""
    path = folder / LEDGER
    if not path.exists():
        return {"runs": {}, "submissions": []}
    ledger = read_json_file(path, "move it aside (the runs' own folders keep their results; SLURM jobs it lists "
                                  "keep running) and submit again")
    if not isinstance(ledger.get("runs"), dict) or not isinstance(ledger.get("submissions"), list):
        raise AblateError(f"{path} is damaged (no 'runs' or 'submissions'); move it aside and submit again")
    return ledger


_LEDGER_LOCK = threading.Lock()  # local runs start from several threads: one read-modify-write at a time


def record_ledger(folder: Path, entries: dict, submission: dict | None = None, merge: bool = False) -> None:
    """Update the ledger (the caller holds the experiment's submit lock; threads take turns here).

    Each entry replaces the run's entry, or with `merge` adds its fields to it."""
    with _LEDGER_LOCK:
        ledger = read_ledger(folder)
        for key, entry in entries.items():
            ledger["runs"][key] = {**ledger["runs"].get(key, {}), **entry} if merge else entry
        if submission is not None:
            ledger["submissions"].append(submission)
        atomic_write_json(folder / LEDGER, ledger)


def synthetic_results_path(experiment_dir: str | os.PathLike) -> Path:
    """Where `ablate synthetic --out EXPERIMENT_DIR` keeps its results (the report reads them)."""
    return Path(experiment_dir) / SYNTHETIC_DIR / SYNTHETIC_FILE
