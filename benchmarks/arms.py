"""Step time and peak memory of every registered arm, relative to baseline, at a tier's shape on CPU.

    .venv/bin/python benchmarks/arms.py                      # 10M shape, B=1, T=512, 11 rounds; memory at 512, 2048
    .venv/bin/python benchmarks/arms.py --quick              # a smoke check (tiny sizes, seconds)
    .venv/bin/python benchmarks/arms.py --arms baseline sink-logit --profile   # which ops the arm adds
    .venv/bin/python benchmarks/arms.py --json out.json
    .venv/bin/python benchmarks/arms.py --arm-file my_arm.py # your arm(s) against the baseline, in one run

Time: one training forward+backward (`model(idx, targets).loss.backward()`, gradients set to None before
each step; no optimiser step, which is the same for every arm) of the full model — the 50,304-row tied
head included — on one thread unless `--threads`. Every arm gets warm-up steps, then the arms are run
round-robin, the starting arm rotating every round, so slow drift of the machine hits every arm alike.
The ratio is the median over rounds of (arm time / baseline time in the same round); the fastest/fastest
ratio (each arm's quickest step over baseline's) is printed too, as the figure least hurt by a busy machine.
The verdict uses the median ratio.

Memory: CPU has no allocator statistics, so each (arm, T) runs in a fresh subprocess that builds the
model, runs one warm-up step, frees the gradients and trims the heap; it then resets the kernel's
high-water mark (`/proc/self/clear_refs`) and reports VmHWM − VmRSS over one more step: the peak
resident growth of a training step (activations, gradients and any transient buffers). The worker runs
with `MALLOC_MMAP_THRESHOLD_=65536`, so every buffer of 64 KiB or more is its own mapping and returned
to the kernel when freed (RSS follows live memory instead of glibc's cached heap).

Design target (issue 2): every arm within 1.10× of baseline; sink-token within 1.05 × (T+1)/T. An arm on the
reference path (a score modifier or a normaliser: softcap, sigmoid, forgetting, ssmax) has no target on a CPU:
it materialises (B, H, T, T) per layer by design (`Arm.path`; flex_attention on CUDA, where
benchmarks/gpu_check.py times it); its row gives the price of that path beside the baseline's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from ablate.arms import get_arm, list_arms  # noqa: E402
from ablate.model import GPT  # noqa: E402
from ablate.sizing import model_config  # noqa: E402
from ablate.tiers import TIERS  # noqa: E402

TARGET = 1.10
SINK_TOKEN_TARGET = 1.05  # × (T+1)/T: the extra position is the arm's definition, not overhead


# ------------------------------------------------------------------------------------------ machine
def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def machine_line(info: dict) -> str:
    load = ", ".join(f"{x:.2f}" for x in info["load_average"])
    return (f"machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, {info['threads']} thread(s), "
            f"load average {load}")


# ------------------------------------------------------------------------------------------ memory
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def reset_peak() -> int:
    """Reset the kernel's resident high-water mark; return the current RSS in KiB."""
    trim_heap()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_growth_mib(rss_before_kib: int) -> float:
    return (_status_kib("VmHWM") - rss_before_kib) / 1024


def load_arms(arm_file: str | None) -> list[str]:
    """The arms `arm_file` registers (loaded as `ablate run --arm-file` loads it), in registration order; none
    without a file. Every memory subprocess loads it again, so a user's arm is measured like a registered one."""
    if not arm_file:
        return []
    from ablate.cli.arms import load_arm_file

    before = set(list_arms())
    load_arm_file(arm_file)
    return [arm for arm in list_arms() if arm not in before]


def run_worker(module: str, args: list[str], threads: int) -> dict:
    """Run `python -m`-style worker code in a fresh process; it prints one JSON line last."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, module, *args], cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"worker {module} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ models
def build(tier: str, arm: str, seq_len: int, whole_rows: bool = False) -> GPT:
    """The model; `whole_rows`: every arm on the whole-row reference path (`GPTConfig.fused = False`)."""
    model = GPT(model_config(TIERS[tier], arm, max_seq_len=seq_len, **({"fused": False} if whole_rows else {})))
    model.init_weights(seed=0)
    return model.train()


def batch(batch_size: int, seq_len: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model: GPT, idx, targets) -> None:
    model.zero_grad(set_to_none=True)
    model(idx, targets).loss.backward()


def target_for(arm: str, seq_len: int) -> float | None:
    """The step-time target over baseline; None for an arm on the reference path (O(T²) by design on a CPU)."""
    if get_arm(arm).path("cpu") == "reference":
        return None
    return SINK_TOKEN_TARGET * (seq_len + 1) / seq_len if get_arm(arm).sequence_token else TARGET


# ------------------------------------------------------------------------------------------ timing
def rotating_rounds(models: dict[str, GPT], idx, targets, repeats: int, warmup: int,
                    label: str = "") -> dict[str, list[float]]:
    """Seconds of each model's training step over `repeats` rounds, after `warmup` steps each; round r starts at
    the r-th model, so no model always runs first or after the same one (a drifting machine load spreads evenly)."""
    keys = list(models)
    for _ in range(warmup):
        for key in keys:
            train_step(models[key], idx, targets)
    times: dict[str, list[float]] = {key: [] for key in keys}
    for r in range(repeats):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            start = time.perf_counter()
            train_step(models[key], idx, targets)
            times[key].append(time.perf_counter() - start)
        print(f"  {label}round {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    return times


def time_arms(arms, tier, batch_size, seq_len, repeats, warmup) -> dict:
    models = {arm: build(tier, arm, seq_len) for arm in arms}
    idx, targets = batch(batch_size, seq_len, TIERS[tier].vocab_size)
    times = rotating_rounds(models, idx, targets, repeats, warmup)
    rows = {}
    for arm in arms:
        ratios = [a / b for a, b in zip(times[arm], times["baseline"])]
        rows[arm] = {"median_ms": 1e3 * statistics.median(times[arm]), "min_ms": 1e3 * min(times[arm]),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "ratio_of_minima": min(times[arm]) / min(times["baseline"]),
                     "target": target_for(arm, seq_len), "times_ms": [round(1e3 * t, 2) for t in times[arm]]}
        target = rows[arm]["target"]
        rows[arm]["meets_target"] = None if target is None else rows[arm]["ratio"] <= target
    return rows


def memory_worker(argv: list[str]) -> None:
    """One (arm, T) in this process. Flags after the six fields: "whole-rows" (the whole-row reference path);
    "held-gradients" (the measured step is a later micro-batch of an accumulated step: the gradients of the one
    before are held, so the growth leaves them out, as it leaves out the weights)."""
    tier, arm, seq_len, batch_size, threads = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    load_arms(argv[5] if argv[5] != "-" else None)
    torch.set_num_threads(threads)
    model = build(tier, arm, seq_len, whole_rows="whole-rows" in argv[6:])
    held = "held-gradients" in argv[6:]
    idx, targets = batch(batch_size, seq_len, TIERS[tier].vocab_size)
    train_step(model, idx, targets)  # warm-up: lazy initialisation, kernel caches
    if not held:
        model.zero_grad(set_to_none=True)
    before = reset_peak()
    start = time.perf_counter()
    if held:
        model(idx, targets).loss.backward()  # accumulates into the held gradients
    else:
        train_step(model, idx, targets)
    step_s = time.perf_counter() - start
    growth = peak_growth_mib(before)
    print(json.dumps({"arm": arm, "seq_len": seq_len, "peak_growth_mib": growth, "rss_after_setup_mib": before / 1024,
                      "step_s": step_s,
                      "params": sum(p.numel() for p in model.parameters())}))


def measure_memory(arms, tier, batch_size, seq_lens, threads, arm_file: str | None = None) -> dict:
    rows: dict[str, dict] = {arm: {} for arm in arms}
    for seq_len in seq_lens:
        for arm in arms:
            result = run_worker(__file__, ["--memory-worker", tier, arm, str(seq_len), str(batch_size), str(threads),
                                           str(Path(arm_file).resolve()) if arm_file else "-"], threads)
            rows[arm][seq_len] = result["peak_growth_mib"]
            print(f"  memory {arm} T={seq_len}: {result['peak_growth_mib']:.0f} MiB", file=sys.stderr, flush=True)
    return rows


# ------------------------------------------------------------------------------------------ profile
def profile_ops(arms, tier, batch_size, seq_len, steps=3) -> dict[str, dict[str, float]]:
    """Self CPU time per op (ms per step) of each arm, to say what an arm adds over baseline."""
    from torch.profiler import ProfilerActivity, profile

    idx, targets = batch(batch_size, seq_len, TIERS[tier].vocab_size)
    out = {}
    for arm in arms:
        model = build(tier, arm, seq_len)
        train_step(model, idx, targets)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                train_step(model, idx, targets)
        out[arm] = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    return out


def print_profile_diff(ops: dict[str, dict[str, float]], top: int = 12) -> None:
    base = ops["baseline"]
    for arm, table in ops.items():
        if arm == "baseline":
            continue
        diff = sorted(((table.get(k, 0.0) - base.get(k, 0.0), k) for k in set(table) | set(base)), reverse=True)
        total = sum(table.values()) - sum(base.values())
        print(f"\n{arm}: +{total:.1f} ms/step self CPU over baseline; largest increases:")
        print("| op | baseline ms | arm ms | Δ ms |\n|---|---:|---:|---:|")
        for delta, key in diff[:top]:
            print(f"| `{key}` | {base.get(key, 0.0):.1f} | {table.get(key, 0.0):.1f} | {delta:+.1f} |")


# ------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", help="arms to measure (default: every registered arm; baseline "
                                                  "is always added)")
    parser.add_argument("--arm-file", metavar="FILE.py",
                        help="a Python file that registers your arm(s); measured against the baseline (with --arms: "
                             "those arms, which may name the file's)")
    parser.add_argument("--tier", default="10M", help="model shape (default 10M)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--seq-len", type=int, default=512, help="sequence length for timing (default 512)")
    parser.add_argument("--repeats", type=int, default=11, help="timed rounds after warm-up (default 11)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps per arm (default 2)")
    parser.add_argument("--memory-seq-lens", type=int, nargs="*", default=[512, 2048],
                        help="sequence lengths for peak memory (default 512 2048; none to skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: per-core figures)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also profile each arm's ops against baseline")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke check")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to PATH")
    parser.add_argument("--memory-worker", nargs="+", help=argparse.SUPPRESS)  # 6 fields, then flags
    args = parser.parse_args(argv)
    if args.memory_worker:
        memory_worker(args.memory_worker)
        return 0
    if args.quick:
        args.seq_len, args.repeats, args.warmup, args.memory_seq_lens = 64, 3, 1, [64, 128]
        args.tier = "smoke" if args.tier == "10M" else args.tier
    torch.set_num_threads(args.threads)
    registered = load_arms(args.arm_file)
    arms = list(args.arms or registered or list_arms())
    for arm in arms:
        get_arm(arm)
    if "baseline" not in arms:
        arms.insert(0, "baseline")
    tier = TIERS[args.tier]
    info = machine()
    result = {"machine": info, "tier": args.tier, "batch": args.batch, "seq_len": args.seq_len,
              "repeats": args.repeats, "warmup": args.warmup, "arm_file": args.arm_file, "command": " ".join(sys.argv)}
    print(machine_line(info))
    print(f"shape: tier {args.tier} (n_layer {tier.n_layer}, d_model {tier.d_model}, {tier.n_head} heads, "
          f"vocab {tier.vocab_size} padded to 64), batch {args.batch}, float32")
    timing = None if args.no_timing else time_arms(arms, args.tier, args.batch, args.seq_len, args.repeats, args.warmup)
    memory = (measure_memory(arms, args.tier, args.batch, args.memory_seq_lens, args.threads, args.arm_file)
              if args.memory_seq_lens else None)
    result.update(timing=timing, memory=memory, load_average_after=[round(x, 2) for x in os.getloadavg()])

    head = "| arm | path (CPU) |"
    rule = "|---|---|"
    if timing:
        head += (f" fwd+bwd ms (T={args.seq_len}), median | × baseline, median of paired rounds (min–max) |"
                 " × baseline, fastest/fastest | target | meets |")
        rule += "---:|---:|---:|---:|:---:|"
    for seq_len in args.memory_seq_lens or []:
        head += f" peak MiB T={seq_len} | × base |"
        rule += "---:|---:|"
    print(f"\n{head}\n{rule}")
    for arm in arms:
        line = f"| {arm} | {get_arm(arm).path('cpu')} |"
        if timing:
            t = timing[arm]
            target, meets = ("–", "–") if t["target"] is None else (f"≤ {t['target']:.3f}",
                                                                      "yes" if t["meets_target"] else "**no**")
            line += (f" {t['median_ms']:.0f} | {t['ratio']:.3f} ({t['ratio_min']:.2f}–{t['ratio_max']:.2f}) | "
                     f"{t['ratio_of_minima']:.3f} | {target} | {meets} |")
        for seq_len in args.memory_seq_lens or []:
            mib = memory[arm][seq_len]
            line += f" {mib:.0f} | {mib / memory['baseline'][seq_len]:.2f} |"
        print(line)
    print(f"\nload average after: {', '.join(f'{x:.2f}' for x in result['load_average_after'])}")
    if args.profile:
        ops = profile_ops(arms, args.tier, args.batch, args.seq_len)
        result["profile_self_cpu_ms_per_step"] = ops
        print_profile_diff(ops)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
