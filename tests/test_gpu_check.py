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
    # every phase inside its memory plan: on CPU at a reduced smoke shape, measured host peaks within their estimates
    phases = report["phases"]
    assert phases["all_fit"] and list(phases["tiers"]) == ["smoke-reduced"]
    row = phases["tiers"]["smoke-reduced"]
    assert row["micro_batch"] == 4 and row["loss_chunk"] == 128
    assert set(row["phases"]) == {"train_step", "evaluation", "final_evaluation", "eval_scoring"}
    for name, phase in row["phases"].items():
        assert 0 < phase["measured_gb"] <= phase["estimate_gb"] and phase["fits"], (name, phase)
    assert "memory smoke-reduced: micro-batch 4, train_step" in result.stdout


def test_gpu_check_fails_a_phase_that_does_not_fit():
    """The judge marks (and the script exits 1 on) a phase that ran out of memory, exceeded its estimate, or
    whose estimate is above 90% of the GPU; a tier that fits no micro-batch fails too."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import phase_memory

    def tiers(measured, estimate, error=None):
        row = {"phases": {"train_step": {"measured_gb": measured, "estimate_gb": estimate}}}
        return {"10M": {**row, **({"error": error} if error else {})}}

    assert phase_memory.judge(tiers(30.0, 35.0), 40.0)
    for bad, gpu in ((tiers(36.0, 35.0), 40.0), (tiers(None, 35.0), 40.0), (tiers(30.0, 37.0), 40.0),
                     (tiers(36.0, 35.0), None)):
        assert not phase_memory.judge(bad, gpu) and not bad["10M"]["phases"]["train_step"]["fits"]
    assert not phase_memory.judge({"350M": {"error": "does not fit", "phases": {}}}, 4.0)
