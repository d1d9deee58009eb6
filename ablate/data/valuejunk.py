"""The testbed's Filter task with the junk in the value path only (`value-junk`): what routing cannot see.

Why this task. The first Filter task (`ablate.data.filter`) marked its junk reads with a token in front, so the
first layer could write the mark into the junk read's residual and the query could avoid it by its key: the
baseline filtered by routing and every arm reached the floor. Here the junk never touches a token or a key:

* a sequence is one pair p(k, v), stored twice (the same token at positions 0 and 1), then its query q(k) at
  position 2, whose answer is v;
* during training and evaluation alike, one of the two copies is a *junk read*: after the value projection,
  its read v_j is replaced by the read of a decoy pair p(k, v′) (the same key, another value: a read transplanted
  from another pair, SPEC's structural junk) plus a marker u (`ablate.taskmodel.ValueJunkAttention`);
* which copy is junk, the decoy and the marker are a pure function of the batch (`junk_plan`: a hash of its
  tokens seeds them), so every arm of a seed gets the same junk, and no token or key says which copy it is: the
  two copies are the same token, and either position is junk as often.

    inputs   p(3,1)  p(3,1)  q(3)
    junk       ·       J      ·      (not in the tokens: v_1 ← read of p(3, v′) + u)
    targets    -       -      v1

The query reads the two copies only (strictly earlier positions), with weights that routing sets from two equal
keys and their positions, never from the junk. So a softmax head reads a mixture of v's read and the decoy's
(α·read(v) + (1 − α)·(read(v′) + u), or the other way round, as often), in which nothing says which of the two
values is right: the baseline's loss has a floor near log 2 that no training removes. A value gate that closes
the junk read (g_j ≈ 0) leaves the clean copy and can reach zero. The two variants differ in the marker only,
scaled to ε × the head's current median read norm (detached, as SPEC's injection), so that no rescaling of W_v
and W_o escapes it:

* ``junk="norm"``: u of norm ε·median in a random direction, drawn anew for every junk read: a large read, what
  a norm gate sees (norm-gate's σ(β(‖v‖/√d − τ)) grows with ‖v‖, so it passes the junk by construction);
* ``junk="direction"``: u = ε·median·u*_h, one fixed unit direction per head and run (`fixed_directions`, a pure
  function of the run seed, the same for every arm): what proj-gate's learned w_h can pick out;
* ``junk="content"`` (the graded testbed, experiments/testbed_dose.py): u = ε·median·u*_{h,v′}, a fixed unit
  direction per head and *decoy value* (`marker_directions`): a marker drawn from the content, n_values directions
  rather than one. It says which value is the decoy, so the baseline itself can learn to discount the decoy from
  the mixed read, the more the larger ε: its loss falls from log 2 (ε = 0) towards the floor, and a dose can be
  chosen on the baseline alone. A gate can still close the junk (every junk read has a marker in the span of the
  n_values directions; proj-gate's one w_h sees their sum).

Why one pair and not several in a window. With other pairs in the window, a first design (3 pairs stored twice, 3
queries) let the baseline answer at accuracy 0.83 through the junk: the two copies' attention weight comes from
their key, which encodes the *real* value v, so the matched copies' share of the mass against the other reads
said which of v and v′ was in the tokens (a junk at the key could not be hidden from the query's scale). With the
two copies as the only reads, their weights sum to one whatever the key says.

The model reads strictly earlier positions with one attention layer and no MLP (the abstain-stream model), so
the answer is read linearly from the head's output. Everything is a pure function of its seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

import torch

from ablate.data.synthetic import IGNORE, VALIDATION_SEED_OFFSET
from ablate.tiers import task_ceiling

JUNK_KINDS = ("norm", "direction", "content")


@dataclass(frozen=True)
class ValueJunkTask:
    """Sizes of the value-junk task. Token ids: values, query keys, pair tokens (key × value)."""

    n_keys: int = 8  # distinct keys
    n_values: int = 4  # distinct values (a decoy differs from the pair's value)
    junk: str = "norm"  # the junk read's marker: a random direction per read (norm) or one fixed direction
    dose: float = 1.0  # ε: the marker's norm over the head's median read norm

    def ceiling(self) -> float:
        """The loss of a head that cannot tell the two copies apart: a coin between v and v′, log 2 nats."""
        return task_ceiling(asdict(self))

    strict_causal = True  # the task model reads strictly earlier positions (`ablate.taskmodel`)
    copies = 2  # the stored pair's copies: one clean, one junk

    def __post_init__(self):
        if self.junk not in JUNK_KINDS:
            raise ValueError(f"junk={self.junk!r} is not a value-junk kind; valid kinds: {', '.join(JUNK_KINDS)}")
        if self.n_keys < 1 or self.n_values < 2:
            raise ValueError(f"n_keys={self.n_keys} must be at least 1 and n_values={self.n_values} at least 2 (a "
                             "decoy differs from the value)")
        if not self.dose >= 0:
            raise ValueError(f"dose={self.dose} must be a non-negative multiple of the median read norm")

    @property
    def first_query(self) -> int:
        return self.n_values

    @property
    def first_pair(self) -> int:
        return self.n_values + self.n_keys

    @property
    def vocab_size(self) -> int:
        return self.first_pair + self.n_keys * self.n_values

    @property
    def seq_len(self) -> int:
        return self.copies + 1

    def pair_token(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.first_pair + key * self.n_values + value

    def is_pair(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs >= self.first_pair


def value_junk_batch(task: ValueJunkTask, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch_size, task.seq_len) LongTensors: p(k, v) twice, then q(k) with target v; a
    pure function of its arguments."""
    gen = torch.Generator().manual_seed(int(seed))
    keys = torch.randint(task.n_keys, (batch_size, 1), generator=gen)
    values = torch.randint(task.n_values, (batch_size, 1), generator=gen)
    pairs = task.pair_token(keys, values).expand(-1, task.copies)
    inputs = torch.cat([pairs, task.first_query + keys], 1)
    targets = torch.cat([torch.full_like(pairs, IGNORE), values], 1)
    return inputs, targets


def value_junk_validation(task: ValueJunkTask, batch_size: int, n_batches: int, seed: int = 0):
    """Fixed validation batches as (inputs, targets) pairs (disjoint from the training seeds)."""
    return [value_junk_batch(task, batch_size, VALIDATION_SEED_OFFSET + 7919 * seed + i) for i in range(n_batches)]


@dataclass
class JunkPlan:
    """Which reads of a batch are junk and what replaces them: a pure function of the batch's tokens."""

    mask: torch.Tensor  # (B, T) bool: the junk reads, one of each stored key's two copies
    decoys: torch.Tensor  # (B, T) long: the decoy pair token whose read replaces a junk read (the token elsewhere)
    directions: torch.Tensor | None  # (B, T, n_kv_head, head_dim) unit markers (junk "norm"); None: fixed ones


def batch_seed(inputs: torch.Tensor) -> int:
    """A 63-bit seed from the batch's tokens (little-endian int64 bytes: the same on every machine)."""
    digest = hashlib.sha256(b"ablate-value-junk;" + inputs.cpu().numpy().astype("<i8").tobytes()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def junk_plan(task: ValueJunkTask, inputs: torch.Tensor, n_kv_head: int, head_dim: int) -> JunkPlan:
    """The batch's junk: of each key's two copies one at random; its decoy value (≠ the key's); for junk "norm" a
    random unit marker per junk read and head. Seeded by the batch's tokens, not by anything a token carries."""
    gen = torch.Generator().manual_seed(batch_seed(inputs))
    tokens = inputs.cpu()
    B, T = tokens.shape
    pair = task.is_pair(tokens)
    key = torch.where(pair, (tokens - task.first_pair) // task.n_values, -1 - torch.arange(T))  # non-pairs: apart
    draw = torch.rand(B, T, generator=gen)
    same = key[:, :, None] == key[:, None, :]  # (B, T, T)
    mask = pair & (draw == torch.where(same, draw[:, None, :], -1.0).amax(-1))  # the copy with the larger draw
    value = (tokens - task.first_pair) % task.n_values
    shift = torch.randint(1, task.n_values, (B, T), generator=gen)
    decoys = torch.where(mask, task.pair_token((tokens - task.first_pair) // task.n_values,
                                               (value + shift) % task.n_values), tokens)
    directions = None
    if task.junk == "norm":
        directions = torch.randn(B, T, n_kv_head, head_dim, generator=gen)
        directions = directions / directions.norm(dim=-1, keepdim=True)
    device = inputs.device
    return JunkPlan(mask.to(device), decoys.to(device), None if directions is None else directions.to(device))


def fixed_directions(seed: int, n_kv_head: int, head_dim: int) -> torch.Tensor:
    """(n_kv_head, head_dim) unit directions of junk "direction": a pure function of the run seed, every arm's."""
    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(f"value-junk/{int(seed)}".encode()).digest()[:8],
                                                       "little") & (2**63 - 1))
    directions = torch.randn(n_kv_head, head_dim, generator=gen)
    return directions / directions.norm(dim=-1, keepdim=True)


def marker_directions(task: ValueJunkTask, seed: int, n_kv_head: int, head_dim: int) -> torch.Tensor | None:
    """The run's fixed markers: junk "direction"'s (n_kv_head, head_dim), junk "content"'s (n_values, n_kv_head,
    head_dim), one per decoy value (a pure function of the run seed, every arm's); None for junk "norm"."""
    if task.junk == "direction":
        return fixed_directions(seed, n_kv_head, head_dim)
    if task.junk != "content":
        return None
    gen = torch.Generator().manual_seed(int.from_bytes(
        hashlib.sha256(f"value-junk-content/{int(seed)}".encode()).digest()[:8], "little") & (2**63 - 1))
    directions = torch.randn(task.n_values, n_kv_head, head_dim, generator=gen)
    return directions / directions.norm(dim=-1, keepdim=True)


def content_markers(task: ValueJunkTask, decoys: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """(B, T, n_kv_head, head_dim) junk "content"'s unit marker of each read: its decoy value's direction (read
    only where the read is junk)."""
    return directions[(decoys - task.first_pair) % task.n_values]
