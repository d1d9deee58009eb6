"""The testbed's second task, Filter: recall through interference that a gate on the read could recognise.

Why this task. A value gate (norm-gate, proj-gate) multiplies each read v_j by a per-key factor computed from
v_j alone, before the softmax mixes the reads; softmax attention alone can only avoid a read by its key.
So the task stores each queried key once cleanly and also in *junk* reads of the same key that carry a wrong
(decoy) value: the query's key match attends them with the clean read, and their decoy values, mixed into
the read, pull the answer away.

Both variants make a junk read an ordinary pair token p(k, v'), the very token that is a clean read in
other sequences, preceded by a marker token (a clean pair stands alone). Why not a junk token of its own: a token
that is only ever junk is made harmless by the value projection alone (its value learned to carry nothing),
and the baseline then solves the task outright, leaving a gate nothing to drop. A junk pair's value must keep
its content, so the model can only tell it from a clean read by what the first layer writes into its residual
from the marker in front of it. The two variants differ in that marker:

* ``mark="direction"``: one MARK token. Every junk read gets the same addition from the first layer, a fixed
  direction of the read at the retrieval layer: what proj-gate's learned w_h can pick out;

      inputs   BOS  p(k1,v1)  MARK p(k1,v')  p(k2,v2)  p(k3,v3)  q(k1)  q(k3) ...

* ``mark="norm"``: one of ``n_noise`` noise tokens, drawn anew for every junk read. What the first layer
  copies from a noise token differs from one junk read to the next, so no single direction marks them all
  unless the model learns one; what they share is extra energy in the residual, which the pre-attention
  RMSNorm turns into a smaller share of the pair's own content: a mark by norm, what norm-gate sees.

      inputs   BOS  p(k1,v1)  N7 p(k1,v')  p(k2,v2)  p(k3,v3)  q(k1)  q(k3) ...

With learned embeddings no data can force one kind of mark: a model may learn either for either variant.
The variants make one kind the natural one; the testbed measures which gate uses it.

The targets are the clean values at the query positions and IGNORE everywhere else. Every junk read shares
its key with a queried key, so a read that cannot tell junk from clean by its key mixes the decoy in.
Everything is a pure function of its seed: `filter_batch(task, batch_size, seed)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.data.stream import GradedStreamTask, StreamTask, stream_batch, stream_validation
from ablate.data.synthetic import (IGNORE, VALIDATION_SEED_OFFSET, PairTokens, SyntheticTask, synthetic_batch,
                                   synthetic_validation)
from ablate.data.valuejunk import ValueJunkTask, value_junk_batch, value_junk_validation

MARKS = ("norm", "direction")


@dataclass(frozen=True)
class FilterTask(PairTokens):
    """Sizes of the Filter task. Token ids: BOS, (1, unused), MARK, noise tokens, values, query keys, pairs."""

    n_keys: int = 8  # distinct keys
    n_values: int = 4  # distinct values (each decoy differs from its key's clean value)
    n_pairs: int = 4  # clean pairs stored per sequence (distinct keys)
    n_junk: int = 4  # junk reads per sequence, each with the key of one of the queries
    n_queries: int = 4  # queries per sequence, each of a stored key
    mark: str = "norm"  # what precedes a junk read: a noise token (norm) or the MARK token (direction)
    n_noise: int = 16  # distinct noise tokens (mark "norm")

    BOS = 0
    MARK = 2

    def __post_init__(self):
        if self.mark not in MARKS:
            raise ValueError(f"mark={self.mark!r} is not a Filter mark; valid marks: {', '.join(MARKS)}")
        if not 0 < self.n_pairs <= self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} must lie in 1..n_keys={self.n_keys}")
        if self.n_values < 2 or self.n_junk < 0 or self.n_queries < 1:
            raise ValueError(f"n_values={self.n_values} must be at least 2 (a decoy differs from the answer), "
                             f"n_junk={self.n_junk} at least 0 (0: the task without interference) and "
                             f"n_queries={self.n_queries} at least 1")

    @property
    def first_noise(self) -> int:
        return 3

    @property
    def first_value(self) -> int:
        return self.first_noise + self.n_noise

    @property
    def seq_len(self) -> int:
        return 1 + self.n_pairs + 2 * self.n_junk + self.n_queries

    def junk_reads(self, inputs: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the positions of junk reads, the pair tokens right after a marker (MARK or noise)."""
        after_marker = torch.zeros_like(inputs, dtype=torch.bool)
        after_marker[:, 1:] = (inputs[:, :-1] >= self.MARK) & (inputs[:, :-1] < self.first_value)
        return self.is_pair(inputs) & after_marker

    def clean_reads(self, inputs: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the positions of clean pair tokens."""
        return self.is_pair(inputs) & ~self.junk_reads(inputs)

    def is_pair(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs >= self.first_pair


def filter_batch(task: FilterTask, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch_size, task.seq_len) LongTensors; a pure function of its arguments."""
    gen = torch.Generator().manual_seed(int(seed))
    B, n = batch_size, task.n_pairs
    stored = torch.argsort(torch.rand(B, task.n_keys, generator=gen), dim=1)[:, :n]
    values = torch.randint(task.n_values, (B, n), generator=gen)
    asked = torch.randint(n, (B, task.n_queries), generator=gen)  # which stored pair each query asks for
    spoiled = asked.gather(1, torch.randint(task.n_queries, (B, task.n_junk), generator=gen))  # a queried pair each
    decoys = (values.gather(1, spoiled) + torch.randint(1, task.n_values, (B, task.n_junk), generator=gen)) % (
        task.n_values)
    order = torch.argsort(torch.rand(B, n + task.n_junk, generator=gen), dim=1)  # where each item sits
    keys = torch.cat([stored, stored.gather(1, spoiled)], 1).gather(1, order)
    item_values = torch.cat([values, decoys], 1).gather(1, order)
    junk = (order >= n)
    pairs = task.pair_token(keys, item_values)
    # Drawn last, so that all else is the same for both marks.
    noise = task.first_noise + torch.randint(task.n_noise, pairs.shape, generator=gen)
    junk_marker = noise if task.mark == "norm" else torch.full_like(pairs, task.MARK)
    slots = torch.stack([junk_marker, pairs], 2).flatten(1)  # (marker, pair) per item; a clean item has no marker
    kept = torch.stack([junk, torch.ones_like(junk)], 2).flatten(1)
    items = slots.gather(1, torch.argsort((~kept).to(torch.int8), dim=1, stable=True)[:, : n + 2 * task.n_junk])
    answers = task.first_value + values.gather(1, asked)
    inputs = torch.cat([torch.full((B, 1), task.BOS), items, task.first_query + stored.gather(1, asked)], 1)
    targets = torch.cat([torch.full((B, 1 + items.shape[1]), IGNORE), answers], 1)
    return inputs, targets


def filter_validation(task: FilterTask, batch_size: int, n_batches: int, seed: int = 0):
    """Fixed validation batches as (inputs, targets) pairs (disjoint from the training seeds)."""
    return [filter_batch(task, batch_size, VALIDATION_SEED_OFFSET + 7919 * seed + i) for i in range(n_batches)]


def task_from_fields(fields: dict):
    """A task tier's task from its config.json fields (`ablate.tiers.TASKS`): Filter's carry a `mark`, the stream
    task's a `window` (and the graded stream task's an `absent` share), the value-junk task's a `junk`."""
    if "junk" in fields:
        return ValueJunkTask(**fields)
    if "mark" in fields:
        return FilterTask(**fields)
    if "window" in fields:
        return GradedStreamTask(**fields) if "absent" in fields else StreamTask(**fields)
    return SyntheticTask(**fields)


_BATCHES = {FilterTask: (filter_batch, filter_validation), StreamTask: (stream_batch, stream_validation),
            GradedStreamTask: (stream_batch, stream_validation),
            SyntheticTask: (synthetic_batch, synthetic_validation),
            ValueJunkTask: (value_junk_batch, value_junk_validation)}


def task_batch(task, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A training batch of any task: a pure function of (task, batch size, seed)."""
    return _BATCHES[type(task)][0](task, batch_size, seed)


def task_validation(task, batch_size: int, n_batches: int, seed: int = 0):
    return _BATCHES[type(task)][1](task, batch_size, n_batches, seed)
