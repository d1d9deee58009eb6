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
from ablate.identity import IMPLIED, WATCH_KEYS
from ablate.paths import default_data_dir
from ablate.runconfig import (ModelShape, RunConfig, chosen_options, device_defaults, settable_options, stored,
                              tier_options)
from ablate.sizing import model_config
from ablate.tiers import TASK_CONFIG_KEY, TASKS, TIERS, Tier, get_tier

# ---------------------------------------------------------------------------------------------- config
def resolve_config(spec: RunSpec, data_dir: str | None = None, *, tier: Tier | None = None, **options) -> RunConfig:
    """The full, explicit configuration of a run (written to config.json and compared on reruns): the tier's
    values, then the spec's overrides, then the options; every option's name, range and default is a field
    of `RunConfig`. Device-dependent options stay None here ("the device's default"), filled in by the run
    (`RunConfig.with_device_defaults`) before its config.json is written, so the file says what the run did.
    Every reader takes its attributes: the dict (`to_dict`) is what config.json holds. `tier`: the spec's, when the
    caller has it (`ablate submit` resolves each tier once)."""
    tier = tier or get_tier(spec.tier)
    check_arm_tier(spec.arm, tier)
    chosen = chosen_options(spec.overrides, options)
    model_overrides = dict(chosen.pop("model", {}))
    for key in chosen:
        if key not in valid_options():
            raise AblateError(f"unknown run option {key!r}; valid options: {', '.join(valid_options())}")
    run = RunConfig(experiment=spec.experiment, tier=tier.name, arm=spec.arm, seed=int(spec.seed),
                    data_seed=int(spec.seed), **{**{key: getattr(tier, key) for key in tier_options()}, **chosen})
    run.check(flags=tuple(key for key, value in options.items() if value is not None))
    matching = {"match_params": True} if run.match_params else {}
    model = ModelShape.from_dict(dataclasses.asdict(model_config(tier, spec.arm, **matching, **model_overrides)))
    task = None
    if run.document_mask and tier.task is not None:
        raise AblateError(f"--document-mask splits documents at <|endoftext|>: tier {tier.name!r} trains on the "
                          f"synthetic task {tier.task!r}, which has none; use it on a text tier")
    if tier.task is not None:  # a task tier draws its batches from the task: no data folder
        if data_dir is not None:
            raise AblateError(f"tier {tier.name!r} trains on the synthetic task {tier.task!r}: it takes no --data")
        task, data_dir = dict(TASKS[tier.task]), None
    else:
        data_dir = str(Path(data_dir or run.data_dir or default_data_dir(tier.data_dir)).resolve())
    steps = run.steps if run.max_steps is None else min(int(run.max_steps), run.steps)
    return dataclasses.replace(run, steps=steps, max_steps=None, model=model, data_dir=data_dir,
                               betas=list(run.betas), **{TASK_CONFIG_KEY: task})


def check_arm_tier(arm: str, tier) -> None:
    """An arm that runs on some tasks' tiers only (`Arm.only_tasks`: the oracle gate reads the value-junk task's
    mask) is refused at any other tier, in one line naming the tiers it runs on, before a run folder exists."""
    only = get_arm(arm).only_tasks
    if only and tier.task not in only:
        valid = [name for name, t in TIERS.items() if t.task in only]
        raise AblateError(f"arm {arm!r} runs on the tiers of the task(s) {', '.join(only)} only, not on tier "
                          f"{tier.name!r}; valid tiers: {', '.join(valid)}")


def valid_options() -> list[str]:
    """Every key `resolve_config` accepts as an override or option (`model` takes GPTConfig fields)."""
    return settable_options()


def with_device_defaults(config: dict, cuda: bool) -> dict:
    """A config.json's contents with every device-dependent option that is unset (None, or absent from a config.json
    written before the option existed, when the device chose it) set to the device's default (a run's own
    config: `RunConfig.with_device_defaults`)."""
    return {**config, **{k: v for k, v in device_defaults(cuda).items() if config.get(k) is None}}


def semantic(config: RunConfig | dict) -> dict:
    """What a resumed run must share with the run it continues: all but how it is watched. A key the older
    config.json lacks reads as unset, as the fingerprints read it (`ablate.identity`): an option added since,
    left unset (None) or at the value runs had before it existed (`IMPLIED`), is no difference. Compared as
    config.json holds it: a run's config is taken as its config.json would be written (`to_dict`)."""
    config = stored(config)
    def unset(key, value) -> bool:
        return value is None or IMPLIED.get(key, object()) == value

    kept = {k: v for k, v in config.items() if k not in WATCH_KEYS and not unset(k, v)}
    if isinstance(kept.get("model"), dict):
        kept["model"] = {k: v for k, v in kept["model"].items() if v is not None}
    return kept


def lr_at(step: int, config: RunConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine decay to min_lr_ratio × lr at the last step (steps − 1)."""
    peak, warmup, total = config.lr, config.warmup_steps, config.steps
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))  # the last step (total − 1) is at the floor
    floor = peak * config.min_lr_ratio
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
