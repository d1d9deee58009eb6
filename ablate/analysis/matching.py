"""Whether the runs of one source may share a table: matched pairs within a seed, one setting per row.

Two checks, both before any table is built:

* within one (tier, seed), the runs of the arms form pairs: they must share the initial weights, the
  batches, every setting but the arm and the validation tokens (the fingerprints of FINGERPRINTS);
* within one tier, the runs of every seed are averaged into one row: they must share every setting but
  the arm and the seed (`settings_fingerprint`, from `ablate.identity.shared_config`), the training
  data (`data_id`, the shards' checksums: `data_dir` is only where they lay) and the validation tokens (and, for a
  downstream metric, the evaluation settings).

A refusal names what differs as plainly as it can: the settings themselves (`steps: 2 vs 3`) from the
runs' config.json when those differ, and the fingerprint only when the settings agree.
"""

from __future__ import annotations

from pathlib import Path

from ablate.analysis.runs import Runs
from ablate.arms.source import ARM_SOURCE, current_scheme
from ablate.errors import AblateError
from ablate.identity import config_differences, describe_differences
from ablate.store import CONFIG, read_json, run_key

FINGERPRINTS = ("init_fingerprint", "data_fingerprint", "config_fingerprint", "val_fingerprint")
SETTINGS = "settings_fingerprint"  # of shared_config: equal for every run of one tier
DATA_ID = "data_id"  # the training data's identity: equal for every run of one tier (older runs lack it)
# Within a seed: the settings first, so that a different step count is named as such and not as other batches.
PAIR_COLUMNS = ("config_fingerprint", "init_fingerprint", "data_fingerprint", "val_fingerprint")
ROW_COLUMNS = (SETTINGS, DATA_ID, "val_fingerprint")
ARM_COLUMNS = (ARM_SOURCE,)  # within one tier and arm: the seeds of a row trained the same arm's code
EVAL = "eval_fingerprint"
WAY_OUT = ("rerun one of them with the other's settings (`ablate run ... --force` keeps the old folder aside) or "
           "move it out of the experiment folder")


def check_matched(runs: Runs, allow_unverified: bool = False, with_eval: bool = False,
                  varied: tuple[str, ...] = ()) -> None:
    """Refuse a source in which two counted runs of one (tier, seed) differ in anything but the arm, or two
    counted runs of one tier in anything but the arm and the seed (and the `varied` keys the source's
    fingerprints leave out: an LR sweep's or a tuned table's `lr`)."""
    order = {arm: i for i, arm in enumerate(runs.arm_order)}
    completed = runs.completed
    if runs.root is not None and not allow_unverified:
        _refuse_unverified(completed)
    extra = (EVAL,) if with_eval else ()
    for by, columns, across in ((["tier", "seed"], PAIR_COLUMNS + extra, False),
                                (["tier"], ROW_COLUMNS + extra, True), (["tier", "arm"], ARM_COLUMNS, True)):
        for _, group in completed.group_by(by, maintain_order=True):
            rows = sorted(group.iter_rows(named=True), key=lambda r: (order.get(r["arm"], len(order)), r["seed"]))
            for row in rows[1:]:
                _check_pair(rows[0], row, columns, across, varied)


def _refuse_unverified(completed) -> None:
    for row in completed.iter_rows(named=True):
        absent = [c for c in FINGERPRINTS if row[c] is None]
        if absent:
            raise AblateError(
                f"run {row['path']} has no {', '.join(absent)} (a run made before they were recorded): its "
                "pairing cannot be verified. Rerun it, or pass --allow-unverified to pair it anyway (the "
                "table's footer then names it)")
        if row[SETTINGS] is None:
            raise AblateError(
                f"run {row['path']} has no {CONFIG}: its settings cannot be compared with the other runs of its "
                "tier. Rerun it (`ablate run ... --force` keeps the folder aside), or pass --allow-unverified to "
                "count it anyway (the table's footer then names it)")


def _check_pair(a: dict, b: dict, columns, across_seeds: bool, varied: tuple[str, ...] = ()) -> None:
    differing = [c for c in columns if a[c] is not None and b[c] is not None and a[c] != b[c]
                 and not (c == "init_fingerprint" and parameter_matched(a, b))
                 and not (c == ARM_SOURCE and current_scheme(a[c]) != current_scheme(b[c]))]  # schemes: not compared
    if not differing:
        return
    names = [_name(a), _name(b)]
    settings = [d for d in _settings_differences(a, b, across_seeds) if d[0] not in varied]
    if settings:
        what = ("the runs of one tier are averaged over seeds into one row, so they must differ only in the arm "
                "and the seed" if across_seeds else "a paired difference needs runs that differ only in the arm")
        raise AblateError(f"runs {names[0]} and {names[1]} are not matched: their settings differ "
                          f"({describe_differences(settings)}); {what}: {WAY_OUT}")
    raise AblateError(_mismatch(names, a, b, differing[0], across_seeds))


def parameter_matched(a: dict, b: dict) -> bool:
    """Two runs whose MLP widths differ (match_params) but whose common initial parameters are equal."""
    return (a["mlp_hidden"] is not None and b["mlp_hidden"] is not None and a["mlp_hidden"] != b["mlp_hidden"]
            and a["init_fingerprint_common"] is not None
            and a["init_fingerprint_common"] == b["init_fingerprint_common"])


def _name(row: dict) -> str:
    return row["path"] or run_key(row['tier'], row['arm'], row['seed'])


def _settings_differences(a: dict, b: dict, across_seeds: bool) -> list:
    """The settings two store runs differ in, from their config.json ([] for a table source or unreadable files)."""
    if not (a["path"] and b["path"]):
        return []
    try:
        return config_differences(read_json(Path(a["path"]) / CONFIG), read_json(Path(b["path"]) / CONFIG),
                                  across_seeds=across_seeds)
    except (OSError, ValueError, AttributeError):
        return []


def _mismatch(names: list[str], a: dict, b: dict, column: str, across_seeds: bool) -> str:
    text = (f"runs {names[0]} and {names[1]} are not matched: their {column} differs ({a[column][:12]}… vs "
            f"{b[column][:12]}…)")
    text += {
        "val_fingerprint": "; their final losses were measured on different validation tokens",
        "init_fingerprint": "; they did not start from the same initial weights",
        "data_fingerprint": "; they were not trained on the same batches",
        DATA_ID: ("; they were trained on different prepared data (data_id is the split's shard checksums, "
                  "whatever folder held them)"),
        EVAL: "; they were evaluated under other settings (task version, limit, data or lm-eval version)",
        ARM_SOURCE: ("; the arm's code (its class, what it reads and the modules of your own it imports: "
                     "`ablate.arms.source`) changed between them: two versions of an arm under one name"),
    }.get(column, "")
    if across_seeds:
        return text + (". The runs of one tier are averaged over seeds into one row, so they must differ only in the "
                       "arm and the seed")
    return text + ". A paired difference needs runs that differ only in the arm"
