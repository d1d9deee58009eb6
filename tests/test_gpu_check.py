"""benchmarks/gpu_check.py in its CPU mode: the GPU script's code runs on every test run, so it cannot rot."""

import json
import os
import subprocess
import sys

from ablate.arms.names import BUILTIN_ARMS
from ablate.arms import list_arms
from datafix import REPO


def test_gpu_check_runs_on_cpu_and_writes_its_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    # aot_eager: dynamo and AOT autograd trace the model as on a GPU; inductor's C++ build takes minutes on CPU
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--steps", "4",
           "--warmup", "1", "--timed", "1", "--compile-backend", "aot_eager", "--ddp", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(BUILTIN_ARMS) <= set(report["arms"]) and set(report["arms"]) <= set(list_arms())
    for arm, row in report["arms"].items():
        # bf16 fused path vs float32 reference: bf16 rounding of logits of order 1, nothing more
        assert row["accuracy"]["max_abs_logit_error"] < 0.05, arm
        assert abs(row["accuracy"]["loss_bf16_fused"] - row["accuracy"]["loss_fp32_reference"]) < 0.01, arm
        assert row["backend"]["fused_kernel_used"], (arm, row["backend"])
        assert row["speed"]["tokens_per_s"] > 0 and row["speed"]["mfu"] is None  # no GPU: no peak, no MFU
    assert report["arms"]["baseline"]["speed"]["step_ratio_to_baseline"] == 1
    assert report["compile"]["same_loss_to_bf16"] and len(report["compile"]["compiled_losses"]) == 4
    assert report["ddp"]["gradients_match"] and report["ddp"]["world_size"] == 2
    # nothing measured on a GPU: no MFU for `ablate plan`, no goal judged
    assert report["gpu_key"] is None and report["plan_mfu"] is None
    assert report["goals"]["compiled_faster"] is None and report["goals"]["baseline_mfu_at_least_45pct"] is None
    assert "max |Δlogit|" in result.stdout and "ddp: 2 processes (gloo)" in result.stdout
