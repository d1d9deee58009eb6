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

from ablate.arms import probe
from ablate.arms.base import get_arm
from ablate.arms.kernel import attention
from ablate.arms.probe import FALLBACK_ALLOCATED, FALLBACK_SAVED, reference_factors


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


def probe_bytes(name: str, T: int, B: int = 1, path: str = "reference") -> tuple[int, int]:
    """(bytes saved for the backward pass, bytes allocated by the larger pass) of one layer of arm `name` at length
    T on `path`, float32 on a CPU (`ablate.arms.probe.probe_bytes`)."""
    return probe.probe_bytes(get_arm(name), attention, T, B, path)


@functools.lru_cache(maxsize=None)
def _measured(name: str, arm_class: type, device: str) -> AttentionCost:
    path = arm_class.path(device)
    if path != "reference":
        return AttentionCost(name, path, 0.0, 0.0, "path")
    (saved, allocated, saved_shared, allocated_shared), source = reference_factors(arm_class, attention)
    return AttentionCost(name, path, saved, allocated, source, saved_shared, allocated_shared)


def attention_cost(name: str, device: str = "cuda") -> AttentionCost:
    """The arm's measured cost on the path it takes on `device` ("cuda", or "cpu" to plan a CPU shape), cached per
    registered class (an arm re-registered by a reloaded file is probed again)."""
    return _measured(name, get_arm(name), device)
