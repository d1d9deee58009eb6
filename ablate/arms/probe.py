"""The CPU probe of an arm's attention memory: one layer of the arm at three small lengths and two batch sizes,
float32, counting the bytes its graph saves for the backward pass (saved-tensor hooks) and the bytes its operators
allocate (a dispatch mode), reduced to bytes per (B, H, T, T) element (`reference_factors`). `ablate.arms.cost`
documents the method and turns the factors into an arm's cost; `ablate.arms.kernel` sizes its query blocks with
them. The kernel's `attention` is passed in, so the kernel can import this module.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate.arms.base import ArmContext, AttentionContext

# The sizing constant before the probe, and what a plan falls back to when a probe cannot run: 3 saved and 4 working
# float32 (B, H, T, T) tensors per layer.
FALLBACK_SAVED = 3 * 4
FALLBACK_ALLOCATED = 4 * 4
PROBE_LENGTHS = (32, 64, 128)
PROBE_HEADS, PROBE_HEAD_DIM = 2, 16


class _Allocations(TorchDispatchMode):
    """Adds up the bytes of every operator's new outputs (a view or an in-place result shares an input's storage
    and is not counted)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = [*args, *(kwargs or {}).values()]
        inputs = {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.untyped_storage().nbytes()
        return out


def probe_bytes(arm_class: type, attend, T: int, B: int = 1, path: str = "reference") -> tuple[int, int]:
    """(bytes saved for the backward pass, bytes allocated by the larger pass) of one layer of `arm_class` at length
    T on `path`, float32 on a CPU, run by `attend` (`ablate.arms.kernel.attention`, passed in: the kernel imports
    this module to choose its block)."""
    arm = arm_class(ArmContext(PROBE_HEADS, PROBE_HEADS, PROBE_HEAD_DIM, PROBE_HEADS * PROBE_HEAD_DIM,
                                   n_layer=2, layer=1)).float()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, PROBE_HEADS, T, PROBE_HEAD_DIM, generator=gen).requires_grad_() for _ in range(3))
    x = torch.randn(B, T, PROBE_HEADS * PROBE_HEAD_DIM, generator=gen).requires_grad_()
    saved: dict[int, int] = {}

    def pack(t):
        saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    forward, backward = _Allocations(), _Allocations()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), forward:
        o, _ = attend(arm, q, k, v, x, context=AttentionContext.full(x), fused=path)
    inputs = [t for t in (q, k, v, x, *arm.parameters()) if t.requires_grad]
    with backward:
        torch.autograd.grad(o, inputs, torch.ones_like(o), allow_unused=True)
    return sum(saved.values()), max(forward.bytes, backward.bytes)


def _square_coefficient(values: list[int], lengths=PROBE_LENGTHS) -> float:
    """The T² coefficient of a quadratic through (T, value) at T, 2T, 4T."""
    t = lengths[0]
    first, second = values[1] - values[0], values[2] - values[1]
    return (second - 2 * first) / (6 * t * t)


@functools.lru_cache(maxsize=None)
def reference_factors(arm_class: type, attend) -> tuple[tuple[float, float, float, float], str]:
    """((saved, allocated, saved_shared, allocated_shared) bytes per element, source) of the arm's whole-row
    reference path, probed once per class on a CPU, isolated from the caller (it may run inside a training step:
    gradients on, no inference mode, no autocast, the caller's random state untouched)."""
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast("cpu", enabled=False):
            one, two = ([probe_bytes(arm_class, attend, T, B) for T in PROBE_LENGTHS] for B in (1, 2))
    except Exception as err:  # a user's arm that fails at the probe's shape: said in one line, sized by the constant
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
        return (float(FALLBACK_SAVED), float(FALLBACK_ALLOCATED), 0.0, 0.0), f"fallback: {why}"
    factors = []
    for which in (0, 1):  # saved, allocated
        at_one, at_two = (_square_coefficient([c[which] for c in counts]) for counts in (one, two))
        per = max((at_two - at_one) / PROBE_HEADS, 0.0)
        factors += [per, max(at_one - per * PROBE_HEADS, 0.0)]
    return (factors[0], factors[2], factors[1], factors[3]), "measured"
