"""Downstream results tied to their weights: training keeps the final weights' hash,
`ablate eval` holds the run's lock, and the table, the report and `ablate status` count an eval.json
only when it scored the run's final weights (`ablate.evals.results.eval_problem`)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from ablate.analysis.load import load_runs
from ablate.analysis.report import write_report
from ablate.analysis.build import build_table
from ablate.cli import main
from ablate.errors import AblateError
from ablate.evals.results import eval_problem, read_metric, valid_evals
from ablate.evals.run import evaluate_run
from ablate.experiment import Experiment, RunSpec
from ablate.lock import FileLock, LockHeld
from ablate.status import status
from ablate.store import atomic_write_json, file_sha256, read_json, run_dir, run_lock_path
from ablate.store_summary import final_weights_sha256
from analysis_fixtures import write_run
from datafix import REPO
from test_eval import write_task_data

ACC = {("baseline", 0): 0.30, ("baseline", 1): 0.31, ("baseline", 2): 0.29,
       ("sink-logit", 0): 0.32, ("sink-logit", 1): 0.315, ("sink-logit", 2): 0.30}
SETTINGS = {"task_version": 1.0, "lm_eval_version": "0.4.13", "limit": None, "num_fewshot": 0,
            "data": "hub:Rowan/hellaswag"}
METRIC = "hellaswag/acc_norm"


def weights_of(arm: str, seed: int) -> str:
    return hashlib.sha256(f"{arm}/{seed}".encode()).hexdigest()


def write_eval(folder, acc: float, weights: str) -> None:
    entry = {"settings": SETTINGS, "weights_sha256": weights,
             "metrics": {"acc_norm": {"value": acc, "stderr": 0.004, "higher_is_better": True}}}
    (folder / "eval.json").write_text(json.dumps({"tasks": {"hellaswag": entry}}))


@pytest.fixture
def store(tmp_path):
    """Six completed runs of `study` (10M, two arms, three seeds), each evaluated on its own weights."""
    for (arm, seed), acc in ACC.items():
        folder = write_run(tmp_path, "study", "10M", arm, seed, 4.0 - 0.01 * seed, curve_points=2,
                           weights_sha256=weights_of(arm, seed))
        write_eval(folder, acc, weights_of(arm, seed))
    return tmp_path / "study"


def paired_row(store) -> dict:
    table = build_table(load_runs(store, metric=METRIC), "paired")
    return table.frame.row(0, named=True), table.warnings


@pytest.mark.run
def test_training_keeps_the_hash_of_its_final_weights(tmp_path, sample_data):
    from ablate.train import run

    summary = run(RunSpec("adhoc", "smoke", "baseline", 0, {"max_steps": 2}), tmp_path, data_dir=str(sample_data),
                  progress=False)
    folder = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    assert summary.status == "completed"
    assert summary.weights_sha256 == file_sha256(folder / "checkpoints" / "model.pt")
    assert final_weights_sha256(folder) == summary.weights_sha256


@pytest.mark.unit
def test_an_eval_json_copied_from_another_run_is_not_paired(store):
    row, _ = paired_row(store)
    assert row["n"] == 3
    # seed 1's sink-logit folder gets seed 0's evaluation (its own weights were never scored)
    shutil.copy(store / "10M" / "sink-logit" / "seed0" / "eval.json",
                store / "10M" / "sink-logit" / "seed1" / "eval.json")
    row, warnings = paired_row(store)
    assert row["n"] == 2
    assert any(w.startswith("excluded 10M/sink-logit/seed1:") and "scored other weights" in w for w in warnings)
    found = read_metric(store / "10M" / "sink-logit" / "seed1", METRIC)
    assert found["value"] is None and "copied from another run" in found["reason"]
    text = (write_report(store) / "downstream.md").read_text()
    assert "| 10M | sink-logit | 2 |" in text and "- 10M sink-logit seed 1: its hellaswag evaluation" in text


@pytest.mark.unit
def test_an_eval_of_weights_replaced_since_is_stale_in_table_and_status(store):
    """`run --force` retrained the run (new weights, new hash) while an old evaluation wrote its eval.json."""
    experiment = Experiment(name="study", tiers=["10M"], arms=["baseline", "sink-logit"], seeds=3)
    folder = store / "10M" / "baseline" / "seed2"
    rows = {(r.arm, r.seed): r for r in status(experiment, store.parent)}
    assert rows[("baseline", 2)].eval == "evaluated"
    summary = read_json(folder / "summary.json")
    atomic_write_json(folder / "summary.json", {**summary, "weights_sha256": weights_of("retrained", 2)})

    rows = {(r.arm, r.seed): r for r in status(experiment, store.parent)}
    assert rows[("baseline", 2)].eval.startswith("stale, not counted: hellaswag: it scored other weights")
    assert rows[("baseline", 1)].eval == "evaluated"
    row, warnings = paired_row(store)
    assert row["n"] == 2 and any(w.startswith("excluded 10M/baseline/seed2:") and "other weights" in w
                                 for w in warnings)

    # a ledger saying the evaluation was done does not make a stale eval.json count
    ledger = {"runs": {f"eval:{RunSpec('study', '10M', 'baseline', 2).key}": {
        "executor": "local", "tasks": ["hellaswag"], "outcome": "evaluated"}}, "submissions": []}
    (store / "ledger.json").write_text(json.dumps(ledger))
    rows = {(r.arm, r.seed): r for r in status(experiment, store.parent)}
    assert rows[("baseline", 2)].eval.startswith("stale, not counted")


@pytest.mark.unit
def test_the_one_decision_and_runs_completed_before_the_hash_was_kept(tmp_path):
    assert eval_problem({"weights_sha256": "a" * 64}, "a" * 64) is None
    assert "other weights" in eval_problem({"weights_sha256": "a" * 64}, "b" * 64)
    assert "does not say" in eval_problem({}, "a" * 64)
    assert "not completed" in eval_problem({"weights_sha256": "a" * 64}, None)
    # an older run: no weights_sha256 in its summary, so model.pt is hashed when read
    folder = write_run(tmp_path, "old", "10M", "baseline", 0, 4.0)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "model.pt").write_bytes(b"weights v1")
    write_eval(folder, 0.3, hashlib.sha256(b"weights v1").hexdigest())
    assert set(valid_evals(folder)[0]) == {"hellaswag"}
    (folder / "checkpoints" / "model.pt").write_bytes(b"weights v2 (retrained)")
    valid, stale = valid_evals(folder)
    assert not valid and "other weights" in stale["hellaswag"]
    (folder / "checkpoints" / "model.pt").unlink()
    assert "not completed" in valid_evals(folder)[1]["hellaswag"]


def fake_results(names):
    """What `lm_eval.simple_evaluate` returns, for tests that need no scoring."""
    return ({"results": {n: {"acc,none": 0.5, "acc_stderr,none": 0.1} for n in names},
             "higher_is_better": {n: {"acc": True} for n in names}, "n-samples": {}}, 0.01)


def completed_run(tmp_path, weights: bytes = b"final weights", kept: bytes | None = None):
    folder = run_dir(tmp_path / "results", "x", "smoke", "baseline", 0)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.pt").write_bytes(weights)
    atomic_write_json(folder / "summary.json", {"status": "completed", "val_loss": 4.0,
                                                "weights_sha256": hashlib.sha256(kept or weights).hexdigest()})
    return folder


@pytest.mark.unit
def test_eval_holds_the_run_lock_while_it_scores(tmp_path, monkeypatch):
    folder = completed_run(tmp_path)
    data = write_task_data(tmp_path / "tasks")
    seen = []

    def scoring(folder_, names, *args):
        with pytest.raises(LockHeld):  # what `ablate run --force` (or a second eval) meets meanwhile
            FileLock(run_lock_path(folder_), what="run").acquire()
        seen.append(names)
        return fake_results(names)

    monkeypatch.setattr("ablate.evals.run._evaluate", scoring)
    result = evaluate_run(folder, ["lambada_openai"], task_data=data, bootstrap_iters=0)
    assert seen == [["lambada_openai"]]
    assert result["tasks"]["lambada_openai"]["weights_sha256"] == final_weights_sha256(folder)
    assert set(valid_evals(folder)[0]) == {"lambada_openai"}
    assert not run_lock_path(folder).exists()  # released


@pytest.mark.system
def test_eval_while_the_run_trains_is_refused_in_one_line(tmp_path, capsys):
    folder = completed_run(tmp_path)
    atomic_write_json(folder / "summary.json", {"status": "running"})
    data = write_task_data(tmp_path / "tasks")
    holder = subprocess.Popen(  # another process holds the run, as `ablate run` does while it trains
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from ablate.lock import FileLock
            with FileLock({str(run_lock_path(folder))!r}, what="run"):
                print("held", flush=True)
                time.sleep(120)
        """)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["eval", str(folder), "--tasks", "lambada_openai", "--task-data", str(data)])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("ablate: error: run ") and f"pid {holder.pid}" in err and "wait for it to finish" in err
    assert not (folder / "eval.json").exists()


@pytest.mark.unit
def test_eval_refuses_weights_other_than_the_run_completed_with(tmp_path, monkeypatch):
    folder = completed_run(tmp_path, weights=b"swapped in later", kept=b"final weights")
    monkeypatch.setattr("ablate.evals.run._evaluate", lambda folder_, names, *args: fake_results(names))
    with pytest.raises(AblateError, match="is not the weights the run completed with .* --force"):
        evaluate_run(folder, ["lambada_openai"], task_data=write_task_data(tmp_path / "tasks"))
    assert not (folder / "eval.json").exists()
