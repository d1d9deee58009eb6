"""Peak host memory of one training step's forward+backward at the 10M tier's shape, with the loss
computed over the whole micro-batch at once and in chunks (`GPT.forward(..., loss_chunk=N)`).

Each variant runs in its own process, so `ru_maxrss` (the process's high-water mark) is its own peak;
the figure reported is the growth of that mark during the step, over the model already built. CPU,
float32 (no autocast), so the logits exist in float32 only (on a GPU in bf16 there is a bf16 copy too).

    python benchmarks/loss_memory.py [--batch 2] [--seq 1024] [--chunks 0 1024 512 256 128]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def one_variant(batch: int, seq: int, chunk: int) -> dict:
    import torch

    from ablate.model import GPT
    from ablate.sizing import model_config

    torch.manual_seed(0)
    model = GPT(model_config("10M", "baseline"))
    idx = torch.randint(0, 50257, (batch, seq + 1))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    loss = model(idx[:, :-1], idx[:, 1:], loss_chunk=chunk).loss
    loss.backward()
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"loss_chunk": chunk, "loss": loss.item(), "peak_growth_mb": (after - before) / 1024,
            "peak_mb": after / 1024, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2, help="sequences per micro-batch (default 2)")
    parser.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024, the tier's)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 512, 256, 128],
                        help="loss chunks in tokens; 0 = the whole micro-batch at once")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_variant(args.batch, args.seq, args.child)))
        return
    # A fixed, low glibc mmap threshold: every block over 128 KiB is its own mapping, returned to the
    # system when freed, so the high-water mark measures live memory rather than heap fragmentation.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    tokens = args.batch * args.seq
    print(f"10M shape (8 layers, d 320, vocabulary 50,304), {args.batch} × {args.seq} = {tokens} tokens, "
          "float32 on CPU")
    print(f"{'loss chunk':>10} {'peak growth MB':>15} {'peak MB':>9} {'fwd+bwd s':>10} {'loss':>10}")
    for chunk in args.chunks:
        out = subprocess.run([sys.executable, __file__, "--batch", str(args.batch), "--seq", str(args.seq),
                              "--child", str(chunk)], capture_output=True, text=True, env=env, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        label = "whole" if chunk == 0 else str(chunk)
        print(f"{label:>10} {row['peak_growth_mb']:>15.0f} {row['peak_mb']:>9.0f} {row['seconds']:>10.2f} "
              f"{row['loss']:>10.6f}")
    print(f"(one float32 copy of the logits: {tokens * 50304 * 4 / 2**20:.0f} MB)")


if __name__ == "__main__":
    main()
