"""Data: sources → GPT-2 tokens → checksummed uint16 shards → one fixed batch order per data seed.

    from ablate.data import TokenShards, BatchStream, validation_batches, prepare, encode, decode

Names are imported on first use (PEP 562), so `ablate.cli.data` — and with it the `ablate` command —
starts without loading torch, tiktoken or datasets.
"""

from __future__ import annotations

from ablate._lazy import lazy_exports

_EXPORTS = {
    "prepare": "ablate.data.writer",
    "TokenShards": "ablate.data.shards",
    "read_manifest": "ablate.data.shards",
    "BatchStream": "ablate.data.order",
    "validation_batches": "ablate.data.order",
    "validation_windows": "ablate.data.order",
    "selection_windows": "ablate.data.order",
    "encode": "ablate.data.tokenizer",
    "decode": "ablate.data.tokenizer",
    "register_source": "ablate.data.sources",
    "source_names": "ablate.data.sources",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("ablate.data", globals(), _EXPORTS)
