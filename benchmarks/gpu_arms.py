"""`benchmarks/gpu_check.py`'s per-arm checks: the model and batch, bf16 against float32, the fused SDPA kernels
with the math kernel forbidden, step times, and two-process DDP.

Every function takes the device, so the same code runs on a GPU and (at the smoke shape, `--tiny`) on CPU.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ablate.model import GPT
from ablate.plan import training_flops
from ablate.sizing import model_config
from ablate.tiers import get_tier

TINY_VOCAB = 512  # CPU tests: bf16 matmuls on CPU are slow, and the 50,304-way output layer dominates


def shape(tiny: bool) -> dict:
    """The model and batch: the 124M tier at a micro-batch of 8, or the smoke tier at 2 with a small
    vocabulary (CPU tests; the code path is the same)."""
    return {"tier": "smoke", "batch": 2, "vocab_size": TINY_VOCAB} if tiny else {"tier": "124M", "batch": 8}


def build(arm: str, shp: dict, device, seed: int = 0, fused: bool = True) -> GPT:
    """The arm's model at the shape's tier, weights drawn by `GPT.init_weights(seed)`, on `device`."""
    overrides = {"vocab_size": shp["vocab_size"]} if "vocab_size" in shp else {}
    config = model_config(shp["tier"], arm, **overrides)
    model = GPT(config if fused else replace(config, fused=False))
    model.init_weights(seed)
    return model.to(device)


def twin(model: GPT, fused: bool) -> GPT:
    """The same weights on the other path (fused=False: the reference path that materialises the weights)."""
    other = GPT(replace(model.config, fused=fused)).to(model.wte.weight.device)
    other.load_state_dict(model.state_dict())
    return other


def batch_for(shp: dict, batch: int, device, seed: int = 0) -> torch.Tensor:
    t = get_tier(shp["tier"])
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, shp.get("vocab_size", t.vocab_size), (batch, t.seq_len + 1), generator=g).to(device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, enabled: bool = True):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


@contextmanager
def no_tf32():
    """float32 matmuls in float32 (a run on CUDA allows TF32; a comparison of paths should not round)."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def accuracy(model: GPT, data: torch.Tensor, device) -> dict:
    """The fused path in bf16 autocast and in float32 against the reference path in float32 (no TF32), same
    weights and batch: the largest absolute logit error of each (the bf16 one is rounding, the float32 one
    the kernel's)."""
    reference = twin(model, fused=False)
    with torch.no_grad(), no_tf32():
        ref = reference(data[:, :-1], data[:, 1:])
        with autocast(device):
            out = model(data[:, :-1], data[:, 1:])
        fp32 = model(data[:, :-1], data[:, 1:])
    return {"max_abs_logit_error": float((out.logits.float() - ref.logits).abs().max()),
            "max_abs_logit_error_fp32_fused": float((fp32.logits - ref.logits).abs().max()),
            "loss_bf16_fused": float(out.loss), "loss_fp32_fused": float(fp32.loss),
            "loss_fp32_reference": float(ref.loss)}


def backend(model: GPT, data: torch.Tensor, device) -> dict:
    """Which fused SDPA kernel runs the arm's forward and backward (the math kernel is never allowed)."""
    result = {}
    for name, kernel in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel([kernel]), autocast(device):
                loss = model(data[:, :-1], data[:, 1:]).loss
            loss.backward()
            result[name] = "ok"
        except RuntimeError as err:
            result[name] = f"refused: {str(err).splitlines()[0][:160]}"
        model.zero_grad(set_to_none=True)
    result["fused_kernel_used"] = any(v == "ok" for v in result.values())
    return result


def optimizer_for(model: GPT, device) -> torch.optim.Optimizer:
    groups = [{k: v for k, v in g.items() if k != "names"} for g in model.param_groups(0.1)]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_steps(model, data, device, steps: int, forward=None, bf16: bool = True) -> tuple[list[float], list[float]]:
    """`steps` training steps on one batch; per-step seconds (synchronised) and losses."""
    forward = model if forward is None else forward
    opt = optimizer_for(model, device)
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        with autocast(device, bf16):
            loss = forward(data[:, :-1], data[:, 1:]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.detach())
    return times, [float(x) for x in losses]


def flops_per_token(model: GPT, seq_len: int) -> float:
    """The training FLOPs per token `ablate plan` counts for this model at this sequence length."""
    c = model.config
    t = replace(get_tier("smoke"), n_layer=c.n_layer, d_model=c.d_model, seq_len=seq_len, global_batch=1)
    return training_flops(t, model.param_counts()["non_embedding"], c.padded_vocab_size, steps=1) / seq_len


def speed(model: GPT, data: torch.Tensor, device, warmup: int, timed: int, peak_tflops, bf16: bool = True) -> dict:
    """Median step time of `timed` steps after `warmup`, tokens/s, MFU over the bf16 peak, peak memory."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, _ = train_steps(model, data, device, warmup + timed, bf16=bf16)
    step = statistics.median(times[warmup:])
    tokens = data.shape[0] * (data.shape[1] - 1)
    per_token = flops_per_token(model, data.shape[1] - 1)
    return {"step_s": step, "tokens_per_s": tokens / step, "flops_per_token": per_token,
            "mfu": per_token * tokens / step / (peak_tflops * 1e12) if peak_tflops else None,
            "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}


def arm_row(arm: str, shp: dict, data: torch.Tensor, device, args, peak) -> dict:
    """One arm: accuracy (bf16 and float32 against the float32 reference), the fused kernels, the bf16 and
    float32 training steps. Each part records its own error, so one failure leaves the others."""
    model = build(arm, shp, device)
    row = {}
    parts = (("accuracy", lambda: accuracy(model, data, device)), ("backend", lambda: backend(model, data, device)),
             ("speed", lambda: speed(model, data, device, args.warmup, args.timed, peak)),
             ("speed_fp32", lambda: speed(model, data, device, 1, max(1, args.timed // 2), peak, bf16=False)))
    for name, part in parts:
        try:
            row[name] = part()
        except Exception as err:  # recorded; the other parts and arms go on
            row[name] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
    if "step_s" in row["speed"] and "step_s" in row["speed_fp32"]:
        row["speed_fp32"]["bf16_speedup"] = row["speed_fp32"]["step_s"] / row["speed"]["step_s"]
    return row


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
    """Two processes, each half a batch: the averaged gradient against one process's gradient of the whole."""
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
