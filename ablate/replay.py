"""Where a diverged run's first non-finite value came from: its steps replayed from the last checkpoint (or from
its initial weights when it has none) with every slot's and hook's output checked (`ablate.arms.checks.finite_checks`),
in memory, writing nothing.

Why a replay rather than checks in the run: a check reads the device after every slot of every layer, which a run
cannot afford; the replay pays it only for the steps between the last checkpoint and the divergence, and only
once a run has diverged. It is bounded (`MAX_REPLAY_STEPS`): past that it says so rather than train on.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ablate.arms.checks import NonFinite, finite_checks
from ablate.config import lr_at
from ablate.data import BatchStream
from ablate.data.shards import tier_shards
from ablate.loop import Diverged, Step, load_state, make_optimizer
from ablate.model import GPT, GPTConfig
from ablate.runconfig import RunConfig
from ablate.tiers import get_tier

log = logging.getLogger(__name__)

MAX_REPLAY_STEPS = 200  # steps from the last checkpoint the replay trains again at most


@dataclass(frozen=True)
class Origin:
    """What the replay found: one sentence, and whether it found the first non-finite value."""

    text: str
    found: bool


def first_non_finite(config: RunConfig, checkpoint: Path, diverged_step: int) -> Origin:
    """Replay the steps from `checkpoint` (or step 0) to `diverged_step` with the checks on; never raises for
    what the replay itself meets (a replay that fails says so in its sentence)."""
    try:
        return _replay(config, checkpoint, diverged_step)
    except Exception as err:  # the diagnosis of a failure must not become a second failure
        log.debug("the replay failed", exc_info=True)
        return Origin(f"not reproduced: the replay failed ({type(err).__name__}: {err})", False)


def _replay(config: RunConfig, checkpoint: Path, diverged_step: int) -> Origin:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shards = tier_shards(config.data_dir, get_tier(config.tier), config.model.vocab_size)
    stream = BatchStream(shards, seed=config.data_seed, global_batch=config.global_batch, seq_len=config.seq_len)
    torch.manual_seed(config.seed)  # as the run did before building its model
    model = GPT(GPTConfig(**config.model_fields()))
    model.init_weights(config.seed)
    model.to(device)
    optimizer = make_optimizer(model, config.weight_decay, config.lr, config.betas, config.eps, cuda)
    start = 0
    if checkpoint.exists():
        blob = load_state(checkpoint)
        model.load_state_dict(blob["model"])
        optimizer.load_state_dict(blob["optimizer"])
        stream.load_state_dict(blob["stream"])
        start = stream.step
    if diverged_step - start > MAX_REPLAY_STEPS:
        return Origin(f"not replayed: the last checkpoint is {diverged_step - start} steps before the divergence "
                      f"(at most {MAX_REPLAY_STEPS}); a shorter --checkpoint-interval brings it closer", False)
    return _steps(config, model, optimizer, stream, start, diverged_step, device)


def _steps(config: RunConfig, model: GPT, optimizer, stream: BatchStream, start: int, last: int,
           device: torch.device) -> Origin:
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if config.precision == "bf16-mixed" else (
        contextlib.nullcontext())
    micro = min(config.micro_batch, config.global_batch)

    def micro_batches(number: int):
        batch = stream.global_batch(number - 1).to(device)
        return [(c[:, :-1], c[:, 1:]) for c in batch.split(micro)]

    return replay(model, optimizer, micro_batches, lambda number: lr_at(number - 1, config), config.grad_clip,
                  (start, last), device, autocast)


def replay(model, optimizer, micro_batches: Callable[[int], list], lr_of: Callable[[int], float], grad_clip: float,
           steps: tuple[int, int], device=None, autocast=None) -> Origin:
    """Steps `steps[0]` + 1 … `steps[1]` of a run (its model and optimiser at step `steps[0]`), in memory, with every
    slot's and hook's output and every gradient checked: the first non-finite value, or "not reproduced". A corpus
    run's (`first_non_finite`) and a task run's (`ablate.taskrun`) alike."""
    start, last = steps
    step = Step(optimizer, loss_of=lambda inputs, targets: model(inputs, targets).loss,
                clip=lambda: _checked_clip(model, grad_clip), halt_on_nonfinite=True)
    replayed = f"replayed steps {start + 1}–{last} from {'the last checkpoint' if start else 'the initial weights'}"
    model.train()
    for number in range(start + 1, last + 1):
        try:
            with finite_checks(), autocast or contextlib.nullcontext():
                step(number, lr_of(number), micro_batches(number), device)
        except (NonFinite, _NonFiniteGradient) as err:
            return Origin(f"first non-finite value at step {number}: {err} ({replayed} with checks on)", True)
        except Diverged as err:
            return Origin(f"first non-finite value at step {number}: the loss ({err.loss}), every slot and hook "
                          f"finite ({replayed} with checks on)", True)
        updated = next((name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())), None)
        if updated is not None:
            return Origin(f"first non-finite value at step {number}: {updated} after the optimiser's update (every "
                          f"slot and hook output and every gradient finite: the learning rate or the optimiser) "
                          f"({replayed} with checks on)", True)
    return Origin(f"not reproduced: {replayed} with checks on, every value finite", False)


class _NonFiniteGradient(Exception):
    pass


def _checked_clip(model: GPT, max_norm: float) -> torch.Tensor:
    """The gradient norm, clipped as a run clips it, after naming the first parameter whose gradient is not finite."""
    for name, param in model.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            raise _NonFiniteGradient(f"the gradient of {name} (every slot and hook output finite in the forward)")
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
