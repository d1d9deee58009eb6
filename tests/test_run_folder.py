"""Issue 59, item 3 and item 5's run folder: the run records typed and a run folder's life with one owner.

* `RunConfig.model` is a frozen `ModelShape` (GPTConfig's fields, typed) with the length stored once (`seq_len`);
  config.json and the fingerprints of recorded runs read and write back unchanged;
* run options travel typed (`RunOptions`) from the command to the worker, pickled for SLURM, JSON for a local worker,
  one field per settable run option (a new option needs no second list);
* one `resumable(folder, config)`: the holder's resume check and a data-parallel child's are the same;
* `ablate.ranks.RunFolder` owns the folder's lock, child check, resume check, summary and metrics writes: the run
  modules reach none of them but through it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

import ablate.ranks
from ablate.config import resolve_config
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.identity import config_fingerprint
from ablate.model import GPTConfig
from ablate.ranks import ConfigDiffers, check_child_run_dir, prepare_run_dir, resumable
from ablate.runconfig import ModelShape, RunConfig, RunOptions, settable_options

ROOT = Path(__file__).resolve().parents[1]


def recorded_configs() -> list[dict]:
    """Every run config the golden artefacts hold (tests/run_artefacts.json)."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            if {"model", "seq_len", "tier"} <= set(value):
                found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads((ROOT / "tests" / "run_artefacts.json").read_text()))
    return found


@pytest.mark.unit
def test_the_model_shape_is_gpt_configs_fields_but_its_length():
    gpt = {f.name: str(f.type).replace(" | None", "") for f in dataclasses.fields(GPTConfig)}
    shape = {f.name: str(f.type).replace(" | None", "") for f in dataclasses.fields(ModelShape)}
    assert shape == {name: kind for name, kind in gpt.items() if name != "max_seq_len"}
    config = resolve_config(RunSpec("e", "smoke", "baseline", 0), data_dir="data/sample")
    assert isinstance(config.model, ModelShape) and config.model.d_model == 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model.d_model = 128  # frozen, as the run's config


@pytest.mark.unit
def test_recorded_configs_read_and_write_back_unchanged():
    """The golden artefacts' configs (and an older one, without keys added since) read as RunConfig and write back
    the same config.json, with the same fingerprint."""
    configs = recorded_configs()
    assert len(configs) >= 4
    for recorded in configs:
        config = RunConfig.from_dict(recorded)
        assert config.to_dict() == recorded and config_fingerprint(config) == config_fingerprint(recorded)
    older = {**configs[0], "model": {k: v for k, v in configs[0]["model"].items() if k != "fused"}}
    assert config_fingerprint(RunConfig.from_dict(older)) == config_fingerprint(older)


@pytest.mark.unit
def test_the_length_is_stored_once():
    config = resolve_config(RunSpec("e", "smoke", "baseline", 0, {"seq_len": 32}), data_dir="data/sample")
    assert "max_seq_len" not in {f.name for f in dataclasses.fields(config.model)}
    assert config.model_fields()["max_seq_len"] == config.to_dict()["model"]["max_seq_len"] == config.seq_len == 32
    longer = dataclasses.replace(config, seq_len=48)
    assert longer.model_fields()["max_seq_len"] == longer.to_dict()["model"]["max_seq_len"] == 48
    GPTConfig(**longer.model_fields())  # the model's keywords, as training builds it
    stored = config.to_dict()
    with pytest.raises(AblateError, match="max_seq_len 64, not its seq_len 32") as refused:
        RunConfig.from_dict({**stored, "model": {**stored["model"], "max_seq_len": 64}})
    assert "\n" not in str(refused.value)
    with pytest.raises(AblateError, match="unknown model field 'width' in a run's config; valid fields: vocab_size"):
        RunConfig.from_dict({**stored, "model": {**stored["model"], "width": 3}})


@pytest.mark.unit
def test_run_options_are_every_settable_option_typed_and_travel_to_the_worker():
    assert [f.name for f in dataclasses.fields(RunOptions)] == [n for n in (f.name for f in dataclasses.fields(
        RunConfig)) if n in settable_options()]  # a new option of RunConfig is a RunOptions field too
    options = RunOptions(data_dir="/data", max_steps=3, document_mask=True, progress=False)
    assert pickle.loads(pickle.dumps(options)) == options  # a SLURM task's RunJob
    assert RunOptions.of(json.loads(json.dumps(options.given()))) == options  # a local worker's payload
    assert options.given() == {"data_dir": "/data", "max_steps": 3, "document_mask": True, "progress": False}
    assert options.unset_to(threads=1, progress=True) == dataclasses.replace(options, threads=1)
    with pytest.raises(AblateError, match=r"unknown run option 'bogus'; valid options: betas, "):
        RunOptions.of({"bogus": 1})


def a_started_run(tmp_path, **edits):
    spec = RunSpec("e", "smoke", "baseline", 0, {"devices": 2})
    config = resolve_config(spec, data_dir="data/sample")
    folder = spec.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**config.to_dict(), **edits}))
    (folder / "summary.json").write_text(json.dumps({"status": "running", "steps": 3}))
    return folder, config


@pytest.mark.unit
def test_the_holder_and_a_child_ask_the_one_resume_check(tmp_path, monkeypatch):
    folder, config = a_started_run(tmp_path, steps=7)
    with pytest.raises(ConfigDiffers, match=r"differs in: steps\); use another --results folder or --force"):
        prepare_run_dir(folder, config, force=False)
    with pytest.raises(ConfigDiffers, match=r"differs in: steps\); a data-parallel child trains only the run"):
        check_child_run_dir(folder, config)
    with pytest.raises(ConfigDiffers) as differs:
        resumable(folder, config)
    assert differs.value.keys == ["steps"]

    asked = []

    def recording(*args, **kwargs):
        asked.append(args[0])
        raise AblateError("the one check")

    monkeypatch.setattr(ablate.ranks, "resumable", recording)
    for check in (lambda: prepare_run_dir(folder, config, force=False), lambda: check_child_run_dir(folder, config)):
        with pytest.raises(AblateError, match="the one check"):
            check()
    assert asked == [folder, folder]


RUN_FOLDER_OWNED = {"update_summary", "write_summary", "MetricsLog", "FileLock", "run_lock_path", "read_summary",
                    "launched_child", "check_child_run_dir", "await_step_rank0", "prepare_run_dir", "resumable",
                    "keep_aside", "remove_stray_temporaries", "moved_data_only", "refuse_changed_arm"}


@pytest.mark.parametrize("module", ["train.py", "taskrun.py"])
@pytest.mark.unit
def test_a_run_folders_life_has_one_owner(module):
    """The run modules reach the folder's lock, child and resume checks, summary and metrics writes only through
    `ablate.ranks.RunFolder`: none of what it owns is called there but as the folder's method."""
    tree = ast.parse((ROOT / "ablate" / module).read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert called & RUN_FOLDER_OWNED == set()
