"""Registered examples outside the study: arms that touch the scores through the query-key and score-bias
slots. `ablate arms` lists them and any experiment may name them; `arms="all"` leaves them out (`example`).

* qk-norm      per-head RMSNorm of q and k over the head dimension, a learned weight (d) each, before RoPE
* temperature  a learned temperature per query head: l_ij = s·q_i·k_j / T_h
* alibi        ALiBi's fixed per-head distance penalty, l_ij += −m_h (i − j), on top of RoPE

Logit soft-capping (Gemma 2's l ← c·tanh(l/c)) is a nonlinear function of the scores themselves, which neither
slot can express (the query-key slot acts before the dot product; the score bias is added independently of it,
as SDPA's additive mask is): it is a score modifier, one of the hook examples of `ablate.arms.papers`,
registered after these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import ablate.arms.builtin  # noqa: F401  (the study's arms register first, in its order)
from ablate.arms.base import Arm, ArmContext, register_arm

QK_NORM_EPS = 1e-6  # the model's RMSNorm epsilon, and OLMo 2's


@register_arm("qk-norm")
class QKNorm(Arm):
    description = "query-key slot: per-head RMSNorm of q and k over the head dim (learned weight each), before RoPE"
    example = True
    no_weight_decay = frozenset({"q_norm_weight", "k_norm_weight"})  # norm weights, like the model's own

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        # One weight over the head dimension, shared by the heads (OLMo-core's head-wise QK-norm, Qwen3's), rather
        # than OLMo 2's norm over the whole projection: a per-head norm leaves each head's scale to that head.
        self.q_norm_weight = nn.Parameter(torch.empty(ctx.head_dim))
        self.k_norm_weight = nn.Parameter(torch.empty(ctx.head_dim))

    def query_key(self, q, k):
        d = (self.ctx.head_dim,)
        return F.rms_norm(q, d, self.q_norm_weight, QK_NORM_EPS), F.rms_norm(k, d, self.k_norm_weight, QK_NORM_EPS)

    def init_parameter(self, name, param, generator):
        if name in ("q_norm_weight", "k_norm_weight"):
            nn.init.ones_(param)
        else:
            super().init_parameter(name, param, generator)


@register_arm("temperature")
class Temperature(Arm):
    description = "query-key slot: a learned temperature per query head, l_ij = s·q_i·k_j / exp(t_h)"
    example = True
    no_weight_decay = frozenset({"log_temperature"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.log_temperature = nn.Parameter(torch.empty(ctx.n_head))  # t_h; T_h = exp(t_h) > 0

    def query_key(self, q, k):
        return q * torch.exp(-self.log_temperature).view(1, -1, 1, 1), k  # on the query heads: exact under GQA

    def init_parameter(self, name, param, generator):
        if name == "log_temperature":
            nn.init.zeros_(param)  # T_h = 1: the baseline at the start
        else:
            super().init_parameter(name, param, generator)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """m_h = 2^(−8h/H), h = 1 … H: ALiBi's geometric slopes (its formula for H a power of two, used for any H)."""
    return torch.pow(2.0, -8.0 * torch.arange(1, n_head + 1, dtype=torch.float64) / n_head)


@register_arm("alibi")
class Alibi(Arm):
    description = "score-bias slot: ALiBi's fixed distance penalty −m_h (i − j), m_h = 2^(−8h/H), on top of RoPE"
    example = True

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.register_buffer("slopes", alibi_slopes(ctx.n_head).float(), persistent=False)  # fixed, not learned

    def score_bias(self, query_pos, key_pos):
        distance = (query_pos.unsqueeze(1) - key_pos.unsqueeze(0)).to(self.slopes.dtype)  # (Tq, Tk), i − j
        return -self.slopes.view(-1, 1, 1) * distance  # (H, Tq, Tk)


import ablate.arms.papers  # noqa: E402, F401  (the hook examples register after these, in this order)
