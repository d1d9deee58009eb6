"""The LR sweep and the tuned table obey the grid's rules: a run's lr is its folder's, one folder per run, every
identity the grid's rows carry (data_id, fingerprints), and every arm tuned on the declared grid only."""

import json
import shutil

import pytest

from ablate.analysis.lr import lr_table
from ablate.analysis.tuned import tuned_tables
from ablate.errors import AblateError
from test_lr_sweep import BASE_LR, sweep_experiment, write_run, write_sweep

pytestmark = pytest.mark.unit

ARMS = ("baseline", "sink-logit")


def a_sweep(root, seeds=1, factors=(0.5, 1.0, 2.0)):
    """baseline best at ×1, sink-logit at ×2."""
    experiment = sweep_experiment(seeds=seeds, factors=factors)
    losses = {("baseline", f): (5.0 + abs(f - 1), 5.0) for f in factors}
    losses.update({("sink-logit", f): (5.0 + abs(f - 2), 5.0) for f in factors})
    write_sweep(root, experiment, losses)
    return experiment


def with_confirmatory(root, experiment):
    for spec in experiment.runs():
        write_run(root, spec, val=4.0 + 0.01 * spec.seed)
    for spec in experiment.confirmatory_runs({"smoke": {"sink-logit": 2.0}}):
        write_run(root, spec, val=3.9 + 0.01 * spec.seed)
    return lr_table(root / "lrx").best_factors()


def edit_summary(folder, **changes):
    path = folder / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_sweep_run_whose_lr_is_not_its_folders_factor_is_refused(tmp_path):
    """Item 1: swapping a baseline's lr0.5 and lr2 folders moved its best LR to its worst."""
    a_sweep(tmp_path)
    arm = tmp_path / "lrx" / "smoke" / "baseline"
    (arm / "lr0.5").rename(arm / "swap")
    (arm / "lr2").rename(arm / "lr0.5")
    (arm / "swap").rename(arm / "lr2")
    with pytest.raises(AblateError, match=r"baseline/lr0.5/seed1000 lies in the folder of lr factor 0.5 but its "
                                          r"config.json trained at lr 0.006, ×2 of tier smoke's lr 0.003"):
        lr_table(tmp_path / "lrx")


def test_a_confirmatory_run_whose_lr_is_not_its_folders_factor_is_refused(tmp_path):
    experiment = a_sweep(tmp_path)
    best = with_confirmatory(tmp_path, experiment)
    wrong = experiment.confirmatory_runs({"smoke": {"sink-logit": 0.5}})[0]
    write_run(tmp_path, wrong, val=3.0, lr=BASE_LR * 2)  # trained at ×2, filed under lr0.5
    with pytest.raises(AblateError, match=r"sink-logit/lr0.5/seed0 lies in the folder of lr factor 0.5"):
        tuned_tables(tmp_path / "lrx", best)


def test_one_sweep_run_under_two_spellings_of_its_factor_is_refused(tmp_path):
    """Item 2: `cp -r lr1 lr1.0` made a 1-seed sweep say "seeds 2"."""
    a_sweep(tmp_path)
    arm = tmp_path / "lrx" / "smoke" / "baseline"
    shutil.copytree(arm / "lr1", arm / "lr1.0")
    with pytest.raises(AblateError, match=r"run smoke/baseline/lr1/seed1000 appears twice: .*/lr1/seed1000 and "
                                          r".*/lr1.0/seed1000"):
        lr_table(tmp_path / "lrx")


def test_a_copied_confirmatory_run_is_refused_not_counted_twice(tmp_path):
    """Item 3: `cp -r lr2 lr2.0` made the tuned table's n 2 → 3... (here 2 seeds → 4 rows)."""
    experiment = a_sweep(tmp_path)
    best = with_confirmatory(tmp_path, experiment)
    arm = tmp_path / "lrx" / "smoke" / "sink-logit"
    shutil.copytree(arm / "lr2", arm / "lr2.0")
    with pytest.raises(AblateError, match=r"run smoke/sink-logit/lr2/seed0 appears twice"):
        tuned_tables(tmp_path / "lrx", best)


def test_the_tuned_table_refuses_seeds_trained_on_different_data(tmp_path):
    """Item 4: tuned rows carry data_id (and every identity of the grid's rows)."""
    experiment = a_sweep(tmp_path)
    for folder in (tmp_path / "lrx" / "smoke").glob("*/*seed*"):
        edit_summary(folder, data_id="data-A")
    best = with_confirmatory(tmp_path, experiment)
    for folder in (tmp_path / "lrx" / "smoke").glob("*/seed*"):
        edit_summary(folder, data_id="data-A")
    edit_summary(tmp_path / "lrx" / "smoke" / "sink-logit" / "lr2" / "seed0", data_id="data-A")
    edit_summary(tmp_path / "lrx" / "smoke" / "sink-logit" / "lr2" / "seed1", data_id="data-B")
    with pytest.raises(AblateError, match=r"sink-logit/lr2/seed1 are not matched: their data_id differs"):
        tuned_tables(tmp_path / "lrx", best)


def test_the_tuned_table_marks_mixed_numerics(tmp_path):
    """Minor: the tuned rows carry what computed each run, so a row mixing kernel sets is marked."""
    experiment = a_sweep(tmp_path)
    best = with_confirmatory(tmp_path, experiment)
    for seed, kind in ((0, "AVX2"), (1, "AVX512")):
        edit_summary(tmp_path / "lrx" / "smoke" / "sink-logit" / "lr2" / f"seed{seed}",
                     versions={"numerics": {"cpu_capability": kind}})
    _, tuned, _, _ = tuned_tables(tmp_path / "lrx", best)
    assert "mixed-numerics" in str(tuned.frame.filter(tuned.frame["arm"] == "sink-logit").row(0, named=True))


def test_the_lr_table_refuses_sweep_seeds_on_different_data_and_runs_without_fingerprints(tmp_path):
    """Item 5: one data_id per tier, and the fingerprints, as the grid's tables require."""
    a_sweep(tmp_path, seeds=2)
    runs = sorted((tmp_path / "lrx" / "smoke").glob("*/lr*/seed*"))
    for folder in runs:
        edit_summary(folder, data_id="data-A" if folder.name == "seed1000" else "data-B")
    with pytest.raises(AblateError, match=r"are not matched: their data_id differs"):
        lr_table(tmp_path / "lrx")
    for folder in runs:
        edit_summary(folder, data_id="data-A")
    assert lr_table(tmp_path / "lrx").best_factors() == {"smoke": {"baseline": 1.0, "sink-logit": 2.0}}
    summary = json.loads((runs[0] / "summary.json").read_text())
    del summary["data_fingerprint"], summary["val_fingerprint"]
    (runs[0] / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(AblateError, match=r"has no data_fingerprint, val_fingerprint .*--allow-unverified"):
        lr_table(tmp_path / "lrx")
    assert lr_table(tmp_path / "lrx", allow_unverified=True).best_factors()["smoke"]["baseline"] == 1.0


def test_an_arm_swept_on_extra_factors_is_refused_or_held_to_the_declared_grid(tmp_path):
    """Item 6: sink-logit swept again at ×0.7 and ×1.4 found its best at ×1.4, outside the declared sweep."""
    experiment = a_sweep(tmp_path, factors=(0.5, 1.0, 2.0))
    extra = sweep_experiment(seeds=1, factors=(0.7, 1.4))
    for spec in extra.sweep_runs():
        if spec.arm == "sink-logit":
            write_run(tmp_path, spec, loss=3.0 if spec.lr_factor == 1.4 else 6.0, val=5.0)
    with pytest.raises(AblateError, match=r"the arms of tier smoke were swept on different grids: "
                                          r"smoke/sink-logit/lr0.7/seed1000, smoke/sink-logit/lr1.4/seed1000 lie "
                                          r"outside the grid every arm shares \(factors 0.5, 1, 2; seeds 1000\)"):
        lr_table(tmp_path / "lrx")
    table = lr_table(tmp_path / "lrx", sweep=experiment.lr_sweep)
    assert table.best_factors() == {"smoke": {"baseline": 1.0, "sink-logit": 2.0}}
    assert any("outside the declared sweep (factors 0.5, 1, 2; seeds 1000) are not counted: "
               "smoke/sink-logit/lr0.7/seed1000, smoke/sink-logit/lr1.4/seed1000" in w for w in table.warnings)
    assert {r["factor"] for r in table.rows} == {0.5, 1.0, 2.0}


def test_confirmatory_runs_reporting_on_the_sweeps_selection_tokens_are_refused(tmp_path):
    """Item 12: final_val_tokens raised between the sweep and `--tuned` moved the confirmatory runs' validation
    windows onto the tokens the sweep chose the LR on."""
    experiment = a_sweep(tmp_path)
    seq_len = 64  # the smoke tier's; windows of seq_len + 1 tokens
    for folder in (tmp_path / "lrx" / "smoke").glob("*/lr*/seed*"):
        edit_summary(folder, val_tokens_evaluated=8 * seq_len)  # selection split from token 8 × 65 = 520
    best = with_confirmatory(tmp_path, experiment)
    confirmatory = [p for p in (tmp_path / "lrx" / "smoke").glob("*/seed*")] + \
        list((tmp_path / "lrx" / "smoke" / "sink-logit" / "lr2").glob("seed*"))
    for folder in confirmatory:
        edit_summary(folder, val_tokens_evaluated=8 * seq_len)
    tuned_tables(tmp_path / "lrx", best)  # the same windows as the sweep's validation: disjoint from selection
    for folder in confirmatory:
        edit_summary(folder, val_tokens_evaluated=16 * seq_len)
    with pytest.raises(AblateError, match=r"reports its loss on val-split tokens 0–1039, which reach the LR sweep's "
                                          r"selection split \(from token 520"):
        tuned_tables(tmp_path / "lrx", best)


def test_older_runs_without_val_tokens_evaluated_are_checked_from_their_config_or_refused(tmp_path):
    """Issue 54 item 17: a summary without val_tokens_evaluated (an older run) passed the selection-split check
    unchecked. Its reach is read from config.json's final_val_tokens and seq_len (smoke: 8192 tokens of windows
    of 64 + 1, so 128 windows, val-split tokens 0–8319; the sweep's selection split starts after them)."""
    experiment = a_sweep(tmp_path)  # no summary here records val_tokens_evaluated
    raised = 2 * 64 * 128  # final_val_tokens doubled after the sweep: 256 windows, tokens 0–16639
    for spec in experiment.runs():
        write_run(tmp_path, spec, val=4.0 + 0.01 * spec.seed, final_val_tokens=raised)
    for spec in experiment.confirmatory_runs({"smoke": {"sink-logit": 2.0}}):
        write_run(tmp_path, spec, val=3.9 + 0.01 * spec.seed, final_val_tokens=raised)
    best = lr_table(tmp_path / "lrx").best_factors()
    with pytest.raises(AblateError, match=r"reports its loss on val-split tokens 0–16639, which reach the LR sweep's "
                                          r"selection split \(from token 8320"):
        tuned_tables(tmp_path / "lrx", best)
    for spec in [*experiment.runs(), *experiment.confirmatory_runs({"smoke": {"sink-logit": 2.0}})]:
        write_run(tmp_path, spec, val=4.0 + 0.01 * spec.seed)  # the sweep's final_val_tokens: disjoint, tabled
    tuned_tables(tmp_path / "lrx", best)
    confirmatory = tmp_path / "lrx" / "smoke" / "sink-logit" / "lr2" / "seed1"
    (confirmatory / "config.json").unlink()  # neither record: refused, named, not passed unchecked
    with pytest.raises(AblateError, match=r"run .*sink-logit/lr2/seed1 records neither val_tokens_evaluated "
                                          r"\(summary.json\) nor final_val_tokens and seq_len \(config.json\)"):
        tuned_tables(tmp_path / "lrx", best, allow_unverified=True)
