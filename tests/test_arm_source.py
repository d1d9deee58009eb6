"""An arm's identity is the code it trains (issue 54, items 2, 4, 12, 13): the syntax tree of its class, of what the
class reads in its module and of the user's own modules that module imports; taken as the class is registered, of
the source as imported; named by module names, never paths; versioned ("v2:"). A row whose seeds trained different
code under one name is refused."""

import json
import shutil
import sys

import pytest

from ablate.analysis.load import load_runs
from ablate.arms import get_arm
from ablate.arms import source
from ablate.arms.source import arm_identity, compute_identity, current_scheme
from ablate.errors import AblateError
from ablate.experiment import Experiment, load_module
from ablate.train import run

pytestmark = pytest.mark.unit

ARM_FILE = '''from ablate.arms import register_arm
from ablate.arms.builtin import SinkLogit

OFFSET = 1.0


@register_arm("shifted-sink-41")
class ShiftedSink(SinkLogit):
    """sink-logit with its logit shifted by a constant of this file."""

    def sink_logit(self):
        return self.sink_bias + OFFSET
'''

# An experiment file that defines its own arms: the arm reads a helper module beside it (GATE) and a function of its
# own file; a second arm and the Experiment declaration are beside it.
HELPER = "GATE = 1.0\n"
EXPERIMENT_FILE = '''from ablate.arms import register_arm
from ablate.arms.builtin import SinkLogit
from ablate.experiment import Experiment
from {helper} import GATE


def scaled(value):
    return value * GATE


@register_arm("{name}")
class GatedSink(SinkLogit):
    def sink_logit(self):
        return scaled(self.sink_bias)


@register_arm("{name}-other")
class OtherSink(SinkLogit):
    window = 32


EXPERIMENT = Experiment(name="{name}", tiers=("synthetic",), arms=("baseline", "{name}"), seeds=2,
                        overrides={{"steps": 3, "val_interval": 3}})
'''


def write_arm(folder, name, helper, gate="1.0", text=None):
    """The experiment file and its helper in `folder`; the file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{helper}.py").write_text(HELPER.replace("1.0", gate))
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(text if text is not None else EXPERIMENT_FILE.format(name=name, helper=helper))
    return path


def fresh_load(path, helper):
    """Load the file as a new process would: its helper imported afresh."""
    sys.modules.pop(helper, None)
    load_module(path)


@pytest.fixture
def forget(request):
    """Helper modules a test imports, taken out of sys.modules afterwards."""
    names = []
    yield names.append
    for name in names:
        sys.modules.pop(name, None)


def test_an_imported_helper_is_part_of_the_identity(tmp_path, forget):
    """Item 2: the arm file imports gates.py (GATE = 1.0); GATE = 0.5 is another arm. Fails if the reachable modules
    are left out (the identity would be the class's code alone)."""
    forget("gates54a")
    path = write_arm(tmp_path, "gated-54a", "gates54a")
    fresh_load(path, "gates54a")
    first = arm_identity(get_arm("gated-54a"))
    assert current_scheme(first) and first.startswith("v2:")
    (tmp_path / "gates54a.py").write_text("GATE = 0.5\n")
    fresh_load(path, "gates54a")
    assert arm_identity(get_arm("gated-54a")) != first
    (tmp_path / "gates54a.py").write_text("# the gate, as it was\nGATE = (1.0)\n")  # a comment, brackets: the tree
    fresh_load(path, "gates54a")
    assert arm_identity(get_arm("gated-54a")) == first


def test_the_declaration_beside_the_arm_is_not_part_of_it(tmp_path, forget):
    """Item 12: more seeds in the experiment file, or an edit of another arm of the file, leave the arm's identity
    as it is; an edit of a function of the file that the arm calls does not. Fails with the whole file hashed."""
    forget("gates54b")
    text = EXPERIMENT_FILE.format(name="gated-54b", helper="gates54b")
    path = write_arm(tmp_path, "gated-54b", "gates54b", text=text)
    fresh_load(path, "gates54b")
    first = arm_identity(get_arm("gated-54b"))
    for edit in (text.replace("seeds=2", "seeds=8"), text.replace("window = 32", "window = 16"),
                 text.replace("def scaled(value):", "def scaled(value):  # the gate\n\n")):
        path.write_text(edit)
        fresh_load(path, "gates54b")
        assert arm_identity(get_arm("gated-54b")) == first
    path.write_text(text.replace("return value * GATE", "return value * GATE * 2"))
    fresh_load(path, "gates54b")
    assert arm_identity(get_arm("gated-54b")) != first


def test_an_edit_of_one_builtin_arm_leaves_the_others_alone(monkeypatch):
    """Item 12: builtin.py edited in renorm's class only (its source as imported, replaced here): renorm is another
    version, sink-logit is not."""
    builtin = sys.modules["ablate.arms.builtin"]
    text = source.source_text("ablate.arms.builtin")
    sink, renorm = compute_identity(get_arm("sink-logit")), compute_identity(get_arm("renorm"))
    assert sink == arm_identity(get_arm("sink-logit")) and sink != renorm
    start = text.index("class Renorm")
    edited = text[:start] + text[start:].replace("return", "return 2 *", 1)
    monkeypatch.setitem(source._TEXTS, builtin, edited)
    assert compute_identity(get_arm("sink-logit")) == sink
    assert compute_identity(get_arm("renorm")) != renorm


def test_a_moved_checkout_or_another_torch_gives_the_same_identity(tmp_path, monkeypatch, forget):
    """Item 13: the same files in another folder give the same identity (names, not paths), and torch's Module is no
    part of it (its source edited here). Fails with paths in the hash, or with library classes hashed."""
    forget("gates54c")
    path = write_arm(tmp_path / "a", "gated-54c", "gates54c")
    fresh_load(path, "gates54c")
    first = arm_identity(get_arm("gated-54c"))
    moved = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(tmp_path / "a", moved)
    fresh_load(moved / path.name, "gates54c")
    assert arm_identity(get_arm("gated-54c")) == first
    import torch.nn.modules.module as torch_module

    monkeypatch.setitem(source._TEXTS, torch_module, "class Module:\n    pass\n")
    assert compute_identity(get_arm("gated-54c")) == first


def test_the_identity_is_of_the_source_as_imported(tmp_path, forget):
    """Item 4: a helper kept imported (a worker's cached `import gates`) while its file is edited: an arm file
    executed again records the gates it runs with, not the file on disk. Fails if the helper is read again."""
    forget("gates54d")
    path = write_arm(tmp_path, "gated-54d", "gates54d")
    fresh_load(path, "gates54d")
    first = arm_identity(get_arm("gated-54d"))
    (tmp_path / "gates54d.py").write_text("GATE = 0.5\n")
    load_module(path)  # the worker's next run: the file again, gates54d from sys.modules
    assert sys.modules["gates54d"].GATE == 1.0
    assert arm_identity(get_arm("gated-54d")) == first
    fresh_load(path, "gates54d")
    assert arm_identity(get_arm("gated-54d")) != first


def test_seeds_trained_on_two_versions_of_an_arm_are_refused(tmp_path):
    """Seed 0 trained with OFFSET 1.0, the file edited to 0.5, seed 1 trained: the table names both."""
    arm_file = tmp_path / "arm41.py"
    arm_file.write_text(ARM_FILE)
    load_module(arm_file)
    experiment = Experiment(name="armsrc", tiers=("synthetic",), arms=("shifted-sink-41",), seeds=2,
                            overrides={"steps": 3, "val_interval": 3})
    seed0, seed1 = experiment.runs()
    summary = run(seed0, tmp_path / "results")
    assert summary.arm_source == arm_identity(get_arm("shifted-sink-41"))
    assert summary.arm_sources == [summary.arm_source]
    arm_file.write_text(ARM_FILE.replace("OFFSET = 1.0", "OFFSET = 0.5"))
    load_module(arm_file)
    run(seed1, tmp_path / "results")
    with pytest.raises(AblateError, match=r"shifted-sink-41/seed0 and .*shifted-sink-41/seed1 are not matched: "
                                          r"their arm_source differs .*the arm's code"):
        load_runs(tmp_path / "results" / "armsrc")
    path = seed1.folder(tmp_path / "results") / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "arm_source": summary.arm_source,
                                "arm_sources": [summary.arm_source]}))
    assert load_runs(tmp_path / "results" / "armsrc").completed.height == 2  # the same code: one row
    older = "0" * 64  # what the older scheme recorded (a bare sha256 of whole files): never compared with v2
    path.write_text(json.dumps({**json.loads(path.read_text()), "arm_source": older, "arm_sources": None}))
    assert load_runs(tmp_path / "results" / "armsrc").completed.height == 2
