"""One command that proves the GPU path: every phase's memory, every arm in bf16 and float32 on the fused
kernels, score-modifier arms through flex_attention, the 124M tier at its configuration eager and compiled, MFU.

    python benchmarks/gpu_check.py                      # on a GPU: writes gpu_check.json, prints a summary
    python benchmarks/gpu_check.py --device cpu --tiny  # the same code at the smoke shape on CPU (tests)

On a lent machine (the device tool's `run`, timeout_s 500, from the repository root; its python3 has torch
2.11 and no lm-eval, so scoring falls back to `phase_memory.score_windows`; nothing else is needed):

    export PYTHONPATH=. PYTHONUNBUFFERED=1; set -o pipefail; nvidia-smi; python3 benchmarks/gpu_check.py
    --budget-s 360 --out $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log          (one line)

then, here: `python benchmarks/gpu_apply.py <files_at>/gpu_check.json` (BENCHMARKS.md and plan's gpu_check.json).

Sections, in this order, each under its own try (an error is recorded in the JSON, the next section runs), the
JSON rewritten after each (and within arms and long after each part, marked partial), so a run cut short still
leaves everything measured so far; each section ends by the deadline (`--budget-s` from the start) less what the
later ones need at least, skipping what it cannot finish, with the reason:
* hardware: name, `ablate.tiers.GPUS` key and peak bf16 TFLOP/s, torch and CUDA versions, a measured bf16 matmul;
* phases (`benchmarks/phase_memory.py`): per tier (10M, 50M, 124M, 350M) the micro-batch `micro_batch_for`
  picks for the GPU's table memory (what `ablate plan` and `submit` pick) and the measured peak of a training
  step, an evaluation, the final evaluation and `ablate eval` scoring against `memory_phases_gb`; on CPU the
  same at a reduced smoke shape (host peaks);
* arms (`gpu_arms.py`): per arm at the 124M shape, micro-batch 8: the fused path in bf16 and in float32
  against the float32 reference path; forward+backward with `sdpa_kernel` restricted to flash, then to the
  memory-efficient kernel (the math kernel is never allowed, so a fallback is refused); bf16 and float32 step
  time, tokens/s, MFU and peak memory, and the step ratio to the baseline;
* flex (`gpu_flex.py`): arms with a score-modifier or normaliser hook, their own path (flex_attention on CUDA)
  against the reference path (values and gradients), their step time against the baseline's;
* long (`gpu_long.py`): baseline and sink-logit at the 124M tier's run configuration on this GPU, eager then
  compiled, for the time the budget leaves: tokens/s, MFU, peak memory against the plan, the step ratio, and
  eager against compiled (same loss, speed-up);
* ddp: two processes on two GPUs (NCCL), or on CPU with `--ddp` (gloo): the averaged gradient equals the
  one-process gradient of the whole batch; skipped otherwise.
`plan_mfu` is the baseline's MFU at the run configuration, eager (a run's default), measured on a GPU of
`ablate.tiers.GPUS`: `ablate plan` uses it for that GPU once this file is found (see `ablate.plan`). MFU is
over the table's peak (the vendor's dense bf16 figure), `mfu_of_measured_matmul` over the matmul measured here.
The script exits 1 when a phase does not fit or a section failed.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # the budget counts from here: imports and CUDA's start included

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_arms  # noqa: E402  (benchmarks/gpu_arms.py)
import gpu_report  # noqa: E402
import phase_memory  # noqa: E402

from ablate.arms import study_arms  # noqa: E402
from ablate.errors import AblateError  # noqa: E402
from ablate.sizing import EVAL_BATCH  # noqa: E402
from ablate.tiers import GPUS, get_tier, gpu_key_for  # noqa: E402

PHASE_TIERS = ("10M", "50M", "124M", "350M")
SECTIONS = ("hardware", "phases", "arms", "flex", "long", "ddp")
LONG_ARMS = ("baseline", "sink-logit")
ARMS_S = 60  # seconds the arms section needs at least on a GPU (12 arms, about 4 s each)


def elapsed() -> float:
    return time.perf_counter() - START


def device_section(device) -> dict:
    """What the device is, and the bf16 throughput a large matmul reaches on it (the MFU's reality check)."""
    row = {"torch": torch.__version__, "python": platform.python_version()}
    if device.type != "cuda":
        return {**row, "name": platform.processor() or "cpu", "gpu_key": None, "peak_bf16_tflops": None,
                "memory_gb": None, "table_memory_gb": None}
    name = torch.cuda.get_device_name(device)
    memory = torch.cuda.get_device_properties(device).total_memory / 1e9
    key = gpu_key_for(name, memory)
    row.update(name=name, gpu_key=key, memory_gb=memory, cuda=torch.version.cuda,
               peak_bf16_tflops=GPUS[key].peak_bf16_tflops if key else None,
               table_memory_gb=GPUS[key].memory_gb if key else None)
    try:
        row["measured_matmul_tflops"] = matmul_tflops(device)
    except Exception as err:  # recorded; the name and peak above are what the other sections need
        row["matmul"] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    if key is None:
        row["note"] = f"{name} is not in ablate.tiers.GPUS: no peak, so no MFU"
    return row


def matmul_tflops(device, n: int = 8192, reps: int = 10) -> float:
    """bf16 TFLOP/s of an n×n×n matmul, the mean of `reps` after three warm-ups."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    gpu_arms.sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    gpu_arms.sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def phases_section(device, memory_gb, deadline: float) -> dict:
    """Every phase of a run inside its memory plan: per tier on a GPU, at a reduced smoke shape on CPU."""
    if device.type != "cuda":
        tiers = {"smoke-reduced": phase_memory.cpu_phases(seq=128, micro=4, eval_batch=4, chunk=128)}
        return {"tiers": tiers, "all_fit": phase_memory.judge(tiers, None)}
    tiers = {}
    for tier in PHASE_TIERS:
        if time.perf_counter() > deadline:
            tiers[tier] = {"error": "not measured: the phases' share of the budget ran out", "phases": {}}
            continue
        try:
            tiers[tier] = phase_memory.cuda_phases(tier, memory_gb, device, EVAL_BATCH)
        except AblateError as err:  # micro_batch_for: not even micro-batch 1 fits
            tiers[tier] = {"error": str(err), "phases": {}}
        except Exception as err:  # recorded; the other tiers go on
            tiers[tier] = {"error": f"{type(err).__name__}: {str(err)[:500]}", "phases": {}}
        gc.collect()
        torch.cuda.empty_cache()
    return {"tiers": tiers, "all_fit": phase_memory.judge(tiers, memory_gb), "gpu_memory_gb": memory_gb}


def arms_section(arms, shp, data, device, args, peak, deadline: float, on_arm) -> dict:
    """Every arm's row (`gpu_arms.arm_row`) until `deadline`; `on_arm(rows so far)` after each."""
    rows = {}
    for arm in arms:
        if time.perf_counter() > deadline:
            rows[arm] = {"skipped": "the arms' share of the budget ran out"}
            continue
        print(f"  arm {arm} ({elapsed():.0f} s)", flush=True)
        try:
            rows[arm] = gpu_arms.arm_row(arm, shp, data, device, args, peak)
        except Exception as err:  # recorded; the other arms go on
            rows[arm] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        on_arm(rows)
    base = rows.get("baseline", {}).get("speed", {})
    for row in rows.values():
        speed = row.get("speed", {})
        if "step_s" in base and "step_s" in speed:
            speed["step_ratio_to_baseline"] = speed["step_s"] / base["step_s"]
            speed["tokens_per_s_ratio_to_baseline"] = speed["tokens_per_s"] / base["tokens_per_s"]
    return rows


def run_section(report: dict, name: str, fn, out: Path) -> None:
    """Run one section, recording its result or its error, and write the report so far."""
    print(f"[{elapsed():6.1f} s] {name}", flush=True)
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as err:  # recorded; the next section runs
        result = {"error": f"{type(err).__name__}: {str(err)[:2000]}", "traceback": traceback.format_exc()[-4000:]}
        print(f"  {name} failed: {result['error'][:300]}", flush=True)
    result["seconds"] = time.perf_counter() - t0
    report[name] = result
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    save(report, out)


def save(report: dict, out: Path) -> None:
    """Judge and write the report as it stands (after each section, and within the long ones after each part,
    so that a run stopped by its timeout still brings back what it measured)."""
    gpu_report.finish(report)
    out.write_text(json.dumps(report, indent=1, default=str))


def saver(report: dict, name: str, out: Path, wrap=lambda partial: partial):
    """A callback that saves a section's partial result, marked as such, under `name`."""
    def save_partial(partial) -> None:
        report[name] = {**wrap(partial), "partial": True}
        save(report, out)
    return save_partial


def parse(argv):
    parser = argparse.ArgumentParser(description="Prove the GPU path; writes gpu_check.json and prints a summary.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--tiny", action="store_true", help="the smoke shape (CPU tests) instead of 124M")
    parser.add_argument("--arms", nargs="+", help="arms of the arms section (default: the study's)")
    parser.add_argument("--flex-arms", nargs="+", default=[], help="arms the flex section checks besides those it "
                                                                   "finds (score-modifier or normaliser hooks)")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS, help="sections to run")
    parser.add_argument("--timed", type=int, default=10, help="timed steps per arm (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm before timing (default 3)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="seconds for the whole script, imports included; sections shrink or skip to end "
                             "within it, plus a step or two in flight (default 360)")
    parser.add_argument("--long-s", type=float, default=40.0, help="the long section's timed seconds per arm and "
                                                                   "mode, shortened to fit the budget (default 40)")
    parser.add_argument("--flex-s", type=float, default=90.0, help="the flex section's seconds at most (default 90)")
    parser.add_argument("--compile-s", type=float, default=75.0,
                        help="seconds the long section keeps for each compilation (default 75)")
    parser.add_argument("--long-modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--ddp", action="store_true", help="on CPU: run the two-process DDP check with gloo")
    parser.add_argument("--out", default="gpu_check.json", help="where to write the results (default ./gpu_check.json)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda":  # as a run does: TF32 for the float32 matmuls autocast leaves
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    out = Path(args.out)
    shp = gpu_arms.shape(args.tiny)
    data = gpu_arms.batch_for(shp, shp["batch"], device)
    deadline = START + args.budget_s
    report = {"tier": shp["tier"], "micro_batch": shp["batch"], "seq_len": get_tier(shp["tier"]).seq_len,
              "vocab_size": shp.get("vocab_size", get_tier(shp["tier"]).vocab_size), "budget_s": args.budget_s,
              "argv": sys.argv[1:] if argv is None else list(argv)}
    run_section(report, "hardware", lambda: device_section(device), out)
    info = report["hardware"]
    peak, key = info.get("peak_bf16_tflops"), info.get("gpu_key")
    report.update(device=info.get("name"), gpu_key=key, peak_bf16_tflops=peak)  # `ablate plan` names "device"
    memory = info.get("table_memory_gb") or info.get("memory_gb")  # the table's: what plan and submit size for
    # Each section ends by the deadline less what the later ones need at least (the long one: 15 s of steps per
    # run and its compilations; the arms: ARMS_S), so that a slow section shortens itself, not the long runs.
    long_need = (len(args.long_modes) * len(LONG_ARMS) * 15 + args.compile_s * len(LONG_ARMS)
                 * ("compiled" in args.long_modes)) if "long" in args.sections else 0
    arms_need = ARMS_S if "arms" in args.sections else 0
    steps = [("phases", lambda: phases_section(device, memory, deadline - long_need - arms_need)),
             ("arms", lambda: {"arms": arms_section(args.arms or study_arms(), shp, data, device, args, peak,
                                                    deadline - long_need,
                                                    saver(report, "arms", out, lambda rows: {"arms": rows}))}),
             ("flex", lambda: flex(shp, data, device, args, peak, report, deadline - long_need)),
             ("long", lambda: long(shp, device, memory, peak, args, deadline, saver(report, "long", out))),
             ("ddp", lambda: gpu_arms.ddp_check(shp, device, args.ddp))]
    for name, fn in steps:
        if name in args.sections:
            run_section(report, name, fn, out)
    gpu_report.print_summary(report)
    print(f"[{elapsed():6.1f} s] wrote {out}", flush=True)
    return 0 if report["ok"] else 1


def flex(shp, data, device, args, peak, report, deadline):
    import gpu_flex  # noqa: E402  (benchmarks/gpu_flex.py)

    def baseline_step_s() -> float:
        timed = report.get("arms", {}).get("arms", {}).get("baseline", {}).get("speed", {}).get("step_s")
        if timed is not None:
            return timed
        # the arms section did not time the baseline: time it here, at the same shape
        return gpu_arms.speed(gpu_arms.build("baseline", shp, device), data, device, args.warmup, args.timed,
                              peak)["step_s"]

    return gpu_flex.flex_section(shp, data, device, args, peak, baseline_step_s,
                                 min(deadline, time.perf_counter() + args.flex_s))


def long(shp, device, memory, peak, args, deadline, on_run):
    import gpu_long  # noqa: E402  (benchmarks/gpu_long.py)

    return gpu_long.long_section(shp, device, memory, peak, list(LONG_ARMS), args.long_modes, args.long_s,
                                 deadline, args.compile_backend, args.tiny, args.compile_s, on_run)


if __name__ == "__main__":
    sys.exit(main())
