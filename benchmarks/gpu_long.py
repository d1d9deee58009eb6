"""`benchmarks/gpu_check.py`'s long section: arms trained at their tier's configuration for as long as the
time allows, eager (a run's default, `compile: false`) and `torch.compile`d.

The configuration a run of the tier has on this GPU: the tier's global batch and sequence length, the
micro-batch `ablate.sizing.run_micro_batch` gives for this GPU (gradient accumulation over the rest), the
loss in `LOSS_CHUNK` chunks on CUDA, bf16 autocast, fused AdamW at the tier's learning rate, gradient clipping
at 1, through `ablate.loop.Step`, the step `ablate.train` runs. The batches are random tokens (four global
batches, cycled): the model is timed, not the data pipeline. Each (arm, mode) starts from the same weights
(`init_weights(0)`) and sees the same batches, so the eager and compiled loss curves of an arm must agree to
bf16 rounding.

Per (arm, mode): the first step's time (compilation included), the median step time after `WARMUP` steps,
tokens/s, MFU (the FLOPs per token `ablate plan` counts, times tokens/s, over the GPU's peak bf16 throughput
from `ablate.tiers.GPUS`), and the peak reserved memory against `memory_phases_gb`'s training-step estimate.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import replace

import torch

from ablate.loop import Step, make_optimizer
from ablate.sizing import loss_chunk_for, memory_phases_gb, run_micro_batch
from ablate.tiers import get_tier
from gpu_arms import autocast, build, flops_per_token, sync

WARMUP = {"eager": 1, "compiled": 2}  # steps left out of the median (compilation, allocator growth)
MIN_STEPS = 3  # timed steps a mode needs to be reported
MIN_WINDOW = 5.0  # timed seconds below which a run is not worth its start (unless --long-s asks for less)
BATCHES = 4  # distinct random global batches, cycled
TINY_CHUNK = 64  # tokens per loss chunk at the smoke shape (`--tiny`)
SAME_LOSS = 0.02  # eager against compiled: the largest loss difference over the loss, bf16 rounding


def configuration(shp: dict, device, gpu_gb: float | None, tiny: bool) -> dict:
    """The tier's run configuration on this device (on CPU `--tiny`: the smoke tier, a global batch of 4)."""
    tier = get_tier(shp["tier"])
    if tiny:  # two micro-batches, the loss in chunks as on a GPU (so compile traces the checkpointed chunks too)
        tier = replace(tier, global_batch=2 * shp["batch"])
        micro, chunk = shp["batch"], TINY_CHUNK
    else:
        micro, chunk = run_micro_batch(tier, gpu_gb, {}), loss_chunk_for(None, device)
    estimate = memory_phases_gb(tier, micro, loss_chunk=chunk)["train_step"] if device.type == "cuda" else None
    return {"tier": tier, "micro_batch": micro, "loss_chunk": chunk, "estimate_gb": estimate}


def timed_run(arm: str, mode: str, conf: dict, shp: dict, device, batches, stop_at: float, seconds: float,
              compile_backend: str) -> dict:
    """Steps of one (arm, mode) until `seconds` after the warm-up or `stop_at` (perf_counter), whichever first."""
    tier, micro, chunk = conf["tier"], conf["micro_batch"], conf["loss_chunk"]
    model = build(arm, shp, device)
    graphs = compiled_graphs()
    if mode == "compiled":
        # GPT.rope casts its tables on first use inside the forward: dynamo would compile a second graph at step 2
        # (a run with `compile: true` pays that); filled here, so the long run pays one compilation.
        model.rope(0, 1, torch.bfloat16)
    forward = torch.compile(model, backend=compile_backend) if mode == "compiled" else model
    optimizer = make_optimizer(model, 0.1, tier.lr, (0.9, 0.95), 1e-8, device.type == "cuda")
    step = Step(optimizer, loss_of=lambda i, t: _bf16_loss(forward, i, t, chunk, device),
                clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    if device.type == "cuda":
        sync(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times, losses, timed_from = [], [], None
    while True:
        batch = batches[len(times) % len(batches)]
        t0 = time.perf_counter()
        loss, _ = step(len(times) + 1, tier.lr, [(c[:, :-1], c[:, 1:]) for c in batch.split(micro)], device)
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
        now = time.perf_counter()
        if len(times) == WARMUP[mode]:
            timed_from = now
        timed = len(times) - WARMUP[mode]
        if timed >= MIN_STEPS and (now - timed_from >= seconds or now >= stop_at):
            break
        if now >= stop_at + 60:  # far past the budget (a step slower than planned): report what there is
            break
    row = _figures(model, mode, conf, device, times, losses)
    if mode == "compiled" and graphs is not None:
        row["graphs_compiled"] = compiled_graphs() - graphs
    return row


def compiled_graphs() -> int | None:
    """Graphs dynamo has compiled in this process (its internal counter; None where it has no such counter)."""
    try:
        from torch._dynamo.utils import counters  # reason: internal, may move between releases

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def _bf16_loss(forward, inputs, targets, chunk: int, device):
    with autocast(device):
        return forward(inputs, targets, loss_chunk=chunk).loss


def _figures(model, mode: str, conf: dict, device, times: list[float], losses: list[float]) -> dict:
    tier = conf["tier"]
    timed = times[WARMUP[mode]:] or times
    step_s = statistics.median(timed)
    tokens = tier.global_batch * tier.seq_len
    row = {"steps": len(times), "timed_steps": len(timed), "first_step_s": times[0], "step_s": step_s,
           "step_times_s": [round(t, 4) for t in times], "losses": losses, "tokens_per_s": tokens / step_s,
           "flops_per_token": flops_per_token(model, tier.seq_len)}
    if device.type == "cuda":
        peak = torch.cuda.max_memory_reserved(device) / 1e9
        row.update(peak_reserved_gb=peak, peak_allocated_gb=torch.cuda.max_memory_allocated(device) / 1e9,
                   estimate_gb=conf["estimate_gb"], within_estimate=peak <= conf["estimate_gb"])
    return row


def long_section(shp: dict, device, gpu_gb, peak_tflops, arms: list[str], modes: list[str], seconds: float,
                 deadline: float, compile_backend: str, tiny: bool, compile_s: float, on_run=None) -> dict:
    """Every (arm, mode), eager ones first, each for `seconds` of timed steps, shortened so that the rest fit
    before `deadline` (a compiled mode reserves `compile_s` for its compilation); a mode that cannot get
    `MIN_STEPS` is skipped with the reason. `on_run(report so far)` after each run (the caller saves it)."""
    conf = configuration(shp, device, gpu_gb, tiny)
    tier = conf["tier"]
    runs: dict = {arm: {} for arm in arms}
    report = {"tier": tier.name, "global_batch": tier.global_batch, "seq_len": tier.seq_len,
              "micro_batch": conf["micro_batch"], "loss_chunk": conf["loss_chunk"],
              "tokens_per_step": tier.global_batch * tier.seq_len, "peak_bf16_tflops": peak_tflops, "runs": runs}
    vocab = shp.get("vocab_size", tier.vocab_size)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (tier.global_batch, tier.seq_len + 1), generator=g).to(device)
               for _ in range(BATCHES)]
    order = [(arm, mode) for mode in modes for arm in arms]
    for index, (arm, mode) in enumerate(order):
        window, left = run_window(order[index:], deadline - time.perf_counter(), seconds, compile_s)
        if window is None:
            runs[arm][mode] = {"skipped": f"{left:.0f} s left for {len(order) - index} runs "
                                          f"({compile_s:.0f} s for each compilation)"}
        else:
            print(f"  long: {arm} {mode}, about {window:.0f} s of timed steps", flush=True)
            runs[arm][mode] = run_or_halve(arm, mode, conf, shp, device, batches, deadline, window, compile_backend)
            report["micro_batch"] = conf["micro_batch"]
        add_judgements(report, arms, modes, peak_tflops)
        if on_run is not None:
            on_run(report)
    return report


def run_or_halve(arm: str, mode: str, conf: dict, shp: dict, device, *args) -> dict:
    """`timed_run`, and after an out-of-memory once more at half the micro-batch (`conf` keeps the smaller one
    for the later runs, and the row says where memory ran out); any other error is recorded as the row."""
    row, oom = attempt(arm, mode, conf, shp, device, *args)
    if oom and conf["micro_batch"] > 1:
        conf["out_of_memory_at_micro_batch"] = conf["micro_batch"]
        conf["micro_batch"] //= 2
        conf["estimate_gb"] = memory_phases_gb(conf["tier"], conf["micro_batch"],
                                               loss_chunk=conf["loss_chunk"])["train_step"]
        print(f"  long: out of memory; again at micro-batch {conf['micro_batch']}", flush=True)
        row, _ = attempt(arm, mode, conf, shp, device, *args)
    if "out_of_memory_at_micro_batch" in conf:
        row["out_of_memory_at_micro_batch"] = conf["out_of_memory_at_micro_batch"]
    return row


def attempt(arm: str, mode: str, conf: dict, shp: dict, device, *args) -> tuple[dict, bool]:
    """(`timed_run`'s row or the error's, whether it ran out of memory), the memory freed either way."""
    try:
        row, oom = timed_run(arm, mode, conf, shp, device, *args), False
    except torch.cuda.OutOfMemoryError as err:
        row, oom = {"error": f"OutOfMemoryError at micro-batch {conf['micro_batch']}: {str(err)[:300]}"}, True
    except Exception as err:  # recorded; the other runs go on
        row, oom = {"error": f"{type(err).__name__}: {str(err)[:800]}"}, False
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row, oom


def run_window(rest: list[tuple[str, str]], left: float, seconds: float, compile_s: float):
    """(timed seconds for the first of the `rest` runs, or None to skip it; `left`): an equal share of what is
    left after the compilations still to come; when the compilations do not fit, the eager runs share all of it
    (a compiled run is then skipped: it cannot compile in time)."""
    least = min(MIN_WINDOW, seconds)
    compiles = sum(mode == "compiled" for _, mode in rest)
    window = min(seconds, (left - compile_s * compiles) / len(rest))
    if window >= least:
        return window, left
    if rest[0][1] == "compiled":
        return None, left
    window = min(seconds, left / sum(mode != "compiled" for _, mode in rest))
    return (window, left) if window > 0 else (None, left)


def add_judgements(report: dict, arms: list[str], modes: list[str], peak_tflops) -> None:
    """MFU per run, each arm's step ratio to the baseline's per mode, and eager against compiled (same loss)."""
    runs = report["runs"]
    for arm in arms:
        for row in runs[arm].values():
            if "step_s" in row:
                row["mfu"] = (row["flops_per_token"] * row["tokens_per_s"] / (peak_tflops * 1e12)
                              if peak_tflops else None)
    base = runs.get("baseline", {})
    report["step_ratio_to_baseline"] = {
        arm: {mode: runs[arm][mode]["step_s"] / base[mode]["step_s"] for mode in modes
              if "step_s" in runs[arm].get(mode, {}) and "step_s" in base.get(mode, {})}
        for arm in arms if arm != "baseline"}
    report["compile"] = {arm: compare_modes(runs[arm]) for arm in arms}


def compare_modes(modes: dict) -> dict:
    """The eager and compiled runs of one arm: the largest loss difference over their common steps, speed-up."""
    eager, compiled = modes.get("eager", {}), modes.get("compiled", {})
    if "losses" not in eager or "losses" not in compiled:
        return {"skipped": "needs both an eager and a compiled run"}
    pairs = list(zip(eager["losses"], compiled["losses"]))
    diff = max(abs(a - b) for a, b in pairs)
    return {"steps_compared": len(pairs), "max_loss_difference": diff,
            "same_loss_to_bf16": diff <= SAME_LOSS * max(a for a, _ in pairs),
            "first_compiled_step_s": compiled["first_step_s"], "eager_step_s": eager["step_s"],
            "compiled_step_s": compiled["step_s"], "speedup": eager["step_s"] / compiled["step_s"]}
