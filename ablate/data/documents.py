"""Document ids from `<|endoftext|>`: every document is written as the end-of-text token followed by its tokens
(`ablate.data.tokenizer`), so an end-of-text token starts a document and belongs to it. A document mask lets a
token attend only within its document (`ablate.arms.kernel.mask_of`)."""

from __future__ import annotations

import torch

from ablate.data.tokenizer import EOT_TOKEN

VISIBLE_TO_ALL = -1  # the document id of a position every document sees (the sink token)


def document_ids(idx: torch.Tensor, eot: int = EOT_TOKEN, start: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) long: the document of each token, counting from `start` (B,) — the last document id of the tokens
    before these (a KV cache's), 0 for a fresh sequence — plus one at every end-of-text token."""
    ids = (idx == eot).long().cumsum(dim=1)
    return ids if start is None else ids + start.view(-1, 1).clamp(min=0)
