"""One command that proves the GPU path: every arm at the 124M shape, bf16, fused kernels, compile, DDP.

    python benchmarks/gpu_check.py                      # on a GPU: writes gpu_check.json, prints a table
    python benchmarks/gpu_check.py --device cpu --tiny  # the same code at the smoke shape on CPU (tests)

What it measures, per arm (model built by `ablate.sizing.model_config`, weights by `GPT.init_weights`):
* accuracy: the fused path under bf16 autocast against the reference path in float32 (materialised
  attention weights), same weights, one batch: the largest absolute logit error and both losses;
* backend: forward+backward with `sdpa_kernel` restricted to the flash kernel, then to the
  memory-efficient one; the math kernel (a T×T tensor) is never allowed, so a fallback raises; an arm with a
  score modifier or a normaliser (`--arms softcap sigmoid forgetting ssmax`) takes compiled flex_attention on
  CUDA instead (`Arm.path`), checked against the reference path in float32, forward and every gradient
  (`ablate.armcheck.check_flex`: the sink as o·σ(lse − b), a normaliser's log-weight as o·exp(lse));
* speed: training steps (forward, backward, AdamW; fused AdamW on CUDA) timed after warm-up: step
  time, tokens/s and their ratio to the baseline's, MFU (6·N·D + attention FLOPs, as `ablate plan`
  counts them, over the GPU's peak bf16 throughput from `ablate.tiers.GPUS`), peak memory.
Every phase's memory (`benchmarks/phase_memory.py`): on a GPU, per tier, the micro-batch `micro_batch_for`
picks for it and the measured peak of a training step, an evaluation, the final evaluation and `ablate eval`
scoring against `ablate.sizing.memory_phases_gb`; on CPU the same at a reduced smoke shape (host peaks). The
script exits 1 when a phase does not fit (out of memory, above its estimate, or an estimate above 90% of the GPU).
Then a 30-step training run of the baseline, eager and `torch.compile`d: a loop over the model itself
(same batches, same init, bf16 autocast), not `ablate.train.run`, so that it needs no prepared data and
times the model alone; it reports both loss curves' largest difference and the speed-up. Two-process
DDP runs when two GPUs exist (NCCL): each rank takes half of a batch and the averaged gradient must equal
the one-process gradient of the whole batch; `--ddp` runs it with gloo on CPU, otherwise it is skipped
with the reason. `plan_mfu` (the baseline's MFU, measured on a GPU of `ablate.tiers.GPUS`) is what
`ablate plan` uses for that GPU once this file is found (see `ablate.plan`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import phase_memory  # noqa: E402  (benchmarks/phase_memory.py)

from ablate.armcheck import check_flex  # noqa: E402
from ablate.arms import get_arm, study_arms  # noqa: E402
from ablate.model import GPT  # noqa: E402
from ablate.errors import AblateError  # noqa: E402
from ablate.plan import training_flops  # noqa: E402
from ablate.sizing import EVAL_BATCH  # noqa: E402
from ablate.sizing import model_config  # noqa: E402
from ablate.tiers import GPUS, get_tier, gpu_key_for  # noqa: E402

PHASE_TIERS = ("10M", "50M", "124M", "350M")
GOAL_MFU = 0.45
GOAL_STEP_RATIO = 1.05


TINY_VOCAB = 512  # CPU tests: bf16 matmuls on CPU are slow, and the 50,304-way output layer dominates


def shape(tiny: bool) -> dict:
    """The model and batch: the 124M tier at a micro-batch of 8, or the smoke tier at 2 with a small
    vocabulary (CPU tests; the code path is the same)."""
    return {"tier": "smoke", "batch": 2, "vocab_size": TINY_VOCAB} if tiny else {"tier": "124M", "batch": 8}


def build(arm: str, shp: dict, device, seed: int = 0) -> GPT:
    overrides = {"vocab_size": shp["vocab_size"]} if "vocab_size" in shp else {}
    model = GPT(model_config(shp["tier"], arm, **overrides))
    model.init_weights(seed)
    return model.to(device)


def batch_for(shp: dict, batch: int, device, seed: int = 0) -> torch.Tensor:
    t = get_tier(shp["tier"])
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, shp.get("vocab_size", t.vocab_size), (batch, t.seq_len + 1), generator=g).to(device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def accuracy(arm: str, shp: dict, data: torch.Tensor, device) -> dict:
    """Fused path in bf16 autocast vs the reference path in float32, same weights, same batch."""
    fused = build(arm, shp, device)
    reference = GPT(replace(fused.config, fused=False)).to(device)
    reference.load_state_dict(fused.state_dict())
    with torch.no_grad():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = fused(data[:, :-1], data[:, 1:])
        ref = reference(data[:, :-1], data[:, 1:])
    return {"max_abs_logit_error": float((out.logits.float() - ref.logits).abs().max()),
            "loss_bf16_fused": float(out.loss), "loss_fp32_reference": float(ref.loss)}


def backend(model: GPT, data: torch.Tensor, device) -> dict:
    """Which fused SDPA kernel runs the arm's forward and backward (the math kernel is never allowed)."""
    result = {}
    for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel([kernel]), torch.autocast(device.type, dtype=torch.bfloat16):
                model(data[:, :-1], data[:, 1:]).loss.backward()
            result[name] = "ok"
        except RuntimeError as err:
            result[name] = f"refused: {str(err).splitlines()[0][:120]}"
        model.zero_grad(set_to_none=True)
    result["fused_kernel_used"] = any(v == "ok" for v in result.values())
    return result


def optimizer_for(model: GPT, device) -> torch.optim.Optimizer:
    groups = [{k: v for k, v in g.items() if k != "names"} for g in model.param_groups(0.1)]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_steps(model, data, device, steps: int, forward=None) -> tuple[list[float], list[float]]:
    """`steps` training steps on one batch; per-step seconds (synchronised) and losses."""
    forward = model if forward is None else forward
    opt = optimizer_for(model, device)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = forward(data[:, :-1], data[:, 1:]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
    return times, [float(x) for x in losses]


def speed(model: GPT, data: torch.Tensor, device, warmup: int, timed: int, peak_tflops) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, _ = train_steps(model, data, device, warmup + timed)
    step = statistics.median(times[warmup:])
    tokens = data.shape[0] * (data.shape[1] - 1)
    c = model.config  # the FLOPs `ablate plan` counts, per token of this shape
    t = replace(get_tier("smoke"), n_layer=c.n_layer, d_model=c.d_model, seq_len=data.shape[1] - 1, global_batch=1)
    per_token = training_flops(t, model.param_counts()["non_embedding"], c.padded_vocab_size, steps=1) / t.seq_len
    row = {"step_s": step, "tokens_per_s": tokens / step, "flops_per_token": per_token,
           "mfu": per_token * tokens / step / (peak_tflops * 1e12) if peak_tflops else None,
           "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
    return row


def compile_check(shp: dict, data: torch.Tensor, device, steps: int, backend_name: str) -> dict:
    """`steps` training steps of the baseline, eager and compiled, from the same init on the same batch."""
    eager_model = build("baseline", shp, device)
    eager_times, eager_losses = train_steps(eager_model, data, device, steps)
    model = build("baseline", shp, device)
    compiled = torch.compile(model, backend=backend_name)
    compiled_times, compiled_losses = train_steps(model, data, device, steps, forward=compiled)
    tail = max(1, steps // 3)  # the last third: compilation is over
    eager_s, compiled_s = statistics.median(eager_times[-tail:]), statistics.median(compiled_times[-tail:])
    diff = max(abs(a - b) for a, b in zip(eager_losses, compiled_losses))
    return {"backend": backend_name, "steps": steps, "eager_losses": eager_losses, "compiled_losses": compiled_losses,
            "max_loss_difference": diff, "same_loss_to_bf16": diff <= 0.02 * max(eager_losses),
            "first_compiled_step_s": compiled_times[0], "eager_step_s": eager_s, "compiled_step_s": compiled_s,
            "speedup": eager_s / compiled_s, "loss_decreased": eager_losses[-1] < eager_losses[0]}


def _ddp_worker(rank: int, world: int, shp: dict, backend_name: str, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend_name, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend_name == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    data = batch_for(shp, 2 * world, device, seed=1)
    model = build("baseline", shp, device)
    ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
    half = data[rank * 2:(rank + 1) * 2]
    ddp(half[:, :-1], half[:, 1:]).loss.backward()
    if rank == 0:
        single = build("baseline", shp, device)
        single(data[:, :-1], data[:, 1:]).loss.backward()
        ref = dict(single.named_parameters())
        err = max(float((p.grad - ref[n].grad).abs().max() / ref[n].grad.abs().max().clamp_min(1e-30))
                  for n, p in model.named_parameters())
        Path(out).write_text(json.dumps({"world_size": world, "backend": backend_name,
                                         "max_relative_gradient_error": err}))
    dist.barrier()
    dist.destroy_process_group()


def ddp_check(shp: dict, device, force_cpu: bool) -> dict:
    if device.type == "cuda" and torch.cuda.device_count() >= 2:
        backend_name = "nccl"
    elif device.type == "cpu" and force_cpu:
        backend_name = "gloo"
    else:
        found = torch.cuda.device_count() if device.type == "cuda" else 0
        return {"skipped": f"two-process DDP needs two GPUs; found {found}"
                           + ("" if device.type == "cuda" else " (on CPU pass --ddp to run it with gloo)")}
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "ddp.json")
        # CUDA cannot be initialised again in a forked child; on CPU a fork saves re-importing torch twice
        mp.start_processes(_ddp_worker, args=(2, shp, backend_name, port, out), nprocs=2, join=True,
                           start_method="spawn" if backend_name == "nccl" else "fork")
        result = json.loads(Path(out).read_text())
    result["gradients_match"] = result["max_relative_gradient_error"] < (2e-2 if backend_name == "nccl" else 1e-4)
    return result


def phases_check(device, memory_gb) -> dict:
    """Every phase of a run inside its memory plan: per tier on a GPU, at a reduced smoke shape on CPU."""
    if device.type != "cuda":
        tiers = {"smoke-reduced": phase_memory.cpu_phases(seq=128, micro=4, eval_batch=4, chunk=128)}
        return {"tiers": tiers, "all_fit": phase_memory.judge(tiers, None)}
    tiers = {}
    for tier in PHASE_TIERS:
        try:
            tiers[tier] = phase_memory.cuda_phases(tier, memory_gb, device, EVAL_BATCH)
        except AblateError as err:  # micro_batch_for: not even micro-batch 1 fits
            tiers[tier] = {"error": str(err), "phases": {}}
    return {"tiers": tiers, "all_fit": phase_memory.judge(tiers, memory_gb)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Prove the GPU path; writes gpu_check.json and prints a table.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    parser.add_argument("--tiny", action="store_true", help="the smoke shape (CPU tests) instead of 124M")
    parser.add_argument("--arms", nargs="+", help="arms to check (default: the study's, every registered arm "
                                                  "but the examples)")
    parser.add_argument("--steps", type=int, default=30, help="steps of the eager/compiled run (default 30)")
    parser.add_argument("--timed", type=int, default=10, help="timed steps per arm (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm before timing (default 3)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--ddp", action="store_true", help="on CPU: run the two-process DDP check with gloo")
    parser.add_argument("--out", default="gpu_check.json", help="where to write the results (default ./gpu_check.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    shp = shape(args.tiny)
    tier, data = shp["tier"], batch_for(shp, shp["batch"], device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    memory = torch.cuda.get_device_properties(device).total_memory / 1e9 if device.type == "cuda" else None
    key = gpu_key_for(name, memory) if device.type == "cuda" else None
    peak = GPUS[key].peak_bf16_tflops if key else None
    report = {"device": name, "gpu_key": key, "peak_bf16_tflops": peak, "torch": torch.__version__,
              "tier": tier, "vocab_size": model_config(tier, "baseline").vocab_size if "vocab_size" not in shp
              else shp["vocab_size"], "micro_batch": shp["batch"], "seq_len": get_tier(tier).seq_len, "arms": {}}
    if device.type == "cuda" and key is None:
        report["note"] = f"{name} is not in ablate.tiers.GPUS: no peak, so no MFU"
    for arm in args.arms or study_arms():  # the study's arms; examples (alibi, …) with --arms
        model = build(arm, shp, device)
        path = get_arm(arm).path(device.type)  # fused SDPA, or (score modifier / normaliser) flex or reference
        row = {"path": path, "accuracy": accuracy(arm, shp, data, device),
               "backend": backend(model, data, device) if path == "fused" else {"fused_kernel_used": path == "flex",
                                                                                 "path": path},
               "speed": speed(model, data, device, args.warmup, args.timed, peak)}
        if path == "flex":  # compiled flex_attention against the reference: forward and every gradient, float32
            row["flex_check"] = asdict(check_flex(arm, device.type))
        report["arms"][arm] = row
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = report["arms"].get("baseline", {}).get("speed")
    for row in report["arms"].values():
        if base:
            row["speed"]["step_ratio_to_baseline"] = row["speed"]["step_s"] / base["step_s"]
            row["speed"]["tokens_per_s_ratio_to_baseline"] = row["speed"]["tokens_per_s"] / base["tokens_per_s"]
    report["compile"] = compile_check(shp, data, device, args.steps, args.compile_backend)
    report["ddp"] = ddp_check(shp, device, args.ddp)
    report["phases"] = phases_check(device, memory)
    report["plan_mfu"] = base["mfu"] if base and key else None
    report["goals"] = goals(report)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0 if report["phases"]["all_fit"] else 1


def goals(report: dict) -> dict:
    """The issue's goal figures, judged only where they were measured on a GPU (None otherwise)."""
    on_gpu = report["gpu_key"] is not None
    t = report["seq_len"]
    within = {}
    for arm, row in report["arms"].items():
        ratio = row["speed"].get("step_ratio_to_baseline")
        allowed = GOAL_STEP_RATIO * ((t + 1) / t if arm == "sink-token" else 1)
        within[arm] = (ratio <= allowed) if (on_gpu and ratio is not None) else None
    return {"baseline_mfu_at_least_45pct": (report["plan_mfu"] >= GOAL_MFU) if report["plan_mfu"] else None,
            "step_time_within_1.05x_baseline": within,
            "compiled_faster": (report["compile"]["speedup"] > 1) if on_gpu else None}


def phase_cell(name: str, phase: dict) -> str:
    measured = "OOM" if phase["measured_gb"] is None else f"{phase['measured_gb']:.2f}"
    return f"{name} {measured}/{phase['estimate_gb']:.2f} GB" + ("" if phase["fits"] else " DOES NOT FIT")


def print_table(report: dict) -> None:
    print(f"{report['device']} ({report['gpu_key'] or 'not a table GPU'}), torch {report['torch']}, "
          f"{report['tier']} shape, micro-batch {report['micro_batch']} × {report['seq_len']}")
    print(f"{'arm':<15} {'max |Δlogit|':>12} {'flash':>6} {'effic.':>6} {'step ms':>8} {'× base':>7} {'tok/s':>10} "
          f"{'MFU':>6} {'peak GB':>8}")
    for arm, row in report["arms"].items():
        s, b = row["speed"], row["backend"]
        mfu = f"{s['mfu']:.1%}" if s["mfu"] is not None else "-"
        mem = f"{s['peak_memory_gb']:.1f}" if s["peak_memory_gb"] is not None else "-"
        print(f"{arm:<15} {row['accuracy']['max_abs_logit_error']:>12.3g} {'ok' if b['flash'] == 'ok' else 'no':>6} "
              f"{'ok' if b['efficient'] == 'ok' else 'no':>6} {s['step_s'] * 1e3:>8.1f} "
              f"{s.get('step_ratio_to_baseline', float('nan')):>7.3f} {s['tokens_per_s']:>10.0f} {mfu:>6} {mem:>8}")
    c = report["compile"]
    print(f"compile ({c['backend']}): {c['steps']} steps, max loss difference {c['max_loss_difference']:.3g}, "
          f"eager {c['eager_step_s'] * 1e3:.1f} ms, compiled {c['compiled_step_s'] * 1e3:.1f} ms "
          f"(×{c['speedup']:.2f}), first compiled step {c['first_compiled_step_s']:.1f} s")
    for tier, row in report["phases"]["tiers"].items():
        print(f"memory {tier}: " + (row["error"] if "error" in row else f"micro-batch {row['micro_batch']}, "
                                    + ", ".join(phase_cell(name, p) for name, p in row["phases"].items())))
    d = report["ddp"]
    print("ddp: " + (d["skipped"] if "skipped" in d else
                     f"{d['world_size']} processes ({d['backend']}), max relative gradient error "
                     f"{d['max_relative_gradient_error']:.3g}"))


if __name__ == "__main__":
    sys.exit(main())
