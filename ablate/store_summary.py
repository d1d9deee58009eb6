"""summary.json's schema: `RunSummary`, one field per thing a run records about itself, and its writers.

A run writes its summary as it goes (running, then completed, diverged or failed), so every field may be
absent: a summary written before a field existed reads with it None. Writing a field that is not declared
here is refused, so a misspelt field never reaches a run folder where no reader would find it. The file
holds what the writers give, as before the schema (`RunSummary` declares the fields; it is not what is written).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError
from ablate.store import SUMMARY, atomic_write_json, read_json


@dataclass(frozen=True)
class RunSummary:
    # which run: as in its config.json
    tier: str | None = None
    arm: str | None = None
    seed: int | None = None
    experiment: str | None = None
    # where it stands: running, completed, diverged or failed (`ablate.status.STATUSES`)
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
    arm_source: str | None = None  # sha256 of the arm's code: its class's files and the registering one
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

    @classmethod
    def from_dict(cls, summary: dict) -> RunSummary:
        """A summary.json, also one written before some fields existed (they read as None)."""
        check_summary_fields(summary)
        return cls(**summary)


SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(RunSummary))


def numerics_history(previous: dict, current: dict, resumed: bool) -> list:
    """What computed a run so far: the numerics of every process that trained it, in order, each once. A resumed
    run keeps those before it (an older summary without the list: its `versions`' numerics); a fresh one starts
    again with its own."""
    earlier = []
    if resumed:
        earlier = previous.get("numerics_history") or [((previous.get("versions") or {}).get("numerics"))]
    return [n for i, n in enumerate([*earlier, current]) if isinstance(n, dict) and n not in [*earlier, current][:i]]


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
