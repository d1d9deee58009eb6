"""A synthetic recall task on which abstention is needed, small enough to train on one CPU core: a data
source like the corpus, whose batches are a pure function of their seed.

Why this task. The study's claim is that softmax attention cannot *abstain*: every query must spend
all of its mass somewhere, so a baseline that has nothing worth reading learns to park the mass on
a quiet key (the first one, a "sink"), while an arm with a phantom key (sink-logit) can put it on
nothing. On web text that takes hours to appear; here it takes well under a minute, because half
of the queries look for a key that was never stored, and the right answer is then a fixed NONE:

    inputs   BOS  p(k1,v1) ... p(kn,vn)  q(a)     q(b)   ...
    targets   -      -     ...    -      ans(a)   ans(b) ...

* a *pair token* p(k, v) holds a key and its value in one token, so attention can find it (query
  key matches stored key) and read its value without an induction circuit;
* a *query token* q(k) asks for key k, and its own position's target is the answer: the value of
  the stored pair with key k, or NONE when k was not stored (``absent_prob`` of the queries).
  Answers are never inputs (a NONE token in the context would be a free, constant place to park
  mass). Every other position's target is ``IGNORE`` (cross-entropy's ignore_index);
* BOS, the same token at position 0 of every sequence, is where a baseline builds its sink.

A head that looks up the queried key finds nothing for an absent key, so it must abstain; the test
the testbed (`experiments/testbed.py`, `ablate.taskrun`) measures where each arm puts that spare mass. Everything is a
pure function of its seed: `synthetic_batch(task, batch_size, seed)` is the same for the same arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ablate.tiers import TASK_CONFIG_KEY

IGNORE = -100  # F.cross_entropy's default ignore_index: positions that predict nothing
SYNTHETIC_KEY = TASK_CONFIG_KEY  # config.json key of a run trained on the synthetic task (its SyntheticTask fields)
VALIDATION_SEED_OFFSET = 2**62  # validation batches never coincide with training batches


class PairTokens:
    """The token ids both recall tasks share after their own first ones (`first_value`): the values, the query
    keys q(k), and the pair tokens p(k, v), key × value (a task has n_keys and n_values)."""

    @property
    def first_query(self) -> int:
        return self.first_value + self.n_values

    @property
    def first_pair(self) -> int:
        return self.first_query + self.n_keys

    @property
    def vocab_size(self) -> int:
        return self.first_pair + self.n_keys * self.n_values

    def pair_token(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.first_pair + key * self.n_values + value


@dataclass(frozen=True)
class SyntheticTask(PairTokens):
    """Sizes of the recall task. Token ids: NONE, BOS, values, query keys, pair tokens (key × value)."""

    n_keys: int = 8  # distinct keys
    n_values: int = 4  # distinct values
    n_pairs: int = 6  # pairs stored per sequence (distinct keys)
    n_queries: int = 4  # queries per sequence
    absent_prob: float = 0.5  # share of queries whose key was never stored
    answer_noise: float = 0.0  # share of stored-key answers replaced by a uniformly drawn value (a loss floor)

    NONE = 0
    BOS = 1

    def __post_init__(self):
        if not 0 < self.n_pairs < self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} must lie in 1..n_keys-1={self.n_keys - 1} (absent "
                             "keys must exist)")
        if not 0.0 <= self.absent_prob <= 1.0:
            raise ValueError(f"absent_prob={self.absent_prob} must lie in [0, 1]")
        if not 0.0 <= self.answer_noise <= 1.0:
            raise ValueError(f"answer_noise={self.answer_noise} must lie in [0, 1]")

    def floor(self) -> tuple[float, float]:
        """(lowest expected loss, highest expected accuracy) any model can reach: the noise is unpredictable.

        A stored key's answer is its value with probability 1 − noise + noise/n_values and each other
        value with noise/n_values; a NONE answer is certain.
        """
        q = self.answer_noise / self.n_values
        right = 1.0 - self.answer_noise + q
        entropy = 0.0 - sum(p * math.log(p) for p in (right, *([q] * (self.n_values - 1))) if p > 0)
        present = 1.0 - self.absent_prob
        return present * entropy, self.absent_prob + present * right

    @property
    def first_value(self) -> int:
        return 2

    @property
    def seq_len(self) -> int:
        return 1 + self.n_pairs + self.n_queries



def synthetic_batch(task: SyntheticTask, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch_size, task.seq_len) LongTensors; a pure function of its arguments.

    targets[b, t] is the answer at a query position and IGNORE everywhere else. (Unlike text, a
    query's target sits at its own position: the answer is never fed back as an input.)
    """
    gen = torch.Generator().manual_seed(int(seed))
    B, n = batch_size, task.n_pairs
    keys = torch.argsort(torch.rand(B, task.n_keys, generator=gen), dim=1)  # a random order of all keys
    stored, unstored = keys[:, :n], keys[:, n:]
    values = torch.randint(task.n_values, (B, n), generator=gen)
    absent = torch.rand(B, task.n_queries, generator=gen) < task.absent_prob
    pick_stored = torch.randint(n, (B, task.n_queries), generator=gen)
    pick_unstored = torch.randint(task.n_keys - n, (B, task.n_queries), generator=gen)
    asked = torch.where(absent, unstored.gather(1, pick_unstored), stored.gather(1, pick_stored))
    answers = torch.where(absent, torch.full_like(asked, task.NONE), task.first_value + values.gather(1, pick_stored))
    # Drawn last, so that the rest of a batch does not depend on the noise level.
    noisy = (torch.rand(B, task.n_queries, generator=gen) < task.answer_noise) & ~absent
    answers = torch.where(noisy, task.first_value + torch.randint(task.n_values, (B, task.n_queries), generator=gen),
                          answers)
    inputs = torch.cat([torch.full((B, 1), task.BOS), task.pair_token(stored, values), task.first_query + asked], dim=1)
    targets = torch.cat([torch.full((B, 1 + n), IGNORE), answers], dim=1)
    return inputs, targets


def synthetic_validation(task: SyntheticTask, batch_size: int, n_batches: int, seed: int = 0):
    """Fixed validation batches as (inputs, targets) pairs, the form the probes take for tasks
    whose targets are not simply the shifted inputs (IGNORE where nothing is predicted)."""
    return [synthetic_batch(task, batch_size, VALIDATION_SEED_OFFSET + 7919 * seed + i) for i in range(n_batches)]
