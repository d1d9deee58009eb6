"""The loss over the vocabulary a few tokens at a time: the float32 logits of a whole micro-batch (and
their gradient) dominate memory at small d_model, so neither training nor evaluation nor scoring makes
them at once when a chunk is set. The checkpointed chunk recomputes its logits in the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), targets, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk: int) -> torch.Tensor:
    """Mean token cross-entropy of `hidden @ weight.T` computed `chunk` tokens at a time.

    Why: at seq 1024 and a 50,304-way vocabulary the output layer's logits, their float32 copy and their
    gradient dominate a small model's memory (about 33 GB at the 10M tier's micro-batch of 64). Each
    chunk runs under `torch.utils.checkpoint`, which keeps only its inputs and recomputes the chunk's
    logits in the backward pass, so forward and backward hold one chunk's logits at a time. The result
    equals `F.cross_entropy(logits.float(), targets)` to float32 rounding (only the summation order
    differs); the recomputation costs one extra output-layer matmul per chunk in the backward pass.
    """
    if chunk < 1:
        raise ValueError(f"loss chunk must be at least 1 token, got {chunk}")
    flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    total = sum(checkpoint(_chunk_loss_sum, h, weight, t, use_reentrant=False)
                for h, t in zip(flat.split(chunk), flat_targets.split(chunk)))
    return total / (flat_targets != -100).sum()  # cross_entropy's default ignore_index, like its mean


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                      vocab: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token (flattened): the float32 log-probability of its target under softmax(hidden @ weight.T)
    over the first `vocab` rows of `weight` (all when None), and whether the target is the argmax;
    computed `chunk` tokens at a time, so at most one chunk's logits exist (no graph is kept: scoring).

    Equals `log_softmax(logits.float())` gathered at the targets to float32 rounding (`ablate eval`'s
    whole path): only the matmul's blocking can differ.
    """
    if chunk < 1:
        raise ValueError(f"loss chunk must be at least 1 token, got {chunk}")
    flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    weight = weight if vocab is None else weight[:vocab]
    scores, greedy = [], []
    for h, t in zip(flat.split(chunk), flat_targets.split(chunk)):
        log_probs = F.log_softmax(F.linear(h, weight).float(), dim=-1)
        scores.append(log_probs.gather(1, t[:, None]).squeeze(1))
        greedy.append(log_probs.argmax(dim=-1) == t)
        del log_probs
    empty = flat.new_zeros(0, dtype=torch.float32)
    return (torch.cat(scores), torch.cat(greedy)) if scores else (empty, empty.bool())
