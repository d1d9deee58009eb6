"""A damaged manifest.json or progress.json is one line naming the file and the way out, in every command.

Each test damages a copy of the prepared sample (or of an unfinished prepare) the way a full disk, a killed
copy or a hand edit would, and runs the real `ablate` command on it in a fresh process (tests/datafix.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ablate.data.layout import problem, read_manifest_file
from ablate.errors import AblateError
from datafix import ablate_cli

MANIFEST_WAY_OUT = "prepare the data again (`ablate data prepare` into a new folder, or delete"
PROGRESS_WAY_OUT = "the unfinished prepare cannot resume from it: delete"
SHARD_TOKENS = 100_000  # the sample's 553k training tokens make several shards: an interruption leaves progress


def truncated(text: str) -> str:
    return text[: len(text) // 2]


def as_list(text: str) -> str:
    return "[]"


def empty(text: str) -> str:
    return ""


def without_splits(text: str) -> str:
    manifest = json.loads(text)
    del manifest["splits"]
    return json.dumps(manifest)


def shard_outside(text: str) -> str:
    manifest = json.loads(text)
    manifest["splits"]["train"]["shards"][0]["file"] = "../../etc/passwd"
    return json.dumps(manifest)


def tokens_as_text(text: str) -> str:
    value = json.loads(text)
    value["splits"]["train"]["shards"][0]["tokens"] = "many"
    return json.dumps(value)


def without_carry(text: str) -> str:
    progress = json.loads(text)
    del progress["carry"]
    return json.dumps(progress)


def damaged_copy(source: Path, out: Path, name: str, damage) -> Path:
    shutil.copytree(source, out)
    (out / name).write_text(damage((out / name).read_text()))
    return out


def assert_one_line(result, path: Path, way_out: str) -> None:
    """Exit 2, no traceback, and exactly one error line that names the file and the way out."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("ablate: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert str(path) in errors[0] and "is damaged" in errors[0] and way_out in errors[0], errors[0]


def experiment_file(tmp_path: Path) -> Path:
    path = tmp_path / "datatrust.py"
    path.write_text("from ablate.experiment import Experiment\n"
                    "EXPERIMENT = Experiment(name='datatrust', tiers=['smoke'], arms=['baseline'], seeds=1,\n"
                    "    overrides={'max_steps': 2})\n")
    return path


COMMANDS = {
    "info": lambda data, tmp_path: ("data", "info", data),
    "submit": lambda data, tmp_path: ("submit", experiment_file(tmp_path), "--executor", "local", "--data", data,
                                      "--results", tmp_path / "results"),
    "prepare": lambda data, tmp_path: ("data", "prepare", "--source", "sample", "--out", data, "--no-progress"),
    "run": lambda data, tmp_path: ("run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "2", "--data", data,
                                   "--results", tmp_path / "results"),
}


@pytest.mark.unit
@pytest.mark.parametrize("damage", [truncated, as_list])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_manifest_is_one_line_in_every_command(tmp_path, sample_data, command, damage):
    data = damaged_copy(sample_data, tmp_path / "data", "manifest.json", damage)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    result = ablate_cli(*COMMANDS[command](data, tmp_path), check=False)
    assert_one_line(result, data / "manifest.json", MANIFEST_WAY_OUT)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # nothing the user made is touched
    if command == "submit":
        assert not (tmp_path / "results").exists()  # refused before anything was queued or written


@pytest.mark.unit
@pytest.mark.parametrize("damage", [empty, without_splits, shard_outside, tokens_as_text])
def test_a_manifest_damaged_inside_is_named_with_the_field(tmp_path, sample_data, damage):
    data = damaged_copy(sample_data, tmp_path / "data", "manifest.json", damage)
    result = ablate_cli("data", "info", data, check=False)
    assert_one_line(result, data / "manifest.json", MANIFEST_WAY_OUT)
    field = {empty: "JSONDecodeError", without_splits: "splits is missing",
             shard_outside: "splits.train.shards[0].file is '../../etc/passwd'",
             tokens_as_text: "splits.train.shards[0].tokens is 'many'"}[damage]
    assert field in result.stderr


@pytest.mark.system
def test_the_way_out_of_a_damaged_manifest_works(tmp_path, sample_data):
    data = damaged_copy(sample_data, tmp_path / "data", "manifest.json", as_list)
    shutil.rmtree(data)  # what the message says: delete the folder and prepare again
    ablate_cli("data", "prepare", "--source", "sample", "--out", data, "--no-progress", process=True)
    assert "train" in ablate_cli("data", "info", data, process=True).stdout


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory) -> Path:
    """A prepare of the sample interrupted after its first shard: progress.json, a carry file, no manifest."""
    from ablate.data.writer import PrepareStopped, prepare

    out = tmp_path_factory.mktemp("unfinished") / "sample"
    with pytest.raises(PrepareStopped):
        prepare("sample", out, shard_tokens=SHARD_TOKENS, progress_bar=False, stop_after_shards=1, workers=1)
    assert (out / "progress.json").exists() and not (out / "manifest.json").exists()
    return out


@pytest.mark.unit
@pytest.mark.parametrize("damage", [truncated, as_list, without_carry, tokens_as_text])
def test_a_damaged_progress_file_is_one_line_when_prepare_resumes(tmp_path, unfinished, damage):
    out = damaged_copy(unfinished, tmp_path / "sample", "progress.json", damage)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = ablate_cli("data", "prepare", "--source", "sample", "--out", out, "--shard-tokens", SHARD_TOKENS,
                        "--workers", "1", "--no-progress", check=False)
    assert_one_line(result, out / "progress.json", PROGRESS_WAY_OUT)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # refused before anything was rewritten


@pytest.mark.unit
def test_the_way_out_of_a_damaged_progress_file_works(tmp_path, unfinished, sample_data):
    out = damaged_copy(unfinished, tmp_path / "sample", "progress.json", truncated)
    shutil.rmtree(out)
    ablate_cli("data", "prepare", "--source", "sample", "--out", out, "--shard-tokens", SHARD_TOKENS, "--workers", "1",
               "--no-progress")
    assert read_manifest_file(out)["splits"]["val"] == read_manifest_file(sample_data)["splits"]["val"]


@pytest.mark.unit
@pytest.mark.parametrize("command", ["info", "submit", "run"])
def test_readers_of_an_unfinished_folder_with_a_damaged_progress_file_say_so_in_one_line(tmp_path, unfinished,
                                                                                        command):
    out = damaged_copy(unfinished, tmp_path / "sample", "progress.json", as_list)
    result = ablate_cli(*COMMANDS[command](out, tmp_path), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("ablate: error:")]
    assert len(errors) == 1 and "not a prepared data folder" in errors[0] and "unfinished prepare" in errors[0]


@pytest.mark.unit
def test_problem_names_the_place_and_accepts_a_good_value():
    schema = {"a": {"b": [{"c": int}]}}
    assert problem({"a": {"b": [{"c": 1}, {"c": -1}]}}, schema) == "a.b[1].c is -1, not a whole number >= 0"
    assert problem({"a": {"b": {}}}, schema) == "a.b is an object, not a list"
    assert problem({"a": {"b": [{"c": True}]}}, schema) == "a.b[0].c is True, not a whole number >= 0"
    assert problem([], schema) == "it is a list, not an object"
    assert problem({"a": {"b": [{"c": 0}]}, "extra": 1}, schema) is None


@pytest.mark.unit
def test_a_manifest_of_another_format_names_it_and_the_way_out(tmp_path, sample_data):
    data = damaged_copy(sample_data, tmp_path / "data", "manifest.json", lambda text: "{}")
    with pytest.raises(AblateError, match=r"format None, expected 'ablate-token-shards/1'.*prepare the data again"):
        read_manifest_file(data)
