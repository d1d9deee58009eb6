"""Reading and writing `eval.json`; torch-free and harness-free, so the analysis can read it anywhere.

Layout of RUN_DIR/eval.json::

    {"tasks": {"hellaswag": {
        "settings": {"task_version": 1.0, "lm_eval_version": "0.4.13", "limit": null, "num_fewshot": 0,
                     "data": "hub:Rowan/hellaswag"},
        "metrics": {"acc": {"value": 0.29, "stderr": 0.0045, "higher_is_better": true}, "acc_norm": {...}},
        "weights_sha256": "...", "bootstrap_iters": 100000, "samples": {"original": 10042, "effective": 10042},
        "evaluated_at": "2025-...", "seconds": 812.3}}}

`settings` is what must agree for two runs' numbers to be compared (a pair evaluated under other
settings is unmatched); the weights' hash and the bootstrap count only decide whether a rerun must
recompute. Each task carries its own settings, so tasks evaluated at different times never mix.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from ablate.errors import AblateError
from ablate.evals import EVAL_FILE
from ablate.store import read_json

SETTINGS_KEYS = ("task_version", "lm_eval_version", "limit", "num_fewshot", "data")


def read_eval(run_folder: str | os.PathLike) -> dict:
    """The run's eval.json, or an empty one ({"tasks": {}}) when it has none."""
    path = Path(run_folder) / EVAL_FILE
    if not path.is_file():
        return {"tasks": {}}
    data = read_json(path)
    data.setdefault("tasks", {})
    return data


def settings_fingerprint(settings: dict) -> str:
    """A short stable hash of a task's settings: equal fingerprints ⇔ comparable numbers."""
    canonical = json.dumps({key: settings.get(key) for key in SETTINGS_KEYS}, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def split_metric(name: str) -> tuple[str, str]:
    """`hellaswag/acc_norm` → ("hellaswag", "acc_norm")."""
    task, slash, metric = str(name).partition("/")
    if not slash or not task or not metric:
        raise AblateError(f"metric {name!r} is not TASK/METRIC (e.g. hellaswag/acc_norm, wikitext/word_perplexity)")
    return task, metric


def metric_names(run_folder: str | os.PathLike) -> list[str]:
    """Every TASK/METRIC the run's eval.json holds, sorted."""
    tasks = read_eval(run_folder)["tasks"]
    return sorted(f"{task}/{metric}" for task, entry in tasks.items() for metric in entry.get("metrics", {}))


def available_metrics(run_folders) -> list[str]:
    """TASK/METRIC names found in any of the run folders' eval.json, sorted."""
    return sorted({name for folder in run_folders for name in metric_names(folder)})


def check_metric(name: str, run_folders) -> tuple[str, str]:
    """(task, metric) when some run has it; otherwise a clear error naming the metrics there are."""
    task, metric = split_metric(name)
    valid = available_metrics(run_folders)
    if name not in valid:
        shown = ", ".join(valid) if valid else "none (no run has an eval.json: run `ablate eval` first)"
        raise AblateError(f"unknown metric {name!r}; valid metrics: {shown}")
    return task, metric


def read_metric(run_folder: str | os.PathLike, name: str) -> dict | None:
    """{"value", "stderr", "higher_is_better", "settings", "fingerprint"} of TASK/METRIC, or None if not evaluated."""
    task, metric = split_metric(name)
    entry = read_eval(run_folder)["tasks"].get(task)
    if not entry or metric not in entry.get("metrics", {}):
        return None
    row = entry["metrics"][metric]
    settings = {key: entry["settings"].get(key) for key in SETTINGS_KEYS}
    return {"value": row["value"], "stderr": row["stderr"], "higher_is_better": row["higher_is_better"],
            "settings": settings, "fingerprint": settings_fingerprint(settings)}


def is_current(entry: dict | None, settings: dict, weights_sha256: str, bootstrap_iters: int) -> bool:
    """Whether a stored task entry already holds what a rerun with these settings would compute."""
    return bool(entry) and entry.get("settings") == settings and entry.get("weights_sha256") == weights_sha256 \
        and entry.get("bootstrap_iters") == bootstrap_iters and bool(entry.get("metrics"))


def task_entry(results: dict, task: str, settings: dict, **extra) -> dict:
    """One task's entry from `lm_eval.simple_evaluate`'s output: every metric with its stderr and direction.

    The harness keys metrics as `<metric>,<filter>` and stderrs as `<metric>_stderr,<filter>`
    ("N/A" when it has none); the filter is dropped when it is the default `none`.
    """
    scores = results["results"][task]
    directions = results.get("higher_is_better", {}).get(task, {})
    metrics = {}
    for key, value in scores.items():
        metric, comma, filt = key.partition(",")
        if not comma or metric.endswith("_stderr") or key == "alias":
            continue
        stderr = scores.get(f"{metric}_stderr,{filt}")
        name = metric if filt == "none" else key
        metrics[name] = {"value": _number(value), "stderr": _number(stderr), "higher_is_better": directions.get(metric)}
    if not metrics:
        raise AblateError(f"lm-eval returned no metric for {task}")
    samples = results.get("n-samples", {}).get(task)
    return {"settings": settings, "metrics": metrics, "samples": samples, **extra}


def _number(value) -> float | None:
    """The harness writes "N/A" for a missing stderr; NaN cannot pair either."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
