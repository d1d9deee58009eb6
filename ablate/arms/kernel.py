"""The one attention computation every arm plugs into: a fused path and a reference path.

Shapes: q (B, H, Tq, d); k, v (B, Hkv, Tk, d); x (B, Tq, C) the pre-normed hidden state.

Fused path (training). Baseline, value-slot and output-slot arms call
`scaled_dot_product_attention(is_causal=True)`: no T×T tensor. The denominator slot (phantom key) and
the routing slot (an additive log-gate per key) go through *extra head dimensions*, which keep the
computation inside the same fused, differentiable kernel (exact algebra, not an approximation):

    q'_i = [q_i, b_h, 1]        k'_j = [k_j, 0, log g_j / s]        v'_j = v_j
    sink key k'_0 = [0, 1/s, 0]  with value 0, prepended; plus a dummy query so the mask stays square

so s·q'_i·k'_j = s·q_i·k_j + log g_j and s·q'_i·k'_sink = b_h, with the scale s = 1/√d kept explicit.
The kernel's own max-shift covers the phantom logit, so off-by-one (b ≡ 0) is stable for any logits.
(A learnable sink through a log-sum-exp is not used on purpose: on CPU, PyTorch's flash op returns an
lse that carries no gradient, and FlashAttention has no backward for a sink.)

The score-bias slot (a bias per head and (query, key) pair) cannot ride in a few columns: it goes in as
SDPA's additive float mask, with the causal mask folded in (−inf above the diagonal) since SDPA takes a
mask or is_causal, not both. With the phantom key the mask gains a first column of zeros (the sink key's
logit b_h still comes from its extra column, so the bias touches real keys only) and the dummy query's
row. The mask is (H, T, T) floats, not the weights: the kernel stays fused, but the mask is T² in every layer (built
whole, kept for the backward pass; its cost is in docs/arms.md, "fused"). The query-key slot needs no
kernel support: the model applies it to q and k before RoPE (`ablate.model`).

Reference path (tests, probes, KV-cache decoding): materialises the weights p_ij and phantom mass.

The mask has one owner, `mask_of`: the causal mask (key position ≤ query position), composed with an arm's mask
hook. Every path reads it from there: the fused path keeps `is_causal` when it is the causal mask alone and
takes it as SDPA's boolean (or, with a score bias, additive) mask otherwise; the reference path and decoding
evaluate it on index tensors (`dense_mask`), queries at their absolute positions; flex_attention takes it as a
BlockMask (`block_mask`), built once per forward and shape and handed to every layer through the context's
shared dict, the causal one from a bounded cache. A normaliser's weights are zeroed wherever it is False.

Hooks (`ablate.arms.base`). A score modifier maps s·q·k first, then the routing gate, the score bias, the mask and
the phantom column follow as above; a normaliser replaces the softmax over the masked logits. Both train on the
reference path on a CPU and through compiled flex_attention on CUDA (`_flex`: the phantom key as o·σ(lse − b),
as torchtitan's sink; a normaliser given as an elementwise log-weight as o·exp(lse)). An override receives
`core`, this kernel with the arm's slots and hooks; each call of `core` in one forward is one *core call*, with
its own KV cache (`LayerCache.for_call`) and state, so an override that calls `core` twice decodes exactly.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from ablate.arms import checks
from ablate.arms.base import Arm, AttentionContext, MaskMod
from ablate.arms.probe import reference_factors
from ablate.errors import AblateError


@dataclass
class AttentionRecord:
    """What the reference path saw, for probes: weights over real keys and every slot's signal."""

    weights: torch.Tensor  # (B, H, Tq, Tk) p_ij over real keys (sums to 1 − phantom mass)
    reads: torch.Tensor  # (B, Hkv, Tk, d) v_j before any gate
    values: torch.Tensor  # (B, Hkv, Tk, d) v_j after the value gate (what is aggregated)
    phantom_mass: torch.Tensor | None = None  # (B, H, Tq)
    value_gate: torch.Tensor | None = None
    routing_log_gate: torch.Tensor | None = None  # (B, Hkv, Tk)
    score_bias: torch.Tensor | None = None  # (H, Tq, Tk), before the causal mask
    output_gate: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)


def _expand_kv(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, Hkv, ...) → (B, H, ...) for grouped-query attention."""
    groups = n_head // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def key_signals(arm: Arm, v: torch.Tensor, x: torch.Tensor):
    """Per-key slot signals from the read: (gated values, value gate, routing log-gate). Cacheable."""
    value_gate = checks.broadcast(arm, "value_gate", arm.value_gate(v, x), tuple(v.shape),
                                  "a gate (B, H_kv, T, 1) or (B, H_kv, T, d)") if arm.has_slot("value") else None
    log_gate = checks.exact(arm, "routing_log_gate", arm.routing_log_gate(v, x), tuple(v.shape[:3]),
                            "log g (B, H_kv, T)") if arm.has_slot("routing") else None
    values = v if value_gate is None else v * value_gate
    return values, value_gate, log_gate


def score_bias(arm: Arm, n_query: int, n_key: int, offset: int, device,
               key_index: torch.Tensor | None = None) -> torch.Tensor | None:
    """The score-bias slot's (H, Tq, Tk) bias, queries at key positions offset … offset+Tq−1, keys at 0 … Tk−1 or
    at `key_index` (the keys the blocked path kept); None without it."""
    if not arm.has_slot("score-bias"):
        return None
    query_pos = torch.arange(offset, offset + n_query, device=device)
    key_pos = torch.arange(n_key, device=device) if key_index is None else key_index
    return checks.broadcast(arm, "score_bias", arm.score_bias(query_pos, key_pos),
                            (arm.ctx.n_head, n_query, key_pos.numel()), "a bias (H, T_q, T_k)")


@dataclass
class LayerCache:
    """Per-layer decoding state of one core call. Value-slot arms store the *gated* reads: gates depend on the
    read alone. An override's second, third … core call of a forward has its own (`for_call`)."""

    keys: torch.Tensor | None = None  # (B, Hkv, T, d), after the query-key slot and RoPE
    values: torch.Tensor | None = None  # (B, Hkv, T, d), after the value gate
    log_gate: torch.Tensor | None = None  # (B, Hkv, T), routing slot
    state: dict = field(default_factory=dict)  # a hooked arm's own state (AttentionContext.state)
    calls: list["LayerCache"] = field(default_factory=list)  # core calls 1, 2, … of an override

    @staticmethod
    def _append(old, new, dim):
        return new if old is None else torch.cat([old, new], dim=dim)

    def append(self, keys, values, log_gate):
        self.keys = self._append(self.keys, keys, 2)
        self.values = self._append(self.values, values, 2)
        if log_gate is not None:
            self.log_gate = self._append(self.log_gate, log_gate, 2)

    def for_call(self, index: int) -> "LayerCache":
        """The cache of core call `index` of a forward (0: this one)."""
        if index == 0:
            return self
        while len(self.calls) < index:
            self.calls.append(LayerCache())
        return self.calls[index - 1]


def refuse_decoding(arm: Arm) -> None:
    """One line naming the arm and why, for an arm whose state a KV cache cannot hold (`Arm.no_decoding`)."""
    if arm.no_decoding:
        raise AblateError(f"arm {arm.name or type(arm).__name__!r} cannot be decoded with a KV cache: "
                          f"{arm.no_decoding}; score whole sequences instead (no cache)")


def attention(
    arm: Arm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, *, fused: bool | str = True,
    context: AttentionContext | None = None, cache: LayerCache | None = None,
) -> tuple[torch.Tensor, AttentionRecord | None]:
    """Causal self-attention. Returns (o (B, H, Tq, d), record or None; a record on the reference path).

    Without a cache: one full sequence (queries at key positions 0 … T−1). With `cache`, decoding: q, k, v are
    the new positions offset … offset+Tq−1, offset the positions the cache holds; their keys and values join the
    cache and the reference path attends
    over every cached key. `context` reaches the hooks only (built from x when the arm has hooks and none is
    given); an override's `core` calls this kernel with the arm's slots, each call with its own cache. `fused`:
    True, the arm's training path; False, the reference path; a path's name ('fused', 'flex' or 'reference', the
    check's): that path, whatever the arm's training path is."""
    if cache is not None:
        refuse_decoding(arm)
    documents = None if context is None else context.documents
    path = fused if isinstance(fused, str) else None
    if path is None:
        path = arm.path(q.device.type) if fused and cache is None else "reference"
        if documents is not None and path == "fused" and q.is_cuda:  # a document mask: blocks to skip
            path = "flex"
        if fused and path == "reference" and blocked_rows(arm, *q.shape[:3], q.dtype) is not None:
            path = "blocked"
    if not arm.hooks() and documents is None:
        return _core(arm, q, k, v, x, path, None, cache)
    if context is None:
        context = AttentionContext.full(x)
    if not arm.has_hook("override"):
        return _core(arm, q, k, v, x, path, context, cache)
    records: list[AttentionRecord | None] = []

    def core(q_call: torch.Tensor, k_call: torch.Tensor, v_call: torch.Tensor) -> torch.Tensor:
        call_cache = None if cache is None else cache.for_call(len(records))
        o_call, rec = _core(arm, q_call, k_call, v_call, x, path, context, call_cache)
        records.append(rec)
        return o_call

    o = checks.exact(arm, "attend", arm.attend(q, k, v, context, core), (*q.shape[:3], arm.ctx.d_model // q.shape[1]),
                     "o (B, H, T_q, d_v), H·d_v = d_model")
    record = records[0] if records and records[0] is not None else None
    if record is not None:
        record.extras["core_calls"] = records
    return o, record


def _core(arm, q, k, v, x, path, context, cache):
    """The kernel with the arm's slots, score modifier, normaliser and mask (the `core` an override receives), on
    `path`; decoding (a cache) always takes the reference path."""
    values, value_gate, log_gate = key_signals(arm, v, x)
    sink = checks.exact(arm, "sink_logit", arm.sink_logit(), (q.shape[1],), "b (H,)") if arm.has_slot(
        "denominator") else None
    offset = 0 if cache is None or cache.keys is None else cache.keys.shape[2]  # positions cached before this call
    if cache is not None:
        cache.append(k, values, log_gate)
        k, values, log_gate = cache.keys, cache.values, cache.log_gate
    n_query, n_key = q.shape[2], k.shape[2]
    bias = score_bias(arm, n_query, n_key, offset, q.device)
    hooks = None
    if context is not None:
        state = context.state if cache is None else cache.state
        call_context = replace(context, key_pos=torch.arange(n_key, device=q.device), state=state,
                               decoding=cache is not None)
        hooks = Hooks.of(arm, call_context)
    if cache is None and path == "fused":
        masked = hooks is not None and (hooks.mask is not None or hooks.context.documents is not None)
        allowed = dense_mask(mask_of(hooks.mask, 0, hooks.context.documents), q, n_key) if masked else None
        o, record = _fused(q, k, values, sink, log_gate, bias, allowed), None
    elif cache is None and path == "flex":
        o, record = _flex(q, k, values, sink, log_gate, bias, hooks), None
    elif cache is None and path == "blocked":
        o, record = blocked_reference(arm, q, k, values, sink, log_gate, context), None
    else:
        o, record = reference_attention(q, k, values, sink, log_gate, offset=offset, bias=bias, hooks=hooks)
        record.reads, record.value_gate = v, value_gate
    if arm.has_slot("output"):
        gate = checks.broadcast(arm, "output_gate", arm.output_gate(o, x), tuple(o.shape),
                                "a gate (B, H, T_q, 1) or (B, H, T_q, d)")
        o = o * gate
        if record is not None:
            record.output_gate = gate
    return o, record


@dataclass
class Hooks:
    """An arm's score modifier and normaliser, bound to one call's context."""

    context: AttentionContext
    score_mod: object = None  # (score, b, h, q_idx, kv_idx) -> score
    normalise: object = None  # (logits) -> weights
    log_weight: object = None  # (score, b, h, q_idx, kv_idx) -> log p, the normaliser elementwise (flex)
    arm: Arm | None = None  # whose score modifier it is (its output is checked on the reference path)
    mask: MaskMod | None = None  # (b, h, q_idx, kv_idx) -> bool, the arm's own (before `mask_of` composes it)
    # The positions of the keys this call holds when the blocked path left out keys the composed mask hides from
    # every query of the block (`kept_keys`); None: all of 0 … Tk−1.
    key_index: torch.Tensor | None = None

    @classmethod
    def of(cls, arm: Arm, context: AttentionContext) -> "Hooks":
        hooks = cls(context)
        if arm.has_hook("score-modifier"):
            hooks.score_mod = arm.score_modifier(context)
            hooks.arm = arm
        if arm.has_hook("normaliser"):
            hooks.normalise = lambda logits: checks.broadcast(arm, "normalise", arm.normalise(logits, context),
                                                              tuple(logits.shape), "weights p (B, H, T_q, T_k)")
            hooks.log_weight = arm.normaliser_log_weight(context)
        if arm.has_hook("mask"):
            hooks.mask = arm.mask_modifier(context)
        return hooks


def mask_of(arm_mask: MaskMod | None, offset: int, documents: torch.Tensor | None = None) -> MaskMod:
    """The one composed mask, FlexAttention's mask_mod (True: query q_idx may see key kv_idx): causal — the key's
    position at most the query's, query q_idx of this call sitting at key position offset + q_idx — the document
    mask (`documents` (B, Tk): a key of the query's document, or of document −1, which every document sees: the
    sink token), and the arm's mask. Every path evaluates this one function; an arm's mask can only take keys
    away. (The phantom key is no position: every query sees it.)"""

    def composed(b, h, q_idx, kv_idx):
        allowed = kv_idx <= q_idx + offset
        if documents is not None:
            key_document = documents[b, kv_idx]
            allowed = allowed & ((key_document == documents[b, q_idx + offset]) | (key_document < 0))
        if arm_mask is not None:
            allowed = allowed & arm_mask(b, h, q_idx, kv_idx)
        return allowed

    return composed


def dense_mask(mask: MaskMod, q: torch.Tensor, n_key: int, key_index: torch.Tensor | None = None) -> torch.Tensor:
    """The composed mask evaluated on broadcasting index tensors: a bool tensor that broadcasts against (B, H, Tq,
    Tk) — (1, 1, Tq, Tk) for the causal mask alone; keys 0 … Tk−1, or `key_index` (then Tk is its length). A mask
    hook returning another dtype or shape is one line naming the hook, the shape expected and the one it gave."""
    B, H, Tq = q.shape[0], q.shape[1], q.shape[2]
    allowed = mask(*_broadcast_indices((B, H, Tq, n_key), q.device, key_index))
    expected = (B, H, Tq, n_key)
    try:
        shaped = torch.broadcast_shapes(allowed.shape, expected) == expected
    except (RuntimeError, AttributeError):
        shaped = False
    if not shaped or allowed.dtype != torch.bool:
        got = f"{getattr(allowed, 'dtype', type(allowed).__name__)} {tuple(getattr(allowed, 'shape', ()))}"
        raise AblateError(f"mask hook (mask_modifier): expected a bool tensor broadcastable to (B, H, Tq, Tk) = "
                          f"{expected}, got {got}")
    return allowed if allowed.dim() == 4 else allowed.view((1,) * (4 - allowed.dim()) + tuple(allowed.shape))


def _fused(q, k, v, sink: torch.Tensor | None, log_gate: torch.Tensor | None,
           bias: torch.Tensor | None = None, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA; `allowed` the composed mask evaluated (`dense_mask`) when an arm has a mask, else None: is_causal,
    the causal mask alone."""
    n_head, d, dv = q.shape[1], q.shape[-1], v.shape[-1]
    scale = 1.0 / math.sqrt(d)
    gqa = k.shape[1] != n_head
    if sink is None and log_gate is None and bias is None and allowed is None and dv == d:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    q2, k2, v2 = _extra_columns(q, k, v, sink, log_gate, scale)
    mask = None
    if bias is not None or allowed is not None:
        if allowed is None:  # the causal mask alone, as a tensor: SDPA takes a mask or is_causal, not both
            allowed = dense_mask(mask_of(None, 0), q, k.shape[2])
        mask = _sdpa_mask(allowed, bias, sink is not None, q2.dtype)
    o = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=gqa)
    return o[:, :, 1:, :dv] if sink is not None else o[..., :dv]


def _extra_columns(q, k, v, sink, log_gate, scale: float):
    """q, k, v with the denominator and routing slots in extra head dimensions (unchanged without them), and one
    head dim for all three (zero columns: q·k and the read are unchanged), as the fused kernels want. A value head
    wider than the query's (an override's core call on half-heads, as `diff` makes) widens q and k with zeros."""
    n_head, d, dv = q.shape[1], q.shape[-1], v.shape[-1]
    if sink is None and log_gate is None:
        if dv == d:
            return q, k, v
        width = max(d, dv)
        return F.pad(q, (0, width - d)), F.pad(k, (0, width - d)), F.pad(v, (0, width - dv))
    B, T = q.shape[0], q.shape[2]
    q_extra, k_extra = [], []
    if sink is not None:
        q_extra.append(sink.to(q.dtype).view(1, n_head, 1, 1).expand(B, n_head, T, 1))
        k_extra.append(k.new_zeros(B, k.shape[1], T, 1))
    if log_gate is not None:
        q_extra.append(q.new_ones(B, n_head, T, 1))
        k_extra.append((log_gate / scale).unsqueeze(-1).to(k.dtype))
    pad = (-(d + len(q_extra))) % 8 if q.is_cuda else 0  # flash kernels want head dims in multiples of 8
    if pad:
        q_extra.append(q.new_zeros(B, n_head, T, pad))
        k_extra.append(k.new_zeros(B, k.shape[1], T, pad))
    q2 = torch.cat([q, *q_extra], dim=-1)  # (B, H, T, d + e)
    k2 = torch.cat([k, *k_extra], dim=-1)  # (B, Hkv, T, d + e)
    if dv > k2.shape[-1]:
        q2, k2 = F.pad(q2, (0, dv - q2.shape[-1])), F.pad(k2, (0, dv - k2.shape[-1]))
    v2 = F.pad(v, (0, k2.shape[-1] - dv))  # fused kernels need one head dim for q, k and v: zero columns
    if sink is not None:
        sink_key = k2.new_zeros(B, k.shape[1], 1, k2.shape[-1])
        sink_key[..., d] = 1.0 / scale
        q2 = torch.cat([q2.new_zeros(B, n_head, 1, q2.shape[-1]), q2], dim=2)  # dummy query at position 0
        k2 = torch.cat([sink_key, k2], dim=2)
        v2 = torch.cat([v2.new_zeros(B, v.shape[1], 1, v2.shape[-1]), v2], dim=2)  # the phantom's value is 0
    return q2, k2, v2


def _sdpa_mask(allowed: torch.Tensor, bias: torch.Tensor | None, with_sink: bool, dtype: torch.dtype) -> torch.Tensor:
    """SDPA's mask from the composed one (`allowed`, broadcasting to (B, H, T, T)): boolean without a score bias;
    with one, additive: the bias where allowed, −inf elsewhere. With the phantom key, a first row and column go in
    front: column 0 is the sink key, visible to every query (its logit b_h is in its extra column, so the bias does
    not touch it); row 0 is the dummy query, which sees the sink key alone, as under is_causal."""
    if with_sink:
        allowed = F.pad(allowed, (1, 0, 1, 0), value=False)
        allowed[..., 0] = True
        bias = None if bias is None else F.pad(bias, (1, 0, 1, 0))
    if bias is None:
        return allowed
    return bias.to(dtype).unsqueeze(0).masked_fill(~allowed, float("-inf"))


def reference_attention(q, k, values, sink, log_gate, *, offset: int, bias: torch.Tensor | None = None,
                        hooks: Hooks | None = None):
    """Materialised attention. Query t sits at key position offset + t (offset > 0 when decoding);
    bias (H, Tq, Tk) is the score-bias slot's, for those positions; hooks: the arm's score modifier (on s·q·k,
    first) and normaliser (in place of the softmax), bound to this call's context. With `hooks.key_index` (the
    blocked path left out keys the composed mask hides from every query), k, values, log_gate and bias hold those
    keys only; the hooks see each key by its position, and a normaliser still gets whole rows (`_normalise_rows`)."""
    n_head, d = q.shape[1], q.shape[-1]
    Tk = k.shape[2]
    key_index = None if hooks is None else hooks.key_index
    logits = (q @ _expand_kv(k, n_head).transpose(-2, -1)) / math.sqrt(d)  # (B, H, Tq, Tk)
    if hooks is not None and hooks.score_mod is not None:
        logits = checks.exact(hooks.arm, "score_modifier",
                              hooks.score_mod(logits, *_broadcast_indices(logits.shape, logits.device, key_index)),
                              tuple(logits.shape), "a score for each (b, h, q_idx, kv_idx)")
    if log_gate is not None:
        logits = logits + _expand_kv(log_gate, n_head).unsqueeze(2)
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    allowed = dense_mask(mask_of(None if hooks is None else hooks.mask, offset,
                                 None if hooks is None else hooks.context.documents), q, Tk, key_index)
    logits = logits.masked_fill(~allowed, float("-inf"))
    phantom = None
    if hooks is not None and hooks.normalise is not None:
        weights = _normalise_rows(hooks, logits)
        weights = weights.masked_fill(~allowed, 0.0)  # no weight on a key the mask takes away
    elif sink is not None:
        sink_column = sink.to(logits.dtype).view(1, n_head, 1, 1).expand(*logits.shape[:3], 1)
        full = torch.softmax(torch.cat([logits, sink_column], dim=-1), dim=-1)
        weights, phantom = full[..., :-1], full[..., -1]
    else:
        weights = torch.softmax(logits, dim=-1)
    o = weights @ _expand_kv(values, n_head)  # (B, H, Tq, d)
    record = AttentionRecord(weights=weights, reads=values, values=values, phantom_mass=phantom,
                             routing_log_gate=log_gate, score_bias=bias)
    return o, record


def _normalise_rows(hooks: Hooks, logits: torch.Tensor) -> torch.Tensor:
    """The normaliser's weights over the keys `logits` holds. When the blocked path left keys out (`key_index`), the
    normaliser still receives the whole rows it would have seen, the left-out keys at −∞ as the mask puts them (a
    normaliser may read a row's width or index keys by column, as selective attention's state does), and its weights
    for the kept keys come back: its input, and so its output, are unchanged."""
    key_index = hooks.key_index
    if key_index is None:
        return hooks.normalise(logits)  # its shape checked where it returns (`Hooks.of`)
    rows = logits.new_full((*logits.shape[:3], hooks.context.key_pos.numel()), float("-inf"))
    rows = rows.index_copy(-1, key_index, logits)
    return hooks.normalise(rows).index_select(-1, key_index)


BLOCK_MIN, BLOCK_MAX = 64, 512  # query rows per block of the blocked reference path
BLOCK_BUDGET = 64 * 2**20  # bytes one block's working set (B, H, block, T) may take, per layer
BLOCKS = "kernel/blocks"  # the key, in a forward's shared dict, of each block's own shared dict


def reference_block(batch: int, heads: int, seq_len: int, element_bytes: float, budget: int | None = None) -> int:
    """Query rows per block of the blocked reference path: the most rows whose working set, batch·heads·rows·T
    elements at `element_bytes` each (the arm's measured bytes saved and allocated per (B, H, T, T) element,
    `block_bytes`), fits `budget` (default BLOCK_BUDGET), rounded down to a power of two, within
    [BLOCK_MIN, BLOCK_MAX]. The saved state per layer is then the blocks' inputs, O(B·H·T·d), not O(B·H·T²)."""
    budget = BLOCK_BUDGET if budget is None else budget
    fit = int(budget // max(batch * heads * seq_len * element_bytes, 1e-9))
    rows = 1 << max(fit.bit_length() - 1, 0)
    return min(max(rows, BLOCK_MIN), BLOCK_MAX)


def blocked_rows(arm, batch: int, heads: int, seq_len: int, dtype: torch.dtype = torch.float32,
                 budget: int | None = None) -> int | None:
    """The block the training reference path takes for `arm` (an Arm or its class) at this shape, or None for the
    whole-row path: an arm whose state a KV cache cannot hold (`no_decoding`: its rows cannot be run as chunks), an
    override (its core calls take the path themselves), or T within one block. One owner: the kernel calls it with
    the call's shape and dtype, `ablate plan` and the memory plan with the run's (`reference_block` of the arm's
    measured bytes per element, `block_bytes`)."""
    if arm.no_decoding or arm.has_hook("override") or seq_len <= BLOCK_MIN:
        return None
    rows = reference_block(batch, heads, seq_len, block_bytes(arm if isinstance(arm, type) else type(arm), dtype),
                           budget)
    return None if seq_len <= rows else rows


def block_bytes(arm_class: type, dtype: torch.dtype = torch.float32) -> float:
    """Bytes one (B, H, block, T) element of a block of the blocked reference path takes while the block is
    computed and differentiated: the arm's measured saved + allocated bytes per element (float32), doubled for a
    float64 call; a bf16 or float16 call is sized as float32 (its softmax and most elementwise work stay float32)."""
    (saved, allocated, _, _), _ = reference_factors(arm_class, attention)
    return (saved + allocated) * max(torch.empty((), dtype=dtype).element_size(), 4) / 4


def kept_keys(arm: Arm, context: AttentionContext, q_block: torch.Tensor, start: int) -> torch.Tensor | None:
    """The keys of 0 … e−1 that some query of block [start, e) may see under the composed mask (`mask_of`: causal,
    documents, the arm's mask, evaluated for the block's queries at once), as an increasing index; None when that is
    every key (the causal mask alone hides none: key j < e is seen by the query at e − 1).
    A key hidden from every query of the block is left out of its scores, weights and gradients (a window of w keys
    costs O(T·w), not O(T²)); a key some query sees stays, so a row's normaliser sees all it sees now."""
    if not arm.has_hook("mask") and context.documents is None:
        return None
    arm_mask = arm.mask_modifier(replace(context, state=dict(context.state))) if arm.has_hook("mask") else None
    n_key = context.key_pos.numel()
    seen = dense_mask(mask_of(arm_mask, start, context.documents), q_block, n_key).flatten(0, 2).any(0)  # (e,)
    return None if bool(seen.all()) else seen.nonzero().squeeze(1)


def blocked_reference(arm: Arm, q, k, values, sink, log_gate, context: AttentionContext):
    """The reference path in query blocks, each recomputed in the backward pass (`torch.utils.checkpoint`): block
    [s, e) attends over keys 0 … e−1 as a decoding chunk at offset s does (its x, query positions, the documents of
    its keys, one shared dict per block index across the layers), carrying `context.state` from block to block, so a
    normaliser that couples query rows sees the earlier rows' state. Each block starts its recomputation from a copy
    of the state it first saw. Keys the composed mask hides from every query of a block are skipped (`kept_keys`)."""
    from torch.utils.checkpoint import checkpoint  # the blocked path only: the fused path never loads it

    T, rows = q.shape[2], blocked_rows(arm, *q.shape[:3], q.dtype)
    state, blocks = context.state, context.shared.setdefault(BLOCKS, {})
    outputs = []
    for start in range(0, T, rows):
        end = min(start + rows, T)
        block_context = replace(context, x=context.x[:, start:end], query_pos=context.query_pos[start:end],
                                key_pos=torch.arange(end, device=q.device), decoding=True,
                                documents=None if context.documents is None else context.documents[:, :end],
                                shared=blocks.setdefault(start, {}))

        keep = kept_keys(arm, block_context, q[:, :, start:end], start)

        def run(q_block, k_keys, v_keys, before=dict(state), start=start, end=end, block_context=block_context,
                keep=keep):
            carried = dict(before)
            hooks = replace(Hooks.of(arm, replace(block_context, state=carried)), key_index=keep)
            gate = None if log_gate is None else log_gate[:, :, :end]
            if keep is not None:  # gathered here, so the backward pass recomputes the copies instead of keeping them
                k_keys, v_keys = k_keys.index_select(2, keep), v_keys.index_select(2, keep)
                gate = None if gate is None else gate.index_select(2, keep)
            o, _ = reference_attention(q_block, k_keys, v_keys, sink, gate, offset=start, hooks=hooks,
                                       bias=score_bias(arm, end - start, end, start, q.device, keep))
            return o, carried

        o, carried = checkpoint(run, q[:, :, start:end], k[:, :, :end], values[:, :, :end], use_reentrant=False)
        state.clear()
        state.update(carried)
        outputs.append(o)
    return torch.cat(outputs, dim=2)


def _broadcast_indices(shape, device, key_index: torch.Tensor | None = None):
    """b, h, q_idx, kv_idx as index tensors that broadcast against shape (B, H, Tq, Tk): a score modifier or mask
    written for flex_attention (scalars there) runs unchanged on the whole materialised tensor. kv_idx: 0 … Tk−1, or
    `key_index` (the key positions the blocked path kept: a hook sees each key by its own index)."""
    B, H, Tq, Tk = shape
    keys = torch.arange(Tk, device=device) if key_index is None else key_index
    return (torch.arange(B, device=device).view(B, 1, 1, 1), torch.arange(H, device=device).view(1, H, 1, 1),
            torch.arange(Tq, device=device).view(1, 1, Tq, 1), keys.view(1, 1, 1, -1))


_COMPILED_FLEX = None
_CAUSAL_BLOCK_MASKS: OrderedDict = OrderedDict()  # (Tq, Tk, device) → the causal block mask, least recent first
CAUSAL_BLOCK_MASK_CACHE = 16  # shapes kept: training uses one, `ablate eval` one per width bucket
FORWARD_BLOCK_MASK = "kernel/block-mask"  # the key of a forward's block masks in the context's shared dict


def block_mask(hooks: Hooks, B: int, H: int, Tq: int, Tk: int, device: torch.device):
    """The composed mask as flex_attention's BlockMask (masked blocks skipped). The causal mask alone comes from a
    bounded cache by shape; with an arm's mask or documents it is built once per forward and shape and kept in the
    context's shared dict, so every layer of that forward gets the same one (an arm's mask is one function in all
    layers)."""
    from torch.nn.attention.flex_attention import create_block_mask  # flex path only

    offset = Tk - Tq
    if hooks.mask is None and hooks.context.documents is None:
        key = (Tq, Tk, str(device))
        if key not in _CAUSAL_BLOCK_MASKS:  # building one costs more than a layer's attention
            _CAUSAL_BLOCK_MASKS[key] = create_block_mask(mask_of(None, offset), None, None, Tq, Tk, device=device)
            while len(_CAUSAL_BLOCK_MASKS) > CAUSAL_BLOCK_MASK_CACHE:
                _CAUSAL_BLOCK_MASKS.popitem(last=False)
        _CAUSAL_BLOCK_MASKS.move_to_end(key)
        return _CAUSAL_BLOCK_MASKS[key]
    masks = hooks.context.shared.setdefault(FORWARD_BLOCK_MASK, {})
    key = (B, H, Tq, Tk)
    if key not in masks:
        masks[key] = create_block_mask(mask_of(hooks.mask, offset, hooks.context.documents), B, H, Tq, Tk,
                                       device=device)
    return masks[key]


def _flex(q, k, values, sink, log_gate, bias, hooks: Hooks, *, compiled: bool | None = None) -> torch.Tensor:
    """Compiled flex_attention (CUDA): the score modifier, routing gate and score bias in one score_mod, the
    composed mask as a block mask (`block_mask`); the phantom key as o·σ(lse − b_h) (Σ_j e^l_ij / (e^b + Σ_j e^l_ij)
    = σ(lse − b)); a normaliser given as an elementwise log-weight log p as o·exp(lse) (flex normalises; its lse
    undoes it). The lse is requested only for those two. `compiled` defaults to q's device being CUDA; eager on a
    CPU (the check's forward: PyTorch 2.13 has no flex backward on a CPU)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention  # flex path only

    if compiled is None:
        compiled = q.is_cuda

    n_head, n_kv = q.shape[1], k.shape[1]
    groups = n_head // n_kv
    Tq, Tk = q.shape[2], k.shape[2]
    arm_mod, log_weight = hooks.score_mod, hooks.log_weight

    def score_mod(score, b, h, q_idx, kv_idx):
        if arm_mod is not None:
            score = arm_mod(score, b, h, q_idx, kv_idx)
        if log_gate is not None:
            score = score + log_gate[b, h // groups, kv_idx]
        if bias is not None:
            score = score + bias[h, q_idx, kv_idx]
        if log_weight is not None:
            score = log_weight(score, b, h, q_idx, kv_idx)
        return score

    if compiled and _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    kernel = _COMPILED_FLEX if compiled else flex_attention
    need_lse = log_weight is not None or sink is not None
    # One dtype for q, k, v (flex_attention is not an autocast op: a gate may have promoted the values to float32).
    out = kernel(q, k.to(q.dtype), values.to(q.dtype), score_mod=score_mod,
                 block_mask=block_mask(hooks, q.shape[0], n_head, Tq, Tk, q.device),
                 scale=1.0 / math.sqrt(q.shape[-1]), enable_gqa=groups > 1,
                 return_aux=AuxRequest(lse=True) if need_lse else None)
    if not need_lse:
        return out
    o, aux = out
    lse = aux.lse.to(o.dtype)  # (B, H, Tq), natural log
    if log_weight is not None:
        o = o * torch.exp(lse).unsqueeze(-1)
    if sink is not None:
        o = o * torch.sigmoid(lse - sink.to(o.dtype).view(1, n_head, 1)).unsqueeze(-1)
    return o
