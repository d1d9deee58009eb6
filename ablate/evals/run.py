"""Evaluating one run folder (`evaluate_run`) and the submitit task that does it on a cluster (`EvalJob`).

A rerun with the same settings is a no-op: each task is recomputed only when its settings (task
version, lm-eval version, --limit, few-shot count, data), the final weights or the bootstrap count
changed; the other tasks' entries are kept as they were, each with its own settings.

The run's lock (`ablate.lock`) is held from the first check to the write of eval.json: an evaluation
is refused while the run trains, and `run --force` cannot replace the folder under an evaluation.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from pathlib import Path

from ablate.errors import AblateError
from ablate.evals.items import item_rows, items_problem, write_items
from ablate.evals.results import is_current, read_eval, task_entry
from ablate.evals.tasks import (
    DEFAULT_BOOTSTRAP_ITERS,
    build_tasks,
    check_tasks,
    data_source,
    lm_eval_version,
    task_config,
    task_manager,
    task_version,
)
from ablate.experiment import RunSpec, start_task
from ablate.lock import FileLock
from ablate.modelio import default_device, load_run
from ablate.store import (CHECKPOINTS, EVAL_FILE, FINAL_WEIGHTS, SUMMARY, atomic_write_json, iter_run_dirs,
                          run_lock_path, run_of)
from ablate.store_summary import RunSummary, read_summary, verified_weights_sha256

log = logging.getLogger(__name__)



def require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401  # the optional `eval` extra
    except ModuleNotFoundError as err:
        raise AblateError("lm-eval is not installed: pip install -e '.[eval]' (the `eval` extra)") from err


def run_summary(folder: str | os.PathLike) -> RunSummary | None:
    """The run's summary.json, None when the folder has none (weights saved by hand)."""
    return read_summary(folder) if (Path(folder) / SUMMARY).is_file() else None


def weights_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / CHECKPOINTS / FINAL_WEIGHTS


def wanted_settings(tasks, limit: int | None, task_data) -> dict[str, dict]:
    """{task: settings} a run evaluated now would carry (no data is loaded: versions come from the YAML)."""
    manager = task_manager()
    version = lm_eval_version()
    settings = {}
    for name in tasks:
        config = task_config(name, manager)
        settings[name] = {"task_version": task_version(config), "lm_eval_version": version, "limit": limit,
                          "num_fewshot": int(config.get("num_fewshot") or 0),
                          "data": data_source(name, task_data, config)}
    return settings


def evaluate_run(folder: str | os.PathLike, tasks, *, limit: int | None = None, batch_size: int = 16,
                 task_data: str | os.PathLike | None = None, bootstrap_iters: int = DEFAULT_BOOTSTRAP_ITERS,
                 device: str | None = None) -> dict:
    """Evaluate the final weights of a run folder on `tasks`; returns (and writes) its eval.json."""
    require_lm_eval()
    folder = Path(folder)
    tasks = check_tasks(tasks)
    if limit is not None and int(limit) < 1:
        raise AblateError(f"--limit must be ≥ 1 documents per task, got {limit}")
    if bootstrap_iters < 0:
        raise AblateError(f"--bootstrap-iters must be ≥ 0, got {bootstrap_iters}")
    if not folder.is_dir():
        raise AblateError(f"run folder {str(folder)!r} does not exist")
    with FileLock(run_lock_path(folder), what=f"run {folder}"):
        return _evaluate_locked(folder, tasks, limit, batch_size, task_data, bootstrap_iters, device)


def _evaluate_locked(folder: Path, tasks, limit, batch_size, task_data, bootstrap_iters, device) -> dict:
    weights = verified_weights_sha256(folder)
    settings = wanted_settings(tasks, limit, task_data)
    data = read_eval(folder)
    todo = [name for name in tasks if not is_current(data["tasks"].get(name), settings[name], weights, bootstrap_iters)
            or items_problem(folder, name, data["tasks"].get(name)) is not None]
    if not todo:
        log.info("%s: %s already evaluated with these settings", folder, ", ".join(tasks))
        return data
    log.info("%s: evaluating %s", folder, ", ".join(todo))
    results, seconds = _evaluate(folder, todo, limit, batch_size, task_data, bootstrap_iters, device)
    stamp = dt.datetime.now().isoformat(timespec="seconds")
    for name in todo:
        entry = task_entry(results, name, settings[name], weights_sha256=weights, bootstrap_iters=bootstrap_iters,
                           batch_size=int(batch_size), evaluated_at=stamp, seconds=seconds)
        samples = results.get("samples", {}).get(name)
        if samples is not None:  # first the items, then eval.json naming them: a crash between leaves no false pair
            output_type = results["configs"][name]["output_type"]
            entry["items"] = write_items(folder, name, item_rows(name, output_type, samples))
        data["tasks"][name] = entry
    atomic_write_json(folder / EVAL_FILE, data)
    return data


def _evaluate(folder, names, limit, batch_size, task_data, bootstrap_iters, device) -> tuple[dict, float]:
    import lm_eval  # the optional `eval` extra

    from ablate.evals.lm import AblateLM  # a subclass of lm-eval's TemplateLM: the `eval` extra

    built = build_tasks(names, task_data)  # first: a missing dataset fails before the weights load
    model, config, _ = load_run(folder, device or default_device())
    lm = AblateLM(model, batch_size=batch_size, device=device or default_device(), loss_chunk=config.loss_chunk)
    start = time.perf_counter()
    results = lm_eval.simple_evaluate(model=lm, tasks=list(built.values()), limit=limit,
                                      bootstrap_iters=bootstrap_iters, log_samples=True,
                                      task_manager=task_manager())
    return results, round(time.perf_counter() - start, 3)


def runs_to_evaluate(experiment, results, tiers=None, arms=None, seeds=None) -> tuple[list[Path], list[str]]:
    """(completed run folders of the grid, one line per run skipped and why)."""
    folders, skipped = [], []
    for spec in experiment.runs(tiers, arms, seeds):
        folder = spec.folder(results)
        _sort_evaluable(folder, spec.key, folders, skipped)
    return folders, skipped


def folder_runs_to_evaluate(experiment_dir, tiers=None, arms=None, seeds=None) -> tuple[list[Path], list[str]]:
    """The same for an experiment folder that no experiments/*.py describes (`results/adhoc`, a copied store):
    its run folders (`iter_run_dirs`, as every table counts them), filtered by tier, arm and seed."""
    folders, skipped = [], []
    for folder in iter_run_dirs(experiment_dir):
        run = run_of(folder)
        if (tiers and run.tier not in tiers) or (arms and run.arm not in arms) or (seeds is not None
                                                                                    and run.seed not in seeds):
            continue
        _sort_evaluable(folder, run.key, folders, skipped)
    return folders, skipped


def _sort_evaluable(folder: Path, key: str, folders: list[Path], skipped: list[str]) -> None:
    """Adds a completed run with final weights to `folders`, any other to `skipped` with its status."""
    summary = run_summary(folder)
    if summary is not None and summary.completed and weights_path(folder).is_file():
        folders.append(folder)
    else:
        skipped.append(f"{key}: {(summary or RunSummary()).status or 'not started'}")


class EvalJob:
    """What one array task of `ablate submit --eval` executes: evaluate one run of the grid.

    Picklable (plain fields only). Re-imports the experiment file first, so arms it registers exist
    before the weights are loaded, as `ablate.dispatch.RunJob` does. `options` are evaluate_run's
    keyword arguments (limit, batch_size, task_data, bootstrap_iters, device).
    """

    def __init__(self, experiment_file: str | None, results: str, tasks, options: dict | None = None):
        self.experiment_file, self.results = experiment_file, results
        self.tasks, self.options = list(tasks), dict(options or {})

    def __call__(self, spec: RunSpec) -> dict:
        start_task(self.experiment_file)
        folder = spec.folder(self.results)
        return evaluate_run(folder, self.tasks, **self.options)
