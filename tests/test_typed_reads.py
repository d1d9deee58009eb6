"""A run's options and its summary travel typed to their last reader (issue 46, items 1–3): readers take a
`RunConfig`'s and a `RunSummary`'s attributes, never the files' keys; a run folder's name is read by
`store.run_of` only; and what training writes is what it wrote before the typed objects, key for key.

The byte-identity claim is held by `tests/run_artefacts.json`: the key sets of config.json, summary.json and
eval.json of four small runs (a smoke corpus run, an LR sweep's run, an abstain-stream and a filter-norm task run)
and every value no machine changes (`tests/run_artefacts.py` says which are left out, and why)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from ablate.errors import AblateError
from ablate.runconfig import RunConfig
from ablate.store import Status, run_dir, run_of
from ablate.store_summary import SUMMARY_FIELDS, RunSummary, read_summary
from run_artefacts import GOLDEN, make_runs, portable, without_clocks

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ablate"
OPTIONS = {f.name for f in dataclasses.fields(RunConfig)}
KEYS = OPTIONS | set(SUMMARY_FIELDS)
# config.json's and summary.json's own readers and writers: where the files' keys are the subject.
READERS_AND_WRITERS = {
    "ablate/runconfig.py": "RunConfig: to_dict (config.json) and from_dict",
    "ablate/config.py": "config.json as read back: its device defaults and what a resume compares (`semantic`)",
    "ablate/identity.py": "the fingerprints of config.json's contents",
    "ablate/store_summary.py": "summary.json's schema, reader and writers",
}
# The command's options before a run resolves them (`ablate submit`'s, handed to each job): what the user gave, None
# or absent for "not given". A RunConfig cannot say "not given" (every option has its tier's value there), and the
# micro-batch a GPU gets depends on exactly that (`sizing.run_micro_batch`: the given micro_batch, else the largest
# that fits); they are merged with the overrides in one place (`runconfig.chosen_options`).
COMMAND_OPTIONS = {("ablate/dispatch.py", "options"), ("ablate/sizing.py", "options"), ("ablate/workers.py", "options")}


def _receiver(node: ast.AST) -> str:
    """The name a subscript or `.get` is taken of: `config` of `config["lr"]`, `summary` of `self.summary.get(…)`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            return node.attr
        node = node.value if isinstance(node, ast.Subscript) else node.func
    return node.id if isinstance(node, ast.Name) else ""


def keyed_accesses(path: Path):
    """(line, receiver, key) of every `x["key"]` and `x.get("key")` with a constant key in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            yield node.lineno, _receiver(node.value), node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.lineno, _receiver(node.func.value), node.args[0].value


def string_key_reads(path: Path):
    """(line, receiver, key) of every `x["key"]` and `x.get("key")` whose receiver is named as a config or a
    summary and whose key is a run option or a summary field."""
    for line, receiver, key in keyed_accesses(path):
        if key in KEYS and any(word in receiver.lower() for word in ("config", "summary", "options", "settings")):
            yield line, receiver, key


def test_no_string_key_read_of_a_run_option_or_a_summary_field_outside_their_reader_and_writer():
    found = [f"{where}:{line}: {receiver}[{key!r}]" for path in sorted(PACKAGE.rglob("*.py"))
             if (where := str(path.relative_to(REPO))) not in READERS_AND_WRITERS
             for line, receiver, key in string_key_reads(path) if (where, receiver) not in COMMAND_OPTIONS]
    assert found == [], "string-key reads of a run's config or summary (read the RunConfig's or RunSummary's " \
                        "attributes):\n" + "\n".join(found)


def test_the_scan_sees_what_it_is_meant_to_see(tmp_path):
    """The scan above is no vacuous pass: it finds each form it looks for."""
    path = tmp_path / "m.py"
    path.write_text('a = config["lr"]\nb = self.summary.get("val_loss")\nc = run.config["steps"]\nd = row["lr"]\n')
    assert [(line, key) for line, _, key in string_key_reads(path)] == [(1, "lr"), (2, "val_loss"), (3, "steps")]


def test_no_run_folder_is_parsed_by_hand():
    """A run folder's name is read by `store.run_of` only (the inverse of `run_dir`)."""
    hand = [f"{p.relative_to(REPO)}:{n}: {text.strip()}" for p in sorted(PACKAGE.rglob("*.py")) if p.name != "store.py"
            for n, text in enumerate(p.read_text().splitlines(), 1)
            if "parent.parent.name" in text or 'removeprefix("seed")' in text]
    assert hand == []


@pytest.mark.parametrize("lr_factor", [None, 0.5, 2.0, 1.0])
def test_run_of_is_the_inverse_of_run_dir(tmp_path, lr_factor):
    folder = run_dir(tmp_path, "study", "10M", "sink-logit", 3, lr_factor)
    name = run_of(folder)
    assert (name.experiment, name.tier, name.arm, name.seed, name.lr_factor) == ("study", "10M", "sink-logit", 3,
                                                                                lr_factor)
    assert run_dir(tmp_path, name.experiment, name.tier, name.arm, name.seed, name.lr_factor) == folder
    assert name.key == folder.relative_to(tmp_path / "study").as_posix()


@pytest.mark.parametrize("name", ["seed0.old-20260101-000000-1", "seedx", "seed01", "notes"])
def test_run_of_refuses_a_folder_not_named_as_a_run(tmp_path, name):
    with pytest.raises(AblateError, match="is not a run folder"):
        run_of(tmp_path / "study" / "10M" / "baseline" / name)


def test_read_summary_gives_what_readers_ask_and_leaves_no_field_unread(tmp_path):
    assert read_summary(tmp_path).empty and not read_summary(tmp_path).done  # no summary.json yet
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "val_loss": 3.5, "tokens": 1024,
                                                       "a_field_of_another_version": 1}))
    summary = read_summary(tmp_path)
    assert summary.completed and summary.done and summary.tokens_trained == 1024 and not summary.empty
    assert RunSummary(status="completed", val_loss=float("nan")).completed is False
    assert RunSummary(status="diverged").done and not RunSummary(status="running").done
    (tmp_path / "summary.json").write_text("[1]")
    with pytest.raises(AblateError, match="is damaged"):
        read_summary(tmp_path)


def test_one_status_enum_written_as_the_plain_word():
    assert [str(s) for s in Status] == ["completed", "diverged", "failed", "running"]
    assert json.dumps({"status": Status.COMPLETED}) == '{"status": "completed"}'


@pytest.mark.slow
def test_the_files_runs_write_are_those_they_wrote_before_the_typed_objects(tmp_path, sample_data):
    """config.json, summary.json and eval.json of a smoke run, an LR sweep's run and two task runs: the same keys,
    and the same values but the clocks and the arithmetic's (compared exactly on one machine: run_artefacts.py)."""
    runs = portable(without_clocks(make_runs(tmp_path / "results", sample_data)))
    assert runs == json.loads(GOLDEN.read_text())
