"""The testbed's Abstain task without a place to park (`abstain-stream`): a stream of pairs, every read content.

Why this task. On the first Abstain task (`ablate.data.synthetic`) every arm reached the floor: BOS, the same
token at position 0 of every sequence, is a stable place to park the spare mass, its read can be learned to mean
"nothing", and the MLP after the read maps "no match" to NONE from any read. Here none of that is available:

* no BOS and no token that is only ever a query: every position holds a pair token p(k, v), a key and a value
  drawn afresh, like a window cut at a random offset of a long stream; its read carries its value;
* each position asks for its own key: the target at position t is the value the key k_t carried at its
  previous occurrence in the window, or NONE at its first occurrence (a key occurs at most twice);
* the model reads strictly earlier positions (`ablate.taskmodel`: not itself, whose read would be a fixed,
  learnable place to park), with one attention layer and no MLP, so the answer is read linearly from the head's
  output plus the token's own embedding.

    inputs   p(3,1)  p(5,0)  p(3,2)  p(1,1)  p(5,3) ...
    targets    -     NONE     v1     NONE     v0   ...

At a first occurrence nothing earlier matches, and a softmax head must still read a convex mixture of earlier
pairs' values, which pulls the answer towards them; a head with a phantom key (sink-logit, off-by-one) can read
nothing. Position 0 sees nothing and predicts nothing. Everything is a pure function of its seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ablate.data.synthetic import IGNORE, VALIDATION_SEED_OFFSET
from ablate.tiers import stream_absent_share, task_ceiling


@dataclass(frozen=True)
class StreamTask:
    """Sizes of the stream task. Token ids: NONE, values, pair tokens (key × value)."""

    n_keys: int = 4  # distinct keys; each occurs at most twice in a window
    n_values: int = 4  # distinct values, drawn afresh at every position
    window: int = 8  # positions per sequence

    NONE = 0
    strict_causal = True  # the task model reads strictly earlier positions (`ablate.taskmodel`)

    def __post_init__(self):
        if not 2 <= self.window <= 2 * self.n_keys:
            raise ValueError(f"window={self.window} must lie in 2..2·n_keys={2 * self.n_keys} (a key occurs at "
                             "most twice)")
        if self.n_values < 2:
            raise ValueError(f"n_values={self.n_values} must be at least 2")

    @property
    def first_value(self) -> int:
        return 1

    @property
    def first_pair(self) -> int:
        return self.first_value + self.n_values

    @property
    def vocab_size(self) -> int:
        return self.first_pair + self.n_keys * self.n_values

    @property
    def seq_len(self) -> int:
        return self.window

    def pair_token(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.first_pair + key * self.n_values + value


def stream_batch(task: StreamTask, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch_size, task.window) LongTensors; a pure function of its arguments."""
    gen = torch.Generator().manual_seed(int(seed))
    B, W = batch_size, task.window
    if isinstance(task, GradedStreamTask):
        keys = _graded_keys(task, B, gen)
    else:
        twice = torch.arange(task.n_keys).repeat(2)  # every key twice; a window is a prefix of a shuffle
        keys = twice[torch.argsort(torch.rand(B, 2 * task.n_keys, generator=gen), dim=1)[:, :W]]
    values = torch.randint(task.n_values, (B, W), generator=gen)
    earlier = torch.ones(W, W, dtype=torch.bool).tril(-1)  # [t, j]: j < t
    match = (keys[:, :, None] == keys[:, None, :]) & earlier  # (B, t, j): an earlier occurrence of k_t
    previous = match.to(torch.int8).argmax(-1)  # the only one, when there is one
    answers = torch.where(match.any(-1), task.first_value + values.gather(1, previous), task.NONE)
    answers[:, 0] = IGNORE  # position 0 sees nothing
    return task.pair_token(keys, values), answers


@dataclass(frozen=True)
class GradedStreamTask(StreamTask):
    """The stream task at a graded dose of queries with nothing to read (the graded testbed,
    experiments/testbed_dose.py): each position after the first takes, with probability `absent`, a key not yet in
    the window (its query finds nothing), else a key that occurred there once, so a key still occurs at most twice.
    Where no key is left to repeat (right after a repeat) the position takes a fresh key: the realised share of
    queries with nothing to read (`absent_share`) rises from 3/7 (`absent` 0: fresh, repeat, fresh, …) to 1
    (`absent` 1). With n_keys ≥ window a fresh key is always left. The answers are the stream task's. A subclass,
    so that the ungraded task's fields, batches and fingerprints stay as they are."""

    absent: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.absent <= 1.0:
            raise ValueError(f"absent={self.absent} must lie in [0, 1] (a probability)")
        if self.n_keys < self.window:
            raise ValueError(f"n_keys={self.n_keys} must be at least window={self.window} (a fresh key is always "
                             "left)")

    def absent_share(self) -> float:
        """The share of answers that are NONE (queries with nothing to read), exactly (`ablate.tiers`)."""
        return stream_absent_share(asdict(self))

    def ceiling(self) -> float:
        """The loss of a model that reads nothing (its own token only): `ablate.tiers.task_ceiling`."""
        return task_ceiling(asdict(self))


def _graded_keys(task: GradedStreamTask, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """(B, window) keys: each position after the first fresh with probability `absent`, else a repeat of a key seen
    once (the other kind where none of the drawn kind is left); every choice uniform among its candidates."""
    B = batch_size
    seen = torch.zeros(B, task.n_keys, dtype=torch.long)
    fresh_wanted = torch.rand(B, task.window, generator=gen) < task.absent
    keys = []
    for t in range(task.window):
        fresh, once = seen == 0, seen == 1
        want = fresh_wanted[:, t] | (t == 0) | ~once.any(1)
        want &= fresh.any(1)
        candidates = torch.where(want[:, None], fresh, once)
        scores = torch.where(candidates, torch.rand(B, task.n_keys, generator=gen), -1.0)
        key = scores.argmax(1)
        keys.append(key)
        seen[torch.arange(B), key] += 1
    return torch.stack(keys, 1)


def stream_validation(task: StreamTask, batch_size: int, n_batches: int, seed: int = 0):
    """Fixed validation batches as (inputs, targets) pairs (disjoint from the training seeds)."""
    return [stream_batch(task, batch_size, VALIDATION_SEED_OFFSET + 7919 * seed + i) for i in range(n_batches)]
