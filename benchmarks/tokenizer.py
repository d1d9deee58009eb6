"""GPT-2 tokenizer throughput on the shipped sample: tokens per second, in one process and in N.

    python benchmarks/tokenizer.py [--workers 2] [--repeat 3]

Single-process speed is tiktoken's own; the N-process figure is what `ablate data prepare --workers N`
can reach at most (it also pays for pickling the texts and writing the shards).
"""

from __future__ import annotations

import argparse
import json
import time

import pyarrow.parquet as pq

from ablate.data.sources import SAMPLE_FILE
from ablate.data.tokenizer import encode_documents, gpt2_encoding


def measure(texts: list[str], workers: int) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = sum(len(encoded) for _, encoded in encode_documents(((None, t) for t in texts), workers=workers))
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="copies of the sample to tokenize per measurement")
    args = parser.parse_args()
    texts = pq.read_table(SAMPLE_FILE, columns=["text"]).column("text").to_pylist() * args.repeat
    gpt2_encoding()  # load outside the timing
    results = {"characters": sum(map(len, texts))}
    for workers in sorted({1, args.workers}):
        tokens, seconds = measure(texts, workers)
        results[f"workers={workers}"] = {
            "tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds),
            "tokens_per_s_per_process": round(tokens / seconds / workers),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
