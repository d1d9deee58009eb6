"""An arm's code is part of each run's identity (item 9): a run records a hash of the files of its arm's class and
of the file that registers it, and a row whose seeds trained different code under one name is refused."""

import json

import pytest

from ablate.analysis.load import load_runs
from ablate.arms import get_arm
from ablate.arms.source import arm_source_hash
from ablate.errors import AblateError
from ablate.experiment import Experiment, load_module
from ablate.train import run

ARM_FILE = '''from ablate.arms import register_arm
from ablate.arms.builtin import SinkLogit

OFFSET = 1.0


@register_arm("shifted-sink-41")
class ShiftedSink(SinkLogit):
    """sink-logit with its logit shifted by a constant of this file."""

    def sink_logit(self):
        return self.sink_bias + OFFSET
'''


def test_the_hash_covers_the_class_and_the_registering_file(tmp_path):
    arm_file = tmp_path / "arm41.py"
    arm_file.write_text(ARM_FILE)
    load_module(arm_file)
    first = arm_source_hash(get_arm("shifted-sink-41"))
    assert get_arm("shifted-sink-41").registered_in == str(arm_file)
    arm_file.write_text(ARM_FILE.replace("OFFSET = 1.0", "OFFSET = 0.5"))  # a module constant: code the class reads
    load_module(arm_file)
    assert arm_source_hash(get_arm("shifted-sink-41")) != first
    assert arm_source_hash(get_arm("sink-logit")) == arm_source_hash(get_arm("sink-logit"))
    assert arm_source_hash(get_arm("sink-logit")) != arm_source_hash(get_arm("baseline"))


def test_seeds_trained_on_two_versions_of_an_arm_are_refused(tmp_path):
    """Seed 0 trained with OFFSET 1.0, the file edited to 0.5, seed 1 trained: the table named both."""
    arm_file = tmp_path / "arm41.py"
    arm_file.write_text(ARM_FILE)
    experiment = Experiment(name="armsrc", tiers=("synthetic",), arms=("shifted-sink-41",), seeds=2,
                            overrides={"steps": 3, "val_interval": 3})
    seed0, seed1 = experiment.runs()
    load_module(arm_file)
    summary = run(seed0, tmp_path / "results")
    assert summary["arm_source"] == arm_source_hash(get_arm("shifted-sink-41"))
    arm_file.write_text(ARM_FILE.replace("OFFSET = 1.0", "OFFSET = 0.5"))
    load_module(arm_file)
    run(seed1, tmp_path / "results")
    with pytest.raises(AblateError, match=r"shifted-sink-41/seed0 and .*shifted-sink-41/seed1 are not matched: "
                                          r"their arm_source differs .*the arm's code"):
        load_runs(tmp_path / "results" / "armsrc")
    path = seed1.folder(tmp_path / "results") / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "arm_source": summary["arm_source"]}))
    assert load_runs(tmp_path / "results" / "armsrc").completed.height == 2  # the same code: one row
