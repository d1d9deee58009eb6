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

import sys
import warnings

import torch
import torch.nn.functional as F

from ablate.arms import attention
from ablate.data.valuejunk import JunkPlan, ValueJunkTask, content_markers, junk_plan, marker_directions
from ablate.model import GPT, CausalSelfAttention, GPTConfig


class StrictCausalAttention(CausalSelfAttention):
    """Causal self-attention in which position i reads positions j < i (not itself); no KV cache."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__(config, layer)
        if self.arm.has_slot("output"):  # its gate would read the key positions' hidden states, not the query's
            raise ValueError(f"arm {config.arm!r} has an output gate, which the strict-causal task model does not "
                             "support; use an arm without an output slot on this tier")

    def forward(self, x, cos, sin, cache=None, offset=0, record=False, shared=None, documents=None):
        if cache is not None:
            raise ValueError("the strict-causal task model has no KV-cache decoding")
        if documents is not None:
            raise ValueError("the strict-causal task model has no documents (a task tier refuses --document-mask)")
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


class ValueJunkAttention(StrictCausalAttention):
    """Strictly-earlier attention whose junk reads (the batch's `JunkPlan`, set by `ValueJunkGPT`) are replaced,
    after the value projection and before any gate sees them, by the decoy's read plus the marker ε·median·u.
    Queries and keys are computed from the real tokens: routing never sees the junk."""

    def __init__(self, config: GPTConfig, layer: int, dose: float):
        super().__init__(config, layer)
        self.dose = dose
        self.plan: JunkPlan | None = None  # this forward's junk
        self.decoy_x: torch.Tensor | None = None  # (B, T, C) the decoys' pre-normed hidden states
        self.directions: torch.Tensor | None = None  # junk "direction"'s (Hkv, d) fixed markers, "content"'s per value

    def projected(self, x, cos, sin):
        q, k, v = super().projected(x, cos, sin)
        if self.plan is None:
            raise ValueError("the value-junk attention needs its batch's junk plan (ValueJunkGPT.forward sets it)")
        B, T = x.shape[:2]
        pad = T - self.plan.mask.shape[1]  # a prepended sink token is never junk
        mask = F.pad(self.plan.mask, (pad, 0))
        rows = self.c_attn.weight[(self.n_head + self.n_kv_head) * self.head_dim:]  # W_v
        decoy = F.linear(F.pad(self.decoy_x, (0, 0, pad, 0)), rows).view(B, T, self.n_kv_head, self.head_dim)
        if self.plan.directions is not None:  # junk "norm", "content": a unit direction per read and head
            directions = F.pad(self.plan.directions, (0, 0, 0, 0, pad, 0)).transpose(1, 2)  # (B, Hkv, T, d)
        else:
            directions = self.directions.view(1, self.n_kv_head, 1, self.head_dim)
        median = v.detach().norm(dim=-1).transpose(0, 1).reshape(self.n_kv_head, -1).median(dim=1).values
        marker = self.dose * median.view(1, -1, 1, 1) * directions.to(device=v.device, dtype=v.dtype)
        junk = mask[:, None, :, None]
        if hands_junk_mask(self.arm):  # the testbed's oracle gate reads the same mask (`ablate.arms.testbed`)
            self.arm.junk_mask = mask
        return q, k, torch.where(junk, decoy.transpose(1, 2) + marker, v)


def hands_junk_mask(arm) -> bool:
    """Whether the value-junk attention hands `arm` the batch's ground-truth junk mask: only the oracle control's
    own class (`ablate.arms.testbed.OracleGate`, not a subclass, not an arm that merely has a `junk_mask`
    attribute), so that no arm of one's own can read the answer. A run whose arm received it records
    `received_junk_mask` in its summary (`ablate.taskrun`). Looked up, not imported: importing it registers it."""
    oracle = sys.modules.get("ablate.arms.testbed")
    return oracle is not None and type(arm) is oracle.OracleGate


class ValueJunkGPT(GPT):
    """The one-layer, strictly-earlier GPT of the value-junk task (`ablate.data.valuejunk`): each forward draws
    the batch's junk plan from its tokens and hands it to the attention layer. Its parameters are the GPT's, so
    its saved weights load as the strict-causal model (without the task's junk, which is the data's, not the
    weights')."""

    def __init__(self, config: GPTConfig, task):
        if config.n_layer != 1:  # a decoy's read is defined at the first layer only (its token's embedding)
            raise ValueError(f"the value-junk task model has one attention layer, not n_layer={config.n_layer}")
        super().__init__(config)
        self.task = task
        self.blocks[0].attn = ValueJunkAttention(config, 0, task.dose)
        self.init_weights(0)

    def init_weights(self, seed: int) -> None:
        """As the GPT's, and junk "direction"'s fixed markers from the run seed (the same for every arm)."""
        super().init_weights(seed)
        attn = self.blocks[0].attn
        if isinstance(attn, ValueJunkAttention):
            directions = marker_directions(self.task, seed, attn.n_kv_head, attn.head_dim)
            attn.directions = None if directions is None else directions.to(self.wte.weight.device)

    @property
    def hands_junk_mask(self) -> bool:
        """Whether its arm receives the ground-truth junk mask (the oracle control: `hands_junk_mask`)."""
        return hands_junk_mask(self.blocks[0].attn.arm)

    def forward(self, idx, targets=None, **kwargs):
        attn = self.blocks[0].attn
        attn.plan = junk_plan(self.task, idx, attn.n_kv_head, attn.head_dim)
        if self.task.junk == "content":  # a marker per read, its decoy value's
            attn.plan.directions = content_markers(self.task, attn.plan.decoys, attn.directions)
        attn.decoy_x = self.blocks[0].ln_1(self.wte(attn.plan.decoys))
        try:
            return super().forward(idx, targets, **kwargs)
        finally:
            attn.plan = attn.decoy_x = None


def task_model(config: GPTConfig, task) -> GPT:
    """The GPT of `config` for `task`: with strictly-earlier attention when the task asks for it, and the value
    junk of the value-junk task."""
    if isinstance(task, ValueJunkTask):
        with warnings.catch_warnings():  # an attention-only model (mlp_ratio 0) has MLP matrices of no elements
            warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
            return ValueJunkGPT(config, task)
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
