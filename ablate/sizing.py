"""Sizing a run: the model config of an arm at a tier (parameter-matched on request), parameter counts,
the memory estimate of every phase, and the micro-batch that fits a GPU.

Counts come from the real model built on the meta device, so they cannot drift from the code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import torch

from ablate.arms import get_arm, list_arms
from ablate.arms.cost import attention_cost
from ablate.arms.kernel import blocked_rows
from ablate.errors import AblateError
from ablate.model import GPTConfig, shape_only
from ablate.tiers import Tier, get_tier

LOSS_CHUNK = 8192  # tokens per chunk of the loss on a GPU (float32 logits of 8192 × 50,304: 1.6 GB)


# ---------------------------------------------------------------------------------------------- model configs
MATCH_TOLERANCE = 0.005  # parameter matching: non-embedding counts equal to 0.5%


def model_config(tier: Tier | str, arm: str, *, match_params: bool = False, **overrides):
    """The GPTConfig of `arm` at `tier` (overrides: GPTConfig fields, e.g. from an experiment).

    match_params: for an arm whose extra parameters put its non-embedding count more than 0.5% above
    the baseline's (g1-elementwise and g2-value: n_layer·d² more), narrow the MLP hidden width of every
    layer so the counts agree (`matched_mlp_hidden`). Arms within 0.5% already keep the baseline's width,
    so their config, and so their init fingerprint, is the unmatched one.
    """
    tier = get_tier(tier) if isinstance(tier, str) else tier
    fields = dict(vocab_size=tier.vocab_size, n_layer=tier.n_layer, n_head=tier.n_head, n_kv_head=tier.n_kv_head,
                  d_model=tier.d_model, max_seq_len=tier.seq_len, arm=arm, mlp_ratio=tier.mlp_ratio)
    fields.update(overrides)
    config = GPTConfig(**fields)
    if not match_params:
        return config
    if overrides.get("mlp_hidden") is not None:
        raise AblateError(f"mlp_hidden={overrides['mlp_hidden']} and match_params both set the MLP width; "
                          "give one of them")
    width = matched_mlp_hidden(config)
    return config if width is None else replace(config, mlp_hidden=width)


def matched_mlp_hidden(config, tolerance: float = MATCH_TOLERANCE) -> int | None:
    """The MLP hidden width (same in every layer) that brings `config`'s non-embedding parameters to its
    baseline's (same config, arm 'baseline') within `tolerance`; None when they already are.

    Counts come from the real model on the meta device. The count is affine in the width, so the exact
    minimiser is solved from two counts; the width taken is the multiple of 64 nearest to it if that is
    within the tolerance (kernel-friendly tiles), else the nearest multiple of 8 if that is, else the
    minimiser itself. For the built-in arms (extra n_layer·d²) the minimiser is 3.5·d, a multiple of 64
    at 50M and above and of 8 at the 10M and smoke tiers, so the counts agree to a few parameters.
    """
    base = _meta_counts(replace(config, arm="baseline"))["non_embedding"]
    mine = _meta_counts(config)["non_embedding"]
    if abs(mine / base - 1) <= tolerance:
        return None
    width = config.mlp_width
    if width < 1:
        raise AblateError(f"arm {config.arm!r} adds {mine - base:,} non-embedding parameters and the model has no MLP "
                          "(mlp_ratio 0): it cannot be parameter-matched by narrowing one; run it unmatched "
                          "(match_params False)")
    slope = mine - _meta_counts(replace(config, mlp_hidden=width - 1))["non_embedding"]  # parameters per unit
    exact = width - round((mine - base) / slope)
    if exact < 1:
        raise AblateError(f"arm {config.arm!r} adds {mine - base:,} non-embedding parameters, more than the MLPs "
                          f"hold ({slope * width:,}): it cannot be parameter-matched by narrowing them")

    def gap(w: int) -> float:
        return abs(mine + (w - width) * slope - base) / base

    for multiple in (64, 8):
        rounded = max(multiple, multiple * round(exact / multiple))
        if gap(rounded) <= tolerance:
            return rounded
    return exact


def _meta_counts(config) -> dict[str, int]:
    """Parameter counts without allocating memory (meta tensors), so a 350M count is instant; cached,
    because matching and planning count the same configs many times."""
    return dict(_cached_counts(tuple(sorted(asdict(config).items())), get_arm(config.arm)))


@lru_cache(maxsize=1024)
def _cached_counts(fields: tuple, arm_class: type) -> tuple:
    """`arm_class` is part of the key: an arm registered again under its name (replace=True) is recounted."""
    return tuple(shape_only(GPTConfig(**dict(fields))).param_counts().items())


# ---------------------------------------------------------------------------------------------- memory
OPTIMIZER_BYTES = 16  # per parameter: float32 weight, float32 gradient, AdamW's two float32 moments
DDP_BYTES = 4  # per parameter with more than one process: DDP's float32 gradient buckets
ACTIVATION_SAFETY = 1.25  # arm gates, autocast copies, allocator fragmentation
RESERVED_GB = 2.0  # CUDA context, cuBLAS/cuDNN workspaces
USABLE_FRACTION = 0.9
EVAL_BATCH = 16  # `ablate eval --batch-size`'s default
# An arm on the reference path (a normaliser with no elementwise log-weight on CUDA; any hooked arm on a CPU)
# materialises (B, H, T, T) per layer: the bytes per element its graph keeps for the backward pass, and the working
# bytes of one layer's forward or backward, are measured for the arm on a small CPU probe (`ablate.arms.cost`).
PHASES = ("train_step", "evaluation", "final_evaluation", "eval_scoring")


def loss_chunk_for(setting: int | None, device) -> int:
    """The loss chunk of every phase of a run (training step, evaluations, probes, `ablate eval`): the run's
    `loss_chunk` when set (0: never chunk), else LOSS_CHUNK on a GPU and 0 (the whole micro-batch) on a CPU,
    where the whole loss is what tests/recorded_smoke_run.json recorded."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return int(setting) if setting is not None else (0 if kind == "cpu" else LOSS_CHUNK)


def reference_attention_bytes(tier: Tier, rows: int, arm: str | None, device: str = "cuda") -> tuple[int, int]:
    """(bytes kept for the backward pass in all layers, working bytes of one layer) of the T×T tensors an arm's
    attention path materialises for `rows` sequences; (0, 0) on the flex path and on the fused path without a score
    bias. On the reference path, from the arm's measured bytes per (B, H, T, T) element
    (`ablate.arms.cost.attention_cost`); on the blocked reference path (`ablate.arms.kernel.blocked_rows` at this
    shape: an arm that decodes, T over one block) no layer keeps a square (its blocks keep their inputs, O(T)
    activations) and one block's saved and allocated tensors, (B, H, block, T), are the working set. On the fused
    path, an arm with a score-bias slot keeps SDPA's additive (H, T, T) float32 mask in every layer (4 bytes per
    element, whatever B: measured, benchmarks/blocked_arms.py)."""
    if arm is None:
        return 0, 0
    arm_class, heads, seq = get_arm(arm), tier.n_head, tier.seq_len
    path = arm_class.path(device)
    if path == "fused" and arm_class.has_slot("score-bias"):
        return tier.n_layer * 4 * heads * seq * seq, 0
    if path != "reference":
        return 0, 0
    saved, working = attention_cost(arm, device).bytes(rows, heads, seq)
    block = blocked_rows(arm_class, rows, heads, seq)
    if block is None:  # whole rows: every layer keeps its square for the backward pass
        return tier.n_layer * saved, working
    return 0, (saved + working) * block // seq  # blocks: one block recomputed and differentiated at a time


@dataclass(frozen=True)
class PhaseBytes:
    """One phase's estimate before the margin: `fixed` bytes (weights, optimiser states, gradients) take none;
    `activations` take it; the output layer's peak `output` takes it when `output_margin`."""

    fixed: float
    activations: float
    output: float
    output_margin: bool


def phase_bytes(tier: Tier, micro_batch: int, world_size: int = 1, loss_chunk: int = 0,
                mlp_hidden: int | None = None, eval_batch: int = EVAL_BATCH,
                precision: str = "bf16-mixed") -> dict[str, PhaseBytes]:
    """The parts of every phase's estimate on the fused path (`memory_phases_gb`)."""
    if precision not in ("bf16-mixed", "32-true"):
        raise AblateError(f"precision {precision!r}: valid precisions are bf16-mixed, 32-true")
    a = 2 if precision == "bf16-mixed" else 4
    d, layers, seq = tier.d_model, tier.n_layer, tier.seq_len
    m = mlp_hidden or 4 * d
    vocab = math.ceil(tier.vocab_size / 64) * 64
    head_dim = d // tier.n_head
    per_layer = (tier.n_head + 2 * tier.n_kv_head) * head_dim * d + d * d + 2 * d * m + 2 * d
    params = vocab * d + layers * per_layer + d
    states = params * (OPTIMIZER_BYTES + (DDP_BYTES if world_size > 1 else 0))

    def output(tokens: int, per_token: int) -> int:  # bytes of the output layer, whole or in chunks
        return per_token * vocab * (min(loss_chunk, tokens) if loss_chunk > 0 else tokens)

    tokens, scored = micro_batch * seq, eval_batch * seq
    working = 8 * d + a * (6 * d + 2 * m)  # per token: one layer at a time, no graph
    evaluation = PhaseBytes(states, tokens * working, output(tokens, a + 4 + (4 if a < 4 else 0)), True)
    return {"train_step": PhaseBytes(states + 2 * 4 * vocab * d, tokens * layers * (8 * d + a * (11 * d + 2 * m)),
                                     output(tokens, 12 + (2 * a if a < 4 else 0)), False),
            "evaluation": evaluation, "final_evaluation": evaluation,
            "eval_scoring": PhaseBytes(params * 4, scored * (8 * d + 4 * (6 * d + 2 * m)),
                                       output(scored, 8) if loss_chunk > 0 else 4 * vocab * (scored + 3 * seq), True)}


def memory_phases_gb(tier: Tier | str, micro_batch: int, *, margin: float = ACTIVATION_SAFETY,
                     reserved_gb: float = RESERVED_GB, **options) -> dict[str, float]:
    """Estimated peak memory (GB) of each phase of a run of `tier`: {phase: GB} for PHASES.

    a = 2 bytes per activation under "bf16-mixed" autocast (a GPU's default), 4 under "32-true" (a CPU's);
    d the width, m the MLP width, V the padded vocabulary, P the parameters (the baseline's shape).
    * train_step: the states, P × 16 bytes (float32 weights and gradients, AdamW's two moments; 4 more with
      DDP's buckets); the activations kept for the backward pass, per token and layer: RMSNorm inputs 2 × 4·d
      (float32 residual stream), the inputs of the four matmuls 4 × a·d, q, k, v before and after RoPE
      2 × 3a·d, the attention output a·d, the MLP's two hidden tensors 2 × a·m: 8·d + a·(11·d + 2·m); flash
      attention keeps no T×T tensor; the output layer, per token, the saved float32 log-softmax, its
      gradient and the logits' gradient, 12·V, plus the compute-dtype logits and gradient when they are
      not float32 (2·V each at a = 2): 16·V under bf16, for every token of the micro-batch, or for
      `loss_chunk` tokens only with the chunked loss (`GPT(..., loss_chunk=)`); the tied output and
      embedding weights' gradients before they are accumulated, 2 × 4·V·d.
    * evaluation (every val_interval) and final_evaluation (the same micro-batch over the final windows):
      the states; no graph, so one layer's tensors at a time, per token 8·d + a·(6·d + 2·m); the output
      layer's logits, their float32 copy and cross-entropy's log-softmax, (a + 4 + 4)·V per token (no copy
      at a = 4), for the micro-batch's tokens, or for `loss_chunk` of them (`ablate.loop.mean_token_loss`).
    * eval_scoring (`ablate eval`, another process, float32): P × 4 bytes of weights; one layer's tensors
      for eval_batch × seq_len tokens; float32 logits 4·V for every token and, for a row of seq_len, its
      contiguous copy, its log-softmax and the last row's, 3 × 4·V; or (4 + 4)·V for `loss_chunk` tokens
      (`ablate.evals.lm.AblateLM`).
    This is the fused attention path's estimate (no T×T tensor); `arm_memory_phases_gb` adds an arm's path.
    Activations, and the logits of the phases without a graph (a chunk's blocks are freed and allocated
    again), are times `margin` (ACTIVATION_SAFETY, 1.25: arm gates, autocast copies, fragmentation; the margin
    is for choosing a micro-batch, `micro_batch_for`; `ablate plan`'s predicted peak takes margin 1, the model's
    own estimate); each phase adds `reserved_gb` (the CUDA context; 0 for a CPU process).
    """
    return arm_memory_phases_gb(tier, micro_batch, None, margin=margin, reserved_gb=reserved_gb, **options)


def arm_memory_phases_gb(tier: Tier | str, micro_batch: int, arm: str | None, *, device: str = "cuda",
                         margin: float = ACTIVATION_SAFETY, reserved_gb: float = RESERVED_GB,
                         **options) -> dict[str, float]:
    """`memory_phases_gb` (options: `phase_bytes`'s keywords) plus what `arm`'s attention path adds on `device`
    (`reference_attention_bytes`): the T×T tensors kept for the backward pass join the training step's
    activations; one layer's (or one block's) working bytes are taken at a time, when the output layer's peak is
    not, so a phase's peak is the larger of the two, not their sum; both times `margin`. Nothing on the flex path
    and on the fused path without a score bias, which keep no T×T tensor."""
    tier = get_tier(tier) if isinstance(tier, str) else tier
    parts = phase_bytes(tier, micro_batch, **options)
    saved, working = reference_attention_bytes(tier, micro_batch, arm, device)
    scoring = reference_attention_bytes(tier, options.get("eval_batch", EVAL_BATCH), arm, device)
    extra = {"train_step": (saved, working), "evaluation": (0, working), "final_evaluation": (0, working),
             "eval_scoring": (0, scoring[1])}

    def total(phase: str, part: PhaseBytes) -> float:
        kept, transient = extra[phase]
        out = part.output * (margin if part.output_margin else 1.0)
        return part.fixed + (part.activations + kept) * margin + max(out, transient * margin)

    return {phase: total(phase, part) / 1e9 + reserved_gb for phase, part in parts.items()}


def memory_estimate_gb(tier: Tier | str, micro_batch: int, *, world_size: int = 1, loss_chunk: int = 0,
                       mlp_hidden: int | None = None, eval_batch: int = EVAL_BATCH,
                       precision: str = "bf16-mixed", arm: str | None = None) -> float:
    """Estimated peak GPU memory (GB) of a run of `tier` (of `arm`: its path's attention counted): the largest of
    its phases (`memory_phases_gb`)."""
    return max(arm_memory_phases_gb(tier, micro_batch, arm, world_size=world_size, loss_chunk=loss_chunk,
                                    mlp_hidden=mlp_hidden, eval_batch=eval_batch, precision=precision).values())


def micro_batch_for(tier: Tier | str, gpu_mem_gb: float, *, world_size: int = 1, loss_chunk: int = 0,
                    mlp_hidden: int | None = None, eval_batch: int = EVAL_BATCH, arm: str | None = None) -> int:
    """The largest micro-batch that divides the per-rank batch (global_batch / world_size) and for which every
    phase's estimate (`arm_memory_phases_gb`: training step, evaluations, `ablate eval` at `eval_batch`) fits 90%
    of `gpu_mem_gb`. Gradient accumulation over the per-rank batch keeps the global batch, and so the
    optimisation, unchanged; only float summation order differs."""
    tier = get_tier(tier) if isinstance(tier, str) else tier
    if world_size < 1 or tier.global_batch % world_size:
        raise AblateError(f"world size {world_size} must divide tier {tier.name}'s global batch {tier.global_batch}")
    local = tier.global_batch // world_size
    budget = USABLE_FRACTION * gpu_mem_gb
    options = dict(world_size=world_size, loss_chunk=loss_chunk, mlp_hidden=mlp_hidden, eval_batch=eval_batch)
    for micro in sorted((m for m in range(1, local + 1) if local % m == 0), reverse=True):
        if memory_estimate_gb(tier, micro, arm=arm, **options) <= budget:
            return micro
    phases = arm_memory_phases_gb(tier, 1, arm, **options)
    worst = max(phases, key=phases.get)
    way_out = (f"lower `ablate eval --batch-size` (estimated at {eval_batch})" if worst == "eval_scoring"
               else "use a larger GPU or set loss_chunk")
    raise AblateError(f"tier {tier.name} does not fit {gpu_mem_gb:g} GB even at micro-batch 1 ({worst} estimated "
                      f"at {phases[worst]:.1f} GB); {way_out}")


GPU_SIZED = ("global_batch", "seq_len")  # run options that change what fits a GPU (besides loss_chunk, model)


def run_micro_batch(tier: Tier | str, gpu_mem_gb: float, options: dict, *, world_size: int = 1,
                    arm: str | None = None) -> int:
    """The micro-batch a run with these options (an experiment's tier overrides, the command's options on
    top) has on a GPU of `gpu_mem_gb`: the options' micro_batch when set, else the largest that fits
    (`micro_batch_for`) with the run's own loss chunk (`loss_chunk_for(options' loss_chunk, "cuda")`: 0
    sizes for the unchunked loss), batch shape and MLP width, and `arm`'s attention path (an arm on the reference
    path materialises (B, H, T, T) per layer). `ablate plan`, `ablate submit` and the run all take it from here,
    so the micro-batch a plan prints is the one the run uses."""
    if options.get("micro_batch"):
        return int(options["micro_batch"])
    tier = get_tier(tier) if isinstance(tier, str) else tier
    tier = replace(tier, **{key: int(options[key]) for key in GPU_SIZED if options.get(key) is not None})
    return micro_batch_for(tier, gpu_mem_gb, world_size=world_size,
                           loss_chunk=loss_chunk_for(options.get("loss_chunk"), "cuda"),
                           mlp_hidden=(options.get("model") or {}).get("mlp_hidden"), arm=arm)


def arm_table(d_model: int = 768, n_head: int = 12, arms: list[str] | None = None, *, tier: str | None = None,
              model: dict | None = None) -> list[dict]:
    """One row per arm (default: every registered arm); parameter counts are measured on the real model
    (meta device), one layer of that width for the count per layer.

    tier: count at that tier's shape instead (its width, heads and key/value heads, with `model`: GPTConfig
    fields an experiment overrides), and add `extra_params_total`, the arm's parameters in the whole model.
    """
    rows = []
    for name in list_arms() if arms is None else arms:
        cls = get_arm(name)
        if tier is None:
            config = GPTConfig(vocab_size=64, n_layer=1, n_head=n_head, d_model=d_model, max_seq_len=8, arm=name)
            where = {}
        else:
            full = model_config(tier, name, **(model or {}))
            config = replace(full, vocab_size=64, n_layer=1, max_seq_len=8)
            where = {"tier": get_tier(tier).name, "n_layer": full.n_layer, "n_kv_head": full.n_kv_head,
                     "extra_params_total": _meta_counts(full)["arm_extra"]}
        extra = _meta_counts(config)["arm_extra"]
        rows.append({
            "arm": name,
            "slots": list(cls.slots()) or (["sequence"] if cls.sequence_token else []),
            "hooks": list(cls.hooks()),
            "path": {"cpu": cls.path("cpu"), "cuda": cls.path("cuda")},
            "extra_params_per_layer": 0 if cls.sequence_token else extra,
            "extra_params_once": extra if cls.sequence_token else 0,
            "description": cls.description,
            "d_model": config.d_model, "n_head": config.n_head, **where,
        })
    return rows


def run_peak_gb(tier: Tier, micro: int, options: dict, world_size: int, arm: str, mlp_hidden: int | None) -> float:
    """The predicted peak memory per GPU (GB) of a run of `arm` with these options at its micro-batch: the largest
    phase's (`arm_memory_phases_gb`) with the run's own global batch, length and loss chunk, at margin 1 — the
    model's own estimate; the 1.25 margin (ACTIVATION_SAFETY) applies only when the micro-batch is chosen."""
    shaped = replace(tier, **{k: int(options[k]) for k in ("global_batch", "seq_len") if options.get(k) is not None})
    return max(arm_memory_phases_gb(shaped, micro, arm, world_size=world_size, mlp_hidden=mlp_hidden, margin=1.0,
                                    loss_chunk=loss_chunk_for(options.get("loss_chunk"), "cuda")).values())
