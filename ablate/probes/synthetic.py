"""A synthetic recall task on which abstention is needed, small enough to train on one CPU core.

Why this task. The study's claim is that softmax attention cannot *abstain*: every query must spend
all of its mass somewhere, so a baseline that has nothing worth reading learns to park the mass on
a quiet key (the first one, a "sink"), while an arm with a phantom key (sink-logit) can put it on
nothing. On web text that takes hours to appear; here it takes a minute, because half of the
queries look for a key that was never stored and the right answer is a fixed NONE token:

    BOS  p(k1,v1) ... p(kn,vn)  SEP  q(a) ans(a)  q(b) ans(b) ...

* a *pair token* p(k, v) holds a key and its value in one token, so a single attention layer can
  find it (query key matches stored key) and read its value — no induction circuit needed;
* a *query token* q(k) asks for key k; the next token is the answer: the value of the stored pair
  with key k, or NONE when k was not stored (``absent_prob`` of the queries). Only answer
  positions carry a target; every other target is ``IGNORE`` (cross-entropy's ignore_index);
* BOS is the same token at position 0 of every sequence: the natural place for a baseline sink.

A head that looks up the queried key finds nothing for an absent key, so it must abstain; that
is what the test measures (`tests/test_probes_synthetic.py`). Everything is a pure function of its
seed: `synthetic_batch(task, batch_size, seed)` returns the same tokens for the same arguments.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import torch

log = logging.getLogger(__name__)

IGNORE = -100  # F.cross_entropy's default ignore_index: positions that predict nothing
VALIDATION_SEED_OFFSET = 2**62  # validation batches never coincide with training batches


@dataclass(frozen=True)
class SyntheticTask:
    """Sizes of the recall task. Token ids: BOS, SEP, NONE, values, query keys, pair tokens."""

    n_keys: int = 16  # distinct keys
    n_values: int = 8  # distinct values
    n_pairs: int = 6  # pairs stored per sequence (distinct keys)
    n_queries: int = 6  # queries per sequence
    absent_prob: float = 0.5  # share of queries whose key was never stored

    BOS = 0
    SEP = 1
    NONE = 2

    def __post_init__(self):
        if not 0 < self.n_pairs < self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} must lie in 1..n_keys-1={self.n_keys - 1} (absent keys must exist)")
        if not 0.0 <= self.absent_prob <= 1.0:
            raise ValueError(f"absent_prob={self.absent_prob} must lie in [0, 1]")

    @property
    def first_value(self) -> int:
        return 3

    @property
    def first_query(self) -> int:
        return self.first_value + self.n_values

    @property
    def first_pair(self) -> int:
        return self.first_query + self.n_keys

    @property
    def vocab_size(self) -> int:
        return self.first_pair + self.n_keys * self.n_values

    @property
    def seq_len(self) -> int:
        """Input length (the targets are the inputs shifted by one, as for text)."""
        return 1 + self.n_pairs + 1 + 2 * self.n_queries - 1

    def pair_token(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.first_pair + key * self.n_values + value


def synthetic_batch(task: SyntheticTask, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both (batch_size, task.seq_len) LongTensors; a pure function of its arguments.

    targets[b, t] is the token after inputs[b, t] at answer positions (a query token's position)
    and IGNORE everywhere else: stored pairs and the queries themselves are random, so predicting
    them only adds noise to the loss.
    """
    gen = torch.Generator().manual_seed(int(seed))
    B, n = batch_size, task.n_pairs
    keys = torch.argsort(torch.rand(B, task.n_keys, generator=gen), dim=1)  # a random order of all keys
    stored, unstored = keys[:, :n], keys[:, n:]
    values = torch.randint(task.n_values, (B, n), generator=gen)
    absent = torch.rand(B, task.n_queries, generator=gen) < task.absent_prob
    pick_stored = torch.randint(n, (B, task.n_queries), generator=gen)
    pick_unstored = torch.randint(task.n_keys - n, (B, task.n_queries), generator=gen)
    asked_present = stored.gather(1, pick_stored)
    asked_absent = unstored.gather(1, pick_unstored)
    asked = torch.where(absent, asked_absent, asked_present)
    answers = torch.where(absent, torch.full_like(asked, task.NONE), task.first_value + values.gather(1, pick_stored))

    full = torch.cat([
        torch.full((B, 1), task.BOS),
        task.pair_token(stored, values),
        torch.full((B, 1), task.SEP),
        torch.stack([task.first_query + asked, answers], dim=2).view(B, -1),
    ], dim=1)  # (B, seq_len + 1)
    inputs, targets = full[:, :-1].clone(), full[:, 1:].clone()
    answer_positions = torch.zeros(full.shape[1] - 1, dtype=torch.bool)
    answer_positions[n + 2 :: 2] = True  # the query tokens: each predicts its answer
    targets[:, ~answer_positions] = IGNORE
    return inputs, targets


def synthetic_validation(task: SyntheticTask, batch_size: int, n_batches: int, seed: int = 0):
    """Fixed validation batches as (inputs, targets) pairs, the form the probes take for tasks
    whose targets are not simply the shifted inputs (IGNORE where nothing is predicted)."""
    return [synthetic_batch(task, batch_size, VALIDATION_SEED_OFFSET + 7919 * seed + i) for i in range(n_batches)]


@dataclass
class SyntheticRun:
    """What `train_synthetic` returns: the trained model (eval mode) and its training record."""

    model: "torch.nn.Module"
    task: SyntheticTask
    config: dict
    losses: list[float] = field(default_factory=list)  # training loss per step
    val_loss: float = float("nan")
    val_accuracy: float = float("nan")  # share of answers predicted exactly
    absent_accuracy: float = float("nan")  # share of NONE answers predicted exactly


def default_model_config(task: SyntheticTask, arm: str, **overrides):
    from ablate.model import GPTConfig

    fields = dict(vocab_size=task.vocab_size, n_layer=1, n_head=2, d_model=64, max_seq_len=task.seq_len, arm=arm)
    fields.update(overrides)
    return GPTConfig(**fields)


def train_synthetic(
    arm: str,
    seed: int,
    steps: int = 600,
    *,
    task: SyntheticTask | None = None,
    batch_size: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    warmup_steps: int = 50,
    progress: bool = False,
    **model_overrides,
) -> SyntheticRun:
    """Train a tiny GPT of one arm on the recall task; same seed → same init, same batches, same result.

    The shared parameters of two arms with the same seed start equal (the model's name-keyed init),
    and both see the same batches (batch k is `synthetic_batch(task, batch_size, training_seed(seed, k))`),
    so the arms differ only in their attention mechanism. AdamW over
    `model.param_groups` (arm scalars undecayed), linear warm-up then constant, gradient clipping 1.0.
    """
    from ablate.model import GPT

    task = task or SyntheticTask()
    config = default_model_config(task, arm, **model_overrides)
    torch.manual_seed(seed)
    model = GPT(config)
    model.init_weights(seed)
    optimizer = torch.optim.AdamW(model.param_groups(weight_decay), lr=lr, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    run = SyntheticRun(model=model, task=task, config=asdict(config))
    steps_iter = range(steps)
    if progress:
        from tqdm.auto import tqdm

        steps_iter = tqdm(steps_iter, desc=f"synthetic {arm} seed {seed}", unit="step")
    model.train()
    for step in steps_iter:
        inputs, targets = synthetic_batch(task, batch_size, training_seed(seed, step))
        loss = model(inputs, targets).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        run.losses.append(loss.item())
    model.eval()
    run.val_loss, run.val_accuracy, run.absent_accuracy = evaluate_synthetic(model, task)
    log.info("synthetic %s seed %d: val loss %.4f, accuracy %.3f", arm, seed, run.val_loss, run.val_accuracy)
    return run


def training_seed(seed: int, step: int) -> int:
    """The data seed of training batch `step` of run seed `seed` (disjoint from validation seeds)."""
    return int(seed) * 100_003 + int(step) + 1


@torch.no_grad()
def evaluate_synthetic(model, task: SyntheticTask, batch_size: int = 256, seed: int = 0) -> tuple[float, float, float]:
    """(loss, answer accuracy, accuracy on NONE answers) on one fixed validation batch."""
    inputs, targets = synthetic_validation(task, batch_size, 1, seed)[0]
    out = model(inputs, targets)
    scored = targets != IGNORE
    predicted = out.logits[..., : task.vocab_size].argmax(-1)
    correct = (predicted == targets) & scored
    absent = scored & (targets == task.NONE)
    return out.loss.item(), (correct.sum() / scored.sum()).item(), ((correct & absent).sum() / absent.sum()).item()
