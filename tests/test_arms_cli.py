"""The commands around arms: `ablate arms` shows each arm's slots, hooks and path; `ablate arms --check NAME
[--arm-file F]` runs the check every arm is held to and prints what holds; `ablate run --arm-file F` trains an arm
defined in a user's file."""

import json

from ablate.cli import main
from ablate.store import run_dir
import pytest

USER_ARMS = '''import torch

from ablate.arms import Arm, register_arm


@register_arm("my-cap")
class MyCap(Arm):
    """A score modifier of one's own (a soft cap at 3)."""

    description = "a user's soft cap"

    def score_modifier(self, context):
        def cap(score, b, h, q_idx, kv_idx):
            return 3.0 * torch.tanh(score / 3.0)

        return cap


@register_arm("my-blind-distance")
class BlindDistance(Arm):
    """A distance penalty from the indices of the call, not the positions: decoding goes wrong."""

    def score_modifier(self, context):
        def distance(score, b, h, q_idx, kv_idx):
            return score - 0.5 * (q_idx - kv_idx).abs().to(score.dtype)

        return distance


@register_arm("my-uncached")
class Uncached(Arm):
    no_decoding = "it reads every position's x at once"

    def score_modifier(self, context):
        mean = context.x.mean()

        def shift(score, b, h, q_idx, kv_idx):
            return score + mean

        return shift
'''


@pytest.mark.unit
def test_arms_lists_hooks_and_paths(capsys):
    assert main(["arms", "--d-model", "64", "--n-head", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "slot(s)/hook(s)" in lines[1] and "path CPU/CUDA" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["softcap"][1:4] == ["score-modifier", "0", "reference/flex"]
    assert rows["sigmoid"][1:4] == ["normaliser", "0", "reference/flex"]
    assert rows["diff"][1:4] == ["override", "96", "fused"]  # 3 · head dim 32
    assert rows["forgetting"][1:4] == ["score-modifier", "130", "reference/flex"]  # H (d_model + 1)
    assert rows["ssmax"][1:4] == ["score-modifier", "2", "reference/flex"]
    assert rows["value-residual"][1:4] == ["override", "0", "fused"]  # one layer counted: the first has none
    assert rows["combo"][1:4] == ["value+denominator", "4", "fused"]
    assert rows["sliding-window"][1:4] == ["mask", "0", "fused/flex"]  # SDPA's boolean mask; a block mask on CUDA
    assert main(["arms", "--json"]) == 0
    by_arm = {row["arm"]: row for row in json.loads(capsys.readouterr().out)}
    assert by_arm["forgetting"]["hooks"] == ["score-modifier"]
    assert by_arm["forgetting"]["path"] == {"cpu": "reference", "cuda": "flex"}


@pytest.mark.unit
def test_arms_check_runs_the_harness_on_a_users_arm(tmp_path, capsys):
    arm_file = tmp_path / "my_arms.py"
    arm_file.write_text(USER_ARMS)
    assert main(["arms", "--check", "my-cap", "--arm-file", str(arm_file)]) == 0
    out = capsys.readouterr().out
    assert "hooks score-modifier, path reference on a CPU, flex on CUDA" in out
    for check in ("attention: one path: gradcheck", "flex: flex_attention (eager forward, float64, CPU)",
                  "decoding: KV cache (6 tokens, then 1 at a time, 128 tokens)"):
        assert any(line.split()[0] == "holds" and check in line for line in out.splitlines()[1:]), check
    assert any(line.split()[:2] == ["not", "run"] and "model:" in line and "one path" in line
               for line in out.splitlines())
    assert "6 of 8 checks hold; 0 refused; 2 do not apply; 0 fail" in out

    assert main(["arms", "--check", "my-blind-distance", "--arm-file", str(arm_file)]) == 1
    out = capsys.readouterr().out
    assert any(line.split()[0] == "fails" and "decoding:" in line and "max |Δlogit|" in line
               for line in out.splitlines())

    assert main(["arms", "--check", "my-uncached", "--arm-file", str(arm_file)]) == 0
    out = capsys.readouterr().out
    assert any(line.split()[0] == "refused" and "'my-uncached'" in line and "every position's x" in line
               for line in out.splitlines())


@pytest.mark.unit
def test_arms_check_names_the_registered_arms_for_an_unknown_one(capsys):
    assert main(["arms", "--check", "no-such-arm"]) == 2
    err = capsys.readouterr().err
    assert "no-such-arm" in err and "softcap" in err and len(err.strip().splitlines()) == 1


@pytest.mark.run
def test_run_trains_an_arm_from_a_users_file(tmp_path, sample_data, capsys):
    arm_file = tmp_path / "my_arms.py"
    arm_file.write_text(USER_ARMS)
    results = tmp_path / "results"
    argv = ["run", "--tier", "smoke", "--arm", "my-cap", "--arm-file", str(arm_file), "--max-steps", "2",
            "--data", str(sample_data), "--results", str(results), "--no-progress", "--threads", "1"]
    assert main(argv) == 0
    summary = json.loads((run_dir(results, "adhoc", "smoke", "my-cap", 0) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["arm"] == "my-cap" and summary["steps"] == 2
    assert main(["run", "--tier", "smoke", "--arm", "my-other", "--arm-file", str(tmp_path / "x.txt"),
                 "--results", str(results)]) == 2
    assert "is not a Python file" in capsys.readouterr().err
