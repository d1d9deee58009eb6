"""The per-step cost of hashing each global batch into the data fingerprint, at the 124M tier's batch
(512 × 1025 tokens, read as uint16 and widened to int64 as `ablate.data.BatchStream` does), against the
tier's planned H100 step time (`ablate.plan`: 6·N·D FLOPs at the assumed MFU).

Three ways, all giving the same fingerprint (checked): the loop's former inline hash
(`sha256(fp + batch.tobytes())`), `ablate.loop.chain_fingerprint` (the same bytes, not copied), and what
the step itself now waits for: `DataFingerprint.add` (the hash runs in a background thread; hashlib
releases the GIL). With CUDA also the pinned copy of the batch to the GPU (`ablate.loop.copy_in`).

    python benchmarks/fingerprint_cost.py [--rounds 21] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds per variant (median; default 21)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    import numpy as np
    import torch

    from ablate.loop import DataFingerprint, chain_fingerprint, copy_in
    from ablate.plan import plan_rows
    from ablate.tiers import get_tier

    tier = get_tier("124M")
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, tier.vocab_size, tier.seq_len + 1, dtype=np.uint16) for _ in range(tier.global_batch)]
    batch = torch.from_numpy(np.stack(rows).astype(np.int64))
    start = hashlib.sha256(b"ablate-data").hexdigest()

    inline = hashlib.sha256(start.encode() + batch.numpy().tobytes()).hexdigest()
    assert chain_fingerprint(start, batch) == inline
    background = DataFingerprint(start)
    background.add(batch)
    assert background.value == inline

    figures = {
        "batch": list(batch.shape), "dtype": str(batch.dtype).replace("torch.", ""), "bytes": batch.numel() * 8,
        "inline_ms": median_ms(lambda: hashlib.sha256(start.encode() + batch.numpy().tobytes()).hexdigest(),
                               args.rounds),
        "chain_ms": median_ms(lambda: chain_fingerprint(start, batch), args.rounds),
    }
    # What the step waits for: handing the batch over (the hash of the one before has finished by then,
    # as it does in training, where a step takes far longer than a hash).
    def hand_over():
        background.value  # noqa: B018 (waits for the previous batch, outside the timed call)
        t0 = time.perf_counter()
        background.add(batch)
        return time.perf_counter() - t0

    figures["add_ms"] = statistics.median(hand_over() for _ in range(args.rounds)) * 1e3
    if torch.cuda.is_available():
        device = torch.device("cuda")
        def copy():  # one GPU: the rank's rows are the whole global batch
            copy_in(batch, device)
            torch.cuda.synchronize()

        figures["pinned_copy_ms"] = median_ms(copy, args.rounds)
    run = plan_rows("124M", arms=["baseline"], seed_count=1)["runs"][0]
    step_ms = run["gpu_hours_per_run"] * 3600 / run["steps"] * 1e3
    figures.update(planned_step_ms=step_ms, inline_share=figures["inline_ms"] / step_ms,
                   chain_share=figures["chain_ms"] / step_ms, add_share=figures["add_ms"] / step_ms,
                   cpu=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads())
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"124M global batch {figures['batch'][0]} × {figures['batch'][1]} {figures['dtype']} "
          f"({figures['bytes'] / 1e6:.1f} MB); planned H100 step {step_ms:.0f} ms "
          f"({plan_rows('124M', arms=['baseline'], seed_count=1)['assumption']})")
    for key, what in (("inline", "inline sha256(fp + tobytes()) [before]"), ("chain", "chain_fingerprint (no copy)"),
                      ("add", "DataFingerprint.add: the step's wait [now]")):
        print(f"  {what:45s} {figures[key + '_ms']:8.2f} ms  {figures[key + '_share']:7.2%} of the step")
    if "pinned_copy_ms" in figures:
        print(f"  pinned copy of the batch to the GPU            {figures['pinned_copy_ms']:8.2f} ms")


if __name__ == "__main__":
    main()
