"""Results you can trust: each attack on the store, the pairing or the run folder, and what it now gets."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

import ablate.lock
from ablate.analysis.load import load_runs
from ablate.analysis.build import build_table
from ablate.errors import AblateError
from ablate.experiment import Experiment, RunSpec
from ablate.lock import FileLock, LockHeld
from ablate.store import SUBMIT_LOCK, read_json, read_metrics, run_dir, run_lock_path
from ablate.train import run
from conftest import STRAIGHT_ARM, STRAIGHT_STEPS
from datafix import REPO, ablate_cli

torch.set_num_threads(1)


def train(results, arm="baseline", seed=0, steps=4, experiment="study", data=None, **options):
    spec = RunSpec(experiment, "smoke", arm, seed, {"max_steps": steps, **options.pop("overrides", {})})
    return run(spec, results, data_dir=str(data), progress=False, **options)


# ---------------------------------------------------------------------------------------------- 1. matching
@pytest.mark.run
def test_runs_differing_in_lr_are_not_paired_and_the_keys_are_named(tmp_path, sample_data, finished_runs):
    finished_runs(tmp_path, ("baseline", 0))  # the smoke tier's own lr 0.003 and weight decay 0.1
    train(tmp_path, "sink-logit", data=sample_data, overrides={"lr": 0.05, "weight_decay": 0.5})
    result = ablate_cli("table", tmp_path / "study", check=False)
    assert result.returncode == 2, result.stdout
    message = result.stderr
    assert "smoke/baseline/seed0" in message and "smoke/sink-logit/seed0" in message
    assert ("their settings differ" in message and "lr: 0.003 vs 0.05" in message
            and "weight_decay: 0.1 vs 0.5" in message)


@pytest.mark.run
def test_matched_runs_share_every_fingerprint_and_pair(tmp_path, sample_data, finished_runs):
    a = read_json(run_dir(finished_runs(tmp_path, ("baseline", 0)), "study", "smoke", "baseline", 0) / "summary.json")
    b = train(tmp_path, "combo", data=sample_data, micro_batch=2, checkpoint_interval=2)  # execution-only keys
    for key in ("init_fingerprint", "data_fingerprint", "config_fingerprint", "val_fingerprint"):
        assert a[key] and a[key] == getattr(b, key), key
    assert a["val_tokens_evaluated"] == 128 * 64
    table = build_table(load_runs(tmp_path / "study"), "paired")
    row = table.frame.row(0, named=True)
    assert row["arm"] == "combo" and row["n"] == 1
    assert row["mean"] == pytest.approx(a["val_loss"] - b.val_loss, abs=0)


def _one_token_changed(sample_data, out):
    """A copy of the prepared data whose validation split differs in one token (manifest checksums updated)."""
    shutil.copytree(sample_data, out)
    manifest = json.loads((out / "manifest.json").read_text())
    shard = manifest["splits"]["val"]["shards"][0]
    tokens = np.fromfile(out / shard["file"], dtype="<u2")
    tokens[10] = (int(tokens[10]) + 1) % 50000
    tokens.tofile(out / shard["file"])
    shard["sha256"] = hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.run
def test_a_validation_set_differing_in_one_token_is_refused(tmp_path, sample_data, finished_runs):
    other = _one_token_changed(sample_data, tmp_path / "other-data")
    a = read_json(run_dir(finished_runs(tmp_path / "res", ("baseline", 0)), "study", "smoke", "baseline", 0)
                  / "summary.json")
    b = train(tmp_path / "res", "sink-logit", data=other)
    assert a["data_fingerprint"] == b.data_fingerprint and a["config_fingerprint"] == b.config_fingerprint
    with pytest.raises(AblateError, match="their val_fingerprint differs.*different validation tokens"):
        load_runs(tmp_path / "res" / "study")


@pytest.mark.run
def test_an_older_run_without_fingerprints_needs_allow_unverified_and_is_named(tmp_path, finished_runs):
    finished_runs(tmp_path, ("baseline", 0), ("sink-logit", 0))
    path = run_dir(tmp_path, "study", "smoke", "sink-logit", 0) / "summary.json"
    summary = read_json(path)
    del summary["config_fingerprint"], summary["val_fingerprint"]
    path.write_text(json.dumps(summary))
    refused = ablate_cli("table", tmp_path / "study", check=False)
    assert refused.returncode == 2 and "--allow-unverified" in refused.stderr and "sink-logit/seed0" in refused.stderr
    allowed = ablate_cli("table", tmp_path / "study", "--allow-unverified").stdout
    assert "pairing NOT verified for smoke/sink-logit/seed0" in allowed


@pytest.mark.system
def test_a_csv_table_says_pairing_was_not_verified(tmp_path):
    path = tmp_path / "losses.csv"
    path.write_text("tier,arm,seed,val_loss\n10M,baseline,0,4.0\n10M,sink-logit,0,3.9\n")
    assert "pairing NOT verified" in ablate_cli("table", path, process=True).stdout


# ---------------------------------------------------------------------------------------------- 2. the store
@pytest.mark.run
def test_a_forced_rerun_is_counted_once_and_a_copied_folder_is_an_error(tmp_path, sample_data, finished_runs):
    finished_runs(tmp_path, ("baseline", 0), ("sink-logit", 0))
    train(tmp_path, "sink-logit", data=sample_data, force=True)
    folder = run_dir(tmp_path, "study", "smoke", "sink-logit", 0)
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith("seed0.old-")]
    table = build_table(load_runs(tmp_path / "study"), "paired")
    assert table.frame["n"].to_list() == [1]
    shutil.copytree(folder, folder.with_name("seed7"))
    with pytest.raises(AblateError, match=r"seed7 holds a run of seed 0, but its folder says 7"):
        load_runs(tmp_path / "study")


@pytest.mark.run
def test_a_damaged_summary_is_named_with_the_way_out(tmp_path, sample_data, finished_runs):
    finished_runs(tmp_path, ("baseline", 0))
    path = run_dir(tmp_path, "study", "smoke", "baseline", 0) / "summary.json"
    path.write_text('{"status": "compl')
    result = ablate_cli("table", tmp_path / "study", check=False)
    assert result.returncode == 2 and str(path) in result.stderr and "--force" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(AblateError, match="summary.json is damaged.*--force"):
        train(tmp_path, "baseline", data=sample_data)


# ---------------------------------------------------------------------------------------------- 3. one writer
@pytest.mark.system
def test_a_second_process_on_a_running_run_is_refused_and_touches_nothing(tmp_path, sample_data):
    args = ["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "40", "--data", sample_data,
            "--no-progress", "--threads", "1", "--results", tmp_path]
    first = subprocess.Popen([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=REPO,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    folder = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    deadline = time.time() + 120
    while not read_metrics(folder / "metrics.jsonl") and time.time() < deadline:
        time.sleep(0.05)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file())
    second = ablate_cli(*args, check=False, timeout=60, process=True)
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid}" in second.stderr and socket.gethostname() in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=300) == 0, first.stderr.read()
    steps = [r["step"] for r in read_metrics(folder / "metrics.jsonl") if "train_loss" in r]
    assert steps == list(range(1, 41))  # each step once
    assert read_json(folder / "summary.json")["status"] == "completed"
    assert before  # the refused process ran while the first was writing
    assert not run_lock_path(folder).exists()  # released at the end


@pytest.mark.system
def test_a_dead_holders_lock_is_taken_over_and_a_live_one_is_not(tmp_path, monkeypatch):
    path = tmp_path / ".seed0.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "token": "old"}))
    with FileLock(path, "run") as lock:
        assert lock.held()
        with pytest.raises(LockHeld, match=f"pid {os.getpid()}"):
            FileLock(path, "run").acquire()
    assert not path.exists()
    # another host: judged by whether the holder refreshed the file over 300 s of this host's own clock
    monkeypatch.setenv("ABLATE_LOCK_SEEN_DIR", str(tmp_path / "seen"))
    path.write_text(json.dumps({"host": "node-elsewhere", "pid": 1, "token": "remote"}))
    old = time.time() - 3600
    os.utime(path, (old, old))  # an old mtime is the holder's clock, not ours: the first look finds it alive
    with pytest.raises(LockHeld, match="node-elsewhere"):
        FileLock(path, "run").acquire()
    later = time.time() + 301
    monkeypatch.setattr(ablate.lock, "time", types.SimpleNamespace(time=lambda: later, strftime=time.strftime))
    with FileLock(path, "run") as lock:  # unchanged for 301 s of our clock: its holder is gone
        assert lock.held()


@pytest.mark.system
def test_two_submits_at_once_do_not_both_queue_and_duplicate_arms_are_one_run(tmp_path, sample_data):
    experiment = tmp_path / "dup.py"
    experiment.write_text(
        "from ablate.experiment import Experiment\n"
        f"EXPERIMENT = Experiment(name='dup', tiers=['smoke'], arms=['baseline', 'baseline'], seeds=1,\n"
        f"    overrides={{'max_steps': 2, 'data_dir': {str(sample_data)!r}}})\n")
    results = tmp_path / "results"
    holder = FileLock(results / "dup" / SUBMIT_LOCK, "experiment 'dup'").acquire()
    try:
        refused = ablate_cli("submit", experiment, "--executor", "local", "--results", results, check=False)
        assert refused.returncode == 2 and f"pid {os.getpid()}" in refused.stderr
        assert not (results / "dup" / "ledger.json").exists()
    finally:
        holder.release()
    out = ablate_cli("submit", experiment, "--executor", "local", "--arms", "baseline", "baseline",
                     "--results", results).stdout
    assert "ran 1 runs here, 0 failed" in out


# ---------------------------------------------------------------------------------------------- 4. the last step
@pytest.mark.run
def test_an_interruption_during_the_final_writes_resumes_to_the_same_val_loss(tmp_path, sample_data, monkeypatch,
                                                                           straight_run):
    """Killed after its final checkpoint, before model.pt and the summary: the rerun ends where the session's
    straight run of the same settings (tests/conftest.py) ended, bit for bit."""
    import ablate.modelio

    def killed(*args, **kwargs):
        raise SystemExit(137)  # as SIGKILL would, after the final checkpoint, before model.pt and the summary

    monkeypatch.setattr(ablate.modelio, "save_model", killed)
    with pytest.raises(SystemExit):
        train(tmp_path / "b", STRAIGHT_ARM, data=sample_data, steps=STRAIGHT_STEPS, threads=1)
    folder = run_dir(tmp_path / "b", "study", "smoke", STRAIGHT_ARM, 0)
    assert read_json(folder / "summary.json")["status"] == "running"
    assert (folder / "checkpoints" / "state.pt").exists()
    (folder / ".summary.json.x.tmp").write_text("torn")  # an interrupted atomic write
    monkeypatch.undo()
    resumed = train(tmp_path / "b", STRAIGHT_ARM, data=sample_data, steps=STRAIGHT_STEPS, threads=1)
    assert resumed.status == "completed" and resumed.val_loss == straight_run["val_loss"]  # bit for bit
    assert resumed.val_fingerprint == straight_run["val_fingerprint"]
    assert not (folder / ".summary.json.x.tmp").exists()
    assert not (folder / "checkpoints" / "state.pt").exists() and (folder / "checkpoints" / "model.pt").exists()


@pytest.mark.unit
def test_an_interrupted_prepare_that_left_only_a_temporary_file_resumes(tmp_path):
    from ablate.data import prepare

    out = tmp_path / "sample"
    out.mkdir()
    (out / ".progress.json.abc.tmp").write_text("{")
    prepare("sample", out, progress_bar=False)
    assert (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))


# ---------------------------------------------------------------------------------------------- 5. no code runs
def unfinished_run(results, finished_runs):
    """A run folder whose summary says it is still running: the next start resumes from its checkpoint."""
    finished_runs(results, ("baseline", 0), steps=2)
    folder = run_dir(results, "study", "smoke", "baseline", 0)
    summary = read_json(folder / "summary.json")
    summary.update(status="running", val_loss=None)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.mark.run
def test_a_planted_pickle_is_refused_and_runs_nothing(tmp_path, sample_data, finished_runs):
    folder = unfinished_run(tmp_path, finished_runs)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model": Exploit()}, folder / "checkpoints" / "state.pt")
    result = ablate_cli("run", "--experiment", "study", "--tier", "smoke", "--arm", "baseline", "--max-steps", "2",
                        "--data", sample_data, "--results", tmp_path, "--no-progress", check=False)
    assert result.returncode == 2 and "cannot be loaded safely" in result.stderr and "--force" in result.stderr
    assert not marker.exists()


@pytest.mark.unit
def test_names_that_would_leave_the_results_folder_are_refused(tmp_path):
    for name in ("../evil", "a/b", "..", ".hidden"):
        with pytest.raises(AblateError, match="invalid experiment name"):
            Experiment(name=name, tiers=["smoke"], arms=["baseline"], seeds=1)
        with pytest.raises(AblateError, match="invalid experiment name"):
            run_dir(tmp_path, name, "smoke", "baseline", 0)


# ---------------------------------------------------------------------------------------------- 6. bad input
@pytest.mark.unit
@pytest.mark.parametrize("option,value", [("--max-steps", "0"), ("--checkpoint-interval", "-1"), ("--devices", "0")])
def test_non_positive_run_options_are_one_line_errors(tmp_path, sample_data, option, value):
    result = ablate_cli("run", "--tier", "smoke", "--arm", "baseline", option, value, "--data", sample_data,
                        "--results", tmp_path, check=False)
    assert result.returncode == 2 and f"{option} must be a positive integer, not {value}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.unit
def test_bad_grids_and_tables_are_refused(tmp_path):
    with pytest.raises(AblateError, match="seed counts must be positive integers, not 0"):
        Experiment(name="x", tiers=["smoke"], arms=["baseline"], seeds={"smoke": 0})
    result = ablate_cli("submit", "demo", "--executor", "local", "--parallel", "-1", "--results", tmp_path,
                        check=False)
    assert result.returncode == 2 and "--parallel must be a positive integer, not -1" in result.stderr
    for body, message in [("10M,baseline,1.7,4.0", "seed 1.7 is not an integer"),
                          ("10M,baseline,1,true", "val_loss holds Boolean"),
                          ("10M,baseline,1,low", "val_loss holds String")]:
        path = tmp_path / "t.csv"
        path.write_text("tier,arm,seed,val_loss\n" + body + "\n")
        with pytest.raises(AblateError, match=message):
            load_runs(path)


@pytest.mark.unit
def test_a_tier_without_the_reference_arm_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("tier,arm,seed,val_loss\n10M,baseline,0,4.0\n10M,combo,0,3.9\n50M,combo,0,3.5\n50M,combo2,0,3.4\n")
    out = ablate_cli("table", path).stdout
    assert "tier 50M has no completed baseline run: its arms (combo, combo2)" in out


@pytest.mark.run
def test_a_damaged_checkpoint_or_ledger_is_named(tmp_path, sample_data, finished_runs):
    folder = unfinished_run(tmp_path, finished_runs)
    (folder / "checkpoints" / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(AblateError, match="state.pt cannot be loaded safely.*--force"):
        train(tmp_path, data=sample_data, steps=2)
    (tmp_path / "study" / "ledger.json").write_text("{")
    experiment = tmp_path / "study.py"
    experiment.write_text("from ablate.experiment import Experiment\n"
                          "EXPERIMENT = Experiment(name='study', tiers=['smoke'], arms=['baseline'], seeds=1)\n")
    result = ablate_cli("status", experiment, "--results", tmp_path, check=False)
    assert result.returncode == 2 and "ledger.json is damaged" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.unit
def test_submit_checks_data_and_overrides_before_queuing(tmp_path, sample_data):
    experiment = tmp_path / "bad.py"
    experiment.write_text("from ablate.experiment import Experiment\n"
                          "EXPERIMENT = Experiment(name='bad', tiers=['smoke'], arms=['baseline'], seeds=1,\n"
                          "    overrides={'learning_rate': 1e-3})\n")
    result = ablate_cli("submit", experiment, "--executor", "local", "--data", sample_data, "--results", tmp_path,
                        check=False)
    assert result.returncode == 2 and "unknown run option 'learning_rate'" in result.stderr
    result = ablate_cli("submit", "demo", "--executor", "local", "--data", tmp_path / "nothing", "--results",
                        tmp_path, check=False)
    assert result.returncode == 2 and "not a prepared data folder" in result.stderr
    assert not (tmp_path / "bad").exists() and not (tmp_path / "demo").exists()


# ---------------------------------------------------------------------------------------------- parameter matching
SHORT = {"final_val_tokens": 512}  # a shorter final evaluation (the same for every run): no claim here is on val_loss
@pytest.mark.run
def test_a_parameter_matched_arm_pairs_with_its_baseline_and_is_marked(tmp_path, sample_data):
    base = train(tmp_path, "baseline", data=sample_data, overrides={"match_params": True, **SHORT})
    gated = train(tmp_path, "g2-value", data=sample_data, overrides={"match_params": True, **SHORT})
    assert gated.mlp_hidden < base.mlp_hidden
    assert abs(gated.params_non_embedding / base.params_non_embedding - 1) <= 0.005
    assert gated.init_fingerprint != base.init_fingerprint  # the MLP matrices differ in shape
    assert gated.init_fingerprint_common == base.init_fingerprint_common
    assert gated.config_fingerprint == base.config_fingerprint
    table = build_table(load_runs(tmp_path / "study"), "paired")
    assert "parameter-matched" in table.frame.row(0, named=True)["marks"].split(",")
    assert any("narrowed (match_params)" in w for w in table.warnings)
    unmatched = train(tmp_path, "g2-value", seed=1, data=sample_data, overrides=SHORT)
    train(tmp_path, "baseline", seed=1, data=sample_data, overrides=SHORT)
    assert unmatched.params_non_embedding > base.params_non_embedding * 1.05
    with pytest.raises(AblateError, match="their settings differ.*match_params: True vs False"):
        train(tmp_path, "baseline", seed=1, data=sample_data, force=True, overrides={"match_params": True, **SHORT})
        load_runs(tmp_path / "study")
