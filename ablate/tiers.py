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
* smoke: a tiny shape for CPU tests and the demo (~100 steps in well under a minute on one core).
"""

from __future__ import annotations

import argparse
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
    val_tokens: int = 2**20  # validation tokens per evaluation (fixed set, same for every arm)
    checkpoint_interval: int = 500  # steps between checkpoints
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
        Tier("smoke", 0.1e6, n_layer=2, d_model=64, n_head=2, n_kv_head=2, seq_len=64, global_batch=8,
             tokens=100 * 8 * 64, lr=3e-3, warmup_steps=10, seeds=2, val_interval=25, val_tokens=8 * 64 * 4,
             checkpoint_interval=25),
        Tier("10M", 10e6, n_layer=8, d_model=320, n_head=5, n_kv_head=5, seq_len=1024, global_batch=128,
             tokens=200_000_000, lr=1.5e-3, warmup_steps=30),
        Tier("50M", 50e6, n_layer=16, d_model=512, n_head=8, n_kv_head=8, seq_len=1024, global_batch=256,
             tokens=950_000_000, lr=1e-3, warmup_steps=70),
        Tier("124M", 124e6, n_layer=18, d_model=768, n_head=12, n_kv_head=12, seq_len=1024, global_batch=512,
             tokens=1_600_000_000, lr=6e-4, warmup_steps=60),
        Tier("350M", 350e6, n_layer=28, d_model=1024, n_head=16, n_kv_head=16, seq_len=1024, global_batch=512,
             tokens=5_800_000_000, lr=3e-4, warmup_steps=220, seeds=1),
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
