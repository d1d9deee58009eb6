"""Data: sources → GPT-2 tokens → checksummed uint16 shards → one fixed batch order per data seed.

    from ablate.data import TokenShards, BatchStream, validation_batches, prepare, encode, decode

Names are imported on first use (PEP 562), so `ablate.data.cli` — and with it the `ablate` command —
starts without loading torch, tiktoken or datasets.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "prepare": "ablate.data.writer",
    "TokenShards": "ablate.data.shards",
    "read_manifest": "ablate.data.shards",
    "BatchStream": "ablate.data.order",
    "validation_batches": "ablate.data.order",
    "encode": "ablate.data.tokenizer",
    "decode": "ablate.data.tokenizer",
    "register_source": "ablate.data.sources",
    "source_names": "ablate.data.sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ablate.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
