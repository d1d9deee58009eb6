"""The tier ladder: model shapes, token budgets and optimisation hyperparameters; the GPUs a plan may
assume. Torch-free: the analysis orders tiers by it. Model configs, parameter matching, memory and the
micro-batch that fits a GPU are `ablate.sizing`; the cost of a grid is `ablate.plan`.

Where the values come from
--------------------------
* Shapes: GPT-2-style blocks (attention 4·d², MLP 8·d², two RMSNorm vectors) with head dim 64,
  chosen so the *baseline's* non-embedding parameters land within ±5% of the tier's name
  (the study counts non-embedding parameters; `tests/test_tiers.py` checks the ±5% against the
  real model). 124M/350M use GPT-2 small/medium widths (768, 1024) with more layers, because GPT-2's
  "124M" counts embeddings.
* Naming: two readings of "124M" and "350M" are defensible. The literal one (the default tiers 124M
  and 350M) takes the names as non-embedding counts, as the study counts parameters. GPT-2's own
  small and medium models (12×768 and 24×1024) are called 124M and 350M counting their embeddings;
  without them they hold 85M and 302M parameters, and only then are the token budgets below about
  20 tokens per parameter (1.6B / 85M ≈ 19, 5.8B / 302M ≈ 19; literally 1.6B / 127M ≈ 13 and
  5.8B / 352M ≈ 16). The tiers `124M-gpt2` and `350M-gpt2` are that reading: GPT-2's shapes with the
  same budgets and hyperparameters as 124M and 350M. Their `nominal_params` are their non-embedding
  counts (85M, 302M), which is what orders tiers and places crossovers.
* Tokens: the study's budgets (0.2B, 0.95B, 1.6B, 5.8B ≈ 20 tokens per parameter, Chinchilla).
* Sequence length 1024 (GPT-2's context) in every real tier, so every tier sees the same documents
  cut the same way; global batch grows with size as in GPT-3 (Brown et al. 2020, Table 2.1: 0.5M
  tokens at 125M–350M); smaller tiers use smaller batches to keep ≥1,500 optimiser steps.
* Learning rate: GPT-3 Table 2.1 (6e-4 at 125M, 3e-4 at 350M), extended upward for the small tiers
  as is usual for models this size: 1e-3 at 50M and 1.5e-3 at 10M (the smaller the model, the larger
  the stable rate; Pythia and nanoGPT's small models use 1e-3 and above).
* Schedule: linear warm-up (≈2% of steps, as in nanoGPT's GPT-2 recipe: 700 of ~19k steps), then
  cosine decay to 10% of the peak (GPT-3, Chinchilla). AdamW β=(0.9, 0.95), ε=1e-8, weight decay
  0.1 on matrices and embeddings (GPT-3), gradient clipping at global norm 1.0 (GPT-3).
* Seeds: 3, 3, 3, 1 as in the study.
* micro_batch: what fits one 80 GB GPU in bf16 at seq 1024 (gradient accumulation fills the global
  batch; identical across arms, so it changes no comparison). `micro_batch_for` estimates it for
  another GPU's memory.
* The dense ladder (20M, 35M, 80M, 200M between the study's four): a scale *law* is decided on the tiers'
  scatter about a line in log N, and four tiers leave it 2 degrees of freedom (docs/power.md). These tiers are
  built by the ladder's own rules: head dim 64, widths 384, 448, 640, 896 (between 320, 512, 768 and 1024) with
  the layers that put the baseline within ±5% of the name (11, 15, 16, 21 layers: 19.5M, 36.1M, 78.7M, 202.3M);
  20 tokens per nominal non-embedding parameter (0.4B, 0.7B, 1.6B, 4B); the learning rate interpolated
  log-linearly in log N between the two study tiers around it (`interpolated_lr`: 1.26e-3, 1.09e-3, 7.68e-4,
  4.36e-4); the global batch's log2 likewise, rounded to a whole power of two (`interpolated_batch`: 128, 256,
  512, 512 sequences); warm-up 2% of the steps; micro_batch what fits 80 GB. They join the tier order. The
  study's experiment keeps its four tiers and budgets; `experiments/sink_vs_filter_dense.py` runs the eight, each
  at 20 tokens per parameter (`at_tokens_per_param`: any ladder at one ratio, as step overrides).
* smoke: a tiny shape for CPU tests and the demo (~100 steps in well under a minute on one core).
  Its cost is the 50,304-way output layer (d_model · V per token), so it keeps 256 tokens per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ablate.errors import choice_error


@dataclass(frozen=True)
class Tier:
    name: str
    nominal_params: float  # the non-embedding parameter count the tier stands for (orders tiers)
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
    task: str | None = None  # a task tier's synthetic task (`TASKS`): no corpus, batches drawn from the task
    mlp_ratio: int = 4  # MLP width per d_model (0: attention only, the stream task's model)

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
# The study's ladder: the points the dense tiers' learning rate and batch are interpolated between.
LADDER = ("10M", "50M", "124M", "350M")
DENSE_LADDER = ("10M", "20M", "35M", "50M", "80M", "124M", "200M", "350M")
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal training tokens per parameter
WARMUP_FRACTION = 0.02  # of the steps (nanoGPT's GPT-2 recipe: 700 of ~19k steps)


def _bracket(params: float) -> tuple[Tier, Tier, float]:
    """The two study tiers around `params` and where it lies between them in log N (0 at the lower, 1 at the upper)."""
    points = [TIERS[name] for name in LADDER]
    for low, high in zip(points, points[1:]):
        if low.nominal_params <= params <= high.nominal_params:
            return low, high, math.log(params / low.nominal_params) / math.log(high.nominal_params / low.nominal_params)
    raise ValueError(f"{params:g} parameters lie outside the study's ladder {LADDER[0]}–{LADDER[-1]}")


def interpolated_lr(params: float) -> float:
    """The ladder's learning rate at `params` nominal parameters: log-linear in log N between the study tiers
    around it (so 1.5e-3 at 10M and 1e-3 at 50M give 1.26e-3 at 20M), to three significant figures."""
    low, high, t = _bracket(params)
    return float(f"{math.exp((1 - t) * math.log(low.lr) + t * math.log(high.lr)):.3g}")


def interpolated_batch(params: float) -> int:
    """The ladder's global batch (sequences) at `params`: its log2 linear in log N between the study tiers around
    it, rounded to a whole power of two (128 at 10M and 256 at 50M give 128 at 20M, 256 at 35M)."""
    low, high, t = _bracket(params)
    return 2 ** round((1 - t) * math.log2(low.global_batch) + t * math.log2(high.global_batch))


def _dense_tier(name: str, params: float, n_layer: int, d_model: int, micro_batch: int) -> Tier:
    """A dense-ladder tier by the ladder's rules: head dim 64, 20 tokens per nominal parameter, the interpolated
    learning rate and batch, warm-up WARMUP_FRACTION of the steps."""
    batch = interpolated_batch(params)
    tokens = int(CHINCHILLA_TOKENS_PER_PARAM * params)
    steps = math.ceil(tokens / (batch * 1024))
    return Tier(name, params, n_layer=n_layer, d_model=d_model, n_head=d_model // 64, n_kv_head=d_model // 64,
                seq_len=1024, global_batch=batch, tokens=tokens, lr=interpolated_lr(params),
                warmup_steps=round(WARMUP_FRACTION * steps), micro_batch=micro_batch)


for _tier in (_dense_tier("20M", 20e6, 11, 384, 64), _dense_tier("35M", 35e6, 15, 448, 32),
              _dense_tier("80M", 80e6, 16, 640, 32), _dense_tier("200M", 200e6, 21, 896, 32)):
    TIERS[_tier.name] = _tier


def at_tokens_per_param(tiers, ratio: float = CHINCHILLA_TOKENS_PER_PARAM) -> dict[str, dict]:
    """Run-config overrides ({tier: {"steps", "warmup_steps"}}, an Experiment's `overrides`) that train each of
    `tiers` at `ratio` training tokens per nominal non-embedding parameter (steps rounded up to whole global
    batches), the warm-up kept at the tier's own fraction of its steps. Today 124M and 350M train at 12.9 and 16.6;
    at 20 they take 4,731 and 13,352 steps."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"tokens per parameter {ratio!r} must be a positive number")
    out = {}
    for name in tiers:
        tier = get_tier(name)
        steps = math.ceil(ratio * tier.nominal_params / tier.tokens_per_step)
        out[name] = {"steps": steps, "warmup_steps": max(1, round(tier.warmup_steps * steps / tier.steps))}
    return out


# The synthetic tasks of the mechanism testbed (`ablate.data.synthetic.SyntheticTask` fields; torch-free here so
# that a plan or a table knows a task tier's vocabulary and sequence length without loading the task).
TASK_CONFIG_KEY = "synthetic_task"  # config.json key of a task tier's run: its task's fields
TASKS: dict[str, dict] = {
    "abstain": {"n_keys": 6, "n_values": 4, "n_pairs": 3, "n_queries": 4, "absent_prob": 0.5, "answer_noise": 0.0},
}


def task_vocab_size(fields: dict) -> int:
    """NONE, BOS, values, query keys, pair tokens (as `SyntheticTask.vocab_size`; a test holds them equal)."""
    return 2 + fields["n_values"] + fields["n_keys"] + fields["n_keys"] * fields["n_values"]


def task_seq_len(fields: dict) -> int:
    return 1 + fields["n_pairs"] + fields["n_queries"]


# synthetic: the mechanism testbed's tier (experiments/testbed.py). Sizes, budget, learning rate, warm-up and decay
# were chosen on the baseline alone (benchmarks/testbed_design.py), so that its seeds 0..15 all reach the
# learned criterion under AVX2 and AVX-512 kernels, by step 150 of 500 (docs/method.md, "The mechanism testbed").
TIERS["synthetic"] = Tier(
    "synthetic", 0.1e6, n_layer=2, d_model=64, n_head=2, n_kv_head=2, seq_len=task_seq_len(TASKS["abstain"]),
    global_batch=64, tokens=500 * 64 * task_seq_len(TASKS["abstain"]), lr=2e-3, warmup_steps=100, seeds=5,
    val_interval=25, val_tokens=1, final_val_tokens=1, checkpoint_interval=10**9, micro_batch=64, data_dir="",
    tokenizer="synthetic", vocab_size=task_vocab_size(TASKS["abstain"]), log_interval=1, task="abstain",
    min_lr_ratio=0.1)
# Filter, the testbed's second task (`ablate.data.filter.FilterTask` fields): junk reads, ordinary pairs marked
# by a fresh noise token in front (filter-norm) or by one MARK token in front (filter-direction). Sizes, budget,
# batch, learning rate, warm-up and decay chosen on the baseline alone (benchmarks/testbed_design.py --tier T: of
# its seeds 0..15 under AVX2 and AVX-512 kernels, all 32 runs of each variant reached the learned criterion, by
# step 400 of 800; docs/method.md, "The mechanism testbed").
FILTER_SIZES = {"n_keys": 8, "n_values": 4, "n_pairs": 3, "n_junk": 1, "n_queries": 3, "n_noise": 16}
TASKS["filter-norm"] = {**FILTER_SIZES, "mark": "norm"}
TASKS["filter-direction"] = {**FILTER_SIZES, "mark": "direction"}


def filter_vocab_size(fields: dict) -> int:
    """BOS, CLEAN, MARK, noise, values, query keys, pairs (as `FilterTask.vocab_size`; a test holds them equal)."""
    return 3 + fields["n_noise"] + fields["n_values"] + fields["n_keys"] * (1 + fields["n_values"])


def filter_seq_len(fields: dict) -> int:
    return 1 + fields["n_pairs"] + 2 * fields["n_junk"] + fields["n_queries"]


FILTER_STEPS, FILTER_BATCH = 800, 256
for _name in ("filter-norm", "filter-direction"):
    TIERS[_name] = replace(
        TIERS["smoke"], name=_name, nominal_params=0.1e6, seq_len=filter_seq_len(TASKS[_name]),
        global_batch=FILTER_BATCH, tokens=FILTER_STEPS * FILTER_BATCH * filter_seq_len(TASKS[_name]), lr=3e-3,
        warmup_steps=100, seeds=5, val_interval=50, val_tokens=1, final_val_tokens=1, checkpoint_interval=10**9,
        micro_batch=FILTER_BATCH, data_dir="", tokenizer="synthetic", vocab_size=filter_vocab_size(TASKS[_name]),
        log_interval=1, task=_name, min_lr_ratio=0.1)
# abstain-stream, the testbed's Abstain task without a place to park (`ablate.data.stream.StreamTask` fields): a
# stream of pairs, no BOS, strictly-earlier attention, one layer and no MLP (docs/method.md, "The mechanism
# testbed"). Sizes, budget, batch and learning rate chosen on the baseline alone (benchmarks/testbed_design.py).
TASKS["abstain-stream"] = {"n_keys": 4, "n_values": 4, "window": 8}
STREAM_STEPS, STREAM_BATCH = 600, 64
TIERS["abstain-stream"] = replace(
    TIERS["synthetic"], name="abstain-stream", n_layer=1, mlp_ratio=0, seq_len=TASKS["abstain-stream"]["window"],
    global_batch=STREAM_BATCH, tokens=STREAM_STEPS * STREAM_BATCH * TASKS["abstain-stream"]["window"], lr=2e-3,
    warmup_steps=50, vocab_size=1 + TASKS["abstain-stream"]["n_values"] * (1 + TASKS["abstain-stream"]["n_keys"]),
    task="abstain-stream", seeds=12)
# value-junk, the testbed's Filter task with the junk in the value path only (`ablate.data.valuejunk`): a pair
# twice, then its query; one copy's read replaced after the value projection by a decoy's plus a marker of ε × the
# head's median read norm, a random direction per read (norm, ε = 2) or one fixed direction (direction, ε = 1); the
# abstain-stream model (one layer, no MLP, strictly earlier reads). Dose, budget, batch and learning rate chosen on
# the baseline alone (benchmarks/testbed_design.py; docs/method.md, "The mechanism testbed").
VALUE_JUNK_SIZES = {"n_keys": 8, "n_values": 4}
TASKS["value-junk-norm"] = {**VALUE_JUNK_SIZES, "junk": "norm", "dose": 2.0}
TASKS["value-junk-direction"] = {**VALUE_JUNK_SIZES, "junk": "direction", "dose": 1.0}


def value_junk_vocab_size(fields: dict) -> int:
    """Values, query keys, pairs (as `ValueJunkTask.vocab_size`; a test holds them equal)."""
    return fields["n_values"] + fields["n_keys"] * (1 + fields["n_values"])


def value_junk_seq_len(fields: dict) -> int:
    return 3  # the pair twice, then the query


VALUE_JUNK_STEPS, VALUE_JUNK_BATCH = 600, 64
for _name in ("value-junk-norm", "value-junk-direction"):
    TIERS[_name] = replace(
        TIERS["abstain-stream"], name=_name, seq_len=value_junk_seq_len(TASKS[_name]), global_batch=VALUE_JUNK_BATCH,
        tokens=VALUE_JUNK_STEPS * VALUE_JUNK_BATCH * value_junk_seq_len(TASKS[_name]), lr=2e-3, warmup_steps=50,
        vocab_size=value_junk_vocab_size(TASKS[_name]), task=_name, seeds=8)
# The graded testbed (experiments/testbed_dose.py): each mechanism at a graded dose, one tier per dose, the model,
# batch, budget and schedule of abstain-stream. Stream: the share of queries with nothing to read (`absent`,
# `ablate.data.stream.GradedStreamTask`), 8 keys so that a fresh key is always left. Value-junk: the marker drawn
# from the content (a direction per decoy value) at size ε. The doses and the declared one were chosen on a
# baseline-only pilot by the rule stated in the experiment file (docs/method.md, "The graded testbed").
def stream_absent_share(fields: dict) -> float:
    """The graded stream task's share of answers with nothing to read (`ablate.data.stream.GradedStreamTask`),
    exactly: positions 1..window−1 each take a fresh key with probability `absent`, or always when no key seen
    once is left (a dynamic programme over the count of keys seen once)."""
    p, window = fields["absent"], fields["window"]
    states, fresh = {1: 1.0}, 0.0  # {keys seen once: probability} after position 0
    for _ in range(window - 1):
        nxt: dict[int, float] = {}
        for once, prob in states.items():
            q = 1.0 if once == 0 else p
            fresh += prob * q
            nxt[once + 1] = nxt.get(once + 1, 0.0) + prob * q
            if q < 1:
                nxt[once - 1] = nxt.get(once - 1, 0.0) + prob * (1 - q)
        states = nxt
    return fresh / (window - 1)


def task_ceiling(fields: dict) -> float:
    """The loss (nats per answer) of a model that cannot do a graded task's mechanism job: on the stream task one
    that reads nothing (NONE with probability s, the share with nothing to read, else a uniform value: H(s) +
    (1 − s)·log n_values); on the value-junk task one that cannot tell the two copies apart (a coin, log 2)."""
    if "junk" in fields:
        return math.log(2)
    s = stream_absent_share(fields)
    return -sum(q * math.log(q) for q in (s, 1 - s) if q > 0) + (1 - s) * math.log(fields["n_values"])


STREAM_DOSES = {"stream-absent-60": 0.6, "stream-absent-90": 0.9, "stream-absent-95": 0.95}  # tier: `absent`
CONTENT_DOSES = {"junk-content-e010": 0.01, "junk-content-e020": 0.02, "junk-content-e050": 0.05}  # tier: ε
for _name, _absent in STREAM_DOSES.items():
    TASKS[_name] = {"n_keys": 8, "n_values": 4, "window": 8, "absent": _absent}
    TIERS[_name] = replace(TIERS["abstain-stream"], name=_name, task=_name, seeds=8,
                           vocab_size=1 + TASKS[_name]["n_values"] * (1 + TASKS[_name]["n_keys"]))
for _name, _dose in CONTENT_DOSES.items():
    TASKS[_name] = {**VALUE_JUNK_SIZES, "junk": "content", "dose": _dose}
    TIERS[_name] = replace(TIERS["value-junk-direction"], name=_name, task=_name)
# GPT-2 small and medium shapes with the budgets of 124M and 350M (the other reading of the names).
TIERS["124M-gpt2"] = replace(TIERS["124M"], name="124M-gpt2", nominal_params=85e6, n_layer=12)
TIERS["350M-gpt2"] = replace(TIERS["350M"], name="350M-gpt2", nominal_params=302e6, n_layer=24)
TIER_ORDER = tuple(sorted(TIERS, key=lambda name: TIERS[name].nominal_params))  # by size


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


# The smallest tier that can carry evidence; any tier below it only shows that the pipeline runs.
SMALLEST_REAL_TIER = "10M"
PIPELINE_CHECK_NOTE = "pipeline check: no evidence"  # what every table, plot and probe says of such a tier


def is_pipeline_check(tier: str) -> bool:
    """A tier below the smallest real tier (by nominal non-embedding parameters), e.g. `smoke`."""
    if tier in TIERS and TIERS[tier].task is not None:  # a task tier's runs are evidence about the task
        return False
    return tier_rank(tier) < tier_rank(SMALLEST_REAL_TIER)


def evidence_note(tier: str | None) -> str | None:
    """`pipeline check: no evidence (...)` for a run of a pipeline-check tier (None for any other), said by the
    measurements of one run (probe, inject) as the tables say it of their rows."""
    if tier is None or not is_pipeline_check(tier):
        return None
    return (f"{PIPELINE_CHECK_NOTE} ({tier} is smaller than the smallest real tier, {SMALLEST_REAL_TIER}: "
            "its numbers show the pipeline runs, not how the arm behaves)")


# ---------------------------------------------------------------------------------------------- GPUs
@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    peak_bf16_tflops: float  # dense (no sparsity), from the vendor's data sheet
    memory_gb: float
    memory_tb_per_s: float = 2.0  # HBM bandwidth, from the vendor's data sheet (prices a materialised attention)


GPUS: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU("a100", "NVIDIA A100 40GB", 312.0, 40.0, 1.555),
        GPU("a100-80", "NVIDIA A100 80GB", 312.0, 80.0, 2.039),
        GPU("h100", "NVIDIA H100 SXM", 989.0, 80.0, 3.35),
        GPU("h200", "NVIDIA H200", 989.0, 141.0, 4.8),
    )
}
DEFAULT_GPU = "h100"


def get_gpu(key: str) -> GPU:
    if key not in GPUS:
        raise choice_error("gpu", key, GPUS)
    return GPUS[key]


def gpu_key_for(device_name: str, memory_gb: float | None = None) -> str | None:
    """'NVIDIA H100 80GB HBM3' → 'h100' (what `torch.cuda.get_device_name` says); None if not in the table.
    An A100 is told apart by its memory (over 40 GB: the 80 GB model)."""
    text = device_name.upper()
    for key in ("H200", "H100"):
        if key in text:
            return key.lower()
    if "A100" in text:
        return "a100-80" if ("80G" in text or (memory_gb or 0) > 41) else "a100"
    return None
