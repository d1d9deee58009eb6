"""The compiled flex_attention forward on a CPU (float32, inference) against the reference path, for every arm that
takes flex on CUDA (`Arm.path("cuda") == "flex"`), and a document mask.

    .venv/bin/python benchmarks/flex_cpu.py                       # every such arm, T = 256
    .venv/bin/python benchmarks/flex_cpu.py --arms sliding-window --seq-len 128

The kernel requests flex_attention's lse only for a phantom key or a normaliser's log-weight, so the compiled
forward runs on a CPU without gradients. A compile takes tens of seconds to minutes on a small CPU, so this is a
benchmark, not a test; the quick suite runs flex eagerly in float64 (`ablate.armcheck.check_flex`).
Prints one line per arm: the largest relative error of o, and the first call's (compile) time.
"""

from __future__ import annotations

import argparse
import time

import torch

from ablate.armcheck import CUDA_HEAD_DIM, check_inputs, make_checked_arm
from ablate.arms import AttentionContext, get_arm, list_arms
from ablate.arms.kernel import attention


def compare(name: str, seq_len: int, documents: bool = False) -> tuple[float, float]:
    """(max relative error of the compiled flex forward against the reference, seconds of the first call)."""
    arm = make_checked_arm(name, head_dim=CUDA_HEAD_DIM).float()
    q, k, v, x = (t.detach().float() for t in check_inputs(T=seq_len, head_dim=CUDA_HEAD_DIM))
    outputs, first_call = {}, 0.0
    for path in ("flex", "reference"):
        context = AttentionContext.full(x, train_len=seq_len)
        if documents:  # four documents per row
            context.documents = (torch.arange(seq_len) * 4 // seq_len).expand(q.shape[0], -1)
        start = time.perf_counter()
        with torch.no_grad():
            outputs[path], _ = attention(arm, q, k, v, x, context=context, fused=path)
        if path == "flex":
            first_call = time.perf_counter() - start
    reference = outputs["reference"]
    error = float((outputs["flex"] - reference).abs().max() / reference.abs().max())
    return error, first_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="*", help="arms to run (default: every arm whose CUDA path is flex)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import ablate.arms.kernel as kernel

    kernel._flex.__kwdefaults__["compiled"] = True  # compiled even on a CPU (the kernel compiles on CUDA only)
    arms = args.arms or [name for name in list_arms() if get_arm(name).path("cuda") == "flex"]
    for name in arms:
        error, seconds = compare(name, args.seq_len)
        print(f"{name:<16} T = {args.seq_len}: max relative error {error:.1e} (float32), first call {seconds:.1f} s")
    error, seconds = compare("baseline", args.seq_len, documents=True)
    print(f"{'documents':<16} T = {args.seq_len}: max relative error {error:.1e} (float32), first call {seconds:.1f} s")


if __name__ == "__main__":
    main()
