"""Every arm at its own learning rate: the sweep's grid and matching, selection without leaks, divergence as data,
the quadratic vertex, confirmatory seeds, the tuned paired table."""

import json
import math
import os
from collections import Counter

import numpy as np
import pytest

from ablate.analysis.lr import lr_table
from ablate.analysis.tuned import tuned_tables
from ablate.config import resolve_config
from ablate.errors import AblateError
from ablate.experiment import Experiment, LRSweep, RunSpec
from ablate.identity import config_differences, config_fingerprint
from ablate.store import atomic_write_json, iter_run_dirs
from datafix import REPO, ablate_cli, ablate_on_path

BASE_LR = 3e-3  # the smoke tier's


def sweep_experiment(**sweep):
    return Experiment(name="lrx", tiers=("smoke",), arms=("baseline", "sink-logit"), seeds=2,
                      lr_sweep=LRSweep(**{"factors": (0.5, 1, 2), "tiers": ("smoke",), **sweep}))


@pytest.mark.unit
def test_the_sweep_grid_is_arms_by_factors_by_its_seeds_and_differs_only_in_lr():
    experiment = sweep_experiment(factors=(2, 0.5, 1), seeds=2)
    specs = experiment.sweep_runs()
    assert len(specs) == 2 * 3 * 2
    assert [s.key for s in specs[:3]] == ["smoke/baseline/lr0.5/seed1000", "smoke/baseline/lr0.5/seed1001",
                                          "smoke/baseline/lr1/seed1000"]
    configs = {s.key: resolve_config(s).to_dict() for s in specs}
    first = configs[specs[0].key]
    for spec in specs[1:]:
        keys = {d[0] for d in config_differences(first, configs[spec.key], across_seeds=True)}
        assert keys <= {"lr"}, keys  # the arm and the seed aside, only lr differs
    assert sorted({c["lr"] for c in configs.values()}) == pytest.approx([BASE_LR * 0.5, BASE_LR, BASE_LR * 2])
    assert all(c["selection_tokens"] == 4 * 64 * 8 for c in configs.values())  # default: the tier's val_tokens
    grid_config = resolve_config(experiment.runs()[0]).to_dict()
    assert "selection_tokens" not in grid_config  # a grid run's config (and fingerprint) is what it was
    assert {s.seed for s in specs} == {1000, 1001}


@pytest.mark.unit
def test_sweep_declarations_are_checked():
    with pytest.raises(AblateError, match="first seed 1 is one of the grid's seeds"):
        sweep_experiment(first_seed=1)
    with pytest.raises(AblateError, match="tier 'xl'"):
        sweep_experiment(tiers=("xl",))
    with pytest.raises(AblateError, match="positive numbers"):
        sweep_experiment(factors=(1, -2))
    with pytest.raises(AblateError, match="declares no LR sweep"):
        Experiment(name="plain", tiers=("smoke",), arms=("baseline",), seeds=1).sweep_runs()


@pytest.mark.unit
def test_confirmatory_runs_use_the_grid_seeds_which_the_sweep_did_not():
    experiment = sweep_experiment(seeds=2)
    confirm = experiment.confirmatory_runs({"smoke": {"baseline": 1.0, "sink-logit": 2.0}})
    sweep_seeds = {s.seed for s in experiment.sweep_runs()}
    assert {s.seed for s in confirm} == {0, 1} and not {s.seed for s in confirm} & sweep_seeds
    keys = sorted(s.key for s in confirm)
    assert keys == ["smoke/baseline/seed0", "smoke/baseline/seed1",  # the shared LR: the grid's runs serve
                    "smoke/sink-logit/lr2/seed0", "smoke/sink-logit/lr2/seed1"]
    tuned = [s for s in confirm if s.arm == "sink-logit"][0]
    assert resolve_config(tuned).lr == pytest.approx(2 * BASE_LR) and resolve_config(tuned).selection_tokens is None


# ---------------------------------------------------------------------------------------------- hand-made stores
def write_run(root, spec: RunSpec, *, loss=None, val=None, status="completed", **config_changes):
    """A run folder as training leaves it: config.json and summary.json, fingerprints shared within a seed."""
    config = {**resolve_config(spec, data_dir="data/sample").to_dict(), **config_changes}
    folder = spec.folder(root)
    atomic_write_json(folder / "config.json", config)
    summary = {"experiment": spec.experiment, "tier": spec.tier, "arm": spec.arm, "seed": spec.seed, "status": status,
               "val_loss": val if status == "completed" else None, "init_fingerprint": f"init{spec.seed}",
               "init_fingerprint_common": f"init{spec.seed}", "data_fingerprint": f"data{spec.seed}",
               "config_fingerprint": config_fingerprint(config), "val_fingerprint": "val", "mlp_hidden": 256}
    if "selection_tokens" in config and status == "completed":
        summary.update(selection_loss=loss, selection_fingerprint="sel")
    if status == "diverged":
        summary.update(diverged_step=3, error="non-finite training loss nan at step 3")
    atomic_write_json(folder / "summary.json", summary)
    return folder


def write_sweep(root, experiment, losses: dict):
    """losses: {(arm, factor): (selection loss, val loss) or "diverged"}, one per sweep seed."""
    for spec in experiment.sweep_runs():
        value = losses[(spec.arm, spec.lr_factor)]
        if value == "diverged":
            write_run(root, spec, status="diverged")
        else:
            write_run(root, spec, loss=value[0] + 0.001 * (spec.seed - 1000), val=value[1])


@pytest.mark.unit
def test_the_best_lr_is_chosen_on_the_selection_split_not_the_validation_split(tmp_path):
    experiment = sweep_experiment(seeds=1)
    # selection and validation disagree: selection is lowest at ×2, validation at ×0.5
    write_sweep(tmp_path, experiment, {(arm, f): (5.0 - 0.1 * f, 4.0 + 0.1 * f) for arm in ("baseline", "sink-logit")
                                       for f in (0.5, 1.0, 2.0)})
    table = lr_table(tmp_path / "lrx")
    assert [b["best_lr"] for b in table.best] == pytest.approx([2 * BASE_LR, 2 * BASE_LR])
    assert table.best_factors() == {"smoke": {"baseline": 2.0, "sink-logit": 2.0}}
    row = table.as_json()["rows"][0]
    assert set(row) == {"tier", "arm", "lr", "seeds", "loss_mean", "loss_sd", "val_loss_mean", "diverged"}
    assert row["loss_mean"] == pytest.approx(4.95) and row["val_loss_mean"] == pytest.approx(4.05)
    assert not list(iter_run_dirs(tmp_path / "lrx"))  # the grid's readers never count a sweep run


@pytest.mark.unit
def test_a_sweep_run_of_another_batch_size_is_refused(tmp_path):
    experiment = sweep_experiment(seeds=1)
    write_sweep(tmp_path, experiment,
                {(arm, f): (5.0, 4.0) for arm in ("baseline", "sink-logit") for f in (0.5, 1.0, 2.0)})
    odd = [s for s in experiment.sweep_runs() if s.arm == "sink-logit" and s.lr_factor == 2.0][0]
    write_run(tmp_path, odd, loss=4.0, val=4.0, global_batch=8)
    with pytest.raises(AblateError, match=r"differ in global_batch: 4 vs 8.*may differ only in lr"):
        lr_table(tmp_path / "lrx")


@pytest.mark.unit
def test_a_hand_edited_sweep_or_confirmatory_config_is_refused(tmp_path):
    """The LR table and the tuned pairs read config.json (lr, the selection split): each checks it against the
    fingerprint the run trained with, as every table does."""
    experiment = sweep_experiment(seeds=1)
    write_sweep(tmp_path, experiment, {(arm, f): (5.0 + abs(f - 1), 5.0) for arm in ("baseline", "sink-logit")
                                       for f in (0.5, 1.0, 2.0)})
    for spec in experiment.runs():
        write_run(tmp_path, spec, val=4.0 + 0.01 * spec.seed)
    best = lr_table(tmp_path / "lrx").best_factors()
    swept = [s for s in experiment.sweep_runs() if s.arm == "sink-logit" and s.lr_factor == 2.0][0]
    config = swept.folder(tmp_path) / "config.json"
    config.write_text(config.read_text().replace('"steps": ', '"steps": 1', 1))  # edited after the run
    with pytest.raises(AblateError, match=r"is damaged: its config.json is not the configuration it trained with"):
        lr_table(tmp_path / "lrx")
    config.write_text(config.read_text().replace('"steps": 1', '"steps": ', 1))
    grid = [s for s in experiment.runs() if s.arm == "baseline"][0].folder(tmp_path) / "config.json"
    grid.write_text(grid.read_text().replace('"steps": ', '"steps": 1', 1))
    with pytest.raises(AblateError, match=r"is damaged"):
        tuned_tables(tmp_path / "lrx", best)


@pytest.mark.unit
def test_a_diverged_top_lr_sets_the_largest_stable_lr_below_it(tmp_path):
    experiment = sweep_experiment(factors=(0.5, 1, 2, 4), seeds=1)
    losses = {("baseline", 0.5): (5.0, 5.0), ("baseline", 1.0): (4.9, 4.9), ("baseline", 2.0): (4.93, 4.9),
              ("baseline", 4.0): "diverged"}
    losses.update({("sink-logit", f): (5.0 - 0.002 * f, 5.0) for f in (0.5, 1.0, 2.0, 4.0)})
    write_sweep(tmp_path, experiment, losses)
    table = lr_table(tmp_path / "lrx", margin=0.05, delta=0.02)
    best = {b["arm"]: b for b in table.best}
    top = [r for r in table.rows if r["arm"] == "baseline" and r["factor"] == 4.0][0]
    assert top["diverged"] == 1 and top["loss_mean"] is None
    assert best["baseline"]["max_stable_lr"] == pytest.approx(2 * BASE_LR)  # below the diverged ×4
    assert best["sink-logit"]["max_stable_lr"] == pytest.approx(4 * BASE_LR)
    assert best["baseline"]["range_width_log2"] == pytest.approx(0.0)  # ×2 is 0.03 worse: outside δ = 0.02
    assert best["sink-logit"]["range_width_log2"] == pytest.approx(3.0)  # ×0.5 … ×4 all within δ


@pytest.mark.unit
def test_the_quadratic_vertex_is_numpy_polyfit_s_over_the_best_lr_and_its_neighbours(tmp_path):
    experiment = sweep_experiment(factors=(0.25, 0.5, 1, 2, 4), seeds=2)
    rng = np.random.default_rng(3)
    curve = {f: 4.0 + 0.03 * (math.log2(f) - 0.4) ** 2 + float(rng.normal(0, 0.002)) for f in (0.25, 0.5, 1, 2, 4)}
    write_sweep(tmp_path, experiment, {(arm, float(f)): (v, v) for arm in ("baseline", "sink-logit")
                                       for f, v in curve.items()})
    table = lr_table(tmp_path / "lrx")
    best = table.best[0]
    assert best["best_lr"] == pytest.approx(BASE_LR)  # the minimum of the means is at ×1
    x = [math.log2(BASE_LR * f) for f in (0.5, 1, 2) for _ in (0, 1)]
    y = [curve[f] + 0.001 * k for f in (0.5, 1, 2) for k in (0, 1)]
    a, b, _ = np.polyfit(x, y, 2)
    assert best["vertex_lr"] == pytest.approx(2 ** (-b / (2 * a)), rel=1e-9)
    assert table.curvature[("smoke", "baseline")] == pytest.approx(2 * a, rel=1e-9)


@pytest.mark.unit
def test_table_tuned_reads_the_folder_once(tmp_path, monkeypatch, capsys):
    """`ablate table FOLDER --tuned`: the run folders listed once each (the grid's, the sweep's) and every run's
    summary.json and config.json read once, though the LR table, the grid's table and the tuned table all read
    them (they read the folder two and three times before: `ablate.analysis.load.RunFolders`)."""
    import ablate.store
    from ablate.cli import main

    experiment = sweep_experiment(seeds=1)
    write_sweep(tmp_path, experiment, {(arm, f): (5.0 + abs(f - 1), 5.0) for arm in ("baseline", "sink-logit")
                                       for f in (0.5, 1.0, 2.0)})
    for spec in experiment.runs():
        write_run(tmp_path, spec, val=4.0 + 0.01 * spec.seed)
    reads, listings = [], []
    read_json, glob = ablate.store.read_json, type(tmp_path).glob
    monkeypatch.setattr(ablate.store, "read_json", lambda path: reads.append(str(path)) or read_json(path))
    monkeypatch.setattr(type(tmp_path), "glob", lambda self, pattern: listings.append(pattern) or glob(self, pattern))
    assert main(["table", str(tmp_path / "lrx"), "--tuned"]) == 0
    assert "each arm at its own best LR" in capsys.readouterr().out
    summaries = [r for r in reads if r.endswith("summary.json")]
    assert len(summaries) == 2 * 3 + 2 * 2 == len(set(summaries))  # the 6 sweep runs' and the 4 grid runs', once
    configs = Counter(r for r in reads if r.endswith("config.json"))  # once for the settings, once checked against
    assert len(configs) == 10 and set(configs.values()) == {2}  # the run's fingerprint (ablate.store's own check)
    assert sorted(p for p in listings if "seed*" in p) == ["*/*/lr*/seed*/summary.json", "*/*/seed*/summary.json"]


@pytest.mark.unit
def test_tuned_pairs_each_arm_at_its_own_best_lr(tmp_path):
    experiment = sweep_experiment(seeds=1)
    # the sweep: baseline is best at ×1, sink-logit at ×2
    losses = {("baseline", f): (5.0 + abs(f - 1), 5.0) for f in (0.5, 1.0, 2.0)}
    losses.update({("sink-logit", f): (5.0 + abs(f - 2), 5.0) for f in (0.5, 1.0, 2.0)})
    write_sweep(tmp_path, experiment, losses)
    grid_losses = {("baseline", 0): 4.00, ("baseline", 1): 4.02, ("sink-logit", 0): 3.99, ("sink-logit", 1): 4.00}
    for spec in experiment.runs():
        write_run(tmp_path, spec, val=grid_losses[(spec.arm, spec.seed)])
    for spec in experiment.confirmatory_runs({"smoke": {"sink-logit": 2.0}}):
        write_run(tmp_path, spec, val=3.90 + 0.01 * spec.seed)  # sink-logit at its own best LR
    for spec in experiment.confirmatory_runs({"smoke": {"sink-logit": 0.5}}):
        write_run(tmp_path, spec, val=1.0)  # a run at another LR: not the arm's best, never paired
    best = lr_table(tmp_path / "lrx").best_factors()
    assert best == {"smoke": {"baseline": 1.0, "sink-logit": 2.0}}
    shared, tuned, survived, _ = tuned_tables(tmp_path / "lrx", best)
    mean = lambda t: t.frame.filter(t.frame["arm"] == "sink-logit")["mean"][0]  # noqa: E731
    assert mean(shared) == pytest.approx(((4.00 - 3.99) + (4.02 - 4.00)) / 2)
    assert mean(tuned) == pytest.approx(((4.00 - 3.90) + (4.02 - 3.91)) / 2)  # baseline ×1 vs sink-logit ×2
    assert survived[0]["sign_kept"] is True
    assert any("pairs differ in the arm and in lr only" in n for n in tuned.notes)
    from ablate.analysis.report import write_report

    report = write_report(tmp_path / "lrx")  # the LR section: the table, its U-curves, the tuned table beside
    summary = (report / "summary.md").read_text()
    assert (report / "lr.png").stat().st_size > 0 and json.loads((report / "lr.json").read_text())["best"]
    assert "smoke sink-logit: best lr 0.006" in summary
    assert survived[0]["did_mean"] == pytest.approx(0.09) and survived[0]["did_p"] is None  # d = 0.09, 0.09
    assert ("smoke sink-logit: no test (fewer than two seeds or no spread): no change detected; described: shared LR "
            "+0.0150 (not significant), tuned +0.1050 (significant), sign kept") in summary
    assert "Each arm at its own best LR" in (report / "tuned.md").read_text()
    assert "Did the picked LRs change the comparison?" in summary  # what the tuned test asks, named
    assert "It does not ask whether an arm's optimum moved" in summary
    assert "Did an arm's optimum move?" in summary  # the other question, its own test: one sweep seed, none
    assert "- smoke sink-logit vs baseline: no test (0 sweep seed(s) with a vertex at both arms" in summary


@pytest.mark.unit
def test_the_optimum_test_is_the_paired_t_of_the_sweep_seeds_parabola_vertices(tmp_path):
    """Issue 57 item 4: per sweep seed, the vertex of the parabola through its losses at the arm's best LR and its
    neighbours (numpy's polyfit here), the shift against the baseline's on the same seed, the t over the seeds."""
    from scipy import stats

    from ablate.analysis.lr import render_lr
    from ablate.analysis.lr_optimum import MOVED, NOT_MOVED, optimum_text

    factors = (0.25, 0.5, 1.0, 2.0, 4.0)
    experiment = sweep_experiment(factors=factors, seeds=2)
    rng = np.random.default_rng(5)
    centre = {"baseline": 0.1, "sink-logit": 1.2}  # sink-logit's optimum an octave above: ×2.3 vs ×1.07
    loss = {(spec.arm, spec.lr_factor, spec.seed): 4.0 + 0.03 * (math.log2(spec.lr_factor) - centre[spec.arm]) ** 2
            + float(rng.normal(0, 0.003)) for spec in experiment.sweep_runs()}
    for spec in experiment.sweep_runs():
        write_run(tmp_path, spec, loss=loss[(spec.arm, spec.lr_factor, spec.seed)], val=5.0)
    table = lr_table(tmp_path / "lrx")
    [row] = table.optimum
    best = table.best_factors()["smoke"]

    def vertex(arm, seed):
        i = factors.index(best[arm])
        x = [math.log2(BASE_LR * f) for f in factors[i - 1:i + 2]]
        a, b, _ = np.polyfit(x, [loss[(arm, f, seed)] for f in factors[i - 1:i + 2]], 2)
        return -b / (2 * a)

    d = [vertex("sink-logit", s) - vertex("baseline", s) for s in (1000, 1001)]
    se = np.std(d, ddof=1) / math.sqrt(2)
    p = 2 * stats.t.sf(abs(np.mean(d) / se), 1)
    assert (row["arm"], row["reference"], row["seeds"], row["df"]) == ("sink-logit", "baseline", 2, 1)
    assert row["shift_octaves"] == pytest.approx(np.mean(d), rel=1e-9) and row["se"] == pytest.approx(se, rel=1e-9)
    assert (row["low"], row["high"]) == pytest.approx((np.mean(d) - 12.7062 * se, np.mean(d) + 12.7062 * se), rel=1e-4)
    assert row["p"] == pytest.approx(p, rel=1e-9) and row["p_holm"] == row["p"]  # one arm against the reference
    assert row["decision"] == (MOVED if p < 0.05 else NOT_MOVED)
    assert "Did an arm's optimum move?" in render_lr(table, "md")
    assert json.loads(render_lr(table, "json"))["optimum"][0]["shift_octaves"] == pytest.approx(np.mean(d))
    assert f"smoke sink-logit vs baseline: optimum shift {np.mean(d):+.2f} octaves" in optimum_text(table.optimum)


# ---------------------------------------------------------------------------------------------- real runs
@pytest.mark.unit
def test_the_selection_split_is_held_out_after_the_validation_windows(sample_data):
    from ablate.data import selection_windows, validation_windows

    reported = validation_windows(sample_data, 64, 64 * 128)
    chosen = selection_windows(sample_data, 64, 64 * 128, 64 * 32)
    every = validation_windows(sample_data, 64, None)
    assert len(reported) == 128 and bool((every[:128] == reported).all())
    assert len(chosen) == 32 and bool((every[128:160] == chosen).all())  # the next windows, none of the reported
    with pytest.raises(AblateError, match="selection split needs 32 more.*--val-tokens 54600"):
        selection_windows(sample_data, 64, None, 64 * 32)  # the validation set takes every window: none is left


SWEEP_FILE = """
from ablate.experiment import Experiment, LRSweep

EXPERIMENT = Experiment(name="diverging", tiers=("smoke",), arms=("baseline",), seeds=1,
                        overrides={"max_steps": 6, "grad_clip": 1e30, "warmup_steps": 1},
                        lr_sweep=LRSweep(factors=(1, 1e9), tiers=("smoke",)))
"""


@pytest.mark.system
def test_a_run_diverging_at_the_top_lr_is_an_outcome_shown_and_never_retried(tmp_path, sample_data):
    (tmp_path / "diverging.py").write_text(SWEEP_FILE)
    common = ["--results", tmp_path / "res"]
    submit = ["submit", tmp_path / "diverging.py", "--sweep", "--executor", "local", "--parallel", "1",  # one worker
              "--data", sample_data, *common]
    ablate_cli(*submit, check=False)
    status = json.loads(ablate_cli("status", tmp_path / "diverging.py", "--sweep", "--json", *common).stdout)
    states = {r["lr_factor"]: r["state"] for r in status["runs"]}
    assert states == {1.0: "completed", 1e9: "diverged"}
    diverged = tmp_path / "res" / "diverging" / "smoke" / "baseline" / "lr1e+09" / "seed1000" / "summary.json"
    summary = json.loads(diverged.read_text())
    assert summary["status"] == "diverged" and 1 <= summary["diverged_step"] < 6  # it ended early, step recorded
    completed = json.loads(diverged.parent.parent.parent.joinpath("lr1", "seed1000", "summary.json").read_text())
    assert (math.isfinite(completed["selection_loss"])
            and completed["selection_fingerprint"] != completed["val_fingerprint"])
    again = ablate_cli(*submit)
    assert "nothing to submit (1 completed, 1 diverged)" in again.stdout  # the diverged run is not retried
    table = json.loads(ablate_cli("table", tmp_path / "diverging.py", "--kind", "lr", "--format", "json",
                                  *common).stdout)
    top = [r for r in table["rows"] if r["lr"] > 1][0]
    assert top["diverged"] == 1 and table["best"][0]["max_stable_lr"] == pytest.approx(BASE_LR)
    assert os.path.isdir(tmp_path / "res" / "diverging" / "smoke" / "baseline" / "lr1")


# ---------------------------------------------------------------------------------------------- docs/lr-sweeps.md
@pytest.mark.unit
def test_the_lr_page_s_costs_are_those_plan_computes():
    from ablate.experiment import load_experiment
    from ablate.plan import sweep_plan

    text = " ".join((REPO / "docs" / "lr-sweeps.md").read_text().split())
    plan = sweep_plan(load_experiment("sink_vs_filter"))
    assert (f"**{plan['total_runs']} runs, {plan['total_gpu_hours']:.1f} GPU-hours**" in text
            and f"**{plan['confirmatory_runs_at_most']} runs, {plan['confirmatory_gpu_hours_at_most']:.2f} GPU-hours**"
            in text and f"the grid's {plan['grid_runs']} runs, {plan['grid_gpu_hours']:.1f} GPU-hours" in text)
    assert plan["factors"] == [0.25, 0.5, 1, 2, 4, 8] and plan["seeds"] == [1000, 1001]  # 2 seeds: an interval


@pytest.mark.system
def test_the_lr_page_s_sweep_example_runs_as_written(tmp_path, sample_data):
    import re
    import shlex
    import subprocess

    page = (REPO / "docs" / "lr-sweeps.md").read_text()
    block = re.search(r"<!-- example: lr-sweep .*?-->\s*```bash\n(.*?)```", page, re.S)
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).strip().splitlines()]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(sample_data)
    results = {"ABLATE_RESULTS": str(tmp_path / "results")}  # the checkout's results/ otherwise
    out = []
    for line in lines:
        assert line.startswith("ablate "), line
        if " submit " in line:  # as a user's shell runs it (it starts the worker processes anyway)
            result = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=ablate_on_path(tmp_path, **results),
                                    capture_output=True, text=True, timeout=600)
        else:  # plan, status, table: the same command in this process (no torch import of its own)
            result = ablate_cli(*shlex.split(line)[1:], cwd=tmp_path, env=results, check=False)
        assert result.returncode == 0, (line, result.stderr[-2000:])
        out.append(result.stdout)
    assert "LR sweep:" in out[0] and "smoke/baseline/lr2/seed1000" in out[0]
    assert "ran 3 runs here, 0 failed" in out[1] and "completed: 3" in out[2]
    assert out[3].count("| smoke | baseline |") == 4  # a row at each of the 3 LRs, then the best LR's
    assert len(re.findall(r"\| smoke \| baseline \| 0\.00[0-9]+ \| 1 \|", out[3])) == 3


LRX_FILE = """
from ablate.experiment import Experiment, LRSweep

EXPERIMENT = Experiment(name="lrx", tiers=("smoke",), arms=("baseline", "sink-logit"), seeds=2,
                        lr_sweep=LRSweep(factors=(0.5, 1, 2), tiers=("smoke",)))
"""


@pytest.mark.unit
def test_submit_tuned_queues_the_grid_seeds_at_each_arm_s_best_lr_once_the_sweep_chose_it(tmp_path, sample_data):
    (tmp_path / "lrx.py").write_text(LRX_FILE)
    tuned = ["submit", tmp_path / "lrx.py", "--tuned", "--dry-run", "--data", sample_data, "--results", tmp_path]
    experiment = sweep_experiment(seeds=1)
    for spec in experiment.sweep_runs():
        if not (spec.arm == "sink-logit" and spec.lr_factor == 2.0):  # that one has not run yet
            write_run(tmp_path, spec, loss=5.0 + abs(spec.lr_factor - (1 if spec.arm == "baseline" else 2)), val=5.0)
    refused = ablate_cli(*tuned, check=False)
    assert refused.returncode == 2 and "no best LR yet for smoke/sink-logit" in refused.stderr
    write_run(tmp_path, [s for s in experiment.sweep_runs() if s.arm == "sink-logit" and s.lr_factor == 2.0][0],
              loss=5.0, val=5.0)
    listed = ablate_cli(*tuned).stdout
    assert "4 of 4 runs would be submitted" in listed
    for key in ("smoke/baseline/seed0", "smoke/baseline/seed1", "smoke/sink-logit/lr2/seed0",
                "smoke/sink-logit/lr2/seed1"):
        assert f"  {key}\n" in listed
