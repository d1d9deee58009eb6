"""Reading and writing `eval.json`; torch-free and harness-free, so the analysis can read it anywhere.

Layout of RUN_DIR/eval.json::

    {"tasks": {"hellaswag": {
        "settings": {"task_version": 1.0, "lm_eval_version": "0.4.13", "limit": null, "num_fewshot": 0,
                     "data": "hub:Rowan/hellaswag"},
        "metrics": {"acc": {"value": 0.29, "stderr": 0.0045, "higher_is_better": true}, "acc_norm": {...}},
        "weights_sha256": "...", "bootstrap_iters": 100000, "samples": {"original": 10042, "effective": 10042},
        "batch_size": 16, "items": {"count": 10042, "sha256": "..."},
        "evaluated_at": "2025-...", "seconds": 812.3}}}

`settings` is what must agree for two runs' numbers to be compared (a pair evaluated under other
settings is unmatched); the bootstrap count only decides whether a rerun must recompute. `batch_size`
is an execution setting, recorded but never part of `settings`: scores do not depend on it (to float32
rounding). `items` names the per-item file RUN_DIR/eval_items/<task>.jsonl (`ablate.evals.items`). Each task
carries its own settings, so tasks evaluated at different times never mix.

`weights_sha256` ties a task's numbers to the weights they scored: the table, the report and `ablate
status` accept an entry only when it equals the run's final weights (`eval_problem`, the one place
that decides), so an eval.json copied from another run, or one written for weights since replaced by
`run --force`, is never paired as this run's score.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from ablate.errors import AblateError
from ablate.store import EVAL_FILE, read_json_file
from ablate.store_summary import final_weights_sha256

SETTINGS_KEYS = ("task_version", "lm_eval_version", "limit", "num_fewshot", "data")
GOLD = "gold_logprob"  # a per-item score (RUN/eval_items/), never a metric of eval.json: tables need --by-item


def read_eval(run_folder: str | os.PathLike) -> dict:
    """The run's eval.json, or an empty one ({"tasks": {}}) when it has none; a damaged one is refused."""
    path = Path(run_folder) / EVAL_FILE
    if not path.is_file():
        return {"tasks": {}}
    way_out = f"move it aside and run `ablate eval {run_folder} --tasks ...` again"
    data = read_json_file(path, way_out)
    data.setdefault("tasks", {})
    if not isinstance(data["tasks"], dict):
        raise AblateError(f"{path} is damaged ('tasks' is a {type(data['tasks']).__name__}, not an object); {way_out}")
    for task, entry in data["tasks"].items():
        for key in ("settings", "metrics"):
            if not isinstance(entry, dict) or not isinstance(entry.get(key), dict):
                raise AblateError(f"{path} is damaged (task {task!r} has no {key!r} object); {way_out}")
        if not all(isinstance(row, dict) and "value" in row for row in entry["metrics"].values()):
            raise AblateError(f"{path} is damaged (a metric of task {task!r} has no 'value'); {way_out}")
    return data


def eval_problem(entry: dict, run_weights: str | None) -> str | None:
    """Why a task's entry of eval.json is not a score of this run's final weights; None when it is.

    The one decision the table, the report and `ablate status` all take (through `valid_evals`):
    `run_weights` is `ablate.store_summary.final_weights_sha256` of the run folder.
    """
    if run_weights is None:
        return "the run has not completed with final weights to score"
    scored = entry.get("weights_sha256")
    if not isinstance(scored, str) or not scored:
        return "it does not say which weights it scored; run `ablate eval` again"
    if scored != run_weights:
        return (f"it scored other weights (sha256 {scored[:12]}…, the run's final weights are {run_weights[:12]}…: "
                "an eval.json copied from another run, or the run was trained again since); run `ablate eval` again")
    return None


def valid_evals(run_folder: str | os.PathLike) -> tuple[dict, dict]:
    """({task: entry} that score this run's final weights, {task: why not} for the stale rest)."""
    tasks = read_eval(run_folder)["tasks"]
    if not tasks:
        return {}, {}
    weights = final_weights_sha256(run_folder)
    valid, stale = {}, {}
    for task, entry in tasks.items():
        problem = eval_problem(entry, weights)
        if problem is None:
            valid[task] = entry
        else:
            stale[task] = problem
    return valid, stale


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


def metric_names(run_folder: str | os.PathLike, stale: bool = False) -> list[str]:
    """Every TASK/METRIC the run's eval.json holds for its final weights (with `stale`: for other weights), sorted."""
    valid, problems = valid_evals(run_folder)
    tasks = read_eval(run_folder)["tasks"] if stale else valid
    return sorted(f"{task}/{metric}" for task, entry in tasks.items() for metric in entry["metrics"]
                  if not stale or task in problems)


def available_metrics(run_folders) -> list[str]:
    """TASK/METRIC names of the run folders' final weights in any of their eval.json, sorted."""
    return sorted({name for folder in run_folders for name in metric_names(folder)})


def check_metric(name: str, run_folders) -> tuple[str, str]:
    """(task, metric) when some run has it; otherwise a clear error naming the metrics there are."""
    task, metric = split_metric(name)
    run_folders = list(run_folders)
    valid = available_metrics(run_folders)
    if name not in valid:
        if metric == GOLD:
            raise AblateError(f"metric {name!r} is a per-item score (RUN/eval_items/{task}.jsonl), not one "
                              "of eval.json: "
                              f"add --by-item to pair it by item (`ablate table SOURCE --metric {name} --by-item`)")
        shown = ", ".join(valid) if valid else ("none (no run has an eval.json of its final weights: "
                                                "run `ablate eval` first)")
        stale = [str(f) for f in run_folders if name in metric_names(f, stale=True)]
        extra = (f"; {len(stale)} eval.json hold {name} for other weights than their run's (e.g. {stale[0]}): "
                 "run `ablate eval` on those runs again") if stale else ""
        raise AblateError(f"unknown metric {name!r}; valid metrics: {shown}{extra}")
    return task, metric


def read_metric(run_folder: str | os.PathLike, name: str) -> dict | None:
    """{"value", "stderr", "higher_is_better", "settings", "fingerprint"} of TASK/METRIC, None if not evaluated.

    An entry that scored other weights than the run's final ones (`eval_problem`) gives {"value": None,
    "reason": why}: it is never paired as this run's score.
    """
    task, metric = split_metric(name)
    valid, stale = valid_evals(run_folder)
    if task in stale:
        return {"value": None, "reason": f"its {task} evaluation is not of its final weights: {stale[task]}"}
    entry = valid.get(task)
    if not entry or metric not in entry["metrics"]:
        return None
    row = entry["metrics"][metric]
    settings = {key: entry["settings"].get(key) for key in SETTINGS_KEYS}
    return {"value": row["value"], "stderr": row.get("stderr"), "higher_is_better": row.get("higher_is_better"),
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
