"""Downstream metrics in the paired tables: same sign convention as the loss, refused when unmatched."""

import hashlib
import json

import numpy as np
import pytest
from scipy import stats

from ablate.analysis.load import load_runs
from ablate.analysis.report import write_report
from ablate.analysis.build import build_table
from ablate.errors import AblateError
from analysis_fixtures import write_run
from datafix import ablate_cli

pytestmark = pytest.mark.unit

SETTINGS = {"task_version": 1.0, "lm_eval_version": "0.4.13", "limit": None, "num_fewshot": 0,
            "data": "hub:Rowan/hellaswag"}
ACC = {("baseline", 0): 0.30, ("baseline", 1): 0.31, ("baseline", 2): 0.29,
       ("sink-logit", 0): 0.32, ("sink-logit", 1): 0.315, ("sink-logit", 2): 0.30}
PPL = {("baseline", 0): 40.0, ("baseline", 1): 41.0, ("baseline", 2): 39.5,
       ("sink-logit", 0): 39.0, ("sink-logit", 1): 41.5, ("sink-logit", 2): 38.0}


def write_eval(folder, acc, ppl, settings=SETTINGS):
    weights = json.loads((folder / "summary.json").read_text())["weights_sha256"]  # they scored the run's weights
    tasks = {"hellaswag": {"settings": settings, "weights_sha256": weights, "metrics": {
                "acc_norm": {"value": acc, "stderr": 0.004, "higher_is_better": True}}},
             "wikitext": {"settings": {**settings, "data": "hub:wikitext"}, "weights_sha256": weights, "metrics": {
                "word_perplexity": {"value": ppl, "stderr": None, "higher_is_better": False}}}}
    (folder / "eval.json").write_text(json.dumps({"tasks": tasks}))


def write_evaluated_study(root):
    """root/study: one 10M run per (arm, seed) of ACC, each with its eval.json (ACC, PPL)."""
    for (arm, seed), acc in ACC.items():
        folder = write_run(root, "study", "10M", arm, seed, 4.0 - 0.01 * seed, curve_points=2,
                           weights_sha256=hashlib.sha256(f"{arm}/{seed}".encode()).hexdigest())
        write_eval(folder, acc, PPL[(arm, seed)])
    return root / "study"


@pytest.fixture
def store(tmp_path):
    return write_evaluated_study(tmp_path)


def test_a_metric_where_higher_is_better_is_paired_as_arm_minus_reference(store):
    row = build_table(load_runs(store, metric="hellaswag/acc_norm"), "paired").frame.row(0, named=True)
    diffs = [ACC[("sink-logit", s)] - ACC[("baseline", s)] for s in range(3)]
    assert row["n"] == 3 and row["mean"] == pytest.approx(np.mean(diffs), abs=1e-15)
    assert row["p"] == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue, rel=1e-10)
    assert row["sd"] == pytest.approx(np.std(diffs, ddof=1), rel=1e-12)


def test_a_metric_where_lower_is_better_is_paired_as_reference_minus_arm(store):
    row = build_table(load_runs(store, metric="wikitext/word_perplexity"), "paired").frame.row(0, named=True)
    diffs = [PPL[("baseline", s)] - PPL[("sink-logit", s)] for s in range(3)]
    assert row["mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    assert row["p"] == pytest.approx(stats.ttest_rel([PPL[("baseline", s)] for s in range(3)],
                                                    [PPL[("sink-logit", s)] for s in range(3)]).pvalue, rel=1e-10)


def test_the_cli_states_the_sign_convention_and_refuses_other_settings(store):
    out = ablate_cli("table", store, "--metric", "hellaswag/acc_norm").stdout
    assert "higher is better" in out and "positive: the arm is better" in out
    write_eval(store / "10M" / "sink-logit" / "seed1", 0.315, 41.5, {**SETTINGS, "limit": 100})
    refused = ablate_cli("table", store, "--metric", "hellaswag/acc_norm", check=False)
    assert refused.returncode == 2 and "eval_fingerprint" in refused.stderr and "other settings" in refused.stderr
    bad = ablate_cli("table", store, "--metric", "hellaswag/f1", check=False)
    assert bad.returncode == 2 and "valid metrics: hellaswag/acc_norm, wikitext/word_perplexity" in bad.stderr


def test_an_unevaluated_run_is_excluded_with_its_reason(store):
    (store / "10M" / "baseline" / "seed2" / "eval.json").unlink()
    table = build_table(load_runs(store, metric="hellaswag/acc_norm"), "paired")
    assert table.frame["n"].to_list() == [2]
    assert any("not evaluated on hellaswag/acc_norm" in w for w in table.warnings)
    with pytest.raises(AblateError, match="give an experiment"):
        path = store.parent / "x.csv"
        path.write_text("tier,arm,seed,val_loss\n10M,baseline,0,1.0\n")
        load_runs(path, metric="hellaswag/acc_norm")


def test_the_report_adds_a_downstream_table(store):
    folder = write_report(store)
    text = (folder / "downstream.md").read_text()
    assert "hellaswag/acc_norm" in text and "wikitext/word_perplexity" in text
    assert "Downstream evaluation" in (folder / "summary.md").read_text()
