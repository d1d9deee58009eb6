"""`ablate plan --arm-file F`: a user's arm on the reference path is measured by the CPU probe and priced from it
(peak memory per GPU, the micro-batch from it, the measured bytes per element in --json); an arm the probe cannot
run is said so in one line and sized by the old constant."""

import json

from ablate.arms import get_arm
from ablate.arms.kernel import blocked_rows
from ablate.cli import main
import pytest

pytestmark = pytest.mark.unit

USER_ARMS = '''import torch

from ablate.arms import Arm, register_arm


@register_arm("my-relu-norm")
class ReluNorm(Arm):
    """A normaliser with no elementwise log-weight: the reference path on CUDA too."""

    def normalise(self, logits, context):
        return torch.relu(logits).pow(2) / context.train_len


@register_arm("my-whole-norm")
class WholeNorm(ReluNorm):
    no_decoding = "it reads every position's x at once"


@register_arm("my-broken-norm")
class BrokenNorm(Arm):
    def normalise(self, logits, context):
        raise ValueError("only at T = 1024")
'''


def test_plan_measures_a_users_arm_and_says_when_its_probe_cannot_run(tmp_path, capsys):
    arm_file = tmp_path / "my_arms.py"
    arm_file.write_text(USER_ARMS)
    args = ["plan", "--tier", "10M", "--arms", "baseline", "my-relu-norm", "my-broken-norm", "my-whole-norm",
            "--arm-file", str(arm_file)]
    assert main([*args, "--json"]) == 0
    rows = {r["arm"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    mine, broken, base = rows["my-relu-norm"], rows["my-broken-norm"], rows["baseline"]
    assert mine["attention"]["path"] == "reference" and mine["attention"]["source"] == "measured"
    assert 4 <= mine["attention"]["saved"] < 40 and mine["attention"]["allocated"] > mine["attention"]["saved"]
    assert base["attention"]["saved"] == 0 and base["attention"]["path"] == "fused"
    block = blocked_rows(get_arm("my-relu-norm"), mine["micro_batch_for_gpu"], 5, 1024)  # the kernel's, at that shape
    assert mine["micro_batch_for_gpu"] <= base["micro_batch_for_gpu"] and mine["reference_block"] == block == 64
    assert base["peak_memory_gb"] <= mine["peak_memory_gb"] <= 0.9 * 80
    assert mine["gpu_hours_per_run"] > base["gpu_hours_per_run"]
    whole = rows["my-whole-norm"]
    assert whole["reference_block"] is None and whole["micro_batch_for_gpu"] < mine["micro_batch_for_gpu"]
    assert whole["attention"]["note"].endswith("whole rows (it reads every position's x at once)")
    assert broken["attention"]["source"].startswith("fallback: ValueError: only at T = 1024")
    assert main(args) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "my-broken-norm: probe could not run" in line]
    assert len(lines) == 1 and "ValueError: only at T = 1024" in lines[0] and "sized at 12 saved" in lines[0]
    assert any(line.startswith("  my-relu-norm: reference path, measured") and "blocks of 64 query rows" in line
               for line in out.splitlines())
    assert "without a margin; the micro-batch is chosen with a 1.25× margin" in out
