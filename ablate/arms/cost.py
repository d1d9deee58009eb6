"""What an arm's attention costs in memory per (B, H, T, T) element, measured on a small CPU probe.

An arm on the reference path materialises (B, H, T, T) tensors in every layer; how many, and how many of them the
backward pass keeps, depends on the arm (a normaliser's cumulative sums, a score modifier's saved inputs). The probe
runs the kernel (`ablate.arms.kernel.attention`) for one layer of the arm at three small lengths (T, 2T, 4T) in
float32 on a CPU, on the path the arm takes on CUDA, and counts

* saved: the bytes the autograd graph keeps for the backward pass (`torch.autograd.graph.saved_tensors_hooks`,
  each storage once), and
* allocated: the bytes the forward's or the backward's operators allocate (a `TorchDispatchMode` adding up every
  operator's outputs, each storage once; the larger pass), an upper bound on one layer's working set,

and takes the T² coefficient of each (a quadratic through the three lengths: the O(T) inputs and outputs drop
out), at B = 1 and B = 2: the difference over H is the bytes per (B, H, T, T) element, and what is left at B = 1 the
bytes per (T, T) element that do not grow with the batch or the heads (the composed mask, a bias shared by the
batch). An arm on the fused or flex path on CUDA keeps no (B, H, T,
T) tensor there (flash or flex kernels keep O(T) statistics): its factors are 0 by path, not probed.

dtype: the probe runs float32. A GPU run's bf16 autocast makes the score matmul's output bf16 (half the bytes) and
keeps the softmax and most elementwise work in float32, so the float32 factor is an upper bound for bf16 and the
plan sizes with it as measured (between 0.5× and 1× of it is what bf16 keeps).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate.arms.base import ArmContext, AttentionContext, get_arm
from ablate.arms.kernel import attention

# The sizing constant before the probe, and what a plan falls back to when a probe cannot run: 3 saved and 4 working
# float32 (B, H, T, T) tensors per layer.
FALLBACK_SAVED = 3 * 4
FALLBACK_ALLOCATED = 4 * 4
PROBE_LENGTHS = (32, 64, 128)
PROBE_HEADS, PROBE_HEAD_DIM = 2, 16


@dataclass(frozen=True)
class AttentionCost:
    """Bytes per (B, H, T, T) element of one layer of an arm's attention on `path` (its CUDA path)."""

    arm: str
    path: str  # the path the arm trains on, on the device planned (`Arm.path`: CUDA unless a CPU shape is planned)
    saved: float  # bytes kept for the backward pass per element (float32; the bf16 figure is at most this)
    allocated: float  # bytes allocated by the larger of the forward and backward pass per element
    source: str  # "measured", "path" (fused/flex: none), or "fallback: <why the probe could not run>"
    saved_shared: float = 0.0  # bytes per (T, T) element kept whatever B and H (the mask)
    allocated_shared: float = 0.0

    def bytes(self, rows: int, heads: int, seq_len: int) -> tuple[int, int]:
        """(saved, allocated) bytes of one layer for `rows` sequences of `seq_len` with `heads` heads."""
        square = seq_len * seq_len
        return (int((self.saved * rows * heads + self.saved_shared) * square),
                int((self.allocated * rows * heads + self.allocated_shared) * square))

    @property
    def note(self) -> str:
        """One line on where the factors come from."""
        if self.source == "path":
            return f"{self.arm}: {self.path} path, no (B, H, T, T) tensor"
        if self.source == "measured":
            return (f"{self.arm}: reference path, measured {self.saved:.1f} bytes saved and {self.allocated:.1f} "
                    "allocated per (B, H, T, T) element per layer (float32 CPU probe)")
        return (f"{self.arm}: probe could not run ({self.source.removeprefix('fallback: ')}); sized at "
                f"{FALLBACK_SAVED} saved + {FALLBACK_ALLOCATED} working bytes per element")


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


def probe_bytes(name: str | type, T: int, B: int = 1, path: str = "reference") -> tuple[int, int]:
    """(bytes saved for the backward pass, bytes allocated by the larger pass) of one layer of arm `name` (or its
    class) at length T on `path`, float32 on a CPU."""
    arm_class = get_arm(name) if isinstance(name, str) else name
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
        o, _ = attention(arm, q, k, v, x, context=AttentionContext.full(x), fused=path)
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
def reference_factors(arm_class: type) -> tuple[tuple[float, float, float, float], str]:
    """((saved, allocated, saved_shared, allocated_shared) bytes per element, source) of the arm's whole-row
    reference path, probed once per class on a CPU, isolated from the caller (it may run inside a training step:
    gradients on, no inference mode, no autocast, the caller's random state untouched)."""
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad(), \
                torch.autocast("cpu", enabled=False):
            one, two = ([probe_bytes(arm_class, T, B) for T in PROBE_LENGTHS] for B in (1, 2))
    except Exception as err:  # a user's arm that fails at the probe's shape: said in one line, sized by the constant
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
        return (float(FALLBACK_SAVED), float(FALLBACK_ALLOCATED), 0.0, 0.0), f"fallback: {why}"
    factors = []
    for which in (0, 1):  # saved, allocated
        at_one, at_two = (_square_coefficient([c[which] for c in counts]) for counts in (one, two))
        per = max((at_two - at_one) / PROBE_HEADS, 0.0)
        factors += [per, max(at_one - per * PROBE_HEADS, 0.0)]
    return (factors[0], factors[2], factors[1], factors[3]), "measured"


def block_bytes(arm_class: type, dtype: torch.dtype = torch.float32) -> float:
    """Bytes one (B, H, block, T) element of a block of the blocked reference path takes while the block is
    computed and differentiated: the arm's measured saved + allocated bytes per element (float32), doubled for a
    float64 call; a bf16 or float16 call is sized as float32 (its softmax and most elementwise work stay float32)."""
    (saved, allocated, _, _), _ = reference_factors(arm_class)
    return (saved + allocated) * max(torch.empty((), dtype=dtype).element_size(), 4) / 4


def _measured(name: str, arm_class: type, device: str) -> AttentionCost:
    path = arm_class.path(device)
    if path != "reference":
        return AttentionCost(name, path, 0.0, 0.0, "path")
    (saved, allocated, saved_shared, allocated_shared), source = reference_factors(arm_class)
    return AttentionCost(name, path, saved, allocated, source, saved_shared, allocated_shared)


def attention_cost(name: str, device: str = "cuda") -> AttentionCost:
    """The arm's measured cost on the path it takes on `device` ("cuda", or "cpu" to plan a CPU shape), cached per
    registered class (an arm re-registered by a reloaded file is probed again)."""
    return _measured(name, get_arm(name), device)
