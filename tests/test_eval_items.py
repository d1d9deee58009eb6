"""Per-item results of `ablate eval`: RUN/eval_items/<task>.jsonl from lm-eval's
logged samples, whose means are eval.json's values, tied to the weights, and equal at batch sizes 1 and 16."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ablate.data.tokenizer import EOT_TOKEN, VOCAB_SIZE, encode
from ablate.evals.items import read_items
from ablate.evals.results import settings_fingerprint
from ablate.evals.run import evaluate_run
from ablate.modelio import load_run
from ablate.store import EVAL_FILE, EVAL_ITEMS_DIR, atomic_write_json
from test_eval import ENDINGS, overfit_run

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
ALL = ["lambada_openai", "hellaswag", "wikitext"]
LAMBADA = ["She opened the door and walked into the garden", "The cat sat on the mat and looked at the dog",
           "He", "After a long day at the office the tired engineer finally went home to sleep",
           "Rain fell on the roof all night long"]
HELLASWAG = [("Cooking", "A man slices onions on a board.", "then he", 2),
             ("Gardening", "A woman digs a hole in the soil.", "she", 0),
             ("Music", "A boy lifts a violin to his chin and", "slowly", 3),
             ("Sports", "Two players stand at the net.", "one of them", 1)]
WIKITEXT = [" = Town = \n The town was founded in 1850 @-@ ish by farmers . It grew along the river , and its mill "
            "made flour for the region until 1920 . Later the railway came and the mill closed . \n",
            " = River = \n A river runs through it . \n",
            " = Hill = \n The hill is 300 m high and covered in pine trees . \n"]


def write_data(folder: Path) -> Path:
    """Documents of several lengths (a batch of 16 pads most rows; WikiText needs several windows of 32)."""
    folder.mkdir(parents=True, exist_ok=True)
    hellaswag = [{"ind": i, "activity_label": label, "ctx_a": a, "ctx_b": b, "ctx": f"{a} {b}", "endings": ENDINGS,
                  "source_id": f"t~{i}", "split": "val", "split_type": "indomain", "label": str(gold)}
                 for i, (label, a, b, gold) in enumerate(HELLASWAG)]
    rows = {"lambada_openai": [{"text": t} for t in LAMBADA], "hellaswag": hellaswag,
            "wikitext": [{"page": p} for p in WIKITEXT]}
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return folder


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One overfit run evaluated at batch size 16, and a copy of its weights at batch size 1."""
    root = tmp_path_factory.mktemp("items")
    data = write_data(root / "tasks")
    folder = overfit_run(root / "results" / "x" / "smoke" / "baseline" / "seed0", steps=30)
    single = shutil.copytree(folder, root / "results" / "x" / "smoke" / "baseline" / "seed1")
    wide = evaluate_run(folder, ALL, task_data=data, bootstrap_iters=0, batch_size=16, device="cpu")
    narrow = evaluate_run(single, ALL, task_data=data, bootstrap_iters=0, batch_size=1, device="cpu")
    return {"folder": folder, "single": single, "data": data, "wide": wide, "narrow": narrow}


def lines(folder: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (folder / EVAL_ITEMS_DIR / f"{task}.jsonl").read_text().splitlines()]


def test_item_means_equal_eval_json(evaluated):
    folder, result = evaluated["folder"], evaluated["wide"]
    counts = {"lambada_openai": len(LAMBADA), "hellaswag": len(HELLASWAG), "wikitext": len(WIKITEXT)}
    for task in ALL:
        items, entry = lines(folder, task), result["tasks"][task]
        assert [row["doc_id"] for row in items] == list(range(counts[task]))
        assert all(len(row["doc_hash"]) == 64 and len(row["prompt_hash"]) == 64 for row in items)
        path = folder / EVAL_ITEMS_DIR / f"{task}.jsonl"
        assert entry["items"] == {"count": counts[task], "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        assert entry["batch_size"] == 16
        gold = np.array([row["gold_logprob"] for row in items])
        for metric, row in entry["metrics"].items():
            if metric in ("acc", "acc_norm"):
                assert np.mean([item[metric] for item in items]) == pytest.approx(row["value"], rel=1e-12, abs=0)
            elif metric == "perplexity":  # lm-eval's aggregation: exp of the negated mean log-likelihood
                assert math.exp(-gold.mean()) == pytest.approx(row["value"], rel=1e-9)
            else:
                unit = "words" if metric == "word_perplexity" else "bytes"
                per_unit = -gold.sum() / sum(item[unit] for item in items)
                expected = per_unit / math.log(2) if metric == "bits_per_byte" else math.exp(per_unit)
                assert expected == pytest.approx(row["value"], rel=1e-9), metric
    assert set(lines(folder, "hellaswag")[0]) == {"doc_id", "doc_hash", "prompt_hash", "acc", "acc_norm",
                                                  "gold_logprob"}
    assert set(lines(folder, "wikitext")[0]) == {"doc_id", "doc_hash", "prompt_hash", "gold_logprob", "words", "bytes"}


def logprob(model, context: str, continuation: str) -> float:
    """The continuation's log-likelihood computed here (one unpadded sequence), as lm-eval splits a pair into
    tokens; the softmax in float32 like `AblateLM` (float32 and float64 differ by ~1e-5 over 50,257 tokens)."""
    whole, head = encode(context + continuation), encode(context)
    target = whole[len(head):]
    tokens = torch.tensor([[EOT_TOKEN] + whole] if not head else [whole])
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits[0, :, :VOCAB_SIZE].float()
    logp = F.log_softmax(logits, dim=-1)
    start = tokens.shape[1] - 1 - len(target)
    return float(sum(logp[start + k, t] for k, t in enumerate(target)))


def test_gold_logprob_is_the_gold_continuations_log_likelihood(evaluated):
    model, _, _ = load_run(evaluated["folder"], "cpu")
    for row, (label, a, b, gold) in zip(lines(evaluated["folder"], "hellaswag"), HELLASWAG):
        prompt = f"{label}: {a} {b[0].upper()}{b[1:]}"
        assert row["gold_logprob"] == pytest.approx(logprob(model, prompt, " " + ENDINGS[gold]), rel=1e-6)
    for row, text in zip(lines(evaluated["folder"], "lambada_openai"), LAMBADA):
        context, word = text.rsplit(" ", 1) if " " in text else ("", text)
        if context:
            assert row["gold_logprob"] == pytest.approx(logprob(model, context, " " + word), rel=1e-6)


def test_scores_are_equal_at_batch_sizes_1_and_16_and_the_batch_size_is_recorded(evaluated):
    wide, narrow = evaluated["wide"]["tasks"], evaluated["narrow"]["tasks"]
    for task in ALL:
        assert (wide[task]["batch_size"], narrow[task]["batch_size"]) == (16, 1)
        assert settings_fingerprint(wide[task]["settings"]) == settings_fingerprint(narrow[task]["settings"])
        for metric, row in wide[task]["metrics"].items():
            if metric.startswith("acc"):
                assert narrow[task]["metrics"][metric]["value"] == row["value"], (task, metric)
            else:  # perplexities exponentiate summed float32 log-probabilities: their relative rounding grows with
                # the summed length (1.1e-6 seen with AVX-512 kernels), so the bound is 1e-5, not the per-token 1e-6
                assert narrow[task]["metrics"][metric]["value"] == pytest.approx(row["value"], rel=1e-5), (task, metric)
        a, b = lines(evaluated["folder"], task), lines(evaluated["single"], task)
        assert [(r["doc_id"], r["doc_hash"], r["prompt_hash"]) for r in a] == \
               [(r["doc_id"], r["doc_hash"], r["prompt_hash"]) for r in b]  # pairing does not see the batch size
        for x, y in zip(a, b):
            assert {k: v for k, v in x.items()
                    if k.startswith("acc")} == {k: v for k, v in y.items() if k.startswith("acc")}
            # float32 rounding: other batch shapes round each token's log-probability differently (~1e-7 relative)
            assert y["gold_logprob"] == pytest.approx(x["gold_logprob"], rel=1e-6, abs=0)


def test_an_item_file_is_read_only_for_the_weights_it_scored(evaluated, tmp_path):
    folder = shutil.copytree(evaluated["folder"], tmp_path / "run")
    rows, entry, problem = read_items(folder, "hellaswag")
    assert problem is None and len(rows) == len(HELLASWAG) and entry["weights_sha256"]
    (folder / EVAL_ITEMS_DIR / "wikitext.jsonl").write_text('{"doc_id": 0, "doc_hash": "x", "prompt_hash": "y"}\n')
    assert "not the item file its eval.json recorded" in read_items(folder, "wikitext")[2]
    summary = json.loads((folder / "summary.json").read_text())
    atomic_write_json(folder / "summary.json", {**summary, "weights_sha256": "0" * 64})  # trained again since
    rows, _, problem = read_items(folder, "hellaswag")
    assert rows is None and "not of its final weights" in problem


def test_a_rerun_writes_missing_items_and_keeps_what_is_current(evaluated, tmp_path, monkeypatch):
    folder = shutil.copytree(evaluated["folder"], tmp_path / "run")
    before = (folder / EVAL_ITEMS_DIR / "hellaswag.jsonl").read_bytes()
    (folder / EVAL_ITEMS_DIR / "hellaswag.jsonl").unlink()
    data = json.loads((folder / EVAL_FILE).read_text())
    del data["tasks"]["wikitext"]["items"]  # an evaluation made before item files were kept
    atomic_write_json(folder / EVAL_FILE, data)
    seen = []
    real = evaluate_run.__globals__["_evaluate"]

    def spy(folder_, names, *args):
        seen.append(list(names))
        return real(folder_, names, *args)

    monkeypatch.setattr("ablate.evals.run._evaluate", spy)
    result = evaluate_run(folder, ALL, task_data=evaluated["data"], bootstrap_iters=0, batch_size=16, device="cpu")
    assert seen == [["hellaswag", "wikitext"]]  # lambada's entry and items were current
    assert (folder / EVAL_ITEMS_DIR / "hellaswag.jsonl").read_bytes() == before  # same weights, same batch: same bytes
    assert read_items(folder, "wikitext")[2] is None and result["tasks"]["wikitext"]["items"]["count"] == 3
