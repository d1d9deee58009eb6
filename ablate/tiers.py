"""The tier ladder of SPEC.md §2: model shapes, token budgets and optimisation hyperparameters.

Torch-free on purpose: the analysis and `ablate plan` read it without loading training code.

Where the values come from
--------------------------
* Shapes: GPT-2-style blocks (attention 4·d², MLP 8·d², two RMSNorm vectors) with head dim 64,
  chosen so the *baseline's* non-embedding parameters land within ±5% of the tier's name
  (the study counts non-embedding parameters; the test `test_tiers.py` checks the ±5% against the
  real model). 124M/350M use GPT-2 small/medium widths (768, 1024) with more layers, because GPT-2's
  "124M" counts embeddings.
* Tokens: the study's budgets (0.2B, 0.95B, 1.6B, 5.8B ≈ 20 tokens per parameter, Chinchilla).
* Sequence length 1024 (GPT-2's context) in every real tier, so every tier sees the same documents
  cut the same way; global batch grows with size as in GPT-3 (Brown et al. 2020, Table 2.1: 0.5M
  tokens at 125M–350M); smaller tiers use smaller batches to keep ≥1,500 optimiser steps.
* Learning rate: GPT-3 Table 2.1 (6e-4 at 125M, 3e-4 at 350M), extended upward for the small tiers
  as is usual for models this size (nanoGPT/Pythia-style 1e-3 at ~10M-50M).
* Schedule: linear warm-up (≈2% of steps, as in nanoGPT's GPT-2 recipe: 700 of ~19k steps), then
  cosine decay to 10% of the peak (GPT-3, Chinchilla). AdamW β=(0.9, 0.95), ε=1e-8, weight decay
  0.1 on matrices and embeddings (GPT-3), gradient clipping at global norm 1.0 (GPT-3).
* Seeds: 3, 3, 3, 1 as in the study.
* micro_batch: what fits one 80 GB GPU in bf16 at seq 1024 (gradient accumulation fills the global
  batch; identical across arms, so it changes no comparison).
* smoke: a tiny shape for CPU tests and the demo (~100 steps in well under a minute on one core).
  Its cost is the 50,304-way output layer (d_model · V per token), so it keeps 256 tokens per step.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from ablate.errors import choice_error


@dataclass(frozen=True)
class Tier:
    name: str
    nominal_params: float  # the non-embedding parameter count the tier is named for
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    seq_len: int
    global_batch: int  # sequences per optimiser step, across all ranks
    tokens: int  # training token budget
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    seeds: int = 3
    val_interval: int = 250  # steps between validations
    val_tokens: int = 2**20  # validation tokens of each curve evaluation (fixed set, same for every arm)
    final_val_tokens: int = 10_000_000  # the final val_loss: every prepared validation token, up to this cap
    log_interval: int = 10  # steps between reading the loss back from the GPU (every step on CPU costs nothing)
    checkpoint_interval: int = 500  # steps between checkpoints
    micro_batch: int = 16  # sequences per forward pass (gradient accumulation up to the global batch)
    data_dir: str = "data/fineweb-edu"  # default prepared data folder (`ablate data prepare`)
    tokenizer: str = "gpt2"
    vocab_size: int = 50257

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.tokens_per_step)


TIERS: dict[str, Tier] = {
    t.name: t
    for t in (
        Tier("smoke", 0.1e6, n_layer=2, d_model=64, n_head=2, n_kv_head=2, seq_len=64, global_batch=4,
             tokens=100 * 4 * 64, lr=3e-3, warmup_steps=10, seeds=2, val_interval=25, val_tokens=4 * 64 * 8,
             checkpoint_interval=25, micro_batch=4, data_dir="data/sample", final_val_tokens=64 * 128,
             log_interval=1),
        Tier("10M", 10e6, n_layer=8, d_model=320, n_head=5, n_kv_head=5, seq_len=1024, global_batch=128,
             tokens=200_000_000, lr=1.5e-3, warmup_steps=30, micro_batch=64),
        Tier("50M", 50e6, n_layer=16, d_model=512, n_head=8, n_kv_head=8, seq_len=1024, global_batch=256,
             tokens=950_000_000, lr=1e-3, warmup_steps=70, micro_batch=32),
        Tier("124M", 124e6, n_layer=18, d_model=768, n_head=12, n_kv_head=12, seq_len=1024, global_batch=512,
             tokens=1_600_000_000, lr=6e-4, warmup_steps=60),
        Tier("350M", 350e6, n_layer=28, d_model=1024, n_head=16, n_kv_head=16, seq_len=1024, global_batch=512,
             tokens=5_800_000_000, lr=3e-4, warmup_steps=220, seeds=1, micro_batch=8),
    )
}
TIER_ORDER = tuple(TIERS)  # by size


def get_tier(name: str) -> Tier:
    if name not in TIERS:
        raise choice_error("tier", name, TIERS)
    return TIERS[name]


def tier_rank(name: str) -> float:
    """Sort key by size; an unknown tier name like '2B' sorts by its number, after the known ones otherwise."""
    if name in TIERS:
        return TIERS[name].nominal_params
    units = {"K": 1e3, "M": 1e6, "B": 1e9}
    try:
        return float(name[:-1]) * units[name[-1].upper()]
    except (ValueError, KeyError, IndexError):
        return math.inf


# ---------------------------------------------------------------------------------------------- plan
PEAK_TFLOPS = 989.0  # H100 SXM dense bf16
ASSUMED_MFU = 0.40  # model-FLOPs utilisation a well-tuned small-GPT run reaches (nanoGPT/llm.c report 40-50%)


def training_flops(tier: Tier, params_non_embedding: int, padded_vocab: int) -> float:
    """6·N·D with N = non-embedding weights + the output projection (tied, but still a matmul), plus
    Kaplan et al.'s attention term 6·n_layer·n_ctx·d_model per token (causal mask not discounted)."""
    per_token = 6 * (params_non_embedding + padded_vocab * tier.d_model) + 6 * tier.n_layer * tier.seq_len * tier.d_model
    return float(per_token) * tier.steps * tier.tokens_per_step


def plan_rows(tier_name: str, arms: list[str] | None = None, seeds: int | None = None) -> dict:
    """Per-arm cost of a tier (parameters measured on the real model, built on the meta device)."""
    from ablate.arms import get_arm, list_arms

    tier = get_tier(tier_name)
    arms = list(arms) if arms else list_arms()
    for arm in arms:
        get_arm(arm)
    seeds = tier.seeds if seeds is None else seeds
    rows = []
    for arm in arms:
        config = model_config(tier, arm)
        counts = _meta_counts(config)
        flops = training_flops(tier, counts["non_embedding"], config.padded_vocab_size)
        gpu_hours = flops / (PEAK_TFLOPS * 1e12 * ASSUMED_MFU) / 3600
        rows.append({
            "tier": tier.name, "arm": arm, "params_total": counts["total"],
            "params_non_embedding": counts["non_embedding"], "params_arm_extra": counts["arm_extra"],
            "tokens": tier.steps * tier.tokens_per_step, "steps": tier.steps, "train_flops": flops,
            "gpu_hours_per_run": gpu_hours, "seeds": seeds, "gpu_hours": gpu_hours * seeds,
        })
    return {
        "tier": tier.name, "assumption": f"{PEAK_TFLOPS:g} TFLOP/s peak bf16 (H100 SXM) at {ASSUMED_MFU:.0%} MFU",
        "hyperparameters": {k: v for k, v in asdict(tier).items() if k not in ("name",)},
        "runs": rows, "total_runs": len(rows) * seeds,
        "total_gpu_hours": sum(r["gpu_hours"] for r in rows),
        "total_train_flops": sum(r["train_flops"] * seeds for r in rows),
    }


def _meta_counts(config) -> dict[str, int]:
    """Parameter counts without allocating memory (meta tensors), so a 350M plan is instant."""
    import torch

    from ablate.model import GPT

    with torch.device("meta"):
        return GPT(config).param_counts()


def model_config(tier: Tier, arm: str, **overrides):
    from ablate.model import GPTConfig

    fields = dict(vocab_size=tier.vocab_size, n_layer=tier.n_layer, n_head=tier.n_head, n_kv_head=tier.n_kv_head,
                  d_model=tier.d_model, max_seq_len=tier.seq_len, arm=arm)
    fields.update(overrides)
    return GPTConfig(**fields)


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="parameters, tokens, steps, FLOPs and GPU-hours of a tier's grid")
    parser.add_argument("--tier", required=True, help=f"one of {', '.join(TIERS)}")
    parser.add_argument("--arms", nargs="+", help="arms (default: every registered arm)")
    parser.add_argument("--seeds", type=int, help="seeds per arm (default: the tier's)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=_plan)


def _plan(args) -> int:
    plan = plan_rows(args.tier, args.arms, args.seeds)
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    h = plan["hyperparameters"]
    print(f"tier {plan['tier']}: {h['n_layer']} layers, d_model {h['d_model']}, {h['n_head']} heads, seq {h['seq_len']}, "
          f"batch {h['global_batch']} × {h['seq_len']} tokens, lr {h['lr']:g}, warm-up {h['warmup_steps']}, "
          f"cosine to {h['min_lr_ratio']:g}×, wd {h['weight_decay']:g}, clip {h['grad_clip']:g}")
    print(f"{'arm':<15} {'total':>12} {'non-emb':>12} {'arm extra':>10} {'tokens':>14} {'steps':>7} {'FLOPs':>10} {'GPU-h/run':>10} {'seeds':>5}")
    for r in plan["runs"]:
        print(f"{r['arm']:<15} {r['params_total']:>12,} {r['params_non_embedding']:>12,} {r['params_arm_extra']:>10,} "
              f"{r['tokens']:>14,} {r['steps']:>7,} {r['train_flops']:>10.3g} {r['gpu_hours_per_run']:>10.2f} {r['seeds']:>5}")
    print(f"grid: {plan['total_runs']} runs, {plan['total_train_flops']:.3g} FLOPs, {plan['total_gpu_hours']:.1f} GPU-hours "
          f"(assuming {plan['assumption']})")
    return 0
