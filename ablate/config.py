"""A run's configuration: the tier's values plus overrides and options, resolved, checked and explicit.

Free of training code (no Lightning, no loop), so that `ablate submit` checks a whole grid's overrides before
anything is queued; it does load torch, through `ablate.sizing` (the model config of an arm is built on the
meta device, so its counts cannot drift from the code). The learning rate is a pure function of the step (no scheduler
state to restore).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from ablate.arms import get_arm
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.identity import WATCH_KEYS
from ablate.paths import default_data_dir
from ablate.sizing import model_config
from ablate.tiers import TASK_CONFIG_KEY, TASKS, get_tier

# Device-dependent options: None in a resolved config means "the device's default", filled in by the run
# (`with_device_defaults`) before its config.json is written, so the file says what the run did.
CHOICES = {"precision": ("32-true", "bf16-mixed"), "host_sync": ("step", "log")}
POSITIVE_OPTIONS = ("max_steps", "checkpoint_interval", "devices", "steps", "global_batch", "seq_len", "micro_batch",
                    "val_interval", "val_tokens", "final_val_tokens", "log_interval", "warmup_steps")


# ---------------------------------------------------------------------------------------------- config
def resolve_config(spec: RunSpec, data_dir: str | None = None, **options) -> dict:
    """The full, explicit configuration of a run (written to config.json and compared on reruns)."""
    tier = get_tier(spec.tier)
    get_arm(spec.arm)
    chosen = {**spec.overrides, **{k: v for k, v in options.items() if v is not None}}  # options win
    model_overrides = dict(chosen.pop("model", {}))
    max_steps = chosen.pop("max_steps", None)
    selection_tokens = chosen.pop("selection_tokens", None)
    config = {
        "experiment": spec.experiment, "tier": tier.name, "arm": spec.arm, "seed": int(spec.seed),
        "data_seed": int(spec.seed), "data_dir": None, "model": None,
        "steps": tier.steps, "global_batch": tier.global_batch, "seq_len": tier.seq_len,
        "micro_batch": tier.micro_batch, "lr": tier.lr, "warmup_steps": tier.warmup_steps,
        "min_lr_ratio": tier.min_lr_ratio, "weight_decay": tier.weight_decay, "betas": list(tier.betas),
        "eps": 1e-8, "grad_clip": tier.grad_clip, "val_interval": tier.val_interval, "val_tokens": tier.val_tokens,
        "final_val_tokens": tier.final_val_tokens, "log_interval": tier.log_interval,
        "checkpoint_interval": tier.checkpoint_interval, "devices": 1, "compile": False, "match_params": False,
        "loss_chunk": None, "precision": None, "host_sync": None,
        "progress": True, "logger": "none", "threads": None,
    }
    for key, value in chosen.items():
        if key not in config or key in ("experiment", "tier", "arm", "seed"):
            raise AblateError(f"unknown run option {key!r}; valid options: {', '.join(valid_options())}")
        config[key] = value
    for key in POSITIVE_OPTIONS:
        value = max_steps if key == "max_steps" else config[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            name = f"--{key.replace('_', '-')}" if options.get(key) is not None else f"run option {key!r}"
            raise AblateError(f"{name} must be a positive integer, not {value!r}")
    for key, valid in CHOICES.items():
        if config[key] is not None and config[key] not in valid:
            raise AblateError(f"run option {key!r} must be one of {', '.join(valid)}, not {config[key]!r}")
    if max_steps is not None:
        config["steps"] = min(int(max_steps), config["steps"])
    if selection_tokens is not None:  # an LR sweep's run only: the key is absent from every other run's config
        if isinstance(selection_tokens, bool) or not isinstance(selection_tokens, int) or selection_tokens <= 0:
            raise AblateError(f"run option 'selection_tokens' must be a positive integer, not {selection_tokens!r}")
        config["selection_tokens"] = selection_tokens
    matching = {"match_params": True} if config["match_params"] else {}
    config["model"] = dataclasses.asdict(model_config(tier, spec.arm, **matching, **model_overrides))
    if tier.task is not None:  # a task tier draws its batches from the task: no data folder
        if data_dir is not None:
            raise AblateError(f"tier {tier.name!r} trains on the synthetic task {tier.task!r}: it takes no --data")
        config["data_dir"] = None
        config[TASK_CONFIG_KEY] = dict(TASKS[tier.task])
    else:
        config["data_dir"] = str(Path(data_dir or config["data_dir"] or default_data_dir(tier.data_dir)).resolve())
    config["model"]["max_seq_len"] = config["seq_len"]
    config["betas"] = list(config["betas"])
    return config


def valid_options() -> list[str]:
    """Every key `resolve_config` accepts as an override or option (`model` takes GPTConfig fields)."""
    keys = ["steps", "global_batch", "seq_len", "micro_batch", "lr", "warmup_steps", "min_lr_ratio", "weight_decay",
            "betas", "eps", "grad_clip", "val_interval", "val_tokens", "final_val_tokens", "log_interval",
            "checkpoint_interval", "devices", "compile", "match_params", "loss_chunk", "precision", "host_sync",
            "progress", "logger", "threads", "data_seed", "data_dir", "max_steps", "model", "selection_tokens"]
    return sorted(keys)


def device_defaults(cuda: bool) -> dict:
    """bf16 autocast and a read-back every log_interval steps on a GPU; float32 and every step on a CPU."""
    return {"precision": "bf16-mixed" if cuda else "32-true", "host_sync": "log" if cuda else "step"}


def with_device_defaults(config: dict, cuda: bool) -> dict:
    """The config with every device-dependent option that is unset (None, or absent from a config.json
    written before the option existed, when the device chose it) set to the device's default."""
    return {**config, **{k: v for k, v in device_defaults(cuda).items() if config.get(k) is None}}


def semantic(config: dict) -> dict:
    """What a resumed run must share with the run it continues: all but how it is watched."""
    return {k: v for k, v in config.items() if k not in WATCH_KEYS}


def lr_at(step: int, config: dict) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to min_lr_ratio × lr at the last step (steps − 1)."""
    peak, warmup, total = config["lr"], config["warmup_steps"], config["steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))  # the last step (total − 1) is at the floor
    floor = peak * config["min_lr_ratio"]
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
