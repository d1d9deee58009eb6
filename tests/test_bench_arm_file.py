"""`benchmarks/arms.py --arm-file F`: a user's arm measured against the baseline in one run, its memory subprocesses
loading the file too (a benchmark: the figures are not checked here, only that the user's arm is measured)."""

import json
import subprocess
import sys

import pytest

from datafix import REPO

pytestmark = pytest.mark.system

USER_ARM = '''import torch

from ablate.arms import Arm, register_arm


@register_arm("my-bench-cap")
class MyCap(Arm):
    def score_modifier(self, context):
        def cap(score, b, h, q_idx, kv_idx):
            return 3.0 * torch.tanh(score / 3.0)

        return cap
'''


def test_a_users_arm_is_timed_and_its_memory_measured_against_the_baseline(tmp_path):
    arm_file, out = tmp_path / "my_arm.py", tmp_path / "out.json"
    arm_file.write_text(USER_ARM)
    done = subprocess.run([sys.executable, "benchmarks/arms.py", "--arm-file", str(arm_file), "--tier", "smoke",
                           "--seq-len", "32", "--repeats", "1", "--warmup", "1", "--memory-seq-lens", "32",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert list(result["timing"]) == ["baseline", "my-bench-cap"]  # the file's arm, against the baseline only
    assert set(result["memory"]) == {"baseline", "my-bench-cap"} and result["memory"]["my-bench-cap"]["32"] > 0
    assert "| my-bench-cap | reference |" in done.stdout


@pytest.mark.benchmark
def test_the_blocked_arms_benchmark_measures_an_arm_and_fits_its_largest_length():
    """benchmarks/blocked_arms.py: a worker measures one (arm, T) in its own process (peak growth, step time, the
    window arm loaded as a user's file), the plan's prediction is a positive figure, and the quadratic through three
    lengths reaches the limit where it should."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import blocked_arms

    got = blocked_arms.measure("bench-bias-window", "smoke", 32, 1)
    assert got["peak_growth_mib"] > 0 and got["step_s"] > 0 and got["params"] > 0
    assert blocked_arms.predicted_gb("smoke", "softcap", 32, got["params"]) > 0
    quadratic = [1.0 + 1e-3 * t + 1e-6 * t * t for t in (1024, 2048, 4096)]  # reaches 14 GB at T ≈ 3,140
    assert blocked_arms.largest_t([1024, 2048, 4096], quadratic) == pytest.approx(3140.05, abs=0.1)
    assert blocked_arms.largest_t([1024, 2048, 4096], [1.0, 1.0, 1.0]) is None  # flat: never
