"""Reading a prepared folder: one split's shards as one long token array, checksums verified on open.

Every shard's SHA-256 is checked when the split is opened, so a damaged or swapped shard stops the
run with its name instead of being trained on silently. Shards are memory-mapped lazily, and a
`TokenShards` pickles as its folder and split (not its data), so DataLoader workers reopen the maps
cheaply without checking the hashes again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ablate.data.layout import MANIFEST, PROGRESS, read_manifest_file
from ablate.errors import AblateError, choice_error

_HASH_BLOCK = 1 << 22


def read_manifest(data_dir: str | os.PathLike) -> dict:
    """DIR/manifest.json, checked (`ablate.data.layout`): a missing or damaged one is one AblateError."""
    data_dir = Path(data_dir)
    if not (data_dir / MANIFEST).is_file():
        unfinished = " (it holds an unfinished prepare: rerun the same `ablate data prepare` to finish it)" if (
            data_dir / PROGRESS
        ).exists() else ""
        raise AblateError(f"no {MANIFEST} in {str(data_dir)!r}: not a prepared data folder{unfinished}")
    return read_manifest_file(data_dir)


def _verify_shards(data_dir: Path, shards: list[dict]) -> None:
    from tqdm.auto import tqdm  # a bar only when shards are verified

    total = sum(shard["tokens"] * 2 for shard in shards)
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify shards", disable=total < (1 << 30)) as bar:
        for shard in shards:
            path = data_dir / shard["file"]
            if not path.is_file():
                raise AblateError(f"shard {shard['file']!r} listed in {data_dir / MANIFEST} is missing")
            size = path.stat().st_size
            if size != shard["tokens"] * 2:
                raise AblateError(
                    f"shard {shard['file']!r} in {data_dir} has {size} bytes; the manifest says "
                    f"{shard['tokens']} tokens = {shard['tokens'] * 2} bytes (the file is damaged)"
                )
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(_HASH_BLOCK), b""):
                    digest.update(block)
                    bar.update(len(block))
            if digest.hexdigest() != shard["sha256"]:
                raise AblateError(
                    f"shard {shard['file']!r} in {data_dir} has SHA-256 {digest.hexdigest()}; the manifest says "
                    f"{shard['sha256']} (the file is damaged or was replaced; prepare the data again)"
                )


class TokenShards:
    """One split of a prepared folder, read as a single array of `len(self)` tokens."""

    def __init__(self, data_dir: str | os.PathLike, split: str = "train", verify: bool = True):
        self.data_dir = Path(data_dir)
        self.split = split
        self.manifest = read_manifest(self.data_dir)
        splits = self.manifest["splits"]
        if split not in splits:
            raise choice_error("split", split, sorted(splits))
        self.shards: list[dict] = splits[split]["shards"]
        if verify:
            _verify_shards(self.data_dir, self.shards)
        self._starts = np.cumsum([0] + [shard["tokens"] for shard in self.shards])
        self._maps: list[np.ndarray] | None = None

    @property
    def tokenizer(self) -> str:
        return self.manifest["tokenizer"]

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def fingerprint(self) -> str:
        """Identifies the data: the SHA-256 of this split's name and its shards' checksums, in order."""
        identity = {"split": self.split, "shards": [shard["sha256"] for shard in self.shards]}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _shard_maps(self) -> list[np.ndarray]:
        if self._maps is None:
            self._maps = [
                np.memmap(self.data_dir / shard["file"], dtype="<u2", mode="r") for shard in self.shards
            ]
        return self._maps

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as uint16, crossing shard boundaries as needed."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"token range [{start}, {stop}) outside [0, {len(self)})")
        maps = self._shard_maps()
        pieces = []
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            begin = start - int(self._starts[shard])
            end = min(stop, int(self._starts[shard + 1])) - int(self._starts[shard])
            pieces.append(maps[shard][begin:end])
            start += end - begin
            shard += 1
        return np.concatenate(pieces).astype(np.uint16) if pieces else np.empty(0, np.uint16)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = None  # reopened lazily where unpickled; never ship the mapped data
        return state

    def __repr__(self) -> str:
        return f"TokenShards({str(self.data_dir)!r}, split={self.split!r}, tokens={len(self):,})"


def tier_shards(data_dir: str | os.PathLike, tier, vocab_size: int) -> TokenShards:
    """A data folder's training shards for a run of `tier` (an `ablate.tiers.Tier`), refused in one line when
    they hold another tokenizer's tokens or another vocabulary than the run's model."""
    shards = TokenShards(data_dir, split="train")
    if shards.tokenizer != tier.tokenizer or shards.vocab_size != vocab_size:
        raise AblateError(f"data folder {data_dir} holds {shards.tokenizer!r} tokens (vocabulary {shards.vocab_size}); "
                          f"tier {tier.name!r} expects {tier.tokenizer!r} (vocabulary {vocab_size})")
    return shards


def check_data_folder(data_dir: str) -> None:
    """A data folder that is not a prepared one is refused before the run folder is touched."""
    try:
        read_manifest(data_dir)
    except AblateError as err:
        raise AblateError(f"{err}; pass --data a folder made by `ablate data prepare`") from None
