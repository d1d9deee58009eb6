"""The run's options are RunConfig's fields, whose metadata the checks, the defaults and the fingerprints'
key tuples read; summary.json's fields are RunSummary's, and no writer adds another."""

import dataclasses
import json

import pytest

from ablate import identity
from ablate.config import resolve_config, valid_options, with_device_defaults
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.identity import config_fingerprint
from ablate.runconfig import RunConfig, device_defaults, keys_with
from ablate.store import SUMMARY, atomic_write_json, read_json
from ablate.store_summary import SUMMARY_FIELDS, RunSummary, update_summary, write_summary

# As they were spelt before RunConfig declared them: what the metadata must still say.
OLD_POSITIVE = ("max_steps", "checkpoint_interval", "devices", "steps", "global_batch", "seq_len", "micro_batch",
                "val_interval", "val_tokens", "final_val_tokens", "log_interval", "warmup_steps", "selection_tokens")
OLD_CHOICES = {"precision": ("32-true", "bf16-mixed"), "host_sync": ("step", "log")}
OLD_VALID = ["steps", "global_batch", "seq_len", "micro_batch", "lr", "warmup_steps", "min_lr_ratio", "weight_decay",
             "betas", "eps", "grad_clip", "val_interval", "val_tokens", "final_val_tokens", "log_interval",
             "checkpoint_interval", "devices", "compile", "match_params", "loss_chunk", "precision", "host_sync",
             "progress", "logger", "threads", "data_seed", "data_dir", "max_steps", "model", "selection_tokens",
             "document_mask"]
FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _resolve(**overrides):
    return resolve_config(RunSpec("e", "smoke", "baseline", 0, overrides), "/tmp/data").to_dict()


@pytest.mark.unit
def test_the_valid_options_are_the_settable_fields():
    assert valid_options() == sorted(OLD_VALID)
    with pytest.raises(AblateError, match=r"^unknown run option 'learning_rate'; valid options: betas, checkpoint_"):
        _resolve(learning_rate=0.1)
    for not_settable in ("experiment", "tier", "arm", "seed", "synthetic_task"):
        with pytest.raises(AblateError, match=f"unknown run option '{not_settable}'"):
            _resolve(**{not_settable: 1})


@pytest.mark.unit
@pytest.mark.parametrize("key", OLD_POSITIVE)
def test_a_positive_option_is_refused_at_zero_because_its_field_says_so(key):
    assert FIELDS[key].metadata["positive"]
    with pytest.raises(AblateError, match=f"^run option '{key}' must be a positive integer, not 0$"):
        _resolve(**{key: 0})
    flag = f"--{key.replace('_', '-')}"  # given on the command line: named as its flag
    with pytest.raises(AblateError, match=f"^{flag} must be a positive integer, not True$"):
        resolve_config(RunSpec("e", "smoke", "baseline", 0), "/tmp/data", **{key: True})


@pytest.mark.unit
def test_only_the_declared_options_are_checked_for_a_positive_integer():
    positive = {name for name, f in FIELDS.items() if f.metadata["positive"]}
    assert positive == set(OLD_POSITIVE)
    assert _resolve(lr=-1.0, eps=0)["lr"] == -1.0  # not positive integers: not checked as such


@pytest.mark.unit
@pytest.mark.parametrize(("key", "valid"), OLD_CHOICES.items())
def test_the_choices_of_an_option_come_from_its_field(key, valid):
    assert {name: f.metadata["choices"] for name, f in FIELDS.items() if f.metadata["choices"]} == OLD_CHOICES
    with pytest.raises(AblateError, match=f"^run option '{key}' must be one of {', '.join(valid)}, not 'x'$"):
        _resolve(**{key: "x"})
    for value in valid:
        assert _resolve(**{key: value})[key] == value


@pytest.mark.unit
def test_the_device_defaults_are_the_fields():
    assert device_defaults(cuda=True) == {"precision": "bf16-mixed", "host_sync": "log"}
    assert device_defaults(cuda=False) == {"precision": "32-true", "host_sync": "step"}
    config = _resolve()
    assert config["precision"] is None and config["host_sync"] is None  # the run's device fills them in
    assert with_device_defaults(config, cuda=True)["precision"] == "bf16-mixed"


@pytest.mark.unit
def test_the_identity_key_tuples_are_read_from_the_fields():
    assert set(identity.IDENTITY_KEYS) == {"experiment", "arm"} == set(keys_with("name"))
    assert set(identity.WATCH_KEYS) == {"progress", "logger", "threads", "val_interval", "checkpoint_interval",
                                        "log_interval", "host_sync"}
    assert set(identity.EXECUTION_KEYS) == {"devices", "micro_batch", "compile", "data_dir", "loss_chunk"}
    assert set(identity.SEED_KEYS) == {"seed", "data_seed"}
    # the document mask is off unless asked, and absent from an older config.json: its fingerprint stands
    assert identity.IMPLIED == {"precision": "32-true", "document_mask": False}


@pytest.mark.unit
def test_config_json_keeps_its_keys():
    config = _resolve(max_steps=3)
    assert list(config) == ["experiment", "tier", "arm", "seed", "data_seed", "data_dir", "model", "steps",
                            "global_batch", "seq_len", "micro_batch", "lr", "warmup_steps", "min_lr_ratio",
                            "weight_decay", "betas", "eps", "grad_clip", "val_interval", "val_tokens",
                            "final_val_tokens", "log_interval", "checkpoint_interval", "devices", "compile",
                            "match_params", "loss_chunk", "precision", "host_sync", "progress", "logger", "threads"]
    assert config["steps"] == 3 and config["betas"] == [0.9, 0.95] and config["eps"] == 1e-8
    assert list(_resolve(selection_tokens=64))[-1] == "selection_tokens"
    task = resolve_config(RunSpec("e", "synthetic", "baseline", 0), None).to_dict()
    assert list(task)[-1] == "synthetic_task" and task["data_dir"] is None
    assert RunConfig.from_dict(config).to_dict() == config


@pytest.mark.unit
def test_an_old_config_json_without_the_device_options_reads():
    config = with_device_defaults(_resolve(), cuda=False)
    old = {k: v for k, v in config.items() if k not in ("precision", "host_sync")}
    read = RunConfig.from_dict(json.loads(json.dumps(old)))
    assert read.precision is None and read.host_sync is None
    assert "precision" in read.to_dict()  # read back as unset, the device's default to fill in
    assert config_fingerprint(old) == config_fingerprint(config)  # float32 is what the old runs ran with
    assert with_device_defaults(old, cuda=False) == {**old, "precision": "32-true", "host_sync": "step"}
    with pytest.raises(AblateError, match="unknown run option 'learning_rate' in a run's config; valid keys: "):
        RunConfig.from_dict({**old, "learning_rate": 1})


@pytest.mark.unit
def test_an_unknown_summary_field_is_refused(tmp_path):
    with pytest.raises(AblateError, match="^unknown summary field 'val_los'; valid fields: tier, arm, seed,"):
        update_summary(tmp_path, status="running", val_los=1.0)
    with pytest.raises(AblateError, match="^unknown summary field 'colour'"):
        write_summary(tmp_path, {"status": "completed", "colour": "red"})
    assert not (tmp_path / SUMMARY).exists()  # nothing written


@pytest.mark.unit
def test_update_summary_sets_its_fields_and_keeps_the_others(tmp_path):
    write_summary(tmp_path, {"tier": "smoke", "status": "running", "val_loss": None})
    update_summary(tmp_path, status="completed", val_loss=2.5, weights_sha256="ab")
    assert read_json(tmp_path / SUMMARY) == {"tier": "smoke", "status": "completed", "val_loss": 2.5,
                                             "weights_sha256": "ab"}


@pytest.mark.unit
def test_an_old_summary_without_the_newer_fields_reads(tmp_path):
    atomic_write_json(tmp_path / SUMMARY, {"status": "completed", "val_loss": 3.0, "steps": 4})
    summary = RunSummary.from_dict(read_json(tmp_path / SUMMARY))
    assert summary.val_loss == 3.0 and summary.weights_sha256 is None and summary.loss_read_every is None
    assert update_summary(tmp_path, weights_sha256="cd") == {"status": "completed", "val_loss": 3.0, "steps": 4,
                                                            "weights_sha256": "cd"}


@pytest.mark.run
def test_a_trained_run_writes_only_declared_summary_fields(tmp_path):
    from ablate.train import run

    spec = RunSpec("e", "synthetic", "baseline", 0, {"max_steps": 2})
    summary = run(spec, tmp_path, progress=False, threads=1)
    assert isinstance(summary, RunSummary)  # the run's summary, typed (not a dict the command wraps again)
    assert summary.status == "completed" and set(read_json(spec.folder(tmp_path) / SUMMARY)) <= set(SUMMARY_FIELDS)
    assert summary == RunSummary.of(read_json(spec.folder(tmp_path) / SUMMARY))  # what the folder holds
