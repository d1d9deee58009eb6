"""GPT-2 BPE through tiktoken, built from the BPE file shipped in the package, never from the network.

tiktoken's own `get_encoding("gpt2")` downloads its vocabulary on first use; a laptop or a compute
node without internet would fail there. So the file lives in `assets/gpt2.tiktoken` (from
openai-whisper 20250625, MIT; identical to tiktoken's r50k_base ranks) and its SHA-256 is checked on
every load, so a damaged or swapped file can never silently change the token ids.

Every document is written as `<|endoftext|>` followed by its tokens: the end-of-text token separates
documents (and so also marks where one starts), as in GPT-2's own training data.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ablate.errors import AblateError

log = logging.getLogger(__name__)

TOKENIZER_NAME = "gpt2"
BPE_FILE = Path(__file__).with_name("assets") / "gpt2.tiktoken"
BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
VOCAB_SIZE = 50257
EOT_TOKEN = 50256
EOT_TEXT = "<|endoftext|>"
# GPT-2's pre-tokenisation regex (tiktoken's r50k_pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_bpe_ranks(path: Path) -> dict[bytes, int]:
    """Parse the tiktoken BPE format (one `base64(token) rank` per line) after checking the file's hash.

    We parse it here rather than with `tiktoken.load.load_tiktoken_bpe`, which is the same format but
    also copies the file into a cache folder under /tmp keyed by its path.
    """
    if not path.is_file():
        raise AblateError(f"GPT-2 BPE file {str(path)!r} is missing; it ships with ablate in ablate/data/assets/")
    contents = path.read_bytes()
    actual = hashlib.sha256(contents).hexdigest()
    if actual != BPE_SHA256:
        raise AblateError(
            f"GPT-2 BPE file {str(path)!r} has SHA-256 {actual}; expected {BPE_SHA256} "
            "(the file is damaged or not the GPT-2 vocabulary; restore it from the repository)"
        )
    ranks = {}
    for line in contents.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def gpt2_encoding():
    """The tiktoken Encoding for GPT-2 (50257 tokens, `<|endoftext|>` = 50256), loaded once per process."""
    import tiktoken  # tiktoken loads its BPE table only when text is encoded

    encoding = tiktoken.Encoding(
        name=TOKENIZER_NAME,
        pat_str=GPT2_PATTERN,
        mergeable_ranks=_read_bpe_ranks(BPE_FILE),
        special_tokens={EOT_TEXT: EOT_TOKEN},
        explicit_n_vocab=VOCAB_SIZE,
    )
    return encoding


def encode(text: str) -> list[int]:
    """GPT-2 token ids of `text`; special-token text such as `<|endoftext|>` is encoded as ordinary text."""
    return gpt2_encoding().encode_ordinary(text)


def decode(ids: Iterable[int]) -> str:
    return gpt2_encoding().decode([int(i) for i in ids])


def encode_document(text: str) -> np.ndarray:
    """`<|endoftext|>` + the document's tokens, as uint16 (GPT-2's ids all fit in 16 bits)."""
    ids = gpt2_encoding().encode_ordinary(text)
    tokens = np.empty(len(ids) + 1, dtype=np.uint16)
    tokens[0] = EOT_TOKEN
    tokens[1:] = ids
    return tokens


def _encode_chunk(texts: Sequence[str]) -> list[np.ndarray]:
    return [encode_document(text) for text in texts]


def _chunks(items: Iterable[tuple[object, str]], size: int) -> Iterator[tuple[list, list[str]]]:
    keys, texts = [], []
    for key, text in items:
        keys.append(key)
        texts.append(text)
        if len(texts) == size:
            yield keys, texts
            keys, texts = [], []
    if texts:
        yield keys, texts


def encode_documents(
    items: Iterable[tuple[object, str]], workers: int = 1, chunk_size: int = 64
) -> Iterator[tuple[object, np.ndarray]]:
    """Encode `(key, text)` pairs to `(key, tokens)` in input order, in `workers` processes when more than one.

    The output order is the input order whatever the number of workers, so prepared shards are
    byte-identical for 1 or N workers. Only a bounded number of chunks is in flight (unlike
    `Pool.imap`, which would read a streaming source to its end into memory), and the keys stay in
    this process, so a caller can pass anything it needs to know about each document alongside it.
    """
    if workers <= 1:
        for keys, texts in _chunks(items, chunk_size):
            yield from zip(keys, _encode_chunk(texts))
        return
    import multiprocessing  # only when encoding with worker processes
    from collections import deque  # only when encoding with worker processes

    with multiprocessing.get_context().Pool(workers, initializer=gpt2_encoding) as pool:
        in_flight: deque = deque()
        for keys, texts in _chunks(items, chunk_size):
            in_flight.append((keys, pool.apply_async(_encode_chunk, (texts,))))
            if len(in_flight) >= 4 * workers:
                done_keys, result = in_flight.popleft()
                yield from zip(done_keys, result.get())
        while in_flight:
            done_keys, result = in_flight.popleft()
            yield from zip(done_keys, result.get())
