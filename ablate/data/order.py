"""One fixed order of training batches per (data, seed, global batch, sequence length).

The train tokens are cut into non-overlapping windows of `seq_len + 1` tokens (inputs and shifted
targets). Each epoch visits the windows in a permutation keyed by (seed, epoch); step `s` of epoch
`e = s // steps_per_epoch` takes the next `global_batch` windows of that permutation (the leftover
windows of an epoch are skipped, a different few each epoch). So a global batch is a pure function of
(data, seed, global batch, seq_len, step), and

- the number of DataLoader workers cannot change it (each item is looked up by its step);
- the number of ranks cannot change it: rank r of W takes rows [r·B/W, (r+1)·B/W) of the same
  global batch, so a run may even resume on a different number of GPUs and see the same data;
- the position is the step alone, which is what `state_dict()` saves.

The permutation is an argsort of SplitMix64 hashes of the window indices (a bijection of uint64, so
no ties), computed with plain integer arithmetic: it does not depend on the version of numpy's or
torch's random generators, which do not promise the same streams across releases.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ablate.data.shards import TokenShards
from ablate.errors import AblateError

ORDER = "splitmix64-argsort/1"


def _splitmix64(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def window_permutation(count: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of range(count) determined by (seed, epoch) alone.

    The key hashes seed and epoch together, so (seed 0, epoch 1) and (seed 1, epoch 0) differ — as
    they would not if the epoch's seed were seed + epoch.
    """
    key = int.from_bytes(hashlib.blake2b(f"{seed}:{epoch}".encode(), digest_size=8).digest(), "big")
    keys = _splitmix64(np.arange(count, dtype=np.uint64) ^ np.uint64(key))
    return np.argsort(keys, kind="stable").astype(np.int64)


class BatchStream:
    """The training batches of one (data, seed, global_batch, seq_len), as seen by one rank."""

    def __init__(
        self, shards: TokenShards, seed: int = 0, global_batch: int = 8, seq_len: int = 64,
        rank: int = 0, world_size: int = 1,
    ):
        for name, value in (("global batch", global_batch), ("sequence length", seq_len), ("world size", world_size)):
            if int(value) <= 0:
                raise AblateError(f"{name} {value} must be a positive integer")
        if int(seed) < 0:
            raise AblateError(f"data seed {seed} must be a non-negative integer")
        if global_batch % world_size:
            raise AblateError(
                f"global batch {global_batch} is not divisible by world size {world_size}; "
                "every rank must take an equal slice of the same global batch"
            )
        if not 0 <= rank < world_size:
            raise AblateError(f"rank {rank} is outside 0..{world_size - 1} for world size {world_size}")
        self.shards = shards
        self.seed, self.global_batch_size, self.seq_len = int(seed), int(global_batch), int(seq_len)
        self.rank, self.world_size = int(rank), int(world_size)
        self.window = self.seq_len + 1
        self.windows = len(shards) // self.window
        if self.windows < self.global_batch_size:
            raise AblateError(
                f"the {shards.split} split has {len(shards):,} tokens = {self.windows} windows of {self.window}; "
                f"a global batch needs {self.global_batch_size} (prepare more tokens or use a smaller batch)"
            )
        self.steps_per_epoch = self.windows // self.global_batch_size
        self.step = 0  # the next step to be consumed through `loader()`; what state_dict() saves
        self._permutation: tuple[int, np.ndarray] | None = None

    @property
    def local_batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    def _epoch_permutation(self, epoch: int) -> np.ndarray:
        if self._permutation is None or self._permutation[0] != epoch:
            self._permutation = (epoch, window_permutation(self.windows, self.seed, epoch))
        return self._permutation[1]

    def window_indices(self, step: int) -> np.ndarray:
        """The `global_batch` window indices of `step`, in row order."""
        if step < 0:
            raise AblateError(f"step {step} must be non-negative")
        epoch, within = divmod(int(step), self.steps_per_epoch)
        start = within * self.global_batch_size
        return self._epoch_permutation(epoch)[start : start + self.global_batch_size]

    def _rows(self, windows: np.ndarray) -> torch.Tensor:
        rows = [self.shards.read(int(w) * self.window, (int(w) + 1) * self.window) for w in windows]
        return torch.from_numpy(np.stack(rows).astype(np.int64))

    def global_batch(self, step: int) -> torch.Tensor:
        """(global_batch, seq_len + 1) token ids of `step`: inputs are [:, :-1], targets [:, 1:]."""
        return self._rows(self.window_indices(step))

    def local_batch(self, step: int) -> torch.Tensor:
        """This rank's rows [rank·B/W, (rank+1)·B/W) of `global_batch(step)`."""
        size = self.local_batch_size
        return self._rows(self.window_indices(step)[self.rank * size : (self.rank + 1) * size])

    def loader(self, start_step: int | None = None, num_workers: int = 0, stop_step: int | None = None):
        """A DataLoader of local batches for steps start_step, start_step + 1, ... (stop_step excluded).

        `start_step` defaults to the restored position. Iterating it advances `self.step`, so
        `state_dict()` taken after training on a batch resumes at the batch after it.
        """
        start = self.step if start_step is None else int(start_step)
        stop = start + (1 << 62) if stop_step is None else int(stop_step)
        return _StepLoader(self, start, stop, num_workers)

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "seed": self.seed,
            "global_batch": self.global_batch_size,
            "seq_len": self.seq_len,
            "data": self.shards.fingerprint,
            "order": ORDER,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the position; refuse a state saved by a different stream (other data, seed, B, T or order)."""
        mine = self.state_dict()
        different = [k for k in mine if k != "step" and state.get(k) != mine[k]]
        if different:
            detail = ", ".join(f"{k} {state.get(k)!r} (this stream: {mine[k]!r})" for k in different)
            raise AblateError(f"the saved data-loader state belongs to another batch stream: {detail}")
        self.step = int(state["step"])


class _StepBatches(torch.utils.data.Dataset):
    """Map-style: item i is the local batch of step start + i."""

    def __init__(self, stream: BatchStream, start: int, stop: int):
        self.stream, self.start, self.stop = stream, start, stop

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.stream.local_batch(self.start + index)


class _StepLoader(torch.utils.data.DataLoader):
    """A DataLoader that also moves its stream's position forward as batches are handed out."""

    def __init__(self, stream: BatchStream, start: int, stop: int, num_workers: int):
        super().__init__(_StepBatches(stream, start, stop), batch_size=None, shuffle=False, num_workers=num_workers)
        self.stream, self.start = stream, start

    def __iter__(self):
        for offset, batch in enumerate(super().__iter__()):
            self.stream.step = self.start + offset + 1
            yield batch


def validation_windows(data_dir, seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """The fixed validation set: the first contiguous windows of seq_len + 1 tokens of the val split.

    (windows, seq_len + 1) int64, at most `max_tokens // seq_len` windows (every window when None).
    Which windows are evaluated depends only on the data, seq_len and max_tokens — never on the batch
    size or the number of processes, so every run of a tier evaluates the same tokens.
    """
    if int(seq_len) <= 0 or (max_tokens is not None and int(max_tokens) <= 0):
        raise AblateError(f"seq_len {seq_len} and max_tokens {max_tokens} must be positive")
    shards = TokenShards(data_dir, split="val")
    window = int(seq_len) + 1
    windows = len(shards) // window
    if windows == 0:
        raise AblateError(
            f"the val split of {data_dir} has {len(shards):,} tokens, fewer than one window of {window}"
        )
    if max_tokens is not None:
        windows = max(1, min(windows, int(max_tokens) // int(seq_len)))
    return torch.from_numpy(shards.read(0, windows * window).astype(np.int64)).view(windows, window)


def validation_batches(
    data_dir, seq_len: int, batch_size: int, max_batches: int | None = None
) -> list[torch.Tensor]:
    """`validation_windows` in batches of `batch_size` (only the last may be smaller); at most `max_batches`."""
    if int(seq_len) <= 0 or int(batch_size) <= 0:
        raise AblateError(f"seq_len {seq_len} and batch_size {batch_size} must be positive")
    max_tokens = None if max_batches is None else int(max_batches) * int(batch_size) * int(seq_len)
    return list(validation_windows(data_dir, seq_len, max_tokens).split(int(batch_size)))


def selection_windows(data_dir, seq_len: int, validation_tokens: int | None, max_tokens: int) -> torch.Tensor:
    """The selection split of an LR sweep: the val split's windows right after the final validation windows.

    Held out like the validation set (its documents never enter training) and disjoint from it: the final
    validation takes the first `validation_windows(data_dir, seq_len, validation_tokens)`, the selection
    split the next `max_tokens // seq_len` windows. A val split too small for both is refused, naming the size
    to prepare: an LR chosen on the tokens the results are reported on would leak into them.
    """
    reported = len(validation_windows(data_dir, seq_len, validation_tokens))
    shards = TokenShards(data_dir, split="val")
    window = int(seq_len) + 1
    wanted = max(1, int(max_tokens) // int(seq_len))
    available = len(shards) // window - reported
    if available < wanted:
        need = (reported + wanted) * window
        raise AblateError(
            f"the val split of {data_dir} has {len(shards):,} tokens: the validation set takes {reported} windows "
            f"of {window} and the LR sweep's selection split needs {wanted} more ({need:,} tokens in all); prepare "
            f"the data with `--val-tokens {need}` or more, or give the sweep fewer selection_tokens")
    start = reported * window
    return torch.from_numpy(shards.read(start, start + wanted * window).astype(np.int64)).view(wanted, window)
