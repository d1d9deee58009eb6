"""Registered examples through the hooks, each from its paper (outside the study, like qk-norm):

* softcap         score modifier: l ← c·tanh(l/c), c = `cap` (Gemma 2's 50)
* sigmoid         normaliser: p_ij = σ(l_ij + b), b = −log n, n the training length; no normalisation
                  (Ramapuram et al. 2024)
* diff            override: differential attention (Ye et al. 2024), (A1 − λ A2) v from the two halves of each
                  head's q and k, per-head RMSNorm, times (1 − λ_init)
* forgetting      score modifier: the Forgetting Transformer's decay (Lin et al. 2025), f_t = σ(w_h·x_t + b_h),
                  l_ij += Σ_{t=j+1..i} log f_t
* ssmax           score modifier: scalable softmax (Nakanishi 2025), l_ij ← s_h·log(n_i)·l_ij, n_i the keys query
                  i sees
* value-residual  override: ResFormer's value residual (Zhou et al. 2024), v ← λ₁v + λ₂v⁽¹⁾, v⁽¹⁾ the first
                  layer's values, passed on in the context's shared dict
* sliding-window  mask: query i sees keys j with 0 ≤ i − j < w, w = `window` (64; Mistral, Gemma 2's local layers)
* stick-breaking  normaliser: A_ij = σ(l_ij) Π_{j<k<i} σ(−l_ik), the nearest key first (Tan et al. 2024)
* softpick        normaliser: ReLU(e^l − 1) / (Σ|e^l − 1| + ε) over the keys a query sees (Zuhri et al. 2025)
* selective       normaliser: softmax(l − F), F the ReLU of head 0's logits summed over earlier queries
                  (Leviathan et al. 2024)

Formulas, sources and choices: docs/arms.md. Each is held to its formula, written independently, in
tests/test_arms_papers.py.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ablate.arms.base import Arm, ArmContext, register_arm
from ablate.errors import AblateError

SOFTCAP = 50.0  # Gemma 2's attention logit cap
DIFF_LAMBDA_STD = 0.1  # the Diff Transformer's λ vectors start N(0, 0.1)
DIFF_NORM_EPS = 1e-5  # its per-head RMSNorm's epsilon
FORGET_GATE_STD = 0.02  # w_h like the model's other projections; b_h = 0, so f_t ≈ 0.5 at the start
SSMAX_INIT = 0.43  # s_h at the start: the value of the paper's Figure 1
VALUE_RESIDUAL_INIT = 0.5  # λ₁ = λ₂ = 0.5: ResFormer's fixed mixture, here the start of learned ones


@register_arm("softcap")
class SoftCap(Arm):
    description = "score modifier: logit soft-capping l ← c·tanh(l/c), c = 50 (Gemma 2)"
    example = True
    cap: ClassVar[float] = SOFTCAP

    def score_modifier(self, context):
        cap = self.cap

        def softcap(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)

        return softcap


@register_arm("sigmoid")
class SigmoidAttention(Arm):
    description = "normaliser: p_ij = σ(l_ij − log n), n the training length, no normalisation (Ramapuram et al.)"
    example = True

    def normalise(self, logits, context):
        return torch.sigmoid(logits - math.log(context.train_len))  # σ(−∞) = 0 where the mask is

    def normaliser_log_weight(self, context):
        shift = -math.log(context.train_len)

        def log_sigmoid(score, b, h, q_idx, kv_idx):
            return F.logsigmoid(score + shift)

        return log_sigmoid


def diff_lambda_init(layer: int) -> float:
    """λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) for layer l = 1 … L (`layer` here counts from 0)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def split_rope_pairs(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A head's d channels as two heads of d/2 that keep RoPE whole: the model rotates channel i with i + d/2, so
    the even pairs (i = 0, 2, …) make the first half-head and the odd pairs the second. The first is then exactly
    a d/2 head under RoPE's own frequencies for d/2; the second has the frequencies in between."""
    first, second = t.chunk(2, dim=-1)
    return (torch.cat([first[..., 0::2], second[..., 0::2]], dim=-1),
            torch.cat([first[..., 1::2], second[..., 1::2]], dim=-1))


@register_arm("diff")
class Differential(Arm):
    description = ("override: differential attention (A1 − λA2)v from each head's two q/k halves, per-head RMSNorm "
                   "× (1 − λ_init) (Ye et al.)")
    example = True
    no_weight_decay = frozenset({"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "norm_weight"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        if ctx.head_dim % 4:
            raise AblateError(f"arm 'diff' splits each head's channel pairs in two: head dim {ctx.head_dim} must be a "
                              "multiple of 4")
        half = ctx.head_dim // 2
        self.lambda_q1, self.lambda_k1 = nn.Parameter(torch.empty(half)), nn.Parameter(torch.empty(half))
        self.lambda_q2, self.lambda_k2 = nn.Parameter(torch.empty(half)), nn.Parameter(torch.empty(half))
        self.norm_weight = nn.Parameter(torch.empty(ctx.head_dim))  # the per-head RMSNorm's weight, shared by heads
        self.lambda_init = diff_lambda_init(ctx.layer)

    def mixing(self) -> torch.Tensor:
        """λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init."""
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
                - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)

    def attend(self, q, k, v, context, core):
        (q1, q2), (k1, k2) = split_rope_pairs(q), split_rope_pairs(k)
        o = core(q1, k1, v) - self.mixing() * core(q2, k2, v)  # (B, H, T, d); softmax scale 1/√(d/2)
        return F.rms_norm(o, (self.ctx.head_dim,), self.norm_weight, DIFF_NORM_EPS) * (1 - self.lambda_init)

    def init_parameter(self, name, param, generator):
        if name.startswith("lambda_"):
            nn.init.normal_(param, 0.0, DIFF_LAMBDA_STD, generator=generator)
        elif name == "norm_weight":
            nn.init.ones_(param)
        else:
            super().init_parameter(name, param, generator)


@register_arm("forgetting")
class Forgetting(Arm):
    description = "score modifier: data-dependent decay l_ij += Σ_{t=j+1..i} log σ(w_h·x_t + b_h) (Lin et al., FoX)"
    example = True
    no_weight_decay = frozenset({"gate_b"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.gate_w = nn.Parameter(torch.empty(ctx.n_head, ctx.d_model))  # w_h
        self.gate_b = nn.Parameter(torch.empty(ctx.n_head))  # b_h

    def score_modifier(self, context):
        """c_t = Σ_{t'≤t} log f_t', so Σ_{t=j+1..i} log f_t = c_i − c_j. Decoding keeps the cached keys' c_j in
        the layer's state and continues the sum from the last of them."""
        log_f = F.logsigmoid(torch.einsum("btc,hc->bht", context.x, self.gate_w) + self.gate_b.view(1, -1, 1))
        earlier = context.state.get("cumulative_log_forget")  # (B, H, cached keys), decoding only
        query_sums = log_f.cumsum(-1) if earlier is None else earlier[..., -1:] + log_f.cumsum(-1)
        key_sums = query_sums if earlier is None else torch.cat([earlier, query_sums], dim=-1)
        if context.decoding:
            context.state["cumulative_log_forget"] = key_sums

        def forget(score, b, h, q_idx, kv_idx):
            return score + query_sums[b, h, q_idx] - key_sums[b, h, kv_idx]

        return forget

    def init_parameter(self, name, param, generator):
        if name == "gate_w":
            nn.init.normal_(param, 0.0, FORGET_GATE_STD, generator=generator)
        elif name == "gate_b":
            nn.init.zeros_(param)
        else:
            super().init_parameter(name, param, generator)


@register_arm("ssmax")
class ScalableSoftmax(Arm):
    description = "score modifier: scalable softmax l_ij ← s_h·log(n_i)·l_ij, n_i the keys query i sees (Nakanishi)"
    example = True
    no_weight_decay = frozenset({"scale"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.scale = nn.Parameter(torch.empty(ctx.n_head))  # s_h

    def score_modifier(self, context):
        keys_seen = (context.query_pos + 1).to(self.scale.dtype)  # n_i: positions 0 … i (the sink token counts)
        log_n = torch.log(keys_seen)
        scale = self.scale

        def scalable(score, b, h, q_idx, kv_idx):
            return score * scale[h] * log_n[q_idx]

        return scalable

    def init_parameter(self, name, param, generator):
        if name == "scale":
            nn.init.constant_(param, SSMAX_INIT)
        else:
            super().init_parameter(name, param, generator)


FIRST_VALUES = "value-residual/first-values"  # the key of layer 0's values in the context's shared dict


@register_arm("value-residual")
class ValueResidual(Arm):
    description = "override: v ← λ₁v + λ₂v⁽¹⁾, v⁽¹⁾ the first layer's values from the shared context (ResFormer)"
    example = True
    no_weight_decay = frozenset({"mix"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        # (λ₁, λ₂) per layer after the first; the first layer attends with its own values and passes them on.
        self.mix = nn.Parameter(torch.empty(2)) if ctx.layer > 0 else None

    def attend(self, q, k, v, context, core):
        if self.ctx.layer == 0:
            context.shared[FIRST_VALUES] = v
            return core(q, k, v)
        first = context.shared.get(FIRST_VALUES)
        if first is None:
            raise AblateError(f"arm 'value-residual' at layer {self.ctx.layer}: no first-layer values in the shared "
                              "context; the model's layer 0 puts them there in the same forward")
        return core(q, k, self.mix[0] * v + self.mix[1] * first)

    def init_parameter(self, name, param, generator):
        if name == "mix":
            nn.init.constant_(param, VALUE_RESIDUAL_INIT)
        else:
            super().init_parameter(name, param, generator)


SLIDING_WINDOW = 64  # keys a query sees, itself included


@register_arm("sliding-window")
class SlidingWindow(Arm):
    description = "mask: a hard sliding window, query i sees keys j with 0 ≤ i − j < w, w = 64 (Mistral; Gemma 2)"
    example = True
    window: ClassVar[int] = SLIDING_WINDOW

    def mask_modifier(self, context):
        query_pos, key_pos, window = context.query_pos, context.key_pos, self.window

        def in_window(b, h, q_idx, kv_idx):
            distance = query_pos[q_idx] - key_pos[kv_idx]
            return (distance >= 0) & (distance < window)  # a mask says all it allows: no later key

        return in_window


@register_arm("stick-breaking")
class StickBreaking(Arm):
    description = ("normaliser: stick-breaking A_ij = β_ij Π_{j<k<i} (1 − β_ik), β = σ(l), over earlier keys, "
                   "nearest first (Tan et al.)")
    example = True

    def normalise(self, logits, context):
        """log A_ij = log σ(l_ij) + Σ_{j<k<i} log σ(−l_ik), the sum a reverse cumulative sum over the keys. The query
        does not attend to itself (the authors' `attend_current=False`); a masked key (−∞) breaks nothing off."""
        itself = context.key_pos.view(1, 1, 1, -1) == context.query_pos.view(1, 1, -1, 1)
        logits = logits.masked_fill(itself, float("-inf"))
        log_keep = F.logsigmoid(-logits)  # log(1 − β_ik); 0 where masked
        after = log_keep.flip(-1).cumsum(-1).flip(-1) - log_keep  # Σ_{k > j} log(1 − β_ik)
        return torch.exp(F.logsigmoid(logits) + after)


SOFTPICK_EPS = 1e-6  # ε in the denominator


@register_arm("softpick")
class Softpick(Arm):
    description = ("normaliser: softpick p_ij = ReLU(e^l_ij − 1) / (Σ_j |e^l_ij − 1| + ε), masked keys left out "
                   "(Zuhri et al.)")
    example = True

    def normalise(self, logits, context):
        """Multiplied through by e^−m, m = max(0, max_j l_ij), so no exponential overflows (exact: ε scales too).
        A masked key (−∞) would add |0 − 1| to the denominator: it is left out."""
        shift = logits.amax(-1, keepdim=True).clamp(min=0)
        shifted = torch.exp(logits - shift) - torch.exp(-shift)  # (e^l − 1)·e^−m
        seen = torch.isfinite(logits)
        denominator = torch.where(seen, shifted.abs(), 0.0).sum(-1, keepdim=True) + SOFTPICK_EPS * torch.exp(-shift)
        return F.relu(shifted) / denominator


SELECTIVE_STATE = "selective/mask-sums"  # per key, Σ of S over the queries before this call (decoding)


@register_arm("selective")
class Selective(Arm):
    description = ("normaliser: selective attention, softmax(l − F), F_ij = Σ_{k<i} ReLU(l⁰_kj) from head 0's "
                   "logits, not for key 0 or k = j (Leviathan et al.)")
    example = True

    def normalise(self, logits, context):
        """S_kj = ReLU(l_kj) of head 0 (0 where masked, for the first key and for k = j); F_ij = Σ_{k<i} S_kj over
        earlier queries, those of earlier decoding calls carried per key in the layer's state."""
        query_pos, key_pos = context.query_pos.view(-1, 1), context.key_pos.view(1, -1)
        select = F.relu(logits[:, 0]).masked_fill((key_pos == 0) | (key_pos == query_pos), 0.0)  # (B, Tq, Tk)
        earlier = context.state.get(SELECTIVE_STATE)  # (B, keys of earlier calls)
        carried = select.new_zeros(select.shape[0], select.shape[-1])
        if earlier is not None:
            carried[:, : earlier.shape[-1]] = earlier
        forget = carried.unsqueeze(1) + select.cumsum(1) - select  # Σ over earlier queries, this one excluded
        if context.decoding:
            context.state[SELECTIVE_STATE] = carried + select.sum(1)
        return torch.softmax(logits - forget.unsqueeze(1), dim=-1)
