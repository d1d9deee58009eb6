"""Peak memory and step time of the reference-path arms on the blocked path, against the baseline and the plan.

    .venv/bin/python benchmarks/blocked_arms.py                    # 10M shape, batch 1, T 1024 2048 4096
    .venv/bin/python benchmarks/blocked_arms.py --quick --json out.json   # a smoke check (seconds)

Arms: stick-breaking, softpick (normalisers), softcap (a score modifier), sigmoid (a normaliser) — on a CPU all four
take the reference path, blocked in query blocks (`ablate.arms.kernel.blocked_reference`) — and a window given as a
score bias (benchmarks/window_arm.py, loaded as a user's `--arm-file`: the fused path with SDPA's additive (H, T, T)
mask); `--whole-rows` adds stick-breaking on today's whole-row reference path (`GPTConfig.fused = False`) at the
lengths where it fits, for the step-time comparison.

Memory: each (arm, T) runs in a fresh subprocess (benchmarks/arms.py's worker: glibc mmap threshold 64 KiB, heap
trimmed, the kernel's high-water mark reset after one warm-up step): the peak resident growth of one forward +
backward as a later micro-batch of an accumulated step takes it, the gradients of the one before held (every tier
from 10M up accumulates: its micro-batch is below its batch, so this is the step's peak). Load-independent.

Predicted: the plan's predicted training-step peak for a CPU shape at the same length
(`ablate.sizing.arm_memory_phases_gb`, device "cpu", float32, no CUDA context, margin 1: the model's estimate, as
`ablate plan`'s peak GB), less what the measured growth leaves out: the weights, their gradients and AdamW's two
moments (the plan's 16 bytes per parameter, all resident before the measured micro-batch).

Step time: `--paired-rounds N` times, in one process and one thread, the baseline, each arm on the blocked path and
stick-breaking on today's whole-row path (at the `--whole-rows` lengths) in rotating order for N rounds: the medians
of the per-round ratios, robust to what else the machine runs. The memory subprocesses' single steps are timed too,
minutes apart: indicative only.

Largest T under 14 GB: the process's whole footprint (RSS after set-up + the step's peak growth + AdamW's two moments,
8 bytes per parameter) fitted by the quadratic a + bT + cT² through the three measured lengths and solved for 14 GB;
an extrapolation, said so in the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arms import batch, build, load_arms, machine, machine_line, rotating_rounds, run_worker  # noqa: E402

from ablate.arms import get_arm  # noqa: E402
from ablate.sizing import OPTIMIZER_BYTES, arm_memory_phases_gb  # noqa: E402
from ablate.tiers import TIERS  # noqa: E402

ARMS = ["baseline", "stick-breaking", "softpick", "softcap", "sigmoid", "bench-bias-window"]
WINDOW_ARM = Path(__file__).resolve().parent / "window_arm.py"
LIMIT_GB = 14.0
WHOLE_ROWS = "stick-breaking (whole rows)"


def predicted_gb(tier_name: str, arm: str, seq_len: int, params: int) -> float:
    """The plan's step estimate on a CPU shape (float32, batch 1), less the weights, gradients and AdamW's moments."""
    tier = replace(TIERS[tier_name], seq_len=seq_len)
    step = arm_memory_phases_gb(tier, 1, arm, device="cpu", precision="32-true", reserved_gb=0.0,
                                margin=1.0)["train_step"]
    return step - params * OPTIMIZER_BYTES / 1e9


def largest_t(lengths: list[int], footprints_gb: list[float], limit: float = LIMIT_GB) -> float | None:
    """T where the quadratic through the three (T, GB) points reaches `limit` (None: it never does, or no fit)."""
    if len(lengths) != 3:
        return None
    (t0, t1, t2), (y0, y1, y2) = lengths, footprints_gb
    first, second = (y1 - y0) / (t1 - t0), (y2 - y1) / (t2 - t1)
    c = (second - first) / (t2 - t0)
    b = first - c * (t0 + t1)
    a = y0 - b * t0 - c * t0 * t0
    if abs(c) < 1e-18:
        return None if b <= 0 else (limit - a) / b
    disc = b * b - 4 * c * (a - limit)
    return None if disc < 0 else (-b + math.sqrt(disc)) / (2 * c)


def measure(arm: str, tier: str, seq_len: int, threads: int) -> dict:
    whole = arm == WHOLE_ROWS
    name = "stick-breaking" if whole else arm
    args = ["--memory-worker", tier, name, str(seq_len), "1", str(threads), str(WINDOW_ARM), "held-gradients"]
    return run_worker(str(Path(__file__).resolve().parent / "arms.py"), args + (["whole-rows"] if whole else []),
                      threads)


def paired_times(tier: str, arms: list[str], seq_len: int, rounds: int, whole_rows: bool) -> dict[str, dict]:
    """Step times of `arms` (and, with `whole_rows`, each reference-path arm on the whole-row path, "ARM (whole
    rows)") in this process, batch 1, one warm-up step each, then `rounds` rounds in rotating order: per model the
    median step and the median of its per-round ratios to the baseline and, for a blocked arm timed beside its
    whole-row twin, to that twin."""
    models = {arm: build(tier, arm, seq_len) for arm in arms}
    if whole_rows:
        models.update({f"{arm} (whole rows)": build(tier, arm, seq_len, whole_rows=True)
                       for arm in arms if get_arm(arm).path("cpu") == "reference"})
    idx, targets = batch(1, seq_len, TIERS[tier].vocab_size)
    times = rotating_rounds(models, idx, targets, rounds, warmup=1, label=f"T={seq_len} ")

    def ratio(key: str, other: str) -> float:
        return statistics.median(a / b for a, b in zip(times[key], times[other]))

    return {key: {"median_s": statistics.median(times[key]), "vs_baseline": ratio(key, "baseline"),
                  **({"vs_whole_rows": ratio(key, f"{key} (whole rows)")} if f"{key} (whole rows)" in times else {}),
                  "times_s": [round(t, 3) for t in times[key]]} for key in times}


def paired_table(paired: dict[int, dict[str, dict]]) -> str:
    lines = ["| T | arm | median step s | × baseline | blocked × whole rows |", "|---:|---|---:|---:|---:|"]
    for seq_len, rows in paired.items():
        for key, got in rows.items():
            whole = got.get("vs_whole_rows")
            lines.append(f"| {seq_len} | {key} | {got['median_s']:.2f} | {got['vs_baseline']:.2f} | "
                         f"{'–' if whole is None else f'{whole:.2f}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="10M")
    parser.add_argument("--seq-lens", type=int, nargs="*", default=[1024, 2048, 4096],
                        help="lengths of the memory rows (none: only the paired step times)")
    parser.add_argument("--arms", nargs="+", default=ARMS)
    parser.add_argument("--whole-rows", type=int, nargs="*", default=[1024, 2048],
                        help="lengths at which stick-breaking's whole-row path runs too (none to skip)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paired-rounds", type=int, default=0,
                        help="time every arm in one process for N rotating rounds at the --whole-rows lengths, each "
                             "reference-path arm beside its whole-row twin (0: skip)")
    parser.add_argument("--quick", action="store_true", help="smoke tier, T 64 128 256")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.quick:
        args.tier, args.seq_lens, args.whole_rows = "smoke", [64, 128, 256], [128]
    load_arms(str(WINDOW_ARM))
    info = machine()
    print(machine_line(info), flush=True)
    torch.set_num_threads(args.threads)  # the paired rounds run in this process
    paired = {seq_len: paired_times(args.tier, args.arms, seq_len, args.paired_rounds, whole_rows=True)
              for seq_len in (args.whole_rows if args.paired_rounds else [])}
    if paired:
        print(paired_table(paired), flush=True)
    rows = memory_rows(args)
    if rows:
        print(table(rows, args.seq_lens))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "tier": args.tier, "rows": rows, "paired": paired},
                                              indent=2))
    return 0


def memory_rows(args) -> dict[str, dict]:
    """Each (arm, T) in its own subprocess (`measure`), with the plan's prediction and the process's footprint."""
    rows: dict[str, dict] = {}
    for seq_len in args.seq_lens:
        for arm in args.arms + ([WHOLE_ROWS] if seq_len in args.whole_rows else []):
            got = measure(arm, args.tier, seq_len, args.threads)
            got["peak_gb"] = got["peak_growth_mib"] * 2**20 / 1e9
            got["footprint_gb"] = (got["rss_after_setup_mib"] * 2**20 + 8 * got["params"]) / 1e9 + got["peak_gb"]
            if arm != WHOLE_ROWS:
                got["predicted_gb"] = predicted_gb(args.tier, arm, seq_len, got["params"])
            rows.setdefault(arm, {})[seq_len] = got
            print(f"  {arm} T={seq_len}: {got['peak_gb']:.3f} GB (predicted {got.get('predicted_gb', math.nan):.3f}, "
                  f"footprint {got['footprint_gb']:.3f}), {got['step_s']:.1f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: dict[str, dict], lengths: list[int]) -> str:
    base = rows["baseline"]
    head = "| arm |" + "".join(f" T={t}: peak GB (× base) | predicted GB (pred/meas) | step s (× base) |"
                                for t in lengths) + " largest T under 14 GB (fit) |"
    lines = [head, "|---|" + "---:|---:|---:|" * len(lengths) + "---:|"]
    for arm, by_t in rows.items():
        line = f"| {arm} |"
        for t in lengths:
            got = by_t.get(t)
            if got is None:
                line += " – | – | – |"
                continue
            pred = got.get("predicted_gb")
            line += (f" {got['peak_gb']:.2f} ({got['peak_gb'] / base[t]['peak_gb']:.2f}) |"
                     + (f" {pred:.2f} ({pred / got['peak_gb']:.2f}) |" if pred is not None else " – |")
                     + f" {got['step_s']:.1f} ({got['step_s'] / base[t]['step_s']:.2f}) |")
        fit = largest_t([t for t in lengths if t in by_t], [by_t[t]["footprint_gb"] for t in lengths if t in by_t])
        line += f" {'–' if fit is None else f'≈ {fit:,.0f}'} |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
