"""The run store: one folder per (experiment, tier, arm, seed), written atomically.

Layout::

    RESULTS/<experiment>/<tier>/<arm>/seed<k>/
        config.json     the resolved run configuration (written before training starts)
        summary.json    status and final figures (rewritten atomically as the run progresses)
        metrics.jsonl   one JSON object per line: {"step", "tokens", ...metric: value}
        run.log         the training log
        checkpoints/    resumable training state (state.pt) and the final weights (model.pt)
    RESULTS/<experiment>/<tier>/<arm>/.seed<k>.lock   held by the one process writing that run
    RESULTS/<experiment>/<tier>/<arm>/lr<f>/seed<k>/  a run at f × the tier's lr (an LR sweep's run, or a
                                                      confirmatory run at an arm's best LR): the same files
    RESULTS/<experiment>/ledger.json   what dispatch submitted (job ids, times)
    RESULTS/<experiment>/report/       what `ablate report` writes

This module has no torch dependency: the analysis reads the store through it.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterator, Mapping

from ablate.errors import AblateError, writing
from ablate.identity import config_fingerprint

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
SUBMIT_LOCK = ".submit.lock"  # in RESULTS/<experiment>/: one submit (and ledger writer) at a time


class Status(StrEnum):
    """Where a run stands, as its summary.json says: written as the plain word (a `str`), compared as one."""

    COMPLETED = "completed"
    DIVERGED = "diverged"
    FAILED = "failed"
    RUNNING = "running"


STATUSES = tuple(Status)
_UMASK = os.umask(0)
os.umask(_UMASK)


# A name that becomes one path component: no separators, no `..`, nothing hidden.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SEED_DIR = re.compile(r"seed(0|[1-9][0-9]*)")  # exactly seed<k>: folders kept aside (seed0.old-…) never count


NAME_ROOM = 16  # the most ablate adds to a name to make a file or folder name of it (`eval-<tier>`, `<name>.py`)


@functools.lru_cache(maxsize=1)
def name_max() -> int:
    """The filesystem's longest file name (NAME_MAX, 255 on ext4, XFS, Lustre, NFS), 255 when it cannot say."""
    try:
        return int(os.pathconf(".", "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def check_name(kind: str, name: object) -> str:
    """`name` if it is safe as one folder name (letters, digits, . _ + -, not starting with . and no `..`),
    and short enough that every file or folder name made of it fits the filesystem's limit."""
    text = str(name)
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(text) or ".." in text:
        raise AblateError(f"invalid {kind} name {text!r}: use letters, digits and . _ + - (no path separators, "
                          "no '..', not starting with '.')")
    return check_name_length(kind, text)


def check_name_length(kind: str, text: str) -> str:
    """`text` if every file or folder name made of it fits the filesystem's limit, else one line saying so (before
    any lookup that would end in `OSError: File name too long`)."""
    longest = name_max() - NAME_ROOM
    if len(text) > longest:
        raise AblateError(f"invalid {kind} name {text[:40]!r}… ({len(text)} characters): names are at most {longest} "
                          f"characters (the filesystem's limit of {name_max()} less {NAME_ROOM} for what ablate adds)")
    return text


def check_results_folder(results: str | os.PathLike) -> Path:
    """The results folder, refused in one line when it, or a folder above it, is a symbolic link to nothing
    (a scratch filesystem not mounted on this node): every run would look not yet submitted."""
    path = Path(results)
    for part in (path, *path.parents):
        if part.is_symlink() and not part.exists():
            raise AblateError(f"results folder {str(path)!r}: {part} is a symbolic link to {os.readlink(part)!r}, "
                              "which does not exist here (is its filesystem mounted on this node?)")
    return path


def experiment_dir(results: str | os.PathLike, experiment) -> Path:
    """RESULTS/<experiment>: the folder of an experiment's runs, its ledger and its report."""
    return check_results_folder(results) / check_name("experiment", experiment.name)


def run_key(tier: str, arm: str, seed: int, lr_factor: float | None = None, seq_len: int | None = None) -> str:
    """<tier>/<arm>/seed<k> (…/<arm>/lr<f>/seed<k> at f × the tier's lr; …/<arm>/T<n>/[lr<f>/]seed<k> at a sequence
    length n other than the tier's): a run's name in its experiment folder."""
    lr = "" if lr_factor is None else f"{lr_folder(lr_factor)}/"
    length = "" if seq_len is None else f"{seq_len_folder(seq_len)}/"
    return f"{tier}/{arm}/{length}{lr}seed{int(seed)}"


def run_dir(results: str | os.PathLike, experiment: str, tier: str, arm: str, seed: int,
            lr_factor: float | None = None, seq_len: int | None = None) -> Path:
    """RESULTS/<experiment>/<tier>/<arm>/seed<k>, or …/<arm>/lr<f>/seed<k> for a run at f × the tier's lr, or
    …/<arm>/T<n>/seed<k> for a run at sequence length n (not the tier's); every part is checked, so the folder lies
    inside RESULTS."""
    if isinstance(seed, bool) or int(seed) != seed or int(seed) < 0:
        raise AblateError(f"invalid seed {seed!r}: seeds are integers >= 0")
    check_name("tier", tier), check_name("arm", arm), lr_factor is None or check_name("lr factor", lr_folder(lr_factor))
    seq_len is None or check_name("sequence length", seq_len_folder(seq_len))
    return check_results_folder(results) / check_name("experiment", experiment) / run_key(tier, arm, seed, lr_factor,
                                                                                           seq_len)


@dataclass(frozen=True)
class RunName:
    """Which run a run folder holds, as its path names it (`run_of`): what `run_dir` makes a folder of."""

    experiment: str
    tier: str
    arm: str
    seed: int
    lr_factor: float | None = None
    seq_len: int | None = None  # a run at a sequence length other than its tier's (`ablate run --seq-len`)

    @property
    def key(self) -> str:
        return run_key(self.tier, self.arm, self.seed, self.lr_factor, self.seq_len)


def run_of(folder: str | os.PathLike) -> RunName:
    """The inverse of `run_dir`: RESULTS/<experiment>/<tier>/<arm>/[T<n>/][lr<f>/]seed<k> → its RunName. Every
    reader that needs a run's name from its folder asks here, so none parses paths by hand; a folder not named as a
    run (seed0.old-…, a copy elsewhere) is refused in one line."""
    path = Path(folder)
    factor = lr_factor_of(path)
    above = path.parent.parent if factor is not None else path.parent
    length = seq_len_of(above / "seed0")
    arm_dir = above.parent if length is not None else above
    found = SEED_DIR.fullmatch(path.name)
    if not found or len(arm_dir.parts) < 3:
        raise AblateError(f"{str(folder)!r} is not a run folder "
                          "(RESULTS/<experiment>/<tier>/<arm>[/T<n>][/lr<f>]/seed<k>)")
    return RunName(arm_dir.parent.parent.name, arm_dir.parent.name, arm_dir.name, int(found.group(1)), factor, length)


SEQ_DIR = re.compile(r"T([1-9][0-9]*)")


def seq_len_folder(seq_len: int) -> str:
    """The folder of the runs at sequence length n, not the tier's: T1024, T4096 (between the arm and seed<k>, or
    the arm and lr<f>)."""
    if isinstance(seq_len, bool) or int(seq_len) != seq_len or int(seq_len) < 1:
        raise AblateError(f"invalid sequence length {seq_len!r}: a positive integer")
    return f"T{int(seq_len)}"


def seq_len_of(folder: str | os.PathLike) -> int | None:
    """The sequence length a run folder's parent names (…/T2048/seed<k> → 2048), None for a run at its tier's."""
    found = SEQ_DIR.fullmatch(Path(folder).parent.name)
    return int(found.group(1)) if found else None


LR_DIR = re.compile(r"lr([0-9][0-9.e+-]*)")


def lr_folder(factor: float) -> str:
    """The folder of the runs at `factor` × the tier's lr: lr0.25, lr1, lr8 (between the arm and seed<k>)."""
    return f"lr{float(factor):g}"


def lr_factor_of(folder: str | os.PathLike) -> float | None:
    """The lr factor a run folder's parent names (…/lr0.5/seed<k> → 0.5), None for a grid run's folder."""
    found = LR_DIR.fullmatch(Path(folder).parent.name)
    try:
        return float(found.group(1)) if found else None
    except ValueError:
        return None


def iter_lr_run_dirs(experiment_dir: str | os.PathLike, holding: str = SUMMARY) -> Iterator[Path]:
    """Every run folder at an lr factor (`<tier>/<arm>/lr<f>/seed<k>`) holding `holding`, sorted. The grid's
    readers (`iter_run_dirs`) never see them: a sweep run is not a seed of the grid."""
    root = Path(experiment_dir)
    yield from sorted(p.parent for p in root.glob(f"*/*/lr*/seed*/{holding}")
                      if p.is_file() and SEED_DIR.fullmatch(p.parent.name) and lr_factor_of(p.parent) is not None
                      and not any(part.startswith(".") for part in p.parent.relative_to(root).parts))


def keep_aside(folder: str | os.PathLike) -> Path:
    """Move a run folder aside as `<seed folder>.old-<time>` (the store ignores it): what `--force` and
    `submit --rerun-stale` do to a run before training it again. Never deletes. The caller holds the run's lock."""
    folder = Path(folder)
    aside = folder.with_name(f"{folder.name}.old-{datetime.datetime.now():%Y%m%d-%H%M%S-%f}")
    folder.rename(aside)
    return aside


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
    with writing(path):
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


def refuse_damaged_config(folder: str | os.PathLike, summary) -> None:
    """The one refusal every reader of a run's settings gives when its config.json disagrees with the
    fingerprint it trained with (`config_disagreement`): the tables, the LR sweep and the tuned pairs."""
    damaged = config_disagreement(folder, summary)
    if damaged:
        raise AblateError(f"run {folder} is damaged: {damaged}; put its {CONFIG} back, rerun it (`ablate run ... "
                          "--force` keeps the damaged folder aside) or move the folder out of the experiment")


def config_disagreement(folder: str | os.PathLike, summary) -> str | None:
    """Why a run's config.json is not the configuration it trained with, or None.

    summary.json's `config_fingerprint` is computed by training from the configuration it ran; config.json
    is what every reader compares settings with. A hand-edited config.json (`"steps": 2 → 3`) would make a
    2-step run read as a 3-step one, so every reader (the tables, the report, status) recomputes the
    fingerprint from config.json and calls a run whose two files disagree damaged. A run recorded before
    the fingerprint existed, or without a config.json, cannot be checked here: the tables refuse it as
    unverified (`--allow-unverified` counts it, named in the footer).
    """
    recorded = summary.config_fingerprint  # of a RunSummary (`ablate.store_summary.read_summary`)
    path = Path(folder) / CONFIG
    if recorded is None or not path.is_file():
        return None
    try:
        config = read_json_file(path, "")
    except AblateError:
        return f"its {CONFIG} is damaged (not a JSON object)"
    if not isinstance(recorded, str):
        return f"summary.json's config_fingerprint is {recorded!r}, not a fingerprint"
    found = config_fingerprint(config)
    if found != recorded:
        return (f"its {CONFIG} is not the configuration it trained with (its fingerprint {found[:12]}… differs from "
                f"summary.json's config_fingerprint {recorded[:12]}…: {CONFIG} was edited after the run?)")
    return None


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


# ---------------------------------------------------------------------------------------------- the ledger
@dataclass(frozen=True)
class LedgerEntry:
    """One entry of the ledger's `runs`: a run (key `run_key`) or its evaluation (`eval:` + the run's key), how it
    was submitted and what became of it. Its one reader (`of`: an older ledger's entry too, a field it lacks read as
    the default here) and its one writer (`to_dict`, what ledger.json holds: the fields each writer gives, as the
    ledger always held them)."""

    executor: str | None = None  # "slurm" or "local"
    job_id: str | None = None  # SLURM's (`54_3`), or `local-<pid>` once a local worker took the run
    folder: str | None = None  # a SLURM job's submitit log folder
    submission: str | None = None  # the local submit that queued it (its submit lock's token)
    tasks: tuple[str, ...] | None = None  # an evaluation's tasks
    submitted: str | None = None  # when (ISO time)
    pid: int | None = None  # the local worker process that took it
    exit_code: int | None = None  # a local run's end
    error: str | None = None
    interrupted: bool = False  # a local run stopped by Ctrl-C (resumable)
    outcome: str | None = None  # a local evaluation's: "evaluated" or "failed: …"

    @classmethod
    def of(cls, entry: dict) -> LedgerEntry:
        """The entry as ledger.json holds it (fields of other versions left aside)."""
        known = {k: v for k, v in entry.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, **({"tasks": tuple(known["tasks"])} if known.get("tasks") is not None else {})})

    def to_dict(self) -> dict:
        """What ledger.json holds (its keys sorted when written): the fields given; a queued run's job_id and an ended
        run's error are written even when None, as the ledger always held them."""
        written = {"job_id": self.executor is not None and self.tasks is None, "error": self.exit_code is not None}
        return {name: list(value) if isinstance(value, tuple) else value
                for name in self.__dataclass_fields__
                if (value := getattr(self, name)) is not None and value is not False or written.get(name)}

    @property
    def submitted_at(self) -> datetime.datetime:
        """When it was submitted (an entry without the time: long ago)."""
        return datetime.datetime.fromisoformat(self.submitted or "1970-01-01T00:00:00")


@dataclass(frozen=True)
class Ledger:
    """RESULTS/<experiment>/ledger.json as read (`read_ledger`): each run's entry, and every submission's record
    (one per array or local grid; the sequential and fixed designs read their own, `ablate.sequential`,
    `ablate.design`)."""

    runs: Mapping[str, LedgerEntry]
    submissions: tuple[dict, ...]

    def submitted_with(self, key: str) -> tuple[str | None, str | None, str | None, bool]:
        """(executor, profile, data folder, --document-mask) the run `key` was last submitted with: what resubmits
        it the same way."""
        executor = self.runs[key].executor if key in self.runs else None
        submission = next((s for s in reversed(self.submissions) if isinstance(s, dict)
                           and s.get("executor") == executor and key in s.get("runs", [])), {})
        return executor, submission.get("profile"), submission.get("data"), bool(submission.get("document_mask"))


def read_ledger(folder: Path) -> Ledger:
    """RESULTS/<experiment>/ledger.json: what was submitted (job ids, times); empty when nothing was."""
    ledger = _ledger_file(folder)
    return Ledger({key: LedgerEntry.of(entry) for key, entry in ledger["runs"].items()}, tuple(ledger["submissions"]))


def _ledger_file(folder: Path) -> dict:
    """ledger.json's contents, checked: what `read_ledger` types and `record_ledger` updates."""
    path = folder / LEDGER
    if not path.exists():
        return {"runs": {}, "submissions": []}
    ledger = read_json_file(path, "move it aside (the runs' own folders keep their results; SLURM jobs it lists "
                                  "keep running) and submit again")
    if not isinstance(ledger.get("runs"), dict) or not isinstance(ledger.get("submissions"), list):
        raise AblateError(f"{path} is damaged (no 'runs' or 'submissions'); move it aside and submit again")
    for key, entry in ledger["runs"].items():
        why = _entry_damage(entry)
        if why:
            raise AblateError(f"{path} is damaged: its entry runs[{key!r}] {why}; move the ledger aside (the runs' own "
                              "folders keep their results; SLURM jobs it lists keep running) and submit again")
    return ledger


def _entry_damage(entry: object) -> str | None:
    """Why a ledger run entry cannot be read (status and submit read its fields), or None."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an object"
    if entry.get("executor") == "slurm":
        absent = [k for k in ("job_id", "folder") if not isinstance(entry.get(k), str)]
        if absent:
            return f"is a SLURM job without {' and '.join(absent)}"
    if "submitted" in entry:
        try:
            datetime.datetime.fromisoformat(entry["submitted"])
        except (TypeError, ValueError):
            return f"has submitted {entry['submitted']!r}, not a time"
    return None


_LEDGER_LOCK = threading.Lock()  # local runs start from several threads: one read-modify-write at a time


def record_ledger(folder: Path, entries: Mapping[str, LedgerEntry], submission: dict | None = None,
                  merge: bool = False) -> None:
    """Update the ledger (the caller holds the experiment's submit lock; threads take turns here).

    Each entry replaces the run's entry, or with `merge` adds its fields to it (the others' entries are written
    back as they were read)."""
    with _LEDGER_LOCK:
        ledger = _ledger_file(folder)
        for key, entry in entries.items():
            ledger["runs"][key] = {**ledger["runs"].get(key, {}), **entry.to_dict()} if merge else entry.to_dict()
        if submission is not None:
            ledger["submissions"].append(submission)
        atomic_write_json(folder / LEDGER, ledger)

