"""The study's twelve arms, in its order: baseline, abstention (sink-logit, off-by-one, sink-token),
filtering (norm-gate, proj-gate), the renorm control, combinations, and Qiu et al.'s gates.
Each is a few lines: its parameters, their init, its slot(s)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.arms.base import Arm, ArmContext, register_arm

NORM_GATE_BETA = 8.0  # fixed sharpness of the norm gate (the study fixes β, it is not learned)
GATE_OPEN_LOGIT = 4.0  # σ(4) ≈ 0.982: value gates start (nearly) open
QIU_GATE_STD = 0.02  # Qiu et al.'s gate projections start like any other weight (gate ≈ 0.5)


@register_arm("baseline")
class Baseline(Arm):
    description = "softmax attention, unchanged"


@register_arm("sink-logit")
class SinkLogit(Arm):
    description = "phantom key with a learned per-head logit b_h and value exactly 0 (exact abstention)"
    no_weight_decay = frozenset({"sink_bias"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.sink_bias = nn.Parameter(torch.empty(ctx.n_head))  # b_h

    def sink_logit(self) -> torch.Tensor:
        return self.sink_bias

    def init_parameter(self, name, param, generator):
        if name == "sink_bias":
            nn.init.zeros_(param)
        else:
            super().init_parameter(name, param, generator)


@register_arm("off-by-one")
class OffByOne(Arm):
    description = "softmax with +1 in the denominator (a phantom key with logit fixed at 0)"

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.register_buffer("zero_logit", torch.zeros(ctx.n_head), persistent=False)

    def sink_logit(self) -> torch.Tensor:
        return self.zero_logit


@register_arm("sink-token")
class SinkToken(Arm):
    description = "a learned token prepended to every sequence (approximate abstention: its value is learned)"
    sequence_token = True


def norm_gate_logit(v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """β(‖v_j‖/√d − τ_h), shape (B, H, T): rotation-invariant, it cannot pick out coordinates."""
    return NORM_GATE_BETA * (v.norm(dim=-1) / math.sqrt(v.shape[-1]) - tau.view(1, -1, 1))


@register_arm("norm-gate")
class NormGate(Arm):
    description = "value-slot gate σ(β(‖v_j‖/√d − τ_h)), β = 8: filters reads by their norm"
    no_weight_decay = frozenset({"tau"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.tau = nn.Parameter(torch.empty(ctx.n_kv_head))

    def value_gate(self, v, x):
        return torch.sigmoid(norm_gate_logit(v, self.tau)).unsqueeze(-1)  # (B, H, T, 1)

    def init_parameter(self, name, param, generator):
        if name == "tau":
            nn.init.constant_(param, -GATE_OPEN_LOGIT / NORM_GATE_BETA)
        else:
            super().init_parameter(name, param, generator)


@register_arm("proj-gate")
class ProjGate(Arm):
    description = "value-slot gate σ(w_h·v_j + c_h): direction-selective filtering of reads"
    no_weight_decay = frozenset({"gate_w", "gate_c"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.gate_w = nn.Parameter(torch.empty(ctx.n_kv_head, ctx.head_dim))  # w_h
        self.gate_c = nn.Parameter(torch.empty(ctx.n_kv_head))  # c_h

    def value_gate(self, v, x):
        logit = torch.einsum("bhtd,hd->bht", v, self.gate_w) + self.gate_c.view(1, -1, 1)
        return torch.sigmoid(logit).unsqueeze(-1)

    def init_parameter(self, name, param, generator):
        if name == "gate_w":
            nn.init.zeros_(param)
        elif name == "gate_c":
            nn.init.constant_(param, GATE_OPEN_LOGIT)
        else:
            super().init_parameter(name, param, generator)


@register_arm("renorm")
class Renorm(Arm):
    description = "routing-slot control: norm-gate's signal as log g_j inside the softmax (no zero option)"
    no_weight_decay = frozenset({"tau"})

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.tau = nn.Parameter(torch.empty(ctx.n_kv_head))

    def routing_log_gate(self, v, x):
        return F.logsigmoid(norm_gate_logit(v, self.tau))  # log g_j, (B, H, T)

    def init_parameter(self, name, param, generator):
        if name == "tau":
            nn.init.constant_(param, -GATE_OPEN_LOGIT / NORM_GATE_BETA)
        else:
            super().init_parameter(name, param, generator)


@register_arm("combo")
class Combo(SinkLogit, NormGate):
    description = "sink-logit + norm-gate: abstention and norm filtering"


@register_arm("combo2")
class Combo2(SinkLogit, ProjGate):
    description = "sink-logit + proj-gate: abstention and direction-selective filtering"


class _QiuGate(Arm):
    """A sigmoid gate computed from the pre-normed hidden state by a bias-free projection W_θ."""

    def _make_projection(self, out_features: int) -> None:
        self.gate_proj = nn.Linear(self.ctx.d_model, out_features, bias=False)

    def _gate(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = x.shape
        return torch.sigmoid(self.gate_proj(x)).view(B, T, heads, -1).transpose(1, 2)  # (B, heads, T, d or 1)

    def init_parameter(self, name, param, generator):
        if name == "gate_proj.weight":
            nn.init.normal_(param, 0.0, QIU_GATE_STD, generator=generator)
        else:
            super().init_parameter(name, param, generator)


@register_arm("g1-elementwise")
class G1Elementwise(_QiuGate):
    description = "Qiu et al. G1: o_i ⊙ σ(X_i W_θ) after SDPA, one gate per channel (query-dependent)"

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self._make_projection(ctx.n_head * ctx.head_dim)

    def output_gate(self, o, x):
        return self._gate(x, self.ctx.n_head)


@register_arm("g1-headwise")
class G1Headwise(_QiuGate):
    description = "Qiu et al. G1, one scalar gate per head: o_i ⊙ σ(X_i W_θ)_h"

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self._make_projection(ctx.n_head)

    def output_gate(self, o, x):
        return self._gate(x, self.ctx.n_head)


@register_arm("g2-value")
class G2Value(_QiuGate):
    description = "Qiu et al. G2: value gate from the key token's hidden state, v_j ⊙ σ(X_j W_θ)"

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self._make_projection(ctx.n_kv_head * ctx.head_dim)

    def value_gate(self, v, x):
        return self._gate(x, self.ctx.n_kv_head)
