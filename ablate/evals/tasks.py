"""The harness tasks `ablate eval` runs, and where their documents come from.

Each task is the harness's own configuration (its YAML: prompts, `process_docs`, metrics), loaded
from the installed `lm-eval`. Only where the documents come from may change: with `--task-data DIR`
the dataset becomes the `datasets` JSON loader over `DIR/<task>.jsonl`, read as the split the task
evaluates, in the Hub dataset's own columns. Because a local file has only that split, the task's
other splits are cleared (they would only feed few-shot examples, and every task here is zero-shot).

Which data a number came from is part of its settings (`data`): the Hub dataset's name, or the
SHA-256 of the local file, so results on a 50-document test file can never pair with full-task ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib.metadata import version
from pathlib import Path

from ablate.errors import AblateError, choice_error

# task → (the split it evaluates, the columns of one JSON line, its folder under lm_eval/tasks/)
DEFAULT_BOOTSTRAP_ITERS = 100_000  # lm-eval's own default (stderr of the perplexity metrics)
TASKS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "lambada_openai": ("test", ("text",), "lambada"),
    "hellaswag": ("validation", ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split",
                                 "split_type", "label"), "hellaswag"),
    "wikitext": ("test", ("page",), "wikitext"),
}
SPLIT_KEYS = ("training_split", "validation_split", "test_split")


def file_layout() -> str:
    """`DIR/lambada_openai.jsonl (text), ...`: what --task-data must hold (quoted in errors and help)."""
    return ", ".join(f"DIR/{name}.jsonl ({', '.join(columns)})" for name, (_, columns, _) in TASKS.items())


def check_tasks(names) -> list[str]:
    names = list(dict.fromkeys(names))
    if not names:
        raise AblateError(f"no task given; valid tasks: {', '.join(TASKS)}")
    for name in names:
        if name not in TASKS:
            raise choice_error("task", name, TASKS)
    return names


def offline_error(detail: str) -> AblateError:
    return AblateError(
        f"the tasks' data could not be loaded from the Hub ({detail}; HF_DATASETS_OFFLINE/HF_HUB_OFFLINE set, "
        f"or no network) and no --task-data DIR was given: pass --task-data DIR holding {file_layout()}"
    )


def task_manager():
    """A harness TaskManager indexing only the supported tasks' folders.

    Why: indexing all of the harness's task folders takes 5-15 s; these three take milliseconds.
    """
    import lm_eval.tasks  # the optional `eval` extra
    from lm_eval.tasks import TaskManager  # the optional `eval` extra

    root = Path(lm_eval.tasks.__file__).parent
    return TaskManager(include_defaults=False,
                       include_path=sorted({str(root / folder) for _, _, folder in TASKS.values()}))


def task_config(name: str, manager=None) -> dict:
    """The harness's own configuration of a task (its YAML, `!function`s resolved), without its data."""
    from lm_eval.tasks._yaml_loader import load_yaml  # the optional `eval` extra

    check_tasks([name])
    manager = manager or task_manager()
    entry = manager.task_index.get(name)
    if entry is None or not entry.yaml_path:
        raise AblateError(f"lm-eval {lm_eval_version()} has no task {name!r}; ablate supports {', '.join(TASKS)}")
    return dict(load_yaml(entry.yaml_path, resolve_func=True))


def task_version(config: dict):
    return (config.get("metadata") or {}).get("version")


def local_file(task_data: str | os.PathLike, name: str) -> Path:
    path = Path(task_data) / f"{name}.jsonl"
    if not path.is_file():
        raise AblateError(f"--task-data {str(task_data)!r} has no {path.name}; expected {file_layout()}")
    return path


def data_source(name: str, task_data: str | os.PathLike | None, config: dict | None = None) -> str:
    """What the task's documents are: `hub:<dataset>[/<config>]`, or `file:sha256:<hash>` of the local file."""
    if task_data is None:
        config = config or task_config(name)
        suffix = f"/{config['dataset_name']}" if config.get("dataset_name") else ""
        return f"hub:{config['dataset_path']}{suffix}"
    digest = hashlib.sha256(local_file(task_data, name).read_bytes()).hexdigest()
    return f"file:sha256:{digest}"


def local_overrides(name: str, task_data: str | os.PathLike) -> dict:
    """Config keys that point a task at DIR/<name>.jsonl, read as the split it evaluates."""
    split = TASKS[name][0]
    overrides = {key: None for key in SPLIT_KEYS}
    overrides.update({
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {split: str(local_file(task_data, name).resolve())}},
        f"{split}_split": split,
    })
    return overrides


def build_tasks(names, task_data: str | os.PathLike | None = None) -> dict:
    """{name: a ready harness Task} with its documents loaded (from DIR when `task_data` is given).

    Without `task_data` the Hub datasets load as usual (a cached copy works offline too); when they
    cannot be reached, the error names --task-data and the file layout.
    """
    from lm_eval.api.task import ConfigurableTask  # the optional `eval` extra

    names = check_tasks(names)
    manager = task_manager()
    tasks = {}
    for name in names:
        config = task_config(name, manager)
        if task_data is not None:
            config.update(local_overrides(name, task_data))
            _check_columns(name, local_file(task_data, name))
        config.setdefault("metadata", {})
        try:
            tasks[name] = ConfigurableTask(config=config)
        except ConnectionError as err:  # datasets' answer when offline and the dataset is not cached
            if task_data is None:
                first_line = (str(err).splitlines() or [""])[0]
                raise offline_error(f"{name}: {first_line}") from err
            raise
    return tasks


def _check_columns(name: str, path: Path) -> None:
    """Every line of a local file is a JSON object with the task's columns: a wrong file fails here, naming
    the file and the line, not deep in the harness or a template."""
    columns = TASKS[name][1]
    expected = f"expected one JSON object per line with {', '.join(columns)}"
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise AblateError(f"{path}: line {number} is not JSON ({err}); {expected}") from None
            if not isinstance(row, dict):
                raise AblateError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object; {expected}")
            missing = [column for column in columns if column not in row]
            if missing:
                raise AblateError(f"{path}: line {number}: its columns lack {', '.join(missing)}; "
                                  f"{name} needs {', '.join(columns)}")


def lm_eval_version() -> str:
    return version("lm_eval")
