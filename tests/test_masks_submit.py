"""Masks through the commands a user types beyond `ablate run`: `ablate submit --document-mask` (and the experiment's
`document_mask` override) joins each run's config and the ledger's record of the submission, so the resume hints
repeat it; a finished run of the other mask is refused, not skipped as if it were the asked-for run; a sliding-window
arm trains through `submit` and `testbed --arm`; `testbed --document-mask` is refused in one line (task tiers)."""

import argparse
import json

import pytest

from ablate.cli import main
from ablate.cli.hints import Selection
from ablate.status import StatusRow
from ablate.store import LedgerEntry, read_ledger, record_ledger, run_dir
from datafix import ablate_cli

EXPERIMENT = '''from ablate.experiment import Experiment

EXPERIMENT = Experiment(name="{name}", description="masks through submit, smoke tier", tiers=("smoke",),
                        arms={arms!r}, seeds=1, overrides={overrides!r})
'''

WINDOW_ARM = '''from ablate.arms import register_arm
from ablate.arms.papers import SlidingWindow


@register_arm("my-window")
class MyWindow(SlidingWindow):
    description = "a hard sliding window of 4 keys"
    window = 4
'''


def experiment_file(tmp_path, name, arms, **overrides):
    path = tmp_path / f"{name}.py"
    short = {"max_steps": 2, "val_tokens": 512, "final_val_tokens": 512}  # a test about masks, not the loss
    path.write_text(EXPERIMENT.format(name=name, arms=arms, overrides={**short, **overrides}))
    return path


def trained_config(results, name, arm) -> dict:
    folder = run_dir(results, name, "smoke", arm, 0)
    assert json.loads((folder / "summary.json").read_text())["status"] == "completed"
    return json.loads((folder / "config.json").read_text())


@pytest.mark.system
def test_submit_trains_a_window_arm_and_document_masked_runs(tmp_path, sample_data):
    results = tmp_path / "results"
    option = experiment_file(tmp_path, "option_smoke", ("sliding-window",), document_mask=True)
    flagged = experiment_file(tmp_path, "flag_smoke", ("baseline",))
    common = ("--executor", "local", "--parallel", "1", "--data", sample_data, "--results", results)
    ablate_cli("submit", option, *common)  # the window arm, masked by the experiment's option
    ablate_cli("submit", flagged, "--document-mask", *common)  # masked by the flag
    assert trained_config(results, "option_smoke", "sliding-window")["document_mask"] is True
    assert trained_config(results, "flag_smoke", "baseline")["document_mask"] is True
    submissions = [s for s in read_ledger(results / "flag_smoke").submissions if s.get("executor") == "local"]
    assert [s.get("document_mask") for s in submissions] == [True]  # what the resume hints repeat
    assert ablate_cli("submit", option, "--dry-run", *common).returncode == 0  # the same runs: nothing refused

    # a finished run of the other mask is refused by name, in one line, not skipped as done (dry run or not)
    for command in (("submit", flagged, *common), ("submit", flagged, "--dry-run", *common)):
        refused = ablate_cli(*command, check=False)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "seed0 (with it)" in refused.stderr and "nothing was queued" in refused.stderr


@pytest.mark.unit
def test_the_resume_hints_repeat_document_mask(tmp_path):
    from ablate.cli.status import resume_commands

    args = argparse.Namespace(experiment="e", results=None, tiers=None, arms=None, seeds=None, document_mask=True,
                              executor="local", data=None)
    assert Selection.of(args).submit_command().endswith("--executor local --document-mask")
    assert "--document-mask" not in Selection.of(args).status_command()  # status reads the folders: no run option
    record_ledger(tmp_path, {"smoke/baseline/seed0": LedgerEntry("local"), "smoke/diff/seed0": LedgerEntry("local")},
                  {"executor": "local", "runs": ["smoke/baseline/seed0"], "document_mask": True})
    record_ledger(tmp_path, {}, {"executor": "local", "runs": ["smoke/diff/seed0"]})
    rows = [StatusRow("smoke", arm, 0) for arm in ("baseline", "diff")]
    status_args = argparse.Namespace(experiment="e", results=None, tiers=None, arms=None, seeds=None)
    assert resume_commands(status_args, rows, rows, tmp_path) == [
        "ablate submit e --arms baseline --executor local --document-mask",
        "ablate submit e --arms diff --executor local"]


@pytest.mark.system
def test_a_window_arm_of_ones_own_trains_through_the_testbed(tmp_path, capsys):
    (tmp_path / "window.py").write_text(WINDOW_ARM)
    assert main(["testbed", "--arm", "my-window", "--arm-file", str(tmp_path / "window.py"), "--tier",
                 "abstain-stream", "--steps", "2", "--seed-count", "1", "--parallel", "1",
                 "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "| my-window | 0/1 |" in out or "| my-window | 1/1 |" in out
    summary = json.loads((tmp_path / "r/testbed_steps2/abstain-stream/my-window/seed0/summary.json").read_text())
    assert summary["status"] == "completed"


@pytest.mark.unit
def test_the_testbed_refuses_document_mask_in_one_line(tmp_path):
    refused = ablate_cli("testbed", "--arm", "sliding-window", "--document-mask", "--results", tmp_path / "r",
                         check=False)
    assert refused.returncode == 2 and refused.stdout == "" and not (tmp_path / "r").exists()
    line = refused.stderr.strip()
    assert "\n" not in line and "--document-mask" in line and "synthetic task" in line and "<|endoftext|>" in line
