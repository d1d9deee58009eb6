"""A black box for causality: change a call's inputs at the positions a query may not see, and require its output
there unchanged (and one sequence's output blind to another's inputs).

    find_leak(call, [Probe("x", x, time_dim=1), ...], out_time_dim=1, visible=causal) -> None | "what leaked"

It takes any call and any visibility rule (`causal`: key j visible from query i when j <= i; a document mask's
rule, say), and knows nothing of arms or models: `ablate.armcheck` holds every arm to it at the attention call
and in the whole model (`check_causal`, `check_causal_model`), and a test may hold any other call to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CAUSAL_RTOL = 1e-12  # float64: an output that may not see a change moves by no more than this, relative


@dataclass(frozen=True)
class Probe:
    """One input of a black box: its value, the dimension that is position, and for token ids the vocabulary
    (a changed token is another id below it; a float input is changed by a draw of N(0, 1))."""

    name: str
    value: torch.Tensor
    time_dim: int
    vocab: int | None = None

    def changed(self, where: torch.Tensor, gen: torch.Generator, batch: int | None = None) -> torch.Tensor:
        """The value with the positions `where` (bool, (T,)) changed — in sequence `batch` only, if given."""
        shape = [1] * self.value.dim()
        shape[self.time_dim] = where.numel()
        keep = where.view(shape).expand_as(self.value).clone()
        if batch is not None:
            keep[:batch] = False
            keep[batch + 1:] = False
        if self.vocab is not None:
            shift = torch.randint(1, self.vocab, self.value.shape, generator=gen)
            other = (self.value + shift) % self.vocab
        else:
            other = self.value + torch.randn(self.value.shape, generator=gen, dtype=self.value.dtype)
        return torch.where(keep, other, self.value)


def causal(query: int, keys: torch.Tensor) -> torch.Tensor:
    """The causal rule: which of the positions `keys` query position `query` may see."""
    return keys <= query


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest change from `b` to `a`, relative to `b`'s largest magnitude."""
    scale = max(b.abs().max().item(), 1e-300)
    return (a - b).abs().max().item() / scale


def _moved(before: torch.Tensor, after: torch.Tensor) -> float:
    if not (torch.isfinite(before).all() and torch.isfinite(after).all()):
        return float("nan")
    return relative(after, before)


def find_leak(call, probes: list[Probe], *, out_time_dim: int, visible=causal, seed: int = 0,
              rtol: float = CAUSAL_RTOL) -> str | None:
    """None when `call(*values)` is blind to what it may not see, else one line saying what leaked.

    For each query position i: every probe changed at the positions that `visible(i, positions)` hides, the output
    at position i (along `out_time_dim`) must move by ≤ rtol relative; and every probe changed in the second
    sequence of the batch (dim 0) alone, the first sequence's outputs must not move. A leak is then traced to the
    probe(s) that make it alone. A non-finite output is a leak too (it hides one)."""
    gen = torch.Generator().manual_seed(seed)
    values = [p.value for p in probes]
    base = call(*values)
    n = base.shape[out_time_dim]
    positions = torch.arange(n)

    def moved(which, where, batch=None) -> float:
        out = call(*[p.changed(where, gen, batch) if k in which else p.value for k, p in enumerate(probes)])
        if batch is not None:
            return _moved(base[0], out[0])
        return _moved(base.select(out_time_dim, i), out.select(out_time_dim, i))

    def traced(where, batch=None) -> str:
        names = [p.name for k, p in enumerate(probes) if not moved({k}, where, batch) <= rtol]
        return " and ".join(names) or "the inputs together"

    everything = set(range(len(probes)))
    for i in range(n):
        hidden = ~visible(i, positions)
        if hidden.any() and not (error := moved(everything, hidden)) <= rtol:
            return (f"the output at position {i} moved by {error:.2e} (relative) when {traced(hidden)} changed at "
                    f"positions it may not see ({', '.join(map(str, positions[hidden].tolist()))})")
    every = torch.ones(n, dtype=torch.bool)
    if base.shape[0] > 1 and not (error := moved(everything, every, batch=1)) <= rtol:
        return (f"sequence 0's output moved by {error:.2e} (relative) when {traced(every, batch=1)} of sequence 1 "
                "changed")
    return None
