"""Per-item results of `ablate eval`: RUN_DIR/eval_items/<task>.jsonl; torch-free and harness-free.

One JSON line per item (document), sorted by `doc_id`, from lm-eval's own per-sample output
(`simple_evaluate(log_samples=True)`)::

    {"doc_id": 0, "doc_hash": "…", "prompt_hash": "…", "acc": 1.0, "acc_norm": 1.0, "gold_logprob": -48.74}

* `doc_hash` and `prompt_hash` are lm-eval's (SHA-256 of the document and of its first prompt): two runs'
  items pair only when both agree, so a changed dataset or prompt template is never paired as the same item.
* one key per metric that lm-eval averages over items (`acc`, `acc_norm`): the file's mean is eval.json's value;
* `gold_logprob`, a continuous score: multiple choice, the log-likelihood of the gold ending; LAMBADA, of the
  target word; WikiText, of the whole document, with its `words` and `bytes` (lm-eval's counts). The
  perplexity metrics (`perplexity`, `word_perplexity`, `byte_perplexity`, `bits_per_byte`) are not means
  over items but functions of these sums (`CORPUS_METRICS`), so they have no per-item key.

An item file is tied to its weights through eval.json: the task's entry records the file's SHA-256
(`items`), and an entry counts only for the run's final weights (`ablate.evals.results.eval_problem`).
An item file that is not the one its current entry recorded (copied from another run, or left from
weights since retrained) is never read as this run's (`items_problem`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ablate.errors import AblateError
from ablate.evals.results import GOLD, valid_evals
from ablate.store import EVAL_ITEMS_DIR, atomic_write_bytes, file_sha256

ID_KEYS = ("doc_id", "doc_hash", "prompt_hash")
COUNT_KEYS = ("words", "bytes")  # WikiText: lm-eval's word and byte counts of the document
# metric → (what it is computed from, how); a function of the items' sums, not a mean of item values
CORPUS_METRICS = {
    "perplexity": "exp(−mean gold_logprob)",
    "word_perplexity": "exp(−Σ gold_logprob / Σ words)",
    "byte_perplexity": "exp(−Σ gold_logprob / Σ bytes)",
    "bits_per_byte": "−Σ gold_logprob / Σ bytes / ln 2",
}


def item_file(folder: str | os.PathLike, task: str) -> Path:
    return Path(folder) / EVAL_ITEMS_DIR / f"{task}.jsonl"


def item_rows(task: str, output_type: str, samples: list[dict]) -> list[dict]:
    """One row per item from lm-eval's logged samples (filter `none`), sorted by doc_id."""
    rows = {}
    for sample in samples:
        if sample.get("filter", "none") != "none":
            continue
        row = {key: sample[key] for key in ID_KEYS}
        for metric in sample.get("metrics", []):
            value = sample.get(metric)
            if metric not in CORPUS_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[metric] = float(value)
        row.update(_gold(task, output_type, sample))
        rows[row["doc_id"]] = row
    return [rows[key] for key in sorted(rows)]


def _gold(task: str, output_type: str, sample: dict) -> dict:
    responses = sample["filtered_resps"]
    if output_type == "multiple_choice":
        gold = sample["target"]
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(responses):
            raise AblateError(f"{task} item {sample['doc_id']}: its gold answer {gold!r} is not one index of its "
                              f"{len(responses)} choices; ablate keeps gold_logprob for single-answer tasks only")
        return {GOLD: float(responses[gold][0])}
    if output_type == "loglikelihood":
        return {GOLD: float(responses[0][0])}
    if output_type == "loglikelihood_rolling":
        counts = {}
        for metric, key in (("word_perplexity", "words"), ("byte_perplexity", "bytes"), ("bits_per_byte", "bytes")):
            if isinstance(sample.get(metric), (list, tuple)):
                counts[key] = int(sample[metric][1])
        return {GOLD: float(responses[0]), **counts}
    raise AblateError(f"{task}: output type {output_type!r} has no gold log-likelihood "
                      "(ablate scores likelihoods only)")


def write_items(folder: str | os.PathLike, task: str, rows: list[dict]) -> dict:
    """Write RUN/eval_items/<task>.jsonl atomically; returns what eval.json records of it."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    path = item_file(folder, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    return {"count": len(rows), "sha256": hashlib.sha256(data).hexdigest()}


def items_problem(folder: str | os.PathLike, task: str, entry: dict | None) -> str | None:
    """Why RUN/eval_items/<task>.jsonl is not the per-item record of `entry` (eval.json's task entry); None if it is."""
    path = item_file(folder, task)
    recorded = (entry or {}).get("items")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str):
        return f"its {task} evaluation kept no per-item results (made before they were kept); run `ablate eval` again"
    if not path.is_file():
        return f"{path} is missing; run `ablate eval` again"
    if file_sha256(path) != recorded["sha256"]:
        return (f"{path} is not the item file its eval.json recorded (sha256 {recorded['sha256'][:12]}…): copied from "
                "another run, or left from other weights; run `ablate eval` again")
    return None


def read_items(folder: str | os.PathLike, task: str) -> tuple[list[dict] | None, dict | None, str | None]:
    """(item rows, eval.json's entry, None) when the run's item file of `task` scores its final weights,
    else (None, entry or None, why not)."""
    valid, stale = valid_evals(folder)
    if task in stale:
        return None, None, f"its {task} evaluation is not of its final weights: {stale[task]}"
    entry = valid.get(task)
    if entry is None:
        return None, None, f"not evaluated on {task} (`ablate eval`)"
    problem = items_problem(folder, task, entry)
    if problem is not None:
        return None, entry, problem
    path = item_file(folder, task)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return None, entry, f"{path}: line {number} is not JSON; run `ablate eval` again"
        if not isinstance(row, dict) or any(key not in row for key in ID_KEYS):
            return None, entry, f"{path}: line {number} lacks {', '.join(ID_KEYS)}; run `ablate eval` again"
        rows.append(row)
    return rows, entry, None


def item_metrics(rows: list[dict]) -> list[str]:
    """The per-item scores of a file's rows (acc, acc_norm, gold_logprob, …), sorted; counts and ids left out."""
    keys = {key for row in rows for key, value in row.items()
            if key not in ID_KEYS and key not in COUNT_KEYS and isinstance(value, (int, float))}
    return sorted(keys)

