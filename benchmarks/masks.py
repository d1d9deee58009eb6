"""Step time and peak memory of the masked runs against the baseline on CPU: a sliding window (fused SDPA with a
boolean mask), stick-breaking and selective attention (the reference path), and `--document-mask` against none.

    .venv/bin/python benchmarks/masks.py                     # smoke model at B=4, T=64 and B=1, T=1024; 9 rounds
    .venv/bin/python benchmarks/masks.py --shapes 1x2048 --repeats 5
    .venv/bin/python benchmarks/masks.py --quick             # a smoke check (tiny sizes, seconds)
    .venv/bin/python benchmarks/masks.py --json out.json

Each variant is (arm, document mask). The document-masked variants see sequences with an <|endoftext|> token every
T/4 positions (four documents each; every variant gets the same tokens, so only the mask differs). Time and memory
are measured as benchmarks/arms.py measures them (and with its code): one training forward+backward of the whole
model on one thread, the variants run round-robin with the starting variant rotating, the ratio the median over
rounds of (variant / baseline in the same round); memory the peak resident growth of one step, each (variant,
shape) in a fresh process. The sliding window is 64 keys (the shipped arm): at T = 64 it admits every causal key,
so that row prices the boolean-mask path alone; at T = 1024 it is a 64-key band.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arms as bench  # noqa: E402  (benchmarks/arms.py: the model, batch, step and memory measurement)
import torch  # noqa: E402

from ablate.arms import get_arm  # noqa: E402
from ablate.data.documents import EOT_TOKEN  # noqa: E402
from ablate.tiers import TIERS  # noqa: E402


@dataclass(frozen=True)
class Variant:
    arm: str
    document_mask: bool = False

    @property
    def label(self) -> str:
        return self.arm + (" --document-mask" if self.document_mask else "")

    def path(self) -> str:
        """The attention path a run of it takes on a CPU (`Arm.path`), and whether SDPA gets a boolean mask."""
        path = get_arm(self.arm).path("cpu")
        masked = self.document_mask or "mask" in get_arm(self.arm).hooks()
        return f"{path} + boolean mask" if masked and path == "fused" else path


VARIANTS = (Variant("baseline"), Variant("sliding-window"), Variant("stick-breaking"), Variant("selective"),
            Variant("baseline", True), Variant("sliding-window", True))


def parse_shape(text: str) -> tuple[int, int]:
    batch, _, seq_len = text.partition("x")
    return int(batch), int(seq_len)


def documents_batch(batch_size: int, seq_len: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """benchmarks/arms.py's random batch with an <|endoftext|> every seq_len/4 positions (four documents)."""
    idx, targets = bench.batch(batch_size, seq_len, vocab)
    idx[:, max(1, seq_len // 4) - 1::max(1, seq_len // 4)] = EOT_TOKEN
    return idx, targets


def build(tier: str, variant: Variant, seq_len: int):
    model = bench.build(tier, variant.arm, seq_len)
    model.document_mask = variant.document_mask  # what a run's option sets (`ablate.train`)
    return model


def time_variants(variants, tier: str, batch_size: int, seq_len: int, repeats: int, warmup: int) -> dict:
    models = {v: build(tier, v, seq_len) for v in variants}
    idx, targets = documents_batch(batch_size, seq_len, TIERS[tier].vocab_size)
    for _ in range(warmup):
        for v in variants:
            bench.train_step(models[v], idx, targets)
    times: dict[Variant, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            start = time.perf_counter()
            bench.train_step(models[v], idx, targets)
            times[v].append(time.perf_counter() - start)
        print(f"  T={seq_len} round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    base = times[variants[0]]
    return {v.label: {"median_ms": 1e3 * statistics.median(times[v]), "min_ms": 1e3 * min(times[v]),
                      "ratio": statistics.median([a / b for a, b in zip(times[v], base)]),
                      "ratio_min": min(a / b for a, b in zip(times[v], base)),
                      "ratio_max": max(a / b for a, b in zip(times[v], base)),
                      "times_ms": [round(1e3 * t, 2) for t in times[v]]} for v in variants}


def memory_worker(argv: list[str]) -> dict:
    """One (variant, shape) in this process: the peak resident growth of a training step after a warm-up."""
    tier, arm, document_mask, batch_size, seq_len = argv[0], argv[1], argv[2] == "1", int(argv[3]), int(argv[4])
    model = build(tier, Variant(arm, document_mask), seq_len)
    idx, targets = documents_batch(batch_size, seq_len, TIERS[tier].vocab_size)
    bench.train_step(model, idx, targets)
    model.zero_grad(set_to_none=True)
    before = bench.reset_peak()
    bench.train_step(model, idx, targets)
    return {"label": Variant(arm, document_mask).label, "peak_growth_mib": bench.peak_growth_mib(before)}


def measure_memory(variants, tier: str, batch_size: int, seq_len: int, threads: int) -> dict:
    rows = {}
    for v in variants:
        argv = ["--memory-worker", tier, v.arm, str(int(v.document_mask)), str(batch_size), str(seq_len)]
        rows[v.label] = bench.run_worker(__file__, argv, threads)["peak_growth_mib"]
        print(f"  memory {v.label} T={seq_len}: {rows[v.label]:.0f} MiB", file=sys.stderr, flush=True)
    return rows


def table(variants, shape: dict) -> str:
    """One shape's rows: each variant's path, step time and ratio to the baseline, peak memory and ratio."""
    timing, memory = shape["timing"], shape["memory"]
    base = variants[0].label
    lines = [f"B={shape['batch']}, T={shape['seq_len']}:",
             "| variant | path (CPU) | fwd+bwd ms, median | × baseline, median of paired rounds (min–max) |"
             " peak MiB | × baseline |", "|---|---|---:|---:|---:|---:|"]
    for v in variants:
        t = timing[v.label] if timing else None
        time_cells = (f"{t['median_ms']:.1f} | {t['ratio']:.2f} ({t['ratio_min']:.2f}–{t['ratio_max']:.2f})" if t
                      else "– | –")
        mib = memory.get(v.label) if memory else None
        memory_cells = f"{mib:.0f} | {mib / memory[base]:.2f}" if mib is not None else "– | –"
        lines.append(f"| {v.label} | {v.path()} | {time_cells} | {memory_cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="smoke", help="model shape (default smoke)")
    parser.add_argument("--shapes", nargs="+", default=["4x64", "1x1024"], metavar="BxT",
                        help="batch × sequence length (default 4x64 1x1024: the smoke tier's shape, and T = 1024)")
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds after warm-up (default 9)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps per variant (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-memory", action="store_true", help="time only")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke check")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    parser.add_argument("--memory-worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker)))
        return 0
    if args.quick:
        args.shapes, args.repeats, args.warmup = ["1x32"], 1, 1
    info = bench.machine()
    print(bench.machine_line(info))
    result = {"machine": info, "tier": args.tier, "repeats": args.repeats, "command": " ".join(sys.argv), "shapes": []}
    for text in args.shapes:
        batch_size, seq_len = parse_shape(text)
        timing = time_variants(VARIANTS, args.tier, batch_size, seq_len, args.repeats, args.warmup)
        memory = None if args.no_memory else measure_memory(VARIANTS, args.tier, batch_size, seq_len, args.threads)
        result["shapes"].append({"batch": batch_size, "seq_len": seq_len, "timing": timing, "memory": memory})
        print("\n" + table(VARIANTS, result["shapes"][-1]))
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in result['load_average_after'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
