"""summary.json: its schema `RunSummary`, its one reader (`read_summary`), its writers, and what readers derive
from it (whether a run completed or is done, the hash of its final weights).

A run writes its summary as it goes (running, then completed, diverged or failed), so every field may be
absent: a summary written before a field existed reads with it None. Writing a field that is not declared
here is refused, so a misspelt field never reaches a run folder where no reader would find it. The file
holds what the writers give, as before the schema (`RunSummary` declares the fields; it is not what is written).
Every reader reads a `RunSummary`'s attributes, never the file's keys.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError
from ablate.identity import config_fingerprint
from ablate.runconfig import RunConfig
from ablate.store import (CHECKPOINTS, FINAL_WEIGHTS, SUMMARY, Status, atomic_write_json, file_sha256, read_json,
                          read_json_file)

RERUN = "rerun that run (`ablate run ... --force` keeps the damaged folder aside)"


@dataclass(frozen=True)
class RunSummary:
    # which run: as in its config.json
    tier: str | None = None
    arm: str | None = None
    seed: int | None = None
    experiment: str | None = None
    # where it stands: running, completed, diverged or failed (`ablate.store.Status`)
    status: str | None = None
    val_loss: float | None = None  # the final loss, over every prepared validation token up to the cap
    steps: int | None = None  # steps done so far
    total_steps: int | None = None
    tokens: int | None = None
    error: str | None = None  # why it failed or diverged
    diverged_step: int | None = None
    diverged_detected_at_step: int | None = None
    # fingerprints: what two paired runs must share
    init_fingerprint: str | None = None
    init_fingerprint_common: str | None = None  # the parameters whose shape does not depend on the MLP width
    data_fingerprint: str | None = None
    config_fingerprint: str | None = None  # of the config it trained with (`ablate.identity`)
    val_fingerprint: str | None = None
    val_tokens_evaluated: int | None = None
    data_dir: str | None = None
    data_id: str | None = None
    weights_sha256: str | None = None  # of the final weights, kept so that readers need not hash them
    arm_source: str | None = None  # the arm's identity, the code it trains (`ablate.arms.source`): "v2:<sha256>"
    arm_sources: list | None = None  # every arm identity the run trained under, in order (a resume's too)
    # the model
    params_total: int | None = None
    params_non_embedding: int | None = None
    params_arm_extra: int | None = None
    mlp_hidden: int | None = None
    match_params: bool | None = None
    # how it ran
    loss_read_every: int | None = None  # steps between the host's read-backs of the training loss
    git_commit: str | None = None
    versions: dict | None = None
    numerics_history: list | None = None  # every `versions["numerics"]` the run trained under, a resume's too
    started: str | None = None
    finished: str | None = None
    wall_seconds: float | None = None
    logger_run_id: str | None = None
    # an LR sweep's run: its loss on the selection split
    selection_loss: float | None = None
    selection_fingerprint: str | None = None
    # a task tier's run (`ablate.taskrun`)
    val_loss_auc: float | None = None
    val_accuracy: float | None = None
    absent_accuracy: float | None = None
    signature: dict | None = None
    received_junk_mask: bool | None = None  # True: its arm read the value-junk task's answer (the oracle control)

    @classmethod
    def from_dict(cls, summary: dict) -> RunSummary:
        """A summary.json, also one written before some fields existed (they read as None)."""
        check_summary_fields(summary)
        return cls(**summary)

    @classmethod
    def of(cls, summary: dict, source: str | os.PathLike = SUMMARY) -> RunSummary:
        """What a reader reads of a summary: its declared fields; one no RunSummary declares (written by another
        version of ablate) is left out, as the readers always left it. A declared field of another type than
        declared (hand-edited: status ["completed"], steps "40") is refused in one line naming `source` and the
        field, so no reader ends in a traceback over it."""
        fields = {key: value for key, value in summary.items() if key in SUMMARY_FIELDS}
        for name, value in fields.items():
            if not _of_type(value, SUMMARY_TYPES[name]):
                raise AblateError(f"{source}: field {name!r} holds {json_kind(value)} {str(value)[:40]!r}, not "
                                  f"{' or '.join(k.__name__ for k in SUMMARY_TYPES[name])}; {RERUN}")
        return cls(**fields)

    @property
    def empty(self) -> bool:
        """Nothing recorded: the run has no summary.json yet (or an empty one)."""
        return self == RunSummary()

    @property
    def completed(self) -> bool:
        """Completed *with* its final loss: the one kind of run a table counts and `ablate eval` scores."""
        loss = self.val_loss
        return self.status == Status.COMPLETED and isinstance(loss, (int, float)) and not isinstance(loss, bool) \
            and math.isfinite(loss)

    @property
    def done(self) -> bool:
        """Nothing left to train: it diverged, or completed with its final loss (a run completed without one
        resumes and evaluates). Not `finished`: that field is the time it ended."""
        return self.status == Status.DIVERGED or self.completed

    @property
    def tokens_trained(self) -> int | None:
        """The training tokens of the steps done so far (`RunConfig.tokens`), None when not recorded."""
        return self.tokens if isinstance(self.tokens, int) and not isinstance(self.tokens, bool) else None


SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(RunSummary))
# each field's declared types (besides null): read off the annotations, so the schema stays the one owner
SUMMARY_TYPES = {name: tuple(t for t in typing.get_args(hint) if t is not type(None))
                 for name, hint in typing.get_type_hints(RunSummary).items()}


def _of_type(value, kinds: tuple) -> bool:
    """Null, or one of `kinds`, a bool never read as a number, an int read as a float (JSON writes 3.0 as 3)."""
    if value is None:
        return True
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def json_kind(value) -> str:
    """A JSON value's kind in the file's words."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", dict: "an object",
             list: "a list"}
    return names.get(type(value), type(value).__name__)


def read_summary(folder: str | os.PathLike, way_out: str = RERUN) -> RunSummary:
    """A run folder's summary.json as a RunSummary (`RunSummary.of`); an empty one (status None) when it has none
    yet. A damaged file is one line naming it and `way_out`. Every reader of a run's summary reads it here."""
    path = Path(folder) / SUMMARY
    return RunSummary.of(read_json_file(path, way_out), path) if path.is_file() else RunSummary()


def numerics_history(previous: RunSummary, current: dict, resumed: bool) -> list:
    """What computed a run so far: the numerics of every process that trained it, in order, each once. A resumed
    run keeps those before it (an older summary without the list: its `versions`' numerics); a fresh one starts
    again with its own."""
    earlier = []
    if resumed:
        versions = previous.versions if isinstance(previous.versions, dict) else {}
        earlier = previous.numerics_history or [versions.get("numerics")]
    return [n for i, n in enumerate([*earlier, current]) if isinstance(n, dict) and n not in [*earlier, current][:i]]


def arm_history(previous: RunSummary, current: str, resumed: bool) -> list:
    """Every arm identity a run trained under, in order, each once: a resumed run keeps those before it (an older
    summary without the list: its `arm_source`); a fresh one starts again with its own."""
    earlier = (previous.arm_sources or [previous.arm_source]) if resumed else []
    return list(dict.fromkeys(a for a in [*earlier, current] if isinstance(a, str)))


def check_summary_fields(fields) -> None:
    """Refuse, in one line, a field that RunSummary does not declare."""
    for name in fields:
        if name not in SUMMARY_FIELDS:
            raise AblateError(f"unknown summary field {name!r}; valid fields: {', '.join(SUMMARY_FIELDS)}")


def write_summary(folder: str | os.PathLike, summary: dict) -> None:
    """The run's whole summary.json, written atomically."""
    check_summary_fields(summary)
    atomic_write_json(Path(folder) / SUMMARY, summary)


def update_summary(folder: str | os.PathLike, **fields) -> dict:
    """The run's summary.json with `fields` set (a new file when it has none), written atomically; the summary."""
    check_summary_fields(fields)
    path = Path(folder) / SUMMARY
    summary = read_json(path) if path.exists() else {}
    summary.update(fields)
    atomic_write_json(path, summary)
    return summary


# ---------------------------------------------------------------------------------------------- what runs write
def which_run(config: RunConfig) -> dict:
    """The summary's fields that say which run it is, as its config.json does."""
    return {"tier": config.tier, "arm": config.arm, "seed": config.seed, "experiment": config.experiment}


def started_summary(config: RunConfig, model: dict, *, made_by: tuple, started: str, data: tuple,
                    arm_source: str, arm_sources: list | None = None) -> dict:
    """What every run's summary says of what it is and what computed it, a corpus run's (written as it starts) and a
    task run's (written with its results) alike: which run, its budget, the fingerprint of its config, its model
    (`ablate.model.model_summary`: the initial weights' fingerprints and the counts), `made_by` (the commit and the
    stack's versions, `ablate.provenance`), `data` (the data folder, the data's id), and the arm's code (its identity
    now, and `arm_sources`: every one the run trained under, `arm_history`)."""
    (commit, run_versions), (data_dir, data_id) = made_by, data
    return {**which_run(config), "total_steps": config.steps, **model, "config_fingerprint": config_fingerprint(config),
            "match_params": bool(config.match_params), "git_commit": commit, "versions": run_versions,
            "started": started, "data_dir": data_dir, "data_id": data_id, "error": None, "arm_source": arm_source,
            "arm_sources": arm_sources or [arm_source]}


def completed_summary(config: RunConfig, val_loss: float, *, val: tuple, data_fingerprint: str, weights_sha256,
                      finished: str, wall_seconds: float) -> dict:
    """The fields a run sets as it completes, a corpus run's and a task run's alike (the one place "completed" is
    written): its final loss, all its steps and tokens, the validation set (`val`: its fingerprint and the tokens it
    scored), the data trained on, the final weights' hash and the clocks."""
    val_fingerprint, val_tokens_evaluated = val
    return {"status": Status.COMPLETED, "val_loss": val_loss, "steps": config.steps,
            "tokens": config.tokens(config.steps), "val_fingerprint": val_fingerprint,
            "val_tokens_evaluated": val_tokens_evaluated,
            "data_fingerprint": data_fingerprint, "finished": finished, "wall_seconds": wall_seconds,
            "weights_sha256": weights_sha256}


# ---------------------------------------------------------------------------------------------- the final weights
_HASHED: dict[tuple, str] = {}  # (path, inode, size, mtime) → sha256 of the weights of runs without a kept hash


def final_weights_sha256(folder: str | os.PathLike) -> str | None:
    """The SHA-256 of a completed run's final weights, None when the run has not completed with them.

    Training keeps it in summary.json (`weights_sha256`) when the run completes, so readers need not hash
    the weights. A run completed before it was kept, or weights saved by hand (a folder without a
    summary, as `ablate eval` accepts): checkpoints/model.pt is hashed when first read (once per process
    while the file is unchanged).
    """
    folder = Path(folder)
    summary = read_summary(folder) if (folder / SUMMARY).is_file() else None
    if summary is not None and summary.status != Status.COMPLETED:
        return None
    if summary is not None and isinstance(summary.weights_sha256, str):
        return summary.weights_sha256
    weights = folder / CHECKPOINTS / FINAL_WEIGHTS
    try:
        stat = weights.stat()
    except FileNotFoundError:
        return None
    key = (str(weights.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = file_sha256(weights)
    return _HASHED[key]


def verified_weights_sha256(folder: str | os.PathLike) -> str:
    """The SHA-256 of checkpoints/model.pt, checked to be the weights the run completed with: what every
    reader of a run's final weights (`ablate eval`, `probe`, `inject`) records beside its results, so that
    a result of other weights is never read as the run's. Refused in one line otherwise.

    The caller holds the run's lock (no `--force` can replace the run meanwhile). A folder without a
    summary holds weights saved by hand: its model.pt is the run's.
    """
    folder = Path(folder)
    summary = read_summary(folder) if (folder / SUMMARY).is_file() else None
    if summary is not None and not summary.completed:
        raise AblateError(f"run {folder} is {summary.status}, not completed with its final loss: only final "
                          "weights are read")
    weights = folder / CHECKPOINTS / FINAL_WEIGHTS
    if not weights.is_file():
        raise AblateError(f"{folder} has no trained weights ({weights} is missing): has the run completed?")
    found = file_sha256(weights)
    kept = summary.weights_sha256 if summary is not None else None
    if kept is not None and kept != found:
        raise AblateError(f"{weights} is not the weights the run completed with (summary.json keeps sha256 "
                          f"{str(kept)[:12]}…, the file has {found[:12]}…): rerun the run with "
                          "`ablate run ... --force`")
    return found
