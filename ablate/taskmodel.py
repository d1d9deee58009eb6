"""The model of a task run: the study's GPT, or for a task that asks for it (`strict_causal`) the same GPT whose
attention reads strictly earlier positions.

Why strictly earlier: in a causal model a position always sees itself, and its own read is a fixed place to park
the spare mass of a query that finds nothing (its token's read can be learned to mean "nothing", or be cancelled
by its own embedding in the residual). The stream task (`ablate.data.stream`) removes every such place, so the
query at position i reads keys j < i only: q of positions 1..T−1 against k and v of positions 0..T−2, the same
fused kernel and the arm's slots (`ablate.arms.attention`), shifted by one. Position 0 reads nothing (its output
is zero; it predicts nothing). The parameters, their names and their initialisation are the GPT's, so two arms
of a seed share their common weights as on any tier. A sequence arm's prepended token (sink-token) is an
earlier position of every real one, so it stays a place to park: what the positive control uses.
Limits: an arm with an output gate is refused (its gate would see the key positions' hidden states), and a
score-bias arm's bias, and a hook arm's context (x and positions), are those of the shifted problem (query i + 1
gets the bias of query i: its distances are one short).
"""

from __future__ import annotations

import warnings

import torch

from ablate.arms import attention
from ablate.model import GPT, CausalSelfAttention, GPTConfig


class StrictCausalAttention(CausalSelfAttention):
    """Causal self-attention in which position i reads positions j < i (not itself); no KV cache."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__(config, layer)
        if self.arm.has_slot("output"):  # its gate would read the key positions' hidden states, not the query's
            raise ValueError(f"arm {config.arm!r} has an output gate, which the strict-causal task model does not "
                             "support; use an arm without an output slot on this tier")

    def forward(self, x, cos, sin, cache=None, offset=0, record=False, shared=None):
        if cache is not None:
            raise ValueError("the strict-causal task model has no KV-cache decoding")
        B, T, C = x.shape
        q, k, v = self.projected(x, cos, sin)  # each at its own position
        # Query i + 1 against keys 0..i: the causal kernel on the shifted sequences reads strictly earlier keys. The
        # hooks see that shifted problem (x and positions of 0..T−2), as a score bias does.
        positions = torch.arange(T - 1, device=x.device)
        context = self.hook_context(x[:, :-1], positions, shared)
        y, rec = attention(self.arm, q[:, :, 1:], k[:, :, :-1], v[:, :, :-1], x[:, :-1],
                           fused=self.fused and not record, context=context)
        y = torch.cat([torch.zeros_like(y[:, :, :1]), y], dim=2)  # position 0 reads nothing
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)), rec


def task_model(config: GPTConfig, task) -> GPT:
    """The GPT of `config` for `task`: with strictly-earlier attention when the task asks for it."""
    return built_model(config, strict_causal=getattr(task, "strict_causal", False))


def is_strict_causal(model: GPT) -> bool:
    """Whether the model reads strictly earlier positions (what its saved weights must say, to be loaded as such)."""
    return any(isinstance(block.attn, StrictCausalAttention) for block in model.blocks)


def built_model(config: GPTConfig, strict_causal: bool) -> GPT:
    with warnings.catch_warnings():  # an attention-only model (mlp_ratio 0) has MLP matrices of no elements
        warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
        model = GPT(config)
    if strict_causal:
        for layer, block in enumerate(model.blocks):
            block.attn = StrictCausalAttention(config, layer)
        model.init_weights(0)  # as GPT() leaves a model: every parameter drawn by its name
    return model
