"""Measured peak host memory of every phase of a run against `ablate.sizing.memory_phases_gb`, on CPU.

    python benchmarks/phase_memory.py [--seq 128] [--micro 4] [--eval-batch 4] [--chunks 0 128] [--json]
    /usr/bin/time -v python benchmarks/phase_memory.py --wide-run RESULTS DATA   # the goal figure's run

Phases (each in its own process, so that nothing of another phase is resident): `train_step` (one
optimisation step, `ablate.loop.Step`, the loss `loss_chunk` tokens at a time or whole), `evaluation`
(`ablate.loop.mean_token_loss` over one micro-batch of windows, the optimiser's moments resident, made
by a step over zero gradients), `final_evaluation` (the same over two micro-batches), `eval_scoring`
(`ablate.evals.lm.AblateLM` scoring `--eval-batch` windows whose continuation is the whole window, as its rolling
windows are).

How the peak is measured: the kernel's high-water mark of the process's resident memory (VmHWM in
/proc/self/status), reset to the resident memory of the moment by writing 5 to /proc/self/clear_refs
after the same phase ran on a tiny model (so the library code it runs is already resident: code pages
count too) and just before the phase builds its model; the
figure is that mark's growth over the resident memory at the reset. glibc's mmap threshold is fixed at
128 KiB, so a freed large tensor is returned at once and the mark follows live memory. Linux only.
The estimate is taken at precision "32-true" (CPU float32) with no CUDA context (reserved_gb=0).

`--wide-run` trains the issue's wide smoke shape (micro-batch 32 × 512 tokens, loss_chunk 1024, a
one-micro-batch validation set, 2 steps) through `ablate.train.run`, the function `ablate run` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PHASES = ("train_step", "evaluation", "final_evaluation", "eval_scoring")
WIDE = dict(global_batch=32, micro_batch=32, seq_len=512, loss_chunk=1024, val_tokens=32 * 512,
            final_val_tokens=32 * 512, steps=2, val_interval=1, checkpoint_interval=100, log_interval=1,
            warmup_steps=1, threads=1, progress=False)


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status (Linux only)")


def reset_peak() -> int:
    """Reset the high-water mark to the resident memory now (kB), and return that."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_kb("VmRSS")


def tier_shape(seq: int, micro: int):
    from ablate.tiers import get_tier  # reason: the parent process only launches children

    return replace(get_tier("smoke"), seq_len=seq, global_batch=micro, micro_batch=micro)


def measure(phase: str, chunk: int, seq: int, micro: int, eval_batch: int) -> dict:
    """One phase's measured peak growth (MB) and its estimate (MB), in this process."""
    import torch  # reason: the parent process only launches children

    from ablate.evals.lm import AblateLM  # reason: as above (and lm-eval is the `eval` extra)
    from ablate.loop import Step, make_optimizer, mean_token_loss  # reason: as above
    from ablate.model import GPT, GPTConfig  # reason: as above
    from ablate.sizing import memory_phases_gb, model_config  # reason: as above

    torch.set_num_threads(1)
    tier = tier_shape(seq, micro)
    rows = 2 * micro if phase == "final_evaluation" else max(micro, eval_batch)
    windows = torch.randint(0, tier.vocab_size, (rows, seq + 1), generator=torch.Generator().manual_seed(0))

    def run_phase(model, windows, micro, eval_batch):
        if phase == "eval_scoring":
            lm = AblateLM(model, batch_size=eval_batch, loss_chunk=chunk)
            requests = [(None, w[:1].tolist(), w[1:].tolist()) for w in windows[:eval_batch]]
            lm._loglikelihood_tokens(requests, disable_tqdm=True)
            return
        optimizer = make_optimizer(model, 0.1, 1e-3, (0.9, 0.95), 1e-8, cuda=False)
        if phase == "train_step":
            step = Step(optimizer, loss_of=lambda inputs, targets: model(inputs, targets, loss_chunk=chunk).loss,
                        clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            step(1, 1e-3, [(windows[:micro, :-1], windows[:micro, 1:])])
            return
        for param in model.parameters():  # the moments resident, as after a step
            param.grad = torch.zeros_like(param)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reset_peak()  # the optimiser step's temporaries are not the evaluation's
        mean_token_loss(model, windows, micro, "cpu", loss_chunk=chunk)

    # The same phase on a tiny model first: the library code it runs is paged in (resident) before the reset.
    run_phase(GPT(GPTConfig(vocab_size=tier.vocab_size, n_layer=1, n_head=1, d_model=8, max_seq_len=seq)),
              windows[:2, :9], 1, 2)
    start = reset_peak()
    model = GPT(model_config(tier, "baseline"))
    model.init_weights(0)
    run_phase(model, windows, micro, eval_batch)
    measured = (status_kb("VmHWM") - start) * 1024 / 1e6
    estimate = memory_phases_gb(tier, micro, loss_chunk=chunk, eval_batch=eval_batch, precision="32-true",
                                reserved_gb=0)[phase] * 1e3
    return {"phase": phase, "loss_chunk": chunk, "measured_mb": round(measured, 1), "estimate_mb": round(estimate, 1),
            "ratio": round(estimate / measured, 3) if measured > 0 else None}


def cuda_phases(tier_name: str, gpu_gb: float, device, eval_batch: int) -> dict:
    """On a GPU: the micro-batch `micro_batch_for` picks for `tier_name` (loss chunked by LOSS_CHUNK, as a
    GPU run is), and each phase's peak reserved memory (torch.cuda.max_memory_reserved; the CUDA context is
    not in it) against its estimate; a phase that runs out of memory is measured as None."""
    import torch  # reason: the parent process only launches children

    from ablate.loop import Step, make_optimizer, mean_token_loss  # reason: as above
    from ablate.model import GPT  # reason: as above
    from ablate.sizing import LOSS_CHUNK, memory_phases_gb, micro_batch_for, model_config  # reason: as above
    from ablate.tiers import get_tier  # reason: as above

    tier, chunk = get_tier(tier_name), LOSS_CHUNK
    micro = micro_batch_for(tier, gpu_gb, loss_chunk=chunk, eval_batch=eval_batch)
    estimate = memory_phases_gb(tier, micro, loss_chunk=chunk, eval_batch=eval_batch)
    model = GPT(model_config(tier, "baseline"))
    model.init_weights(0)
    model.to(device)
    windows = torch.randint(0, tier.vocab_size, (max(micro, eval_batch), tier.seq_len + 1), device=device)
    optimizer = make_optimizer(model, 0.1, 1e-4, (0.9, 0.95), 1e-8, cuda=True)

    def bf16(fn):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fn()

    def peak(fn):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            fn()
            torch.cuda.synchronize(device)
        except torch.cuda.OutOfMemoryError:
            return None
        return torch.cuda.max_memory_reserved(device) / 1e9

    step = Step(optimizer, loss_of=lambda i, t: bf16(lambda: model(i, t, loss_chunk=chunk).loss),
                clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    measured = {"train_step": peak(lambda: step(1, 1e-4, [(windows[:micro, :-1], windows[:micro, 1:])]))}
    evaluate = lambda w: bf16(lambda: mean_token_loss(model, w, micro, device, loss_chunk=chunk))  # noqa: E731
    measured["evaluation"] = peak(lambda: evaluate(windows[:micro]))
    measured["final_evaluation"] = peak(lambda: evaluate(torch.cat([windows[:micro]] * 2)))
    optimizer.state.clear()  # `ablate eval` is another process: the weights only
    scoring, scored_by = eval_scoring(model, windows[:eval_batch], eval_batch, device, chunk)
    measured["eval_scoring"] = peak(scoring)
    return {"micro_batch": micro, "loss_chunk": chunk, "eval_batch": eval_batch, "scored_by": scored_by,
            "phases": {p: {"measured_gb": measured[p], "estimate_gb": estimate[p]} for p in PHASES}}


def eval_scoring(model, windows, eval_batch: int, device, chunk: int):
    """(the `ablate eval` scoring of `windows` as a function, what scores them): `AblateLM` where lm-eval is
    installed, else `score_windows`, the computation `AblateLM._score` does for such requests (a GPU machine
    may lack the `eval` extra; the memory of the phase is that forward's)."""
    try:
        from ablate.evals.lm import AblateLM  # reason: lm-eval is the `eval` extra
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("lm_eval"):
            raise
        return (lambda: score_windows(model, windows, chunk)), "score_windows (lm-eval is not installed)"
    lm = AblateLM(model, batch_size=eval_batch, device=str(device), loss_chunk=chunk)
    requests = [(None, w[:1].tolist(), w[1:].tolist()) for w in windows.cpu()]
    return (lambda: lm._loglikelihood_tokens(requests, disable_tqdm=True)), "AblateLM"


def score_windows(model, windows, chunk: int) -> list[float]:
    """Each window's log-likelihood of its tokens after the first (a request whose context is the first token
    and whose continuation is the rest), in one batch, `chunk` tokens at a time: `AblateLM._score`'s chunked
    path for such requests, without lm-eval."""
    import torch  # reason: the parent process only launches children

    from ablate.data.tokenizer import VOCAB_SIZE  # reason: as above
    from ablate.losses import chunked_log_probs  # reason: as above

    with torch.inference_mode():
        hidden = model.eval()(windows[:, :-1], head=False).hidden  # (B, T, C)
        log_probs, _ = chunked_log_probs(hidden.reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                         windows[:, 1:].reshape(-1), chunk, vocab=VOCAB_SIZE)
    return [float(row.sum()) for row in log_probs.view(windows.shape[0], -1)]


def cpu_phases(seq: int, micro: int, eval_batch: int, chunk: int) -> dict:
    """The same report at a reduced smoke shape on CPU (`main`'s children; peaks as in the module docstring)."""
    cmd = [sys.executable, __file__, "--json", "--chunks", str(chunk), "--seq", str(seq), "--micro", str(micro),
           "--eval-batch", str(eval_batch)]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    return {"micro_batch": micro, "loss_chunk": chunk, "eval_batch": eval_batch, "seq_len": seq,
            "phases": {r["phase"]: {"measured_gb": r["measured_mb"] / 1e3, "estimate_gb": r["estimate_mb"] / 1e3}
                       for r in rows}}


def judge(tiers: dict, gpu_gb: float | None) -> bool:
    """Marks every phase: `fits` when it ran (no out-of-memory), its measured peak is within its estimate,
    and (on a GPU) the estimate is within the usable 90% of the GPU's memory. True when all fit."""
    from ablate.sizing import USABLE_FRACTION  # reason: as above

    ok = all("error" not in row for row in tiers.values())
    for row in tiers.values():
        for phase in row["phases"].values():
            m, e = phase["measured_gb"], phase["estimate_gb"]
            phase["fits"] = m is not None and m <= e and (gpu_gb is None or e <= USABLE_FRACTION * gpu_gb)
            ok = ok and phase["fits"]
    return ok


def wide_run(results: str, data: str) -> None:
    from ablate.experiment import RunSpec  # reason: as above
    from ablate.train import run  # reason: as above

    summary = run(RunSpec("wide", "smoke", "baseline", 0, WIDE), results, data_dir=data, force=True)
    print(json.dumps({k: getattr(summary, k) for k in ("status", "val_loss", "steps")}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=128, help="tokens per window (default 128)")
    parser.add_argument("--micro", type=int, default=4, help="micro-batch in windows (default 4)")
    parser.add_argument("--eval-batch", type=int, default=4, help="`ablate eval`'s batch (default 4)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 128], help="loss chunks; 0 = whole")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    parser.add_argument("--wide-run", nargs=2, metavar=("RESULTS", "DATA"), help="the goal figure's run")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.wide_run:
        wide_run(*args.wide_run)
        return 0
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.seq, args.micro, args.eval_batch)))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1")
    rows = []
    for chunk in args.chunks:
        for phase in PHASES:
            cmd = [sys.executable, __file__, "--seq", str(args.seq), "--micro", str(args.micro), "--eval-batch",
                   str(args.eval_batch), "--child", phase, str(chunk)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"smoke model (2 layers, d 64, vocabulary 50,304), micro-batch {args.micro} × {args.seq}, "
          f"ablate eval batch {args.eval_batch}, float32 on CPU")
    print(f"{'loss chunk':>10} {'phase':<17} {'measured MB':>12} {'estimate MB':>12} {'est/meas':>9}")
    for r in rows:
        print(f"{r['loss_chunk'] or 'whole':>10} {r['phase']:<17} {r['measured_mb']:>12.1f} {r['estimate_mb']:>12.1f} "
              f"{r['ratio']:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
