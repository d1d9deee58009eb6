"""Evaluation speed of `AblateLM` at the smoke shape on CPU, and the FLOPs of the three tasks at every tier.

    .venv/bin/python benchmarks/eval_speed.py                    # tokens/s + FLOPs table (estimated token counts)
    .venv/bin/python benchmarks/eval_speed.py --task-data DIR    # token counts measured on the real task files
    .venv/bin/python benchmarks/eval_speed.py --json out.json

Speed: the wrapper's scoring path (`_loglikelihood_tokens`: batching, right padding, forward, log-softmax
over the 50,257 real tokens, gather) on one thread, for two request shapes — loglikelihood requests of
HellaSwag's size and the rolling windows of WikiText-style documents — random-init weights (speed does
not depend on them). Tokens/s counts the input tokens of the requests (padding excluded).

FLOPs: a forward pass costs 2·(N + V·d) per token (N non-embedding weights, V·d the tied output
matrix, which is still a matmul) plus Kaplan et al.'s attention term 2·n_layer·n_ctx·d per token, with
n_ctx the task's mean request length capped at the window (no causal discount, as `ablate plan`).
Token counts of the full tasks, unless --task-data gives the real files:
  * lambada_openai: 5,153 passages; ≈ 75 words of context + 1 target word each (Paperno et al. 2016,
    Table 1) at ≈ 1.3 GPT-2 tokens per word → ≈ 100 tokens per passage, one request each.
  * hellaswag: 10,042 validation items × 4 endings; ≈ 45 tokens of context + ≈ 25 tokens per ending
    (assumed) → 40,168 requests of ≈ 70 tokens (the context is run once per ending, as the harness does).
  * wikitext: the WikiText-2 test set, 245,569 words, ≈ 1.2 GPT-2 tokens per word after the harness's
    detokeniser → ≈ 295k tokens, each predicted once in disjoint rolling windows of the tier's window.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from ablate.plan import plan_rows  # noqa: E402
from ablate.sizing import model_config  # noqa: E402
from ablate.tiers import TIER_ORDER, get_tier  # noqa: E402

# task → (requests, mean input tokens per request): the estimates of the module docstring
ESTIMATES = {
    "lambada_openai": (5153, 100.0),
    "hellaswag": (10042 * 4, 70.0),
    "wikitext": (None, None),  # rolling: tokens = 245,569 words × 1.2, windows depend on the tier
}
WIKITEXT_TOKENS = round(245_569 * 1.2)


def measured_counts(task_data: Path) -> dict:
    """{task: (requests, input tokens per request, total scored tokens)} from the real files, as the harness
    builds them."""
    from ablate.evals.tasks import build_tasks

    tasks = build_tasks(["lambada_openai", "hellaswag", "wikitext"], task_data)
    from ablate.data.tokenizer import encode

    counts = {}
    lengths = []
    for doc in tasks["lambada_openai"].eval_docs:
        lengths.append(len(encode(tasks["lambada_openai"].doc_to_text(doc)
                                  + tasks["lambada_openai"].doc_to_target(doc))))
    counts["lambada_openai"] = (len(lengths), sum(lengths) / len(lengths))
    lengths = []
    hs = tasks["hellaswag"]
    for doc in hs.eval_docs:
        for choice in hs.doc_to_choice(doc):
            lengths.append(len(encode(hs.doc_to_text(doc) + " " + choice)))
    counts["hellaswag"] = (len(lengths), sum(lengths) / len(lengths))
    wt = tasks["wikitext"]
    counts["wikitext_tokens"] = sum(len(encode(wt.doc_to_target(doc))) for doc in wt.eval_docs)
    return counts


def flops_table(counts: dict | None) -> list[dict]:
    rows = []
    for name in TIER_ORDER:
        tier = get_tier(name)
        run = plan_rows(name, ["baseline"])["runs"][0]
        config = model_config(tier, "baseline")
        dense = 2 * (run["params_non_embedding"] + config.padded_vocab_size * tier.d_model)
        row = {"tier": name, "seq_len": tier.seq_len, "train_flops": run["train_flops"]}
        total = 0.0
        for task in ("lambada_openai", "hellaswag"):
            requests, length = (counts or ESTIMATES)[task]
            n_ctx = min(length, tier.seq_len + 1) - 1
            tokens = requests * n_ctx
            flops = tokens * (dense + 2 * tier.n_layer * n_ctx * tier.d_model)
            row[task] = {"tokens": tokens, "flops": flops}
            total += flops
        scored = counts["wikitext_tokens"] if counts else WIKITEXT_TOKENS
        flops = scored * (dense + 2 * tier.n_layer * tier.seq_len * tier.d_model)  # full windows but the last
        row["wikitext"] = {"tokens": scored, "flops": flops}
        row["total_flops"] = total + flops
        rows.append(row)
    return rows


def speed(batch_size: int, rounds: int) -> dict:
    """Tokens/s of the wrapper at the smoke shape: HellaSwag-sized requests and rolling windows."""
    from ablate.data.tokenizer import EOT_TOKEN
    from ablate.evals.lm import AblateLM, rolling_windows
    from ablate.model import GPT

    tier = get_tier("smoke")
    model = GPT(model_config(tier, "baseline"))
    lm = AblateLM(model, batch_size=batch_size)
    gen = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(0, 50000, (n,), generator=gen).tolist()

    choice = [(None, [EOT_TOKEN] + tokens(45), tokens(25)) for _ in range(64)]
    rolling = [(None, c, t) for _ in range(8) for c, t in rolling_windows(tokens(400), tier.seq_len)]
    result = {}
    for name, requests in (("hellaswag-shaped (70 tokens)", choice), (f"rolling windows ({tier.seq_len})", rolling)):
        n_tokens = sum(min(len(c) + len(t), tier.seq_len + 1) - 1 for _, c, t in requests)
        lm._loglikelihood_tokens(requests[:batch_size], disable_tqdm=True)  # warm-up
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            lm._loglikelihood_tokens(requests, disable_tqdm=True)
            times.append(time.perf_counter() - start)
        best = min(times)
        result[name] = {"tokens": n_tokens, "seconds_best": best, "tokens_per_s": n_tokens / best}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task-data", type=Path, help="measure token counts on DIR/<task>.jsonl (the full tasks)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16)")
    parser.add_argument("--rounds", type=int, default=3, help="timed repetitions; the best is reported (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} "
          "thread(s), float32")
    figures = {"speed": speed(args.batch_size, args.rounds)}
    print("\n| smoke shape, CPU | input tokens | best s | tokens/s |\n|---|---:|---:|---:|")
    for name, row in figures["speed"].items():
        print(f"| {name} | {row['tokens']:,} | {row['seconds_best']:.3f} | {row['tokens_per_s']:,.0f} |")

    counts = measured_counts(args.task_data) if args.task_data else None
    figures["flops"] = flops_table(counts)
    basis = f"measured on {args.task_data}" if counts else "estimated token counts (see the docstring)"
    print(f"\nForward FLOPs of the full tasks ({basis}); tokens = input tokens of all requests")
    print("| tier | lambada tokens | lambada FLOPs | hellaswag tokens | hellaswag FLOPs | wikitext tokens "
          "| wikitext FLOPs | all three | ÷ training |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in figures["flops"]:
        cells = " | ".join(f"{row[t]['tokens']:,.0f} | {row[t]['flops']:.3g}"
                           for t in ("lambada_openai", "hellaswag", "wikitext"))
        print(f"| {row['tier']} | {cells} | {row['total_flops']:.3g} | {row['total_flops'] / row['train_flops']:.2%} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
