"""`ablate eval` end to end on local task files: every metric, an overfit HellaSwag item, eval.json
(atomic, a rerun a no-op, changed settings recomputed), the offline error and EvalJob."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from ablate.cli import main
from ablate.data.tokenizer import EOT_TOKEN, encode
from ablate.errors import AblateError
from ablate.store import EVAL_FILE, EVAL_ITEMS_DIR
from ablate.evals.results import check_metric, read_metric, settings_fingerprint
from ablate.evals.run import EvalJob, evaluate_run
from ablate.evals.tasks import TASKS
from ablate.experiment import RunSpec
from ablate.model import GPT
from ablate.modelio import save_model
from ablate.store import atomic_write_json
from ablate.sizing import model_config
from ablate.tiers import get_tier

pytestmark = pytest.mark.run

torch.set_num_threads(1)
ALL = ["lambada_openai", "hellaswag", "wikitext"]
METRICS = {"lambada_openai": {"perplexity", "acc"}, "hellaswag": {"acc", "acc_norm"},
           "wikitext": {"word_perplexity", "byte_perplexity", "bits_per_byte"}}
# HellaSwag's prompt for these columns is "<activity_label>: <ctx_a> <Ctx_b>", each ending after a space.
QUERY, RIGHT = "Cooking: A man slices onions on a board. Then he", "fries them in a hot pan."
ENDINGS = ["sings a song to the moon.", "reads a long book slowly.", RIGHT, "paints the fence bright blue."]


def write_task_data(folder: Path) -> Path:
    """Small files in the datasets' own columns (two documents per task)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = {
        "lambada_openai": [{"text": "She opened the door and walked into the garden"},
                           {"text": "The cat sat on the mat and looked at the dog"}],
        "hellaswag": [{"ind": i, "activity_label": "Cooking", "ctx_a": "A man slices onions on a board.",
                       "ctx_b": "then he", "ctx": "A man slices onions on a board. then he", "endings": ENDINGS,
                       "source_id": f"test~{i}", "split": "val", "split_type": "indomain", "label": "2"}
                      for i in range(2)],
        "wikitext": [{"page": " = Town = \n The town was founded in 1850 @-@ ish by farmers . It grew along the river "
                              ", and its mill made flour for the region until 1920 . \n"},
                     {"page": " = River = \n A river runs through it . \n"}],
    }
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    return folder


def overfit_run(folder: Path, arm: str = "baseline", steps: int = 60) -> Path:
    """A run folder whose smoke-shaped model was overfit on the HellaSwag item's right answer."""
    model = GPT(model_config(get_tier("smoke"), arm, max_seq_len=32))
    model.init_weights(0)
    tokens = torch.tensor([[EOT_TOKEN] + encode(QUERY + " " + RIGHT)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_model(model.eval(), folder / "checkpoints" / "model.pt")
    # with its loss
    atomic_write_json(folder / "summary.json", {"status": "completed", "val_loss": float(loss.detach())})
    return folder


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One overfit run evaluated on all three tasks (shared: the harness run is the slow part)."""
    root = tmp_path_factory.mktemp("eval")
    data = write_task_data(root / "tasks")
    folder = overfit_run(root / "results" / "x" / "smoke" / "baseline" / "seed0")
    return folder, data, evaluate_run(folder, ALL, task_data=data, bootstrap_iters=20, batch_size=4, device="cpu")


def test_three_tasks_produce_every_metric_with_stderr_versions_and_direction(evaluated):
    folder, _, result = evaluated
    assert json.loads((folder / EVAL_FILE).read_text()) == result
    for task, metrics in METRICS.items():
        entry = result["tasks"][task]
        assert set(entry["metrics"]) == metrics
        assert entry["settings"]["task_version"] is not None and entry["settings"]["lm_eval_version"] == "0.4.13"
        assert entry["settings"]["limit"] is None and entry["settings"]["num_fewshot"] == 0
        assert entry["settings"]["data"].startswith("file:sha256:") and entry["samples"]["effective"] == 2
        for name, row in entry["metrics"].items():
            assert isinstance(row["value"], float)
            assert row["higher_is_better"] is (name.startswith("acc"))
    assert result["tasks"]["hellaswag"]["metrics"]["acc"]["stderr"] is not None
    assert result["tasks"]["lambada_openai"]["metrics"]["perplexity"]["stderr"] is not None  # bootstrap


def test_hellaswag_item_whose_right_ending_was_overfit_scores_acc_1(evaluated):
    metrics = evaluated[2]["tasks"]["hellaswag"]["metrics"]
    assert metrics["acc"]["value"] == 1.0 and metrics["acc_norm"]["value"] == 1.0


def test_rerun_with_the_same_settings_is_a_no_op(evaluated, monkeypatch):
    folder, data, result = evaluated
    before = (folder / EVAL_FILE).read_bytes()

    def fail(*args, **kwargs):
        raise AssertionError("recomputed")

    monkeypatch.setattr("ablate.evals.run._evaluate", fail)
    assert evaluate_run(folder, ALL, task_data=data, bootstrap_iters=20, batch_size=8) == result
    assert (folder / EVAL_FILE).read_bytes() == before


def test_changed_settings_recompute_only_that_task_and_the_write_is_atomic(evaluated, tmp_path, monkeypatch):
    source, data, result = evaluated
    folder = shutil.copytree(source, tmp_path / "run")
    before = (folder / EVAL_FILE).read_bytes()

    def no_rename(*args):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr("ablate.store.os.replace", no_rename)
        with pytest.raises(OSError, match="disk full"):
            evaluate_run(folder, ["lambada_openai"], task_data=data, limit=1, bootstrap_iters=20)
    assert (folder / EVAL_FILE).read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", EVAL_FILE, EVAL_ITEMS_DIR, "summary.json"]
    assert sorted(p.name for p in (folder / EVAL_ITEMS_DIR).iterdir()) == [f"{t}.jsonl" for t in sorted(ALL)]  # no temp

    new = evaluate_run(folder, ["lambada_openai"], task_data=data, limit=1, bootstrap_iters=20)
    assert new["tasks"]["lambada_openai"]["settings"]["limit"] == 1
    assert new["tasks"]["lambada_openai"]["samples"]["effective"] == 1
    assert new["tasks"]["hellaswag"] == result["tasks"]["hellaswag"]  # untouched, with its own settings
    limited, full = read_metric(folder, "lambada_openai/acc"), read_metric(source, "lambada_openai/acc")
    assert limited["fingerprint"] != full["fingerprint"]
    assert read_metric(folder, "hellaswag/acc")["fingerprint"] == read_metric(source, "hellaswag/acc")["fingerprint"]


def test_read_metric_and_the_metric_names(evaluated):
    folder = evaluated[0]
    row = read_metric(folder, "wikitext/word_perplexity")
    assert row["higher_is_better"] is False and row["value"] > 1 and row["stderr"] is None
    assert row["fingerprint"] == settings_fingerprint(row["settings"])
    assert settings_fingerprint({**row["settings"], "limit": 5}) != row["fingerprint"]
    assert check_metric("hellaswag/acc_norm", [folder]) == ("hellaswag", "acc_norm")
    with pytest.raises(AblateError, match="unknown metric 'hellaswag/f1'; valid metrics: hellaswag/acc, "
                                          "hellaswag/acc_norm"):
        check_metric("hellaswag/f1", [folder])
    with pytest.raises(AblateError, match="TASK/METRIC"):
        read_metric(folder, "acc")
    assert read_metric(folder.parent, "hellaswag/acc") is None  # a folder never evaluated


def test_offline_without_task_data_names_the_flag_and_the_layout(evaluated, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = shutil.copytree(evaluated[0], tmp_path / "run")
    (folder / EVAL_FILE).unlink()
    assert main(["eval", str(folder), "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--task-data DIR" in err
    for name, (_, columns, _) in TASKS.items():
        assert f"DIR/{name}.jsonl ({', '.join(columns)})" in err


def test_bad_input_is_refused_with_the_valid_values(evaluated, tmp_path):
    folder, data, _ = evaluated
    with pytest.raises(AblateError, match="unknown task 'mmlu'; valid tasks: lambada_openai, hellaswag, wikitext"):
        evaluate_run(folder, ["mmlu"], task_data=data)
    (tmp_path / "hellaswag.jsonl").write_text(json.dumps({"ctx": "only this"}) + "\n")
    with pytest.raises(AblateError, match="lack ind, activity_label"):
        evaluate_run(folder, ["hellaswag"], task_data=tmp_path, limit=1)
    with pytest.raises(AblateError, match="has no wikitext.jsonl"):
        evaluate_run(folder, ["wikitext"], task_data=tmp_path)
    diverged = shutil.copytree(folder, tmp_path / "diverged")
    atomic_write_json(diverged / "summary.json", {"status": "diverged"})
    with pytest.raises(AblateError, match="is diverged, not completed"):
        evaluate_run(diverged, ["wikitext"], task_data=data)


def test_eval_job_is_picklable_and_the_cli_walks_an_experiment(evaluated, tmp_path, capsys):
    folder, data, _ = evaluated
    experiment = tmp_path / "evx.py"
    experiment.write_text("from ablate.experiment import Experiment\n"
                          "EXPERIMENT = Experiment(name='evx', tiers=['smoke'], arms=['baseline', "
                          "'sink-token'], seeds=1)\n")
    results = tmp_path / "results"
    shutil.copytree(folder, results / "evx" / "smoke" / "baseline" / "seed0")
    options = {"limit": 1, "task_data": str(data), "bootstrap_iters": 0, "device": "cpu"}
    job = pickle.loads(pickle.dumps(EvalJob(str(experiment), str(results), ["lambada_openai"], options)))
    out = job(RunSpec("evx", "smoke", "baseline", 0))
    assert out["tasks"]["lambada_openai"]["settings"]["limit"] == 1

    code = main(["eval", str(experiment), "--results", str(results), "--tasks", "lambada_openai", "hellaswag",
                 "--task-data", str(data), "--limit", "1", "--bootstrap-iters", "0"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "skipped smoke/sink-token/seed0: not started" in printed
    assert "| smoke/baseline/seed0 | hellaswag | acc_norm | 1 |" in printed
    assert "| smoke/baseline/seed0 | lambada_openai | acc |" in printed
