"""`ablate table --metric TASK/METRIC --by-item`: downstream differences paired by item
within each seed, then over seeds; checked against an independent computation from the item files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from ablate.analysis.items import crossed_interval, items_table, render_items
from ablate.analysis.load import load_runs
from ablate.analysis.report import write_report
from ablate.cli import main
from ablate.errors import AblateError
from analysis_fixtures import write_run
from datafix import REPO

SETTINGS = {"task_version": 1.0, "lm_eval_version": "0.4.13", "limit": None, "num_fewshot": 0,
            "data": "hub:Rowan/hellaswag"}
ITEMS = 40
ARMS = ("baseline", "sink-logit")


def weights_of(arm: str, seed: int) -> str:
    return hashlib.sha256(f"{arm}/{seed}".encode()).hexdigest()


def fake_items(arm: str, seed: int) -> list[dict]:
    """Items 0..ITEMS-1 with accuracies and gold log-likelihoods; the arm is slightly better; the
    baseline of seed 1 skipped item 3 and the arm of seed 2 item 7 (only shared items pair)."""
    rng = np.random.default_rng(100 * seed + ARMS.index(arm))
    rows = []
    for i in range(ITEMS):
        if (arm, seed, i) in (("baseline", 1, 3), ("sink-logit", 2, 7)):
            continue
        gold = float(-20.0 + rng.normal() + (0.4 if arm == "sink-logit" else 0.0) + 0.1 * i)
        rows.append({"doc_id": i, "doc_hash": f"doc{i}", "prompt_hash": f"prompt{i}", "acc": float(rng.random() < 0.4),
                     "acc_norm": float(rng.random() < 0.45 + (0.1 if arm == "sink-logit" else 0.0)),
                     "gold_logprob": gold})
    return rows


def write_items(folder, rows, weights=None, acc=None) -> None:
    """eval.json's hellaswag entry and eval_items/hellaswag.jsonl, as `ablate eval` leaves them."""
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    (folder / "eval_items").mkdir(exist_ok=True)
    (folder / "eval_items" / "hellaswag.jsonl").write_bytes(data)
    weights = weights or json.loads((folder / "summary.json").read_text())["weights_sha256"]
    metrics = {m: {"value": float(np.mean([r[m] for r in rows])), "stderr": 0.01, "higher_is_better": True}
               for m in ("acc", "acc_norm")}
    entry = {"settings": SETTINGS, "weights_sha256": weights, "metrics": metrics, "batch_size": 16,
             "items": {"count": len(rows), "sha256": hashlib.sha256(data).hexdigest()}}
    (folder / "eval.json").write_text(json.dumps({"tasks": {"hellaswag": entry}}))


def make_store(root, seeds=3, tier="10M"):
    for arm in ARMS:
        for seed in range(seeds):
            folder = write_run(root, "study", tier, arm, seed, 4.0 - 0.01 * seed, curve_points=2,
                               weights_sha256=weights_of(arm, seed))
            write_items(folder, fake_items(arm, seed))
    return root / "study"


@pytest.fixture
def store(tmp_path):
    return make_store(tmp_path)


def read_lines(store, arm, seed, tier="10M"):
    path = store / tier / arm / f"seed{seed}" / "eval_items" / "hellaswag.jsonl"
    return {row["doc_id"]: row for row in map(json.loads, path.read_text().splitlines())}


def independent(store, metric, seeds=(0, 1, 2)):
    """The row computed here from the item files: per seed the mean Δ over shared items, then a t interval."""
    per_seed, counts = [], set()
    for seed in seeds:
        arm, ref = read_lines(store, "sink-logit", seed), read_lines(store, "baseline", seed)
        shared = sorted(arm.keys() & ref.keys())
        counts.update(shared)
        per_seed.append(np.mean([arm[i][metric] - ref[i][metric] for i in shared]))
    per_seed = np.array(per_seed)
    n = len(per_seed)
    se = per_seed.std(ddof=1) / np.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    return {"n": n, "items": len(counts), "mean": per_seed.mean(), "sd": per_seed.std(ddof=1), "se": se,
            "ci_low": per_seed.mean() - half, "ci_high": per_seed.mean() + half,
            "p": stats.ttest_1samp(per_seed, 0).pvalue}


def row_of(store, metric="hellaswag/gold_logprob", **kwargs):
    table = items_table(load_runs(store), metric, "baseline", **kwargs)
    return table.frame.row(0, named=True), table


@pytest.mark.unit
@pytest.mark.parametrize("metric", ["gold_logprob", "acc_norm", "acc"])
def test_the_by_item_row_equals_an_independent_computation_from_the_item_files(store, metric):
    row, _ = row_of(store, f"hellaswag/{metric}")
    expected = independent(store, metric)
    assert row["n"] == 3 and row["items"] == expected["items"] == ITEMS
    for key in ("mean", "sd", "se", "ci_low", "ci_high", "p"):
        assert row[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), key
    assert row["interval_over"] == "seeds" and row["marks"] == "exploratory" and row["p_holm"] is None
    assert row["re_low"] < row["mean"] < row["re_high"] and row["re_df"] >= 2


@pytest.mark.unit
def test_the_crossed_interval_counts_the_items_and_the_seeds():
    by_seed = {0: {0: 1.0, 1: 3.0}, 1: {0: 1.0, 1: 3.0}}  # equal seeds: only the items spread (MS_I = 4, 1 df)
    row = crossed_interval(by_seed, [0, 1])
    assert row["re_df"] == pytest.approx(1.0) and row["re_high"] - 2.0 == pytest.approx(12.7062047, rel=1e-6)
    by_seed = {0: {0: 1.0, 1: 1.0}, 1: {0: 5.0, 1: 5.0}}  # equal items: the seed-level t interval (1 df)
    row = crossed_interval(by_seed, [0, 1])
    assert row["re_df"] == pytest.approx(1.0) and row["re_high"] - 3.0 == pytest.approx(12.7062047 * 2.0, rel=1e-6)


@pytest.mark.unit
def test_json_rows_carry_the_statistics_and_positive_means_the_arm_is_better(store, capsys):
    assert main(["table", str(store), "--metric", "hellaswag/gold_logprob", "--by-item", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["rows"][0]
    for key in ("n", "items", "mean", "sd", "se", "ci_low", "ci_high", "re_low", "re_high", "re_df", "p"):
        assert key in row, key
    assert row["arm"] == "sink-logit" and row["mean"] > 0  # the arm's gold log-likelihoods are 0.4 higher
    assert any("positive means the arm is better" in w for w in out["warnings"])
    assert main(["table", str(store), "--metric", "hellaswag/acc_norm", "--by-item"]) == 0
    text = capsys.readouterr().out
    assert "| 10M | sink-logit | 3 | 40 |" in text and "crossed 95%" in text


@pytest.mark.unit
def test_a_differing_hash_is_refused_naming_the_task_and_the_item(store, capsys):
    folder = store / "10M" / "sink-logit" / "seed1"
    rows = list(read_lines(store, "sink-logit", 1).values())
    rows[5]["prompt_hash"] = "another template"
    write_items(folder, rows)
    with pytest.raises(AblateError, match=r"hellaswag item 5: runs .*seed1 and .*seed1 scored different text "
                                          r"\(their prompt_hash differs"):
        row_of(store)
    assert main(["table", str(store), "--metric", "hellaswag/acc", "--by-item"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hellaswag item 5" in err and "Traceback" not in err


@pytest.mark.unit
def test_one_seed_gives_the_item_level_interval_marked_as_item_variance_only(tmp_path):
    store = make_store(tmp_path, seeds=1)
    row, table = row_of(store)
    arm, ref = read_lines(store, "sink-logit", 0), read_lines(store, "baseline", 0)
    deltas = np.array([arm[i]["gold_logprob"] - ref[i]["gold_logprob"] for i in sorted(arm.keys() & ref.keys())])
    result = stats.ttest_rel([arm[i]["gold_logprob"] for i in sorted(arm)],
                             [ref[i]["gold_logprob"] for i in sorted(arm)])
    interval = stats.t.interval(0.95, len(deltas) - 1, loc=deltas.mean(), scale=stats.sem(deltas))
    assert row["n"] == 1 and row["items"] == ITEMS and row["interval_over"] == "items"
    assert row["mean"] == pytest.approx(deltas.mean(), rel=1e-12)
    assert row["sd"] == pytest.approx(deltas.std(ddof=1), rel=1e-12)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(interval, rel=1e-9)
    assert row["p"] == pytest.approx(result.pvalue, rel=1e-9)
    assert row["marks"] == "exploratory,items-only"
    text = render_items(table, "md")
    assert "(1 seed: over items)" in text and "they cover the variance over items, not over training seeds" in text


@pytest.mark.unit
def test_a_run_whose_weights_changed_after_evaluation_is_not_paired(store):
    summary_path = store / "10M" / "sink-logit" / "seed2" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["weights_sha256"] = hashlib.sha256(b"trained again").hexdigest()
    summary_path.write_text(json.dumps(summary))
    row, table = row_of(store)
    expected = independent(store, "gold_logprob", seeds=(0, 1))
    assert row["n"] == 2 and row["mean"] == pytest.approx(expected["mean"], rel=1e-12)
    assert any("10M/sink-logit/seed2" in w and "other weights" in w for w in table.warnings)


@pytest.mark.unit
def test_an_item_file_copied_from_another_run_is_not_used(store):
    source = store / "10M" / "sink-logit" / "seed0" / "eval_items" / "hellaswag.jsonl"
    shutil.copy(source, store / "10M" / "sink-logit" / "seed1" / "eval_items" / "hellaswag.jsonl")
    row, table = row_of(store)
    assert row["n"] == 2
    assert any("10M/sink-logit/seed1" in w and "not the item file its eval.json recorded" in w for w in table.warnings)


@pytest.mark.unit
def test_bad_requests_are_one_line_naming_the_way_out(store, capsys):
    cases = [(["--by-item"], "give --metric TASK/METRIC"),
             (["--by-item", "--metric", "hellaswag/acc", "--kind", "increments"], "paired table only"),
             (["--by-item", "--metric", "hellaswag/f1"],
              "valid by-item metrics: hellaswag/acc, hellaswag/acc_norm, hellaswag/gold_logprob"),
             (["--by-item", "--metric", "lambada_openai/acc"], "no counted run has per-item results of lambada_openai")]
    for extra, expected in cases:
        assert main(["table", str(store), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.unit
def test_other_eval_settings_in_one_tier_are_refused(store):
    path = store / "10M" / "baseline" / "seed2" / "eval.json"
    data = json.loads(path.read_text())
    data["tasks"]["hellaswag"]["settings"]["limit"] = 10
    path.write_text(json.dumps(data))
    with pytest.raises(AblateError, match="used other settings"):
        row_of(store)


@pytest.mark.unit
def test_the_report_pairs_by_item_and_adds_gold_logprob(store):
    folder = write_report(store)
    text = (folder / "downstream.md").read_text()
    assert "hellaswag/gold_logprob" in text and "Paired by item and seed" in text
    expected = independent(store, "acc_norm")
    assert f"{expected['mean']:+.4f} ± {expected['sd']:.4f}" in text


@pytest.mark.system
def test_the_by_item_table_loads_no_torch(store):
    code = (f"from ablate.cli import main\nassert main(['table', {str(store)!r}, '--metric', 'hellaswag/acc', "
            "'--by-item', '--format', 'json']) == 0\nimport sys\nprint(sorted(m for m in ('torch', 'lm_eval') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
