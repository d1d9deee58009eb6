"""Hand-built run stores for the analysis tests and benchmark (no training).

`reference_losses()` picks per-seed final losses so that the mean paired differences equal the
reference figures the study reports (the seed-to-seed noise added to each quantity sums to zero).
These numbers are a test fixture only: the harness never looks them up.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from ablate.identity import config_fingerprint
from ablate.store import run_dir
from ablate.tiers import tier_rank

TIERS = ("10M", "50M", "124M", "350M")
SEEDS = {"10M": 3, "50M": 3, "124M": 3, "350M": 1}
NINE_ARMS = ("baseline", "sink-logit", "off-by-one", "sink-token", "norm-gate", "proj-gate", "renorm", "combo",
             "combo2")

# The study's mean paired differences in nats, per tier in TIERS order.
REFERENCE = {
    "zero_option": (0.0185, 0.0068, 0.0052, 0.0013),
    "filtering_norm": (-0.0008, 0.0030, 0.0036, 0.0074),
    "filtering_proj": (0.0036, 0.0065, 0.0054, 0.0114),
}
# Overlaps inside the quoted range 0.0024–0.0076, per tier.
OVERLAP = {"norm": (0.0024, 0.0041, 0.0057, 0.0076), "proj": (0.0030, 0.0049, 0.0062, 0.0070)}
# Gains against baseline of the arms outside the increments (the study's 10M figures, scaled down with size).
OTHER_GAINS = {"off-by-one": 0.0160, "sink-token": 0.0025, "renorm": -0.0017}
BASE_LOSS = {"10M": 4.2120, "50M": 3.5512, "124M": 3.3817, "350M": 3.0421}

# Zero-sum seed noise (three seeds), a different pattern per quantity so that the spreads differ.
NOISE = {
    "zero_option": (0.0009, -0.0002, -0.0007),
    "filtering_norm": (0.0005, -0.0006, 0.0001),
    "filtering_proj": (-0.0004, 0.0007, -0.0003),
    "norm": (0.0002, 0.0003, -0.0005),
    "proj": (-0.0006, 0.0001, 0.0005),
    "off-by-one": (0.0004, -0.0004, 0.0),
    "sink-token": (0.0008, -0.0003, -0.0005),
    "renorm": (0.0012, -0.0015, 0.0003),
}


def _noise(name: str, tier: str, seed: int) -> float:
    return NOISE[name][seed] if SEEDS[tier] > 1 else 0.0


def reference_losses() -> dict[tuple[str, str, int], float]:
    """(tier, arm, seed) → final validation loss, for the nine arms of the study."""
    losses = {}
    for t, tier in enumerate(TIERS):
        for seed in range(SEEDS[tier]):
            base = BASE_LOSS[tier] + 0.0041 * seed  # seeds differ; arms within a seed are matched
            sink = base - REFERENCE["zero_option"][t] - _noise("zero_option", tier, seed)
            combo = sink - REFERENCE["filtering_norm"][t] - _noise("filtering_norm", tier, seed)
            combo2 = sink - REFERENCE["filtering_proj"][t] - _noise("filtering_proj", tier, seed)
            arms = {"baseline": base, "sink-logit": sink, "combo": combo, "combo2": combo2}
            # overlap = g_sink + g_gate − g_both  ⇒  g_gate = g_both − g_sink + overlap
            for gate, both in (("norm", "combo"), ("proj", "combo2")):
                g_gate = (sink - arms[both]) + OVERLAP[gate][t] + _noise(gate, tier, seed)
                arms[f"{gate}-gate"] = base - g_gate
            scale = 0.5 ** t
            for arm, gain in OTHER_GAINS.items():
                arms[arm] = base - gain * scale - _noise(arm, tier, seed)
            for arm, loss in arms.items():
                losses[(tier, arm, seed)] = loss
    return losses


def fingerprint(kind: str, tier: str, seed: int) -> str:
    return hashlib.sha256(f"{kind}-{tier}-{seed}".encode()).hexdigest()[:16]


def _trained_size(tier: str) -> int:
    """The size a tier's runs trained at: its nominal size (the ladder builds the baseline within ±5% of it)."""
    size = tier_rank(tier)
    return round(size) if math.isfinite(size) else 1


def write_run(results: Path, experiment: str, tier: str, arm: str, seed: int, val_loss: float | None,
              status: str = "completed", curve_points: int = 12, train_every: int = 0, settings: dict | None = None,
              **summary_extra) -> Path:
    """One run folder as training leaves it: config.json, summary.json and metrics.jsonl (validation curve
    ending at val_loss).

    train_every > 0 interleaves that many training-loss lines between validation lines, as a real log has.
    `settings` changes config.json (e.g. {"steps": 3}); settings=False writes none (an older or damaged run).
    """
    folder = run_dir(results, experiment, tier, arm, seed)
    steps = 1000
    summary = {
        "tier": tier, "arm": arm, "seed": seed, "status": status,
        "val_loss": val_loss if status == "completed" else None,
        "steps": steps, "tokens": steps * 4096,
        "experiment": experiment,
        "init_fingerprint": fingerprint("init", tier, seed), "data_fingerprint": fingerprint("data", tier, seed),
        "config_fingerprint": fingerprint("config", tier, seed), "val_fingerprint": fingerprint("val", tier, 0),
        "params_total": 1, "params_non_embedding": _trained_size(tier), "params_arm_extra": 0, "git_commit": "0" * 40,
        "versions": {}, "started": "2025-01-01T00:00:00", "finished": "2025-01-01T01:00:00", "wall_seconds": 3600.0,
    }
    folder.mkdir(parents=True, exist_ok=True)
    if settings is not False:  # the summary's config_fingerprint is that of config.json, as training writes it
        config = {"experiment": experiment, "tier": tier, "arm": arm, "seed": seed, "data_seed": seed, "steps": steps,
                  "lr": 1e-3, "model": {"arm": arm, "d_model": 64}, **(settings or {})}
        summary["config_fingerprint"] = config_fingerprint(config)
        (folder / "config.json").write_text(json.dumps(config))
    summary.update(summary_extra)
    (folder / "summary.json").write_text(json.dumps(summary))  # plain write: fixtures need no fsync
    final = val_loss if val_loss is not None else 5.0
    lines = []
    for i in range(1, curve_points + 1):
        step = round(steps * i / curve_points)
        for j in range(train_every):
            train_step = step - (train_every - j)
            lines.append(json.dumps({"step": train_step, "tokens": train_step * 4096, "train_loss": final + 0.1,
                                     "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 1e5}))
        loss = final + (10.8 - final) * math.exp(-6.0 * i / curve_points) - (10.8 - final) * math.exp(-6.0)
        lines.append(json.dumps({"step": step, "tokens": step * 4096, "val_loss": loss}))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def write_store(results: Path, experiment: str = "study", losses: dict | None = None, **run_options) -> Path:
    """A store holding every run of `losses` (default: reference_losses()); returns the experiment folder."""
    for (tier, arm, seed), loss in (losses or reference_losses()).items():
        write_run(results, experiment, tier, arm, seed, loss, **run_options)
    return results / experiment


def write_csv(path: Path, losses: dict | None = None) -> Path:
    """The same runs as a CSV table, in a shuffled row order, with an extra column the loader ignores."""
    rows = sorted((losses or reference_losses()).items(), key=lambda item: (item[0][1][::-1], -item[0][2]))
    text = "note,seed,arm,tier,val_loss\n" + "".join(
        f"x,{seed},{arm},{tier},{loss!r}\n" for (tier, arm, seed), loss in rows
    )
    path.write_text(text)
    return path
