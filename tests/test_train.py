"""Matched runs: tiers, fingerprints, exact resume after SIGKILL, divergence, DDP, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from ablate.arms import Arm, register_arm
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.store import config_disagreement, read_json, read_metrics, run_dir
from ablate.plan import plan_rows
from ablate.tiers import TIERS, get_tier
from ablate.config import lr_at
from ablate.runconfig import RunConfig
from ablate.store_summary import RunSummary
from ablate.train import run
from conftest import STRAIGHT_ARM, STRAIGHT_STEPS
from datafix import REPO, ablate_cli

torch.set_num_threads(1)


def train(results, arm="baseline", seed=0, steps=12, experiment="adhoc", data=None, **options):
    spec = RunSpec(experiment, "smoke", arm, seed, {"max_steps": steps, **options.pop("overrides", {})})
    return run(spec, results, data_dir=str(data), progress=False, **options)


@pytest.mark.unit
@pytest.mark.parametrize("name,budget,seeds", [("10M", 0.2e9, 3), ("50M", 0.95e9, 3), ("124M", 1.6e9, 3),
                                                ("350M", 5.8e9, 1)])
def test_tier_ladder_matches_spec(name, budget, seeds):
    plan = plan_rows(name, ["baseline"])
    non_embedding = plan["runs"][0]["params_non_embedding"]
    assert abs(non_embedding / TIERS[name].nominal_params - 1) <= 0.05, non_embedding
    assert abs(plan["runs"][0]["tokens"] / budget - 1) < 0.01
    assert get_tier(name).seeds == seeds
    assert plan["total_gpu_hours"] > 0 and plan["runs"][0]["train_flops"] > 6 * non_embedding * budget


@pytest.mark.unit
def test_lr_schedule_warms_up_then_decays_to_the_floor():
    config = RunConfig(lr=1e-3, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, config) == pytest.approx(1e-4)
    assert lr_at(9, config) == pytest.approx(1e-3)
    assert lr_at(59.5, config) == pytest.approx(0.55e-3)  # half way between warm-up and the last step
    assert lr_at(108, config) > 1e-4
    assert lr_at(109, config) == pytest.approx(1e-4, rel=1e-12)  # the last step (steps − 1) is at the floor
    assert lr_at(110, config) == pytest.approx(1e-4)


@pytest.mark.system
def test_plan_command_json():
    plan = ablate_cli("plan", "--tier", "124M", "--arms", "baseline", "combo2", "--json", process=True)
    out = json.loads(plan.stdout)
    arms = {r["arm"]: r for r in out["runs"]}
    assert arms["combo2"]["params_arm_extra"] == 18 * 12 * (64 + 2)  # H(d+2) per layer
    assert "TFLOP/s" in out["assumption"] and out["total_runs"] == 6


@pytest.mark.unit
def test_unknown_tier_or_arm_names_the_valid_ones(tmp_path, sample_data):
    with pytest.raises(AblateError, match="unknown tier 'huge'; valid tiers: smoke, 10M"):
        run(RunSpec("adhoc", "huge", "baseline", 0), tmp_path)
    result = ablate_cli("run", "--tier", "smoke", "--arm", "nope", "--results", tmp_path, check=False)
    assert result.returncode == 2 and "unknown arm 'nope'" in result.stderr and "combo2" in result.stderr


@pytest.mark.run
def test_same_seed_matches_across_arms_and_a_run_is_recorded(tmp_path, sample_data):
    short = {"overrides": {"final_val_tokens": 512}}  # a shorter final evaluation, the same for all three
    a = train(tmp_path, "baseline", data=sample_data, **short)
    b = train(tmp_path, "combo2", data=sample_data, **short)
    c = train(tmp_path, "baseline", seed=1, data=sample_data, **short)
    assert a.init_fingerprint == b.init_fingerprint and a.data_fingerprint == b.data_fingerprint
    assert c.init_fingerprint != a.init_fingerprint and c.data_fingerprint != a.data_fingerprint
    assert a.val_loss != b.val_loss  # the arms do differ
    folder = run_dir(tmp_path, "adhoc", "smoke", "combo2", 0)
    summary = read_json(folder / "summary.json")
    for key in ("tier", "arm", "seed", "status", "val_loss", "steps", "tokens", "init_fingerprint",
                "data_fingerprint", "params_total", "params_non_embedding", "params_arm_extra", "git_commit",
                "versions", "started", "finished", "wall_seconds"):
        assert key in summary, key
    assert summary["status"] == "completed" and summary["steps"] == 12 and summary["params_arm_extra"] > 0
    assert read_json(folder / "config.json")["arm"] == "combo2"
    assert config_disagreement(folder, RunSummary.of(summary)) is None  # what every reader checks holds for training
    assert a.data_id == c.data_id and len(a.data_id) == 64  # the data's identity, the same for every seed
    metrics = read_metrics(folder / "metrics.jsonl")
    assert [r["step"] for r in metrics if "train_loss" in r] == list(range(1, 13))
    assert {"train_loss", "lr", "grad_norm", "tokens_per_s"} <= set(metrics[-1]) and "val_loss" in metrics[-1]
    assert (folder / "checkpoints" / "model.pt").is_file()


@pytest.mark.run
def test_completed_rerun_is_a_noop_and_force_keeps_the_old_folder(tmp_path, sample_data, finished_runs):
    finished_runs(tmp_path, ("baseline", 0), experiment="adhoc", steps=3)  # what train(steps=3) made
    folder = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    first = read_json(folder / "summary.json")
    mtime = (folder / "summary.json").stat().st_mtime_ns
    assert train(tmp_path, data=sample_data, steps=3) == RunSummary.of(first)
    assert (folder / "summary.json").stat().st_mtime_ns == mtime
    with pytest.raises(AblateError, match="different config.*steps"):
        train(tmp_path, data=sample_data, steps=4)
    assert read_json(folder / "summary.json") == first  # nothing overwritten
    again = train(tmp_path, data=sample_data, steps=4, force=True)
    assert again.steps == 4
    kept = [p for p in folder.parent.iterdir() if p.name.startswith("seed0.old-")]
    assert len(kept) == 1 and read_json(kept[0] / "summary.json") == first


@pytest.mark.unit
def test_data_of_another_tokenizer_is_refused(tmp_path, sample_data):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(sample_data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"] = "synthetic-16"
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AblateError, match="synthetic-16.*expects 'gpt2'"):
        train(tmp_path / "res", data=other)


@pytest.mark.run
def test_non_finite_loss_ends_the_run_as_diverged(tmp_path, sample_data):
    summary = train(tmp_path, data=sample_data, steps=40, overrides={"lr": 1e6, "grad_clip": 1e30, "warmup_steps": 1})
    assert summary.status == "diverged" and 1 <= summary.diverged_step <= 40
    assert summary.val_loss is None and "non-finite" in summary.error


class HalfGate(Arm):
    """A new arm defined in a test file: a learnable per-head value gate starting at one half."""

    description = "test arm"
    no_weight_decay = frozenset({"logit"})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.logit = torch.nn.Parameter(torch.empty(ctx.n_kv_head))

    def value_gate(self, v, x):
        return torch.sigmoid(self.logit).view(1, -1, 1, 1)

    def init_parameter(self, name, param, generator):
        torch.nn.init.zeros_(param)


@pytest.fixture
def halfgate():
    """The arm registered for the test only: a registration at import would join every worker's `arms="all"`."""
    from ablate.arms.base import _REGISTRY

    register_arm("test-halfgate", replace=True)(HalfGate)
    yield "test-halfgate"
    _REGISTRY.pop("test-halfgate", None)


@pytest.mark.run
def test_a_custom_arm_trains_without_touching_the_core(tmp_path, sample_data, halfgate):
    short = {"overrides": {"final_val_tokens": 512}}  # no claim here is on the val_loss
    summary = train(tmp_path, halfgate, data=sample_data, steps=8, **short)
    assert summary.status == "completed" and summary.params_arm_extra == 2 * 2
    metrics = [r for r in read_metrics(run_dir(tmp_path, "adhoc", "smoke", "test-halfgate", 0) / "metrics.jsonl")
               if "train_loss" in r]
    assert metrics[-1]["train_loss"] < metrics[0]["train_loss"]
    assert summary.init_fingerprint == train(tmp_path, "baseline", data=sample_data, steps=1, **short).init_fingerprint


def _wait_for_step(metrics_path, step, process, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = read_metrics(metrics_path)
        if rows and rows[-1].get("step", 0) >= step:
            return
        if process.poll() is not None:
            raise AssertionError(f"run ended early: {process.stderr.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError("timed out waiting for training progress")


@pytest.mark.system
def test_sigkill_then_rerun_resumes_to_the_bitwise_same_result(tmp_path, sample_data, straight_run):
    """Killed past its checkpoint at step 12, the same command resumes and ends where the session's straight run
    of the same settings (tests/conftest.py) ended, bit for bit."""
    args = ["run", "--tier", "smoke", "--arm", STRAIGHT_ARM, "--max-steps", STRAIGHT_STEPS, "--checkpoint-interval",
            "6", "--data", sample_data, "--no-progress", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "ablate.cli", *map(str, args), "--results", tmp_path / "b"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = run_dir(tmp_path / "b", "adhoc", "smoke", STRAIGHT_ARM, 0)
    _wait_for_step(folder / "metrics.jsonl", 14, process)  # past the checkpoint at step 12
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert read_json(folder / "summary.json")["status"] == "running"
    # the killed process is the boundary this test is about; the resume is the same command in this process
    # (tests/datafix.py), which gives what a fresh process gives
    resumed = ablate_cli(*args, "--results", tmp_path / "b")
    assert "resuming at step 12" in resumed.stderr or "resuming at step 18" in resumed.stderr
    a, b = straight_run, json.loads(resumed.stdout)
    assert a["val_loss"] == b["val_loss"] and a["data_fingerprint"] == b["data_fingerprint"]  # bitwise
    assert a["val_fingerprint"] == b["val_fingerprint"] and b["steps"] == STRAIGHT_STEPS
    steps = [r["step"] for r in read_metrics(folder / "metrics.jsonl") if "train_loss" in r]
    assert steps == list(range(1, STRAIGHT_STEPS + 1))  # no step logged twice after the resume


@pytest.mark.system
def test_sigusr1_checkpoints_on_request(tmp_path, sample_data):
    args = ["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "400", "--data", sample_data,
            "--no-progress", "--threads", "1", "--results", tmp_path]
    process = subprocess.Popen([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    _wait_for_step(folder / "metrics.jsonl", 3, process)
    process.send_signal(signal.SIGUSR1)
    deadline = time.time() + 120
    while not (folder / "checkpoints" / "state.pt").exists() and time.time() < deadline:
        time.sleep(0.1)
    steps = torch.load(folder / "checkpoints" / "state.pt", weights_only=False)["stream"]["step"]
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert 3 <= steps < 25  # before the first interval checkpoint: the signal made it


@pytest.mark.system
def test_two_process_data_parallel_matches_one_process(tmp_path, sample_data):
    args = ["run", "--tier", "smoke", "--arm", "combo", "--max-steps", "8", "--data", sample_data,
            "--no-progress", "--threads", "1"]
    one = json.loads(ablate_cli(*args, "--results", tmp_path / "one").stdout)  # in this process, as in a fresh one
    two = json.loads(ablate_cli(*args, "--devices", "2", "--results", tmp_path / "two", process=True).stdout)
    assert one["data_fingerprint"] == two["data_fingerprint"]
    # the same validation windows whatever the number of processes (and the same config: devices is execution)
    assert one["val_fingerprint"] == two["val_fingerprint"] and one["config_fingerprint"] == two["config_fingerprint"]
    assert one["val_tokens_evaluated"] == two["val_tokens_evaluated"] == 128 * 64
    assert abs(one["val_loss"] - two["val_loss"]) < 1e-4


@pytest.mark.run
def test_tensorboard_logger_keeps_one_run_id_per_run_folder(tmp_path, sample_data):
    from ablate.ranks import RunFolder
    from ablate.train import Trainer

    summary = train(tmp_path, data=sample_data, steps=3, logger="tensorboard")
    folder = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    run_id = summary.logger_run_id
    assert [p.name for p in (folder / "tensorboard").iterdir()] == [run_id]
    assert list((folder / "tensorboard" / run_id).glob("events.out.tfevents.*"))
    config = RunConfig.from_dict(read_json(folder / "config.json"))
    assert Trainer(RunFolder(folder, config)).logger_run_id == run_id  # what a requeued job computes again
    assert Trainer(RunFolder(folder.parent / "seed1", config)).logger_run_id != run_id
