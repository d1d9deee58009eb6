"""The six hook examples train through the commands a user types: `ablate submit` (local executor, the smoke tier,
a few steps each) and `ablate testbed --arm` (the testbed's task tiers, its probes on the reference path)."""

import json

from ablate.cli import main
from datafix import ablate_cli
import pytest

pytestmark = pytest.mark.system

SIX = ("softcap", "sigmoid", "diff", "forgetting", "ssmax", "value-residual")

EXPERIMENT = f'''from ablate.experiment import Experiment

EXPERIMENT = Experiment(name="hooks_smoke", description="the six hook examples, smoke tier", tiers=("smoke",),
                        arms={SIX!r}, seeds=1,
                        overrides={{"max_steps": 2, "val_tokens": 512, "final_val_tokens": 512}})
'''


def test_a_local_submit_trains_the_six_on_the_smoke_tier(tmp_path, sample_data):
    (tmp_path / "hooks_smoke.py").write_text(EXPERIMENT)
    results = tmp_path / "results"
    ablate_cli("submit", tmp_path / "hooks_smoke.py", "--executor", "local", "--parallel", "1", "--data",
               sample_data, "--results", results)
    status = json.loads(ablate_cli("status", tmp_path / "hooks_smoke.py", "--results", results, "--json").stdout)
    assert sorted((r["arm"], r["state"], r["steps"]) for r in status["runs"]) == sorted(
        (arm, "completed", 2) for arm in SIX)


def test_the_testbed_trains_hook_arms_beside_the_baseline(tmp_path, capsys):
    argv = ["testbed", "--arm", "diff", "--arm", "forgetting", "--steps", "5", "--seed-count", "1", "--parallel", "1",
            "--results", str(tmp_path / "results")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for arm in ("diff", "forgetting"):
        assert f"| {arm} | 0/1 |" in out or f"| {arm} | 1/1 |" in out  # its row in the testbed's section
