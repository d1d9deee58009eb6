"""What an arm is, and the registry that names arms.

An arm fills one or more *slots* of the one attention computation (each arm is a choice per slot):

* value slot      `value_gate(v, x) -> g`, per key, multiplies the read: v_j ← g_j v_j (cacheable)
* routing slot    `routing_log_gate(v, x) -> log g`, per key, added to the logits inside the softmax
* denominator slot `sink_logit() -> b`, per head, a phantom key with logit b_h and value exactly 0
* output slot     `output_gate(o, x) -> g`, per query, multiplies the attention output o_i
* query-key slot  `query_key(q, k) -> (q, k)`, per position, transforms the projections before RoPE and the
                  scores (QK-norm, a temperature); it must act on each position alone, so keys stay cacheable
* score-bias slot `score_bias(query_pos, key_pos) -> bias`, (H, Tq, Tk): an additive logit per head for
                  each (query, key) pair, from their positions (ALiBi); positions count the sink token too

`v` is the read (B, H_kv, T, d) after any junk injection and before any gate; `x` is the pre-normed
hidden state entering the attention layer (B, T, C). A slot an arm does not override is unused.

Beside the slots, four *hooks* for what no slot can say; only they receive the per-forward `AttentionContext`
(x, query and key positions, the training length, a dict shared across the layers of one forward, a state
kept across decoding calls):

* score modifier  `score_modifier(context) -> mod`, mod(score, b, h, q_idx, kv_idx) -> score (FlexAttention's
                  signature), applied to s·q·k before the routing gate, the score bias, the mask and the phantom
* normaliser      `normalise(logits, context) -> weights` (B, H, Tq, Tk), replacing softmax over the masked
                  logits (−inf where a query may not look); `normaliser_log_weight(context) -> mod` optionally
                  gives the same weights elementwise as log p, so flex_attention can run it on a GPU
* override        `attend(q, k, v, context, core) -> o`, the whole attention; `core(q, k, v) -> o` is the kernel
                  with the arm's slots (fused in training, exact on the reference path, cached when decoding)
* mask            `mask_modifier(context) -> mask`, mask(b, h, q_idx, kv_idx) -> bool (FlexAttention's mask_mod;
                  True: may attend); the kernel composes it with the causal mask in one place (`kernel.mask_of`),
                  so it can only take keys away. An arm states the largest position constant it uses (a window)
                  as the class attribute `window`, so the check decodes far enough to see it.

An arm with a score modifier or a normaliser trains on the reference path on a CPU (O(T²) per layer) and through
compiled flex_attention on CUDA; slot-only and override arms keep the fused path (`Arm.path`). A mask alone keeps
the fused path on a CPU (SDPA with a boolean mask) and takes flex_attention with a block mask on CUDA, so masked
blocks are skipped. An arm whose state
a KV cache cannot hold says why in `no_decoding`, and decoding refuses it in one line.
A *sequence* arm (sink-token) sets `sequence_token = True` and the model prepends a learned token.
An *example* arm (`example = True`: qk-norm, temperature, alibi) is registered and listed like any
other but is not one of the study's: an experiment's `arms="all"` leaves it out.

One instance per layer. Parameters an arm owns are initialised by `init_parameter` from a generator
keyed by (seed, full parameter name), so adding an arm never shifts another parameter's draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
from torch import nn

from ablate.arms.source import compute_identity, registering_file
from ablate.errors import choice_error

SLOTS = ("value", "routing", "denominator", "output", "query-key", "score-bias")
_SLOT_METHODS = {
    "value": "value_gate",
    "routing": "routing_log_gate",
    "denominator": "sink_logit",
    "output": "output_gate",
    "query-key": "query_key",
    "score-bias": "score_bias",
}

HOOKS = ("score-modifier", "normaliser", "override", "mask")
_HOOK_METHODS = {"score-modifier": "score_modifier", "normaliser": "normalise", "override": "attend",
                 "mask": "mask_modifier"}
PATHS = ("fused", "reference", "flex")

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # True: may attend


@dataclass(frozen=True)
class ArmContext:
    """The shape of the attention layer an arm lives in."""

    n_head: int
    n_kv_head: int
    head_dim: int
    d_model: int
    n_layer: int
    layer: int


@dataclass
class AttentionContext:
    """What the hooks see of one forward of one layer (the slots never see it).

    Positions count the sink token and the decoding offset: query t of this call sits at query_pos[t], and the
    keys it may see are key_pos (0 … Tk−1, the cached ones included). A score modifier receives q_idx, kv_idx as
    indices into these (FlexAttention's), so per-position tensors it closes over are indexed by them.
    """

    x: torch.Tensor  # (B, Tq, C) the pre-normed hidden state of this call's positions
    query_pos: torch.Tensor  # (Tq,) long
    key_pos: torch.Tensor  # (Tk,) long
    train_len: int  # the model's training sequence length (GPTConfig.max_seq_len)
    shared: dict = field(default_factory=dict)  # lives for one forward, across the layers (cross-layer state)
    state: dict = field(default_factory=dict)  # this layer's (and core call's) state, kept across decoding calls
    decoding: bool = False  # True when a KV cache holds earlier positions
    # (B, Tk) the document of every key position (cached ones included) under a document mask, −1 for a position
    # every document sees (the sink token); None without one. The kernel composes it into the mask (`mask_of`).
    documents: torch.Tensor | None = None

    @classmethod
    def full(cls, x: torch.Tensor, train_len: int | None = None, shared: dict | None = None) -> "AttentionContext":
        """The context of a whole sequence from position 0 (training, tests)."""
        positions = torch.arange(x.shape[1], device=x.device)
        return cls(x, positions, positions, train_len or x.shape[1], {} if shared is None else shared)


class Arm(nn.Module):
    name: ClassVar[str] = ""  # set by @register_arm
    description: ClassVar[str] = ""
    sequence_token: ClassVar[bool] = False
    example: ClassVar[bool] = False  # a registered example outside the study (left out of arms="all")
    # Local parameter names kept out of weight decay; unioned over base classes, so a combo inherits them.
    no_weight_decay: ClassVar[frozenset[str]] = frozenset()
    # Why a KV cache cannot decode this arm (state the cache does not hold); empty: it can.
    no_decoding: ClassVar[str] = ""
    # The synthetic tasks (`ablate.tiers.TASKS`) whose tiers alone the arm runs on; empty: any tier. A run of it at
    # another tier is refused in one line before it starts (`ablate.config.resolve_config`).
    only_tasks: ClassVar[tuple[str, ...]] = ()
    # The largest position constant the arm uses (a sliding window's width); the check decodes at least twice it.
    window: ClassVar[int | None] = None

    def __init__(self, ctx: ArmContext):
        super().__init__()
        self.ctx = ctx

    # --- slots: override the ones the arm fills ---
    def value_gate(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def routing_log_gate(self, v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def sink_logit(self) -> torch.Tensor:
        raise NotImplementedError

    def output_gate(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def query_key(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def score_bias(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # --- hooks: given the per-forward context ---
    def score_modifier(self, context: AttentionContext) -> ScoreMod:
        raise NotImplementedError

    def normalise(self, logits: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        raise NotImplementedError

    def normaliser_log_weight(self, context: AttentionContext) -> ScoreMod | None:
        """Optional: the normaliser as an elementwise log-weight (no normalisation), for flex_attention on CUDA."""
        return None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: AttentionContext,
               core: Callable[..., torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def mask_modifier(self, context: AttentionContext) -> MaskMod:
        raise NotImplementedError

    def init_parameter(self, name: str, param: torch.Tensor, generator: torch.Generator) -> None:
        """Set `param` (local name, e.g. 'tau') to its initial value; every arm with parameters overrides this."""
        raise NotImplementedError(f"arm {self.name!r} does not say how to initialise {name!r}")

    @classmethod
    def slots(cls) -> tuple[str, ...]:
        return tuple(s for s in SLOTS if getattr(cls, _SLOT_METHODS[s]) is not getattr(Arm, _SLOT_METHODS[s]))

    @classmethod
    def has_slot(cls, slot: str) -> bool:
        return slot in cls.slots()

    @classmethod
    def hooks(cls) -> tuple[str, ...]:
        return tuple(h for h in HOOKS if getattr(cls, _HOOK_METHODS[h]) is not getattr(Arm, _HOOK_METHODS[h]))

    @classmethod
    def has_hook(cls, hook: str) -> bool:
        return hook in cls.hooks()

    @classmethod
    def path(cls, device_type: str = "cpu") -> str:
        """The training path: 'fused' (SDPA) for slot-only and override arms; for an arm with a score modifier or
        a normaliser, 'flex' (compiled flex_attention) on CUDA and 'reference' (materialised, O(T²)) elsewhere —
        PyTorch 2.13's flex_attention has no backward on a CPU. A mask alone: 'fused' on a CPU (SDPA with a
        boolean mask), 'flex' on CUDA (a block mask skips the masked blocks)."""
        hooked = cls.has_hook("score-modifier") or cls.has_hook("normaliser")
        flexible = not cls.has_hook("normaliser") or cls.normaliser_log_weight is not Arm.normaliser_log_weight
        if not hooked:
            return "flex" if device_type == "cuda" and cls.has_hook("mask") else "fused"
        return "flex" if device_type == "cuda" and flexible else "reference"

    @classmethod
    def no_decay_names(cls) -> frozenset[str]:
        names: set[str] = set()
        for klass in cls.__mro__:
            names |= set(vars(klass).get("no_weight_decay", ()))
        return frozenset(names)


_REGISTRY: dict[str, type[Arm]] = {}


def register_arm(name: str, *, replace: bool = False) -> Callable[[type[Arm]], type[Arm]]:
    """Class decorator: `@register_arm("my-arm") class MyArm(Arm): ...` — from any module."""

    def decorate(cls: type[Arm]) -> type[Arm]:
        if not (isinstance(cls, type) and issubclass(cls, Arm)):
            raise TypeError(f"@register_arm({name!r}) needs a subclass of ablate.arms.Arm, got {cls!r}")
        old = _REGISTRY.get(name)
        # The same file executed again (an experiment loaded by `arms` and then `plan` in one process)
        # defines a new class of the same module and name: that is the same arm, not a clash.
        reloaded = old is not None and (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
        if old is not None and old is not cls and not (replace or reloaded):
            raise ValueError(f"an arm named {name!r} is already registered ({_REGISTRY[name].__qualname__})")
        if cls.sequence_token and (cls.slots() or cls.hooks()):
            raise TypeError(f"arm {name!r}: a sequence-token arm fills no attention slot or hook")
        if cls.has_hook("normaliser") and cls.has_slot("denominator"):
            raise TypeError(f"arm {name!r}: the normaliser hook (normalise) replaces the softmax whose denominator "
                            "the denominator slot (sink_logit) adds to; fill one of them")
        _refuse_ambiguous_composition(name, cls)
        cls.name = name
        cls.registered_in = registering_file()
        cls.arm_identity = compute_identity(cls)  # the code it runs, as imported: each run's arm identity
        _REGISTRY[name] = cls
        return cls

    return decorate


def _refuse_ambiguous_composition(name: str, cls: type[Arm]) -> None:
    """Composition is explicit: where two bases fill one slot or hook differently, the class must define it itself
    (Python's method order would otherwise pick one silently). One line naming the bases and the slot."""
    for kind, methods in (("slot", _SLOT_METHODS), ("hook", _HOOK_METHODS)):
        for label, method in methods.items():
            if method in vars(cls):
                continue
            fillers: dict = {}  # the base's implementation → the bases that bring it
            for base in cls.__bases__:
                found = getattr(base, method, None)
                if found is not None and found is not getattr(Arm, method):
                    fillers.setdefault(found, []).append(base.__qualname__)
            if len(fillers) > 1:
                bases = ", ".join(b for group in fillers.values() for b in group)
                raise TypeError(f"arm {name!r}: bases {bases} each fill the {label} {kind} ({method}); define "
                                f"{method} in {cls.__qualname__} to say how they compose")


def get_arm(name: str) -> type[Arm]:
    if name not in _REGISTRY:
        raise choice_error("arm", name, _REGISTRY)
    return _REGISTRY[name]


def list_arms() -> list[str]:
    """Registered arm names in registration order (built-ins first, in the study's order, then the examples)."""
    return list(_REGISTRY)


def study_arms() -> list[str]:
    """What an experiment's `arms="all"` means: every registered arm but the examples (`Arm.example`)."""
    return [name for name, cls in _REGISTRY.items() if not cls.example]
