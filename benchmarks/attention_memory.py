"""Memory of one attention layer per arm, fused path vs reference path, T = 512 … 4096: is there T² growth?

    .venv/bin/python benchmarks/attention_memory.py                          # every arm, T 512 1024 2048 4096
    .venv/bin/python benchmarks/attention_memory.py --arms baseline sink-logit --seq-lens 512 1024
    .venv/bin/python benchmarks/attention_memory.py --quick --json out.json

What is measured: one `CausalSelfAttention` layer of ablate's model (c_attn → RoPE → the arm's attention
→ c_proj) at the tier's shape (10M: d_model 320, 5 heads of 64), batch 1, float32, forward + backward of a
fixed random projection of its output, with the input requiring grad. sink-token acts on the sequence,
so its layer sees T + 1 positions and is otherwise the baseline layer.

How: each (arm, path, T) runs in a fresh subprocess (see arms.py: fresh process, glibc mmap threshold
64 KiB, heap trimmed, kernel high-water mark reset). The figure is the peak resident growth of one
forward+backward over the RSS after setup and one warm-up step (weights and inputs are set-up, their
gradients are included in the growth). The warm-up step runs under the profiler to record which SDPA
kernel served the layer (flash = no T×T tensor; math = T×T materialised). Time is the median of three
steps after the warm-up, one thread.

The slope column is log2(mem(T_max) / mem(T_max / 2)): ≈ 1 for linear growth, ≈ 2 for T².
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from arms import machine, machine_line, peak_growth_mib, reset_peak, run_worker  # noqa: E402

from ablate.arms import get_arm, list_arms  # noqa: E402
from ablate.model import GPT, rope_tables  # noqa: E402
from ablate.sizing import model_config  # noqa: E402
from ablate.tiers import TIERS  # noqa: E402


def layer_step(attn, x, cos, sin, projection) -> None:
    attn.zero_grad(set_to_none=True)
    x.grad = None
    y, _ = attn(x, cos, sin)
    (y * projection).sum().backward()


def worker(argv: list[str]) -> None:
    tier_name, arm, path, seq_len, threads = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    torch.set_num_threads(threads)
    tier = TIERS[tier_name]
    positions = seq_len + (1 if get_arm(arm).sequence_token else 0)
    config = model_config(tier, arm, n_layer=1, vocab_size=64, max_seq_len=positions, fused=(path == "fused"))
    model = GPT(config)  # one block, a tiny vocabulary: the attention layer with the model's own name-keyed init
    model.init_weights(seed=0)
    attn = model.blocks[0].attn.train()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, positions, tier.d_model, generator=gen).requires_grad_()
    projection = torch.randn(1, positions, tier.d_model, generator=gen)
    cos, sin = rope_tables(torch.arange(positions), config.head_dim, config.rope_theta)

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        layer_step(attn, x, cos, sin, projection)
    names = {e.key for e in prof.key_averages()}
    kernel = ("flash" if any("flash_attention" in n for n in names)
              else "math" if any("attention_math" in n for n in names)
              else "none (explicit weights)")
    del prof
    attn.zero_grad(set_to_none=True)
    x.grad = None
    before = reset_peak()
    start = time.perf_counter()
    layer_step(attn, x, cos, sin, projection)
    times = [time.perf_counter() - start]
    growth = peak_growth_mib(before)
    for _ in range(2):
        start = time.perf_counter()
        layer_step(attn, x, cos, sin, projection)
        times.append(time.perf_counter() - start)
    print(json.dumps({"arm": arm, "path": path, "seq_len": seq_len, "positions": positions, "peak_growth_mib": growth,
                      "ms": 1e3 * statistics.median(times), "kernel": kernel}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", help="arms (default: every registered arm)")
    parser.add_argument("--tier", default="10M")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--paths", nargs="+", default=["fused", "reference"], choices=["fused", "reference"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke check: two arms, T 64 128")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.quick:
        args.arms, args.seq_lens = args.arms or ["baseline", "sink-logit"], [64, 128]
    torch.set_num_threads(args.threads)
    arms = list(args.arms or list_arms())
    for arm in arms:
        get_arm(arm)
    info = machine()
    print(machine_line(info))
    tier = TIERS[args.tier]
    print(f"one attention layer of tier {args.tier} (d_model {tier.d_model}, {tier.n_head} heads of "
          f"{tier.d_model // tier.n_head}), batch 1, float32, forward+backward"
)
    rows = []
    for arm in arms:
        for path in args.paths:
            for seq_len in args.seq_lens:
                row = run_worker(__file__, ["--worker", args.tier, arm, path, str(seq_len), str(args.threads)],
                                 args.threads)
                rows.append(row)
                print(f"  {arm} {path} T={seq_len}: {row['peak_growth_mib']:.1f} MiB, {row['ms']:.0f} ms, "
                      f"{row['kernel']}", file=sys.stderr, flush=True)

    lens = args.seq_lens
    by = {(r["arm"], r["path"], r["seq_len"]): r for r in rows}
    head = "| arm | path | SDPA kernel |" + "".join(f" T={t} MiB |" for t in lens) + " slope |" + "".join(
        f" T={t} ms |" for t in lens)
    print(f"\n{head}\n|---|---|---|" + "---:|" * (2 * len(lens) + 1))
    for arm in arms:
        for path in args.paths:
            cells = [by[(arm, path, t)] for t in lens]
            mem = [c["peak_growth_mib"] for c in cells]
            slope = (math.log2(mem[-1] / mem[-2]) / math.log2(lens[-1] / lens[-2])
                     if len(lens) > 1 and mem[-2] > 0 else float("nan"))
            print(f"| {arm} | {path} | {cells[-1]['kernel']} |" + "".join(f" {m:.1f} |" for m in mem)
                  + f" {slope:.2f} |"
                  + "".join(f" {c['ms']:.0f} |" for c in cells))
    tt = {t: 1 * tier.n_head * t * t * 4 / 2**20 for t in lens}
    print("\none T×T float32 tensor (B=1, all heads): " + ", ".join(f"T={t}: {m:.0f} MiB" for t, m in tt.items()))
    load_after = [round(x, 2) for x in __import__("os").getloadavg()]
    print(f"load average after: {', '.join(f'{x:.2f}' for x in load_after)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "load_average_after": load_after, "tier": args.tier,
                                               "command": " ".join(sys.argv),
                                               "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
