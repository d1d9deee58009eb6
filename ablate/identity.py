"""What makes two runs comparable: the configuration they share, as a fingerprint and as a readable diff.

A paired difference L_reference − L_arm measures the arm only if everything else was the same. The
init and data fingerprints cover the initial weights and the batches; the *config fingerprint* covers
every other setting of the run (optimiser, schedule, budget, shape, tokenizer, evaluation sets), with
the arm taken out, and the keys that change only how a run is executed or watched (each key's role is
declared once, in `ablate.runconfig.RunConfig`):

* watching: progress, logger, threads, val_interval, checkpoint_interval, log_interval, host_sync (when the
  host reads the device's losses back: the same numbers, read at other times);
* executing: devices, micro_batch, compile, loss_chunk (the same global batches and the same
  mathematics: they change float summation order, not the experiment), data_dir (a path; the data's identity is the
  data fingerprint and `data_id`).

With `match_params` the MLP width is a function of the arm (it is narrowed to match the baseline's
parameter count), so it leaves the fingerprint as well; `match_params` itself stays in.

`precision` (float32, or bf16 autocast) changes the numbers, so it is part of the fingerprint: a float32
run and a bf16 one never pair. At its float32 value it is left out of the fingerprint's text, so that the
runs recorded before the option existed (float32: none ran on a GPU) keep their fingerprint, and a
config.json without it reads as float32 (`IMPLIED`).

The runs of one row of a table (one tier, every seed) must share even more: everything but the arm and
the seed (`shared_config`, which also leaves out `data_seed`, the seed of the batch order). A run trained
for 2 steps and one trained for 3 are not two seeds of one experiment, whatever their seeds.
Torch-free: the analysis imports it.
"""

from __future__ import annotations

import hashlib
import json

from ablate.runconfig import RunConfig, implied_values, keys_with, stored

# Each key's role is its field's metadata in `RunConfig`.
IDENTITY_KEYS = keys_with("name")  # which run it is: experiment, arm
# May differ between two runs that are paired, and between the two halves of a resumed run (the next line may not).
WATCH_KEYS = keys_with("watch")
EXECUTION_KEYS = keys_with("execution")
ARM_DERIVED_MODEL_KEYS = ("arm",)
MATCHED_MODEL_KEYS = ("mlp_hidden",)  # set per arm when match_params is on
SEED_KEYS = keys_with("seed")  # differ between the seeds of one row, and only there
IMPLIED = implied_values()  # the value of a key absent from a config, left out of the fingerprints


def matching_config(config: RunConfig | dict) -> dict:
    """The part of a resolved run configuration that two paired runs must share, flattened (`model.d_model`):
    of what its config.json holds (`stored`), so that a run's config and an earlier run's file agree."""
    config, shared = stored(config), {}
    for key, value in config.items():
        if key in IDENTITY_KEYS or key in WATCH_KEYS or key in EXECUTION_KEYS:
            continue
        if key == "model" and isinstance(value, dict):
            for sub, sub_value in value.items():
                if sub in ARM_DERIVED_MODEL_KEYS or (config.get("match_params") and sub in MATCHED_MODEL_KEYS):
                    continue
                if sub_value is not None:  # an optional field at its default (e.g. a newer version's) is no change
                    shared[f"model.{sub}"] = sub_value
        elif value is not None:
            shared[key] = value
    return {**IMPLIED, **shared}


def _fingerprint(shared: dict) -> str:
    kept = {k: v for k, v in shared.items() if k not in IMPLIED or v != IMPLIED[k]}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_fingerprint(config: RunConfig | dict) -> str:
    return _fingerprint(matching_config(config))


def shared_config(config: RunConfig | dict) -> dict:
    """What every run of one tier shares, whatever its arm and seed: `matching_config` without SEED_KEYS."""
    return {k: v for k, v in matching_config(config).items() if k not in SEED_KEYS}


def shared_fingerprint(config: RunConfig | dict) -> str:
    return _fingerprint(shared_config(config))


def config_differences(a: RunConfig | dict, b: RunConfig | dict,
                       across_seeds: bool = False) -> list[tuple[str, object, object]]:
    """(key, value in a, value in b) for every key of the matching config where the two runs differ
    (of the shared config with `across_seeds`: the seeds may differ then)."""
    view = shared_config if across_seeds else matching_config
    left, right = view(a), view(b)
    missing = object()
    rows = []
    for key in sorted(set(left) | set(right)):
        x, y = left.get(key, missing), right.get(key, missing)
        if x != y:
            rows.append((key, None if x is missing else x, None if y is missing else y))
    return rows


def describe_differences(diffs: list[tuple[str, object, object]]) -> str:
    """`steps: 2 vs 3, lr: 0.003 vs 0.05` for the rows of `config_differences`."""
    return ", ".join(f"{key}: {x!r} vs {y!r}" for key, x, y in diffs)


def fingerprints_without(config: RunConfig | dict, keys: tuple[str, ...]) -> tuple[str, str]:
    """(config fingerprint, shared fingerprint) of a run with `keys` left out: what runs that may differ in
    exactly those keys (an LR sweep's, or a tuned table's runs each at its arm's best LR: `lr`) must share."""
    matching = {k: v for k, v in matching_config(config).items() if k not in keys}
    return _fingerprint(matching), _fingerprint({k: v for k, v in matching.items() if k not in SEED_KEYS})
