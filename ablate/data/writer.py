"""Documents → GPT-2 tokens → uint16 shards and a manifest, resumable and byte-reproducible.

Folder layout (see `shards.py` for reading it back)::

    OUT/train_000000.bin ...   raw little-endian uint16 tokens, `shard_tokens` each (the last shorter)
    OUT/val_000000.bin ...     the validation split, same format
    OUT/manifest.json          written last: its presence means the folder is complete
    OUT/progress.json          only while unfinished: completed shards and where to resume
    OUT/carry-NNNNNN.bin       only while unfinished: tokens read but not yet in a shard

Validation documents are chosen by a hash of the document id, so a document's split never depends
on the budget or on the order of files; the validation split is capped at `val_tokens` (taken in
source order), so every budget large enough to fill it gets exactly the same validation tokens and a
smaller budget gets a prefix of them. Documents hashed into validation never enter training.

Resuming: after each shard the progress file records the shards done, how many source documents
were consumed and (in the carry file) the tokens waiting for the next shard. Every file is written
to a temporary name and renamed, the progress file after the files it names, so a killed prepare
leaves at worst a shard nobody counts, which the resumed run rewrites. A resumed prepare therefore
writes the same bytes as one that was never interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
from pathlib import Path

import numpy as np

from ablate.data import tokenizer
from ablate.data.layout import FORMAT, MANIFEST, PROGRESS, read_manifest_file, read_progress_file
from ablate.data.sources import get_source
from ablate.errors import AblateError
from ablate.store import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 100_000_000
DEFAULT_VAL_TOKENS = 10_000_000
_VAL_HASH_KEY = b"ablate-val"


class PrepareStopped(Exception):
    """Raised by `prepare(..., stop_after_shards=k)`: an interruption on purpose, for tests."""


def is_validation(doc_id: str, val_fraction: float) -> bool:
    """A stable coin per document: the first 8 bytes of a keyed BLAKE2b hash of its id, below the fraction."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8, key=_VAL_HASH_KEY).digest()
    return int.from_bytes(digest, "big") < val_fraction * 2**64


@functools.cache
def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _readable(path: Path) -> Path:
    """Give a written file the permissions the umask allows (temporary files start owner-only)."""
    os.chmod(path, 0o666 & ~_umask())
    return path


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def _request(source, source_args, provenance, tokens, shard_tokens, val_fraction, val_tokens) -> dict:
    """Everything that determines the output bytes; a finished folder is reused only if this matches."""
    return {
        "format": FORMAT,
        "tokenizer": tokenizer.TOKENIZER_NAME,
        "tokenizer_sha256": tokenizer.BPE_SHA256,
        "source": source,
        "source_args": source_args,
        "source_provenance": provenance,
        "tokens": tokens,
        "shard_tokens": shard_tokens,
        "val_fraction": val_fraction,
        "val_tokens": val_tokens,
    }


def _check_numbers(tokens, shard_tokens, val_fraction, val_tokens) -> None:
    if tokens is not None and int(tokens) <= 0:
        raise AblateError(f"--tokens {tokens} must be a positive number of training tokens")
    if int(shard_tokens) <= 0:
        raise AblateError(f"--shard-tokens {shard_tokens} must be positive")
    if not 0 < float(val_fraction) < 1:
        raise AblateError(f"--val-fraction {val_fraction} must be between 0 and 1 (e.g. 0.005)")
    if int(val_tokens) <= 0:
        raise AblateError(f"--val-tokens {val_tokens} must be positive")


def _differences(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys)


class _Split:
    """One split's running state: finished shards, documents counted, and the tokens not yet in a shard."""

    def __init__(self, name: str, cap: int | None, shards=(), documents: int = 0, carry=None):
        self.name, self.cap = name, cap
        self.shards: list[dict] = list(shards)
        self.documents = documents
        self.pending: list[np.ndarray] = [] if carry is None or not len(carry) else [carry]
        self.pending_tokens = 0 if carry is None else len(carry)

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + self.pending_tokens

    @property
    def full(self) -> bool:
        return self.cap is not None and self.tokens >= self.cap

    def add(self, tokens: np.ndarray) -> None:
        if self.cap is not None:
            tokens = tokens[: self.cap - self.tokens]
        self.documents += 1
        self.pending.append(tokens)
        self.pending_tokens += len(tokens)

    def take(self, count: int) -> np.ndarray:
        joined = np.concatenate(self.pending) if self.pending else np.empty(0, np.uint16)
        taken, rest = joined[:count], joined[count:]
        self.pending = [rest] if len(rest) else []
        self.pending_tokens = len(rest)
        return taken

    def carry(self) -> np.ndarray:
        return np.concatenate(self.pending) if self.pending else np.empty(0, np.uint16)


class _Writer:
    """Writes shards and progress checkpoints into `out`; knows nothing about sources or tokenizing."""

    def __init__(self, out: Path, request: dict):
        self.out, self.request = out, request
        self.carry_file: str | None = None

    def write_shard(self, split: _Split, tokens: np.ndarray) -> None:
        data = tokens.astype("<u2", copy=False).tobytes()
        name = shard_name(split.name, len(split.shards))
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.out / name, data)
        _readable(self.out / name)
        split.shards.append({"file": name, "tokens": len(tokens), "sha256": hashlib.sha256(data).hexdigest()})
        log.debug("wrote %s (%d tokens)", name, len(tokens))

    def checkpoint(self, splits: dict[str, _Split], documents_read: int) -> None:
        carries = {name: split.carry() for name, split in splits.items()}
        data = b"".join(c.astype("<u2", copy=False).tobytes() for c in carries.values())
        done = sum(len(s.shards) for s in splits.values())
        carry_file = f"carry-{done:06d}.bin"
        atomic_write_bytes(self.out / carry_file, data)
        atomic_write_json(
            self.out / PROGRESS,
            {
                "request": self.request,
                "documents_read": documents_read,
                "carry": {"file": carry_file, "sha256": hashlib.sha256(data).hexdigest(),
                          "tokens": {name: len(c) for name, c in carries.items()}},
                "splits": {name: {"documents": s.documents, "shards": s.shards} for name, s in splits.items()},
            },
        )
        if self.carry_file and self.carry_file != carry_file:
            (self.out / self.carry_file).unlink(missing_ok=True)
        self.carry_file = carry_file


def _is_temporary(path: Path) -> bool:
    return path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp")


def _resume(out: Path, request: dict, caps: dict) -> tuple[dict[str, _Split], int, str | None]:
    """The splits and source position saved by an interrupted prepare, or a fresh start."""
    for stray in out.glob(".*.tmp"):  # left by a writer killed mid-write
        stray.unlink()
    if not (out / PROGRESS).exists():
        return {name: _Split(name, caps[name]) for name in SPLITS}, 0, None
    progress = read_progress_file(out)
    if progress["request"] != request:
        raise AblateError(
            f"{out} holds an unfinished prepare with other arguments ({_differences(progress['request'], request)}); "
            "rerun with the same arguments to resume it, or delete the folder"
        )
    for split in progress["splits"].values():
        for shard in split["shards"]:
            _verify_file(out / shard["file"], shard["sha256"])
    carry = progress["carry"]
    _verify_file(out / carry["file"], carry["sha256"])
    flat = np.fromfile(out / carry["file"], dtype="<u2").astype(np.uint16)
    cuts = np.cumsum([carry["tokens"][name] for name in SPLITS])[:-1]
    splits = {
        name: _Split(name, caps[name], saved["shards"], saved["documents"], pending)
        for (name, saved), pending in zip(((n, progress["splits"][n]) for n in SPLITS), np.split(flat, cuts))
    }
    log.info("resuming %s after %d documents and %d shards", out, progress["documents_read"],
             sum(len(s.shards) for s in splits.values()))
    return splits, progress["documents_read"], carry["file"]


def _verify_file(path: Path, sha256: str) -> None:
    if not path.is_file():
        raise AblateError(f"{path} is missing but recorded as written; delete the folder and prepare again")
    actual = tokenizer.file_sha256(path)
    if actual != sha256:
        raise AblateError(f"{path} has SHA-256 {actual}, expected {sha256}; delete the folder and prepare again")


def prepare(
    source: str,
    out: str | os.PathLike,
    *,
    tokens: int | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    val_fraction: float | None = None,
    val_tokens: int = DEFAULT_VAL_TOKENS,
    workers: int | None = None,
    progress_bar: bool = True,
    stop_after_shards: int | None = None,
    **source_args,
) -> Path:
    """Tokenize `source` into `out`; returns `out`. A finished folder with the same request is left as it is.

    `tokens` is the training budget: the train split holds exactly that many tokens (the last
    document cut), or every training token of the source when None. `workers` (default: all CPUs)
    changes speed only, never the output. `stop_after_shards` interrupts on purpose (for tests).
    """
    spec = get_source(source)
    args = spec.resolve_args(source_args)
    val_fraction = spec.val_fraction if val_fraction is None else val_fraction
    _check_numbers(tokens, shard_tokens, val_fraction, val_tokens)
    tokens = None if tokens is None else int(tokens)
    provenance = spec.provenance(**args) if spec.provenance else None
    request = _request(source, args, provenance, tokens, int(shard_tokens), float(val_fraction), int(val_tokens))
    out = Path(out)
    if _already_prepared(out, request):
        return out
    # `out` is made with the first shard (`_Writer.write_shard`): a source that cannot be opened (the hub offline)
    # or gives nothing leaves no empty folder behind.
    splits, documents_read, carry_file = _resume(out, request, {"train": tokens, "val": int(val_tokens)})
    writer = _Writer(out, request)
    writer.carry_file = carry_file
    train, val = splits["train"], splits["val"]
    progress = _Progress(int(shard_tokens), stop_after_shards, workers or os.cpu_count() or 1,
                         dict(total=tokens, initial=train.tokens, unit="tok", unit_scale=True,
                              desc=f"prepare {source}", disable=not progress_bar))

    def unread_documents():
        rows = itertools.islice(spec.documents(**args), documents_read, None)
        for index, (doc_id, text) in enumerate(rows, documents_read):
            split = val if is_validation(doc_id, val_fraction) else train
            yield (index, split), ("" if split.full else text)

    documents_read = _encode_into(writer, splits, unread_documents(), documents_read, progress)
    _check_read(f"source {source!r} ({args})", splits, tokens, documents_read, out, val_fraction)
    _finish(writer, out, request, splits, documents_read)
    log.info("prepared %s: %s train tokens in %d shards, %s val tokens (%d + %d documents)", out,
             f"{train.tokens:,}", len(train.shards), f"{val.tokens:,}", train.documents, val.documents)
    return out


def _check_read(what: str, splits: dict, tokens: int | None, documents_read: int, out: Path,
                val_fraction: float) -> None:
    """Refuses a source that gave no text, fewer training tokens than asked, or no validation document."""
    train, val = splits["train"], splits["val"]
    if train.documents + val.documents == 0:
        raise AblateError(f"{what} gave no documents with text: the corpus is empty")
    if tokens is not None and train.tokens < tokens:
        raise AblateError(
            f"{what} has only {train.tokens:,} training tokens ({documents_read:,} documents) "
            f"but --tokens asks for {tokens:,}; lower --tokens to at most {train.tokens:,} "
            f"(and delete {out}, which holds the unfinished prepare)"
        )
    if val.documents == 0:
        raise AblateError(
            f"no document of the {documents_read:,} read fell in the validation split (val fraction {val_fraction}); "
            f"use a larger --val-fraction (and delete {out})"
        )


def _already_prepared(out: Path, request: dict) -> bool:
    """Whether `out` already holds this request's dataset; refused when it holds another, or anything else."""
    if (out / MANIFEST).exists():
        manifest = read_manifest_file(out)
        if manifest["request"] != request:
            differences = _differences(manifest["request"], request)
            raise AblateError(
                f"{out} already holds a different prepared dataset ({differences}); choose another --out or delete it"
            )
        log.info("%s is already prepared with these arguments; nothing to do", out)
        return True
    # Only temporary files (a prepare killed during its first write) make a folder that resumes, not a stranger.
    if out.exists() and any(not _is_temporary(p) for p in out.iterdir()) and not (out / PROGRESS).exists():
        raise AblateError(
            f"--out {str(out)!r} is a non-empty folder that is not a prepared dataset; choose an empty or new folder"
        )
    return False


@dataclasses.dataclass(frozen=True)
class _Progress:
    """How the encoding loop goes: tokens per shard, an on-purpose stop (tests), tokenizer processes, the bar."""

    shard_tokens: int
    stop_after_shards: int | None
    workers: int
    bar: dict


def _encode_into(writer, splits: dict, to_read, documents_read: int, progress: _Progress) -> int:
    """Tokenize the unread documents into their splits' shards, checkpointing after each new shard, until the
    train split is full or the source ends; the documents read so far."""
    from tqdm.auto import tqdm  # a bar only while preparing

    train, written = splits["train"], 0
    encoded_documents = tokenizer.encode_documents(to_read if not train.full else iter(()), workers=progress.workers)
    with tqdm(**progress.bar) as bar, contextlib.closing(encoded_documents):
        for (index, split), encoded in encoded_documents:
            documents_read = index + 1
            if split.full:
                continue
            split.add(encoded)
            if split is train:
                bar.update(len(encoded))
            new_shards = 0
            while split.pending_tokens >= progress.shard_tokens:
                writer.write_shard(split, split.take(progress.shard_tokens))
                new_shards += 1
            if new_shards:
                writer.checkpoint(splits, documents_read)
                written += new_shards
                if progress.stop_after_shards is not None and written >= progress.stop_after_shards:
                    raise PrepareStopped(f"stopped after {written} shards, as asked")
            if train.full:
                break
    return documents_read


def _finish(writer, out: Path, request: dict, splits: dict, documents_read: int) -> None:
    """The last partial shards, then the manifest (atomically: its presence means the folder is complete)."""
    train, val = splits["train"], splits["val"]
    for split in (train, val):
        if split.pending_tokens:
            writer.write_shard(split, split.take(split.pending_tokens))
    manifest = {
        **{key: request[key] for key in ("format", "tokenizer", "tokenizer_sha256", "source", "source_args")},
        "vocab_size": tokenizer.VOCAB_SIZE,
        "eot_token": tokenizer.EOT_TOKEN,
        "dtype": "uint16",
        "byteorder": "little",
        "documents_read": documents_read,
        "splits": {
            s.name: {"documents": s.documents, "tokens": s.tokens, "shards": s.shards} for s in (train, val)
        },
        "request": request,
    }
    atomic_write_json(out / MANIFEST, manifest)
    _readable(out / MANIFEST)
    (out / PROGRESS).unlink(missing_ok=True)
    for stale in out.glob("carry-*.bin"):
        stale.unlink()
