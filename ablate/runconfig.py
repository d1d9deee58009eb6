"""Every option of a run, once: `RunConfig`, one field per option, whose metadata says what the option is.

* role: what the option is to the run's identity (`ablate.identity` reads its key tuples from here):
  "name" (which run it is: left out of every fingerprint), "seed" (differs between the seeds of one row),
  "identity" (what the run is: in every fingerprint), "execution" (how it is computed: the same mathematics),
  "watch" (how it is watched: may differ even between the two halves of a resumed run);
* positive: a positive integer when set; choices: the values it may take when set;
* device: its default on a GPU and on a CPU, for an option left unset (None) until the run knows its device;
* tier: its default is the tier's value of the same name; settable: an override or option may set it;
* stored: written to config.json (`max_steps` is not: it shortens `steps`); optional: left out of config.json
  when unset (the key is absent from every config that never had it, so their fingerprints stay as they were);
* implied: the value a config.json without the key ran with (left out of the fingerprints at that value).

config.json holds `RunConfig.to_dict()`, so a config.json of a run has the same keys and values as before RunConfig.
Torch-free: the fingerprints (`ablate.identity`) and the analysis read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ablate.errors import AblateError

ROLES = ("name", "seed", "identity", "execution", "watch")


def option(default=None, *, role: str = "identity", positive: bool = False, choices: tuple = (),
           device: dict | None = None, tier: bool = False, **flags):
    """A RunConfig field with its metadata (flags: settable, stored, optional, implied; see the module)."""
    assert role in ROLES, role
    metadata = {"role": role, "positive": positive, "choices": tuple(choices), "device": device, "tier": tier,
                "settable": flags.pop("settable", True), "stored": flags.pop("stored", True),
                "optional": flags.pop("optional", False), "implied": flags.pop("implied", None)}
    assert not flags, flags
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ModelShape:
    """A run's model: the fields of `ablate.model.GPTConfig` but its length, which is the run's `seq_len` (stored
    once; config.json's `model.max_seq_len` is written from it, so a run's file and fingerprint stay as they were).
    None: not recorded (a config.json written before the field existed: the model's default)."""

    vocab_size: int | None = None
    n_layer: int | None = None
    n_head: int | None = None
    n_kv_head: int | None = None  # None: as many as query heads (no GQA)
    d_model: int | None = None
    arm: str | None = None
    mlp_ratio: int | None = None
    mlp_hidden: int | None = None  # MLP hidden width; None: mlp_ratio · d_model (parameter matching narrows it)
    rope_theta: float | None = None
    norm_eps: float | None = None
    fused: bool | None = None  # False: the reference path that materialises the weights

    @classmethod
    def from_dict(cls, model: object, seq_len: int | None = None) -> ModelShape:
        """config.json's `model` (GPTConfig's fields, `max_seq_len` among them, which must be the run's `seq_len`);
        a key that is no GPTConfig field, or another length than the run's, is refused in one line."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(model, dict):
            raise AblateError(f"run option 'model' is {model!r}, not an object of the model's fields: "
                              f"{', '.join(names)}, max_seq_len")
        length = model.get("max_seq_len")
        if length is not None and seq_len is not None and length != seq_len:
            raise AblateError(f"the run's model has max_seq_len {length!r}, not its seq_len {seq_len!r}: a run's "
                              "model is as long as its sequences")
        unknown = [key for key in model if key not in names and key != "max_seq_len"]
        if unknown:
            raise AblateError(f"unknown model field {unknown[0]!r} in a run's config; valid fields: "
                              f"{', '.join(names)}, max_seq_len")
        return cls(**{key: value for key, value in model.items() if key != "max_seq_len"})

    def to_dict(self, seq_len: int | None) -> dict:
        """config.json's `model`: every field, and `max_seq_len` (the run's seq_len)."""
        return {**dataclasses.asdict(self), "max_seq_len": seq_len}


@dataclass(frozen=True)
class RunConfig:
    experiment: str = option(role="name", settable=False)
    tier: str = option(settable=False)
    arm: str = option(role="name", settable=False)
    seed: int = option(role="seed", settable=False)
    data_seed: int = option(role="seed")
    data_dir: str | None = option(role="execution")  # a path: the data's identity is the data fingerprint
    model: ModelShape | None = option()  # the GPTConfig fields (an override gives some of them, as a dict)
    steps: int = option(positive=True, tier=True)
    global_batch: int = option(positive=True, tier=True)
    seq_len: int = option(positive=True, tier=True)
    micro_batch: int = option(role="execution", positive=True, tier=True)
    lr: float = option(tier=True)
    warmup_steps: int = option(positive=True, tier=True)
    min_lr_ratio: float = option(tier=True)
    weight_decay: float = option(tier=True)
    betas: list = option(tier=True)
    eps: float = option(1e-8)
    grad_clip: float = option(tier=True)
    val_interval: int = option(role="watch", positive=True, tier=True)
    val_tokens: int = option(positive=True, tier=True)
    final_val_tokens: int = option(positive=True, tier=True)
    log_interval: int = option(role="watch", positive=True, tier=True)
    checkpoint_interval: int = option(role="watch", positive=True, tier=True)
    devices: int = option(1, role="execution", positive=True)
    compile: bool = option(False, role="execution")
    match_params: bool = option(False)
    loss_chunk: int | None = option(role="execution")
    # float32 or bf16 autocast: it changes the numbers, so a float32 run and a bf16 one never pair
    precision: str | None = option(choices=("32-true", "bf16-mixed"), device={"cuda": "bf16-mixed", "cpu": "32-true"},
                                   implied="32-true")
    # when the host reads the device's losses back (every step, or every log_interval): the same numbers
    host_sync: str | None = option(role="watch", choices=("step", "log"), device={"cuda": "log", "cpu": "step"})
    progress: bool = option(True, role="watch")
    logger: str = option("none", role="watch")
    threads: int | None = option(role="watch")
    max_steps: int | None = option(positive=True, stored=False)  # stop early: `steps` becomes the smaller
    selection_tokens: int | None = option(positive=True, optional=True)  # an LR sweep's runs only
    synthetic_task: dict | None = option(settable=False, optional=True)  # a task tier's runs: its task's fields
    # each token attends within its document only (documents split at <|endoftext|>): what the run is
    document_mask: bool | None = option(optional=True, implied=False)

    def tokens(self, steps: int) -> int:
        """The training tokens of `steps` steps: every step trains global_batch sequences of seq_len tokens."""
        return steps * self.global_batch * self.seq_len

    def with_device_defaults(self, cuda: bool) -> RunConfig:
        """The config with every device-dependent option left unset (None) set to the device's default."""
        return dataclasses.replace(self, **{k: v for k, v in device_defaults(cuda).items() if getattr(self, k) is None})

    def model_fields(self) -> dict:
        """The `GPTConfig` keywords of the run's model: its shape's recorded fields (an unrecorded one: GPTConfig's
        default) and `max_seq_len`, the run's `seq_len`."""
        return {key: value for key, value in self.model.to_dict(self.seq_len).items() if value is not None}

    def to_dict(self) -> dict:
        """config.json: the stored fields in order, without the optional ones left unset (`model` as a dict with its
        `max_seq_len`)."""
        stored = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["stored"]
                  and not (f.metadata["optional"] and getattr(self, f.name) is None)}
        if self.model is not None:
            stored["model"] = self.model.to_dict(self.seq_len)
        return stored

    @classmethod
    def from_dict(cls, config: dict) -> RunConfig:
        """A config.json, also one written before an option existed (the option reads as unset: None, or
        its default); a key that is no run option is refused."""
        names = [f.name for f in dataclasses.fields(cls) if f.metadata["stored"]]
        unknown = [key for key in config if key not in names]
        if unknown:
            raise AblateError(f"unknown run option {unknown[0]!r} in a run's config; valid keys: {', '.join(names)}")
        if config.get("model") is not None:
            config = {**config, "model": ModelShape.from_dict(config["model"], config.get("seq_len"))}
        return cls(**config)

    def check(self, flags: tuple[str, ...] = ()) -> None:
        """Refuse, in one line, a value out of its field's range (an option among `flags` was given as
        `--name` on the command line, and is named so)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.metadata["positive"] and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                name = f"--{f.name.replace('_', '-')}" if f.name in flags else f"run option {f.name!r}"
                raise AblateError(f"{name} must be a positive integer, not {value!r}")
            valid = f.metadata["choices"]
            if valid and value not in valid:
                raise AblateError(f"run option {f.name!r} must be one of {', '.join(valid)}, not {value!r}")


def _run_options() -> type:
    """`RunOptions`: one field per settable RunConfig option (of its type, or None), so that an option added to
    RunConfig travels from a command to the worker with no second list to keep."""
    fields = [(f.name, f.type if "None" in f.type else f"{f.type} | None", dataclasses.field(default=None))
              for f in dataclasses.fields(RunConfig) if f.metadata["settable"]]
    cls = dataclasses.make_dataclass("RunOptions", fields, frozen=True, namespace={
        "of": classmethod(_options_of), "given": _given, "unset_to": _unset_to,
        "__doc__": "What a command sets on top of an experiment's overrides for every run it trains (`ablate run`'s "
                   "flags, `ablate submit`'s --data, a profile's devices and micro-batch), typed from the command line "
                   "to the worker: None is not given (the override, else the tier's value, stands). It pickles (a "
                   "SLURM task's `RunJob`) and travels to a local worker as the JSON of `given()`."})
    cls.__module__ = __name__  # pickled by name: ablate.runconfig.RunOptions
    return cls


def _options_of(cls, options: dict):
    """The RunOptions of a mapping (a worker's payload, `train.run`'s keywords); a key that is no settable run
    option is refused in one line naming the valid ones."""
    unknown = [key for key in options if key not in settable_options()]
    if unknown:
        raise AblateError(f"unknown run option {unknown[0]!r}; valid options: {', '.join(settable_options())}")
    return cls(**options)


def _given(self) -> dict:
    """The options given (not None), by name: what `chosen_options` merges over the overrides."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def _unset_to(self, **defaults):
    """These options with each of `defaults` that is not given set to its value."""
    return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


RunOptions = _run_options()


def stored(config: RunConfig | dict) -> dict:
    """What config.json holds of a run: its config's `to_dict()`, or a config.json already read. The fingerprints
    and the comparison of a rerun with its folder read this, so that a run's config and the file of an earlier
    run are compared as the same thing."""
    return config.to_dict() if isinstance(config, RunConfig) else config


def chosen_options(overrides, options) -> dict:
    """What a run's overrides (an experiment's) and options (the command's) set, the options winning: an option
    left None is not given, so the override stands. The one place the two are merged (the run's config, the
    micro-batch `ablate submit` sizes for a GPU)."""
    return {**overrides, **{key: value for key, value in options.items() if value is not None}}


def option_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(RunConfig)


def keys_with(role: str) -> tuple[str, ...]:
    """The config keys of one role, in field order."""
    assert role in ROLES, role
    return tuple(f.name for f in option_fields() if f.metadata["role"] == role)


def settable_options() -> list[str]:
    """Every key an override or option may set, sorted (`model` takes GPTConfig fields)."""
    return sorted(f.name for f in option_fields() if f.metadata["settable"])


def tier_options() -> tuple[str, ...]:
    """The options whose default is the tier's value of the same name."""
    return tuple(f.name for f in option_fields() if f.metadata["tier"])


def implied_values() -> dict:
    """The value a config without the key ran with, for each option that has one."""
    return {f.name: f.metadata["implied"] for f in option_fields() if f.metadata["implied"] is not None}


def device_defaults(cuda: bool) -> dict:
    """bf16 autocast and a read-back every log_interval steps on a GPU; float32 and every step on a CPU."""
    return {f.name: f.metadata["device"]["cuda" if cuda else "cpu"] for f in option_fields() if f.metadata["device"]}
