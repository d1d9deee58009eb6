"""What an arm's slot or hook returns, checked where it returns: a wrong shape is one line naming the arm, its layer,
the slot or hook and the shape expected (docs/arms.md's table) against the shape that came, instead of a
broadcasting error deep in the kernel that names neither.

The shape checks are always on (they compare tuples; nothing reads the device). The finiteness checks run only
inside `finite_checks()`, as the replay of a diverged run does (`ablate.replay`): the first slot or hook that returns
a non-finite value raises `NonFinite`, naming the arm, the layer and the method.
"""

from __future__ import annotations

import contextlib

import torch

from ablate.errors import AblateError

# method → (the slot or hook it fills, its signature as docs/arms.md writes it)
METHODS = {
    "value_gate": ("value slot", "value_gate(v, x)"),
    "routing_log_gate": ("routing slot", "routing_log_gate(v, x)"),
    "sink_logit": ("denominator slot", "sink_logit()"),
    "output_gate": ("output slot", "output_gate(o, x)"),
    "query_key": ("query-key slot", "query_key(q, k)"),
    "score_bias": ("score-bias slot", "score_bias(query_pos, key_pos)"),
    "score_modifier": ("score-modifier hook", "score_modifier(context)(score, b, h, q_idx, kv_idx)"),
    "normalise": ("normaliser hook", "normalise(logits, context)"),
    "attend": ("override hook", "attend(q, k, v, context, core)"),
}

_CHECKING = False  # inside `finite_checks` (a plain global: torch.compile guards on it without a graph break)


class ArmOutputError(AblateError):
    """An arm's slot or hook returned the wrong shape (or, under `finite_checks`, a non-finite value)."""


class NonFinite(ArmOutputError):
    """The first non-finite value a slot or hook returned, under `finite_checks`."""

    def __init__(self, message: str, arm: str, layer: int, method: str):
        super().__init__(message)
        self.arm, self.layer, self.method = arm, layer, method


def where(arm, method: str) -> str:
    """`arm 'my-gate', layer 2, value slot value_gate(v, x)`"""
    kind, signature = METHODS[method]
    layer = getattr(getattr(arm, "ctx", None), "layer", None)
    at = f", layer {layer}" if layer is not None else ""
    return f"arm {arm.name or type(arm).__name__!r}{at}, {kind} {signature}"


def _shape(value) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}, not a tensor"


def _refuse(arm, method: str, value, expected: str) -> None:
    raise ArmOutputError(f"{where(arm, method)} returned {_shape(value)}; expected {expected} (the table in "
                         "docs/arms.md)")


def exact(arm, method: str, value, shape: tuple[int, ...], described: str):
    """`value`, if it is a tensor of exactly `shape`; else one line naming the arm, the slot or hook and both."""
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape):
        _refuse(arm, method, value, f"{described} = {tuple(shape)}")
    return finite(arm, method, value)


def broadcast(arm, method: str, value, to: tuple[int, ...], described: str):
    """`value`, if it broadcasts to `to` without widening it (a gate multiplying v, o or the logits)."""
    try:
        fits = isinstance(value, torch.Tensor) and tuple(torch.broadcast_shapes(value.shape, to)) == tuple(to)
    except RuntimeError:
        fits = False
    if not fits:
        _refuse(arm, method, value, f"{described}, broadcastable to {tuple(to)}")
    return finite(arm, method, value)


def pair(arm, returned, q: torch.Tensor, k: torch.Tensor):
    """The query-key slot's (q, k), each of its input's shape."""
    if not (isinstance(returned, tuple) and len(returned) == 2):
        raise ArmOutputError(f"{where(arm, 'query_key')} returned {type(returned).__name__}; expected a pair (q, k) "
                             "of the shapes it was given (the table in docs/arms.md)")
    new_q = exact(arm, "query_key", returned[0], tuple(q.shape), "q (B, H, T, d)")
    return new_q, exact(arm, "query_key", returned[1], tuple(k.shape), "k (B, H_kv, T, d)")


@contextlib.contextmanager
def finite_checks():
    """While inside, every checked slot or hook output must be finite, or `NonFinite` names it."""
    global _CHECKING
    before, _CHECKING = _CHECKING, True
    try:
        yield
    finally:
        _CHECKING = before


def finite(arm, method: str, value):
    if _CHECKING and isinstance(value, torch.Tensor) and value.is_floating_point():
        ok = torch.isfinite(value) | (value == float("-inf")) if method == "score_modifier" else (
            torch.isfinite(value))
        if not bool(ok.all()):
            bad = value[~ok].flatten()[0].item()
            layer = getattr(getattr(arm, "ctx", None), "layer", -1)
            raise NonFinite(f"{where(arm, method)} returned {bad} (first non-finite value)", arm.name, layer, method)
    return value
