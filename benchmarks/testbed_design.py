"""Does the testbed's baseline learn its task in every seed, under each CPU kernel set?

    python benchmarks/testbed_design.py --seeds 16 --kernels avx2 native [--tier filter-direction]
                                        [--set global_batch=256 ...]

Trains the baseline of a task tier (`synthetic`, Abstain, by default; `filter-norm`, `filter-direction`: Filter;
`abstain-stream`; `value-junk-norm`, `value-junk-direction`: Filter with the junk in the value path only;
its config as `ablate submit` resolves it, with `--set` tier or task fields replaced: the design being tried)
for each seed, one subprocess per kernel set (`ATEN_CPU_CAPABILITY`; native:
unset, the machine's own), and prints per seed the first checked step at which its answer accuracy on the fixed
validation set reached `LEARNED_ACCURACY`, its accuracy at the budget, and the CPU time. A run learned when its
accuracy at the budget is at least `LEARNED_ACCURACY` (docs/method.md, "The mechanism testbed"). The baseline
only: the design is chosen before, and without, any other arm.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time


def _train_seed(config, check: int) -> dict:
    import torch

    from ablate.config import lr_at
    from ablate.data.filter import task_batch, task_from_fields, task_validation
    from ablate.loop import Step, make_optimizer
    from ablate.model import GPTConfig
    from ablate.taskmodel import task_model
    from ablate.taskrun import VAL_BATCH, VAL_BATCHES, _evaluate, training_seed

    from ablate.analysis.testbed import LEARNED_ACCURACY

    task = task_from_fields(config.synthetic_task)
    torch.manual_seed(config.seed)
    model = task_model(GPTConfig(**config.model_fields()), task)
    model.init_weights(config.seed)
    validation = task_validation(task, VAL_BATCH, VAL_BATCHES)
    optimizer = make_optimizer(model, config.weight_decay, config.lr, config.betas, config.eps, cuda=False)
    step = Step(optimizer, loss_of=lambda inputs, targets: model(inputs, targets).loss,
                clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip))
    clock, learned_at, accuracy, curve = time.process_time(), None, 0.0, []
    model.train()
    for k in range(config.steps):
        batch = task_batch(task, config.global_batch, training_seed(config.seed, k))
        step(k + 1, lr_at(k, config), [batch])
        if (k + 1) % check == 0 or k + 1 == config.steps:
            loss, accuracy, absent_accuracy = _evaluate(model, task, validation)
            curve.append((k + 1, loss))
            model.train()
            if learned_at is None and accuracy >= LEARNED_ACCURACY:
                learned_at = k + 1
    return {"seed": config.seed, "learned_at": learned_at, "accuracy": accuracy, "val_loss": loss,
            "absent_loss": _absent_loss(model, task, validation),
            "absent_accuracy": absent_accuracy, "curve": curve,
            "learned": accuracy >= LEARNED_ACCURACY, "cpu_s": time.process_time() - clock}


def _absent_loss(model, task, validation) -> float | None:
    """The part of val_loss from NONE answers (summed over them, divided by all answers): what an arm that reads
    nothing at an absent key could remove at most. None for a task without NONE answers."""
    import torch

    from ablate.data.synthetic import IGNORE

    if not hasattr(task, "NONE"):
        return None
    model.eval()
    absent_sum, answers = 0.0, 0
    with torch.no_grad():
        for inputs, targets in validation:
            logits = model(inputs).logits[..., : task.vocab_size].float()
            absent = targets == task.NONE
            absent_sum += float(torch.nn.functional.cross_entropy(logits[absent], targets[absent], reduction="sum"))
            answers += int((targets != IGNORE).sum())
    return absent_sum / answers


def _configs(tier_name: str, seeds: int, first: int, design: dict) -> list:
    from ablate import tiers
    from ablate.config import resolve_config
    from ablate.data.filter import task_from_fields
    from ablate.experiment import RunSpec

    tier = tiers.get_tier(tier_name)
    task_fields = {k: v for k, v in design.items() if k in tiers.TASKS[tier.task]}
    tier_fields = {k: v for k, v in design.items() if k not in task_fields and k != "steps"}
    task = task_from_fields(tiers.TASKS[tier.task] | task_fields)
    tiers.TASKS[tier.task] = dataclasses.asdict(task)
    tier = dataclasses.replace(tier, seq_len=task.seq_len, vocab_size=task.vocab_size, **tier_fields)
    steps = design.get("steps", tier.steps)  # steps given: the budget in tokens follows
    tiers.TIERS[tier_name] = dataclasses.replace(tier, tokens=int(steps) * tier.global_batch * tier.seq_len)
    return [resolve_config(RunSpec("bench", tier_name, "baseline", seed)) for seed in range(first, first + seeds)]


def _child(args) -> None:
    import torch

    torch.set_num_threads(1)
    for config in _configs(args.tier, args.seeds, args.first_seed, dict(args.design)):
        print(json.dumps(_train_seed(config, args.check)), flush=True)


def _parse_set(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"--set {text!r}: expected FIELD=PYTHON_LITERAL") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="synthetic", help="a task tier: synthetic, filter-norm, filter-direction, "
                        "abstain-stream, value-junk-norm, value-junk-direction")
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--kernels", nargs="+", default=["avx2", "native"], help="ATEN_CPU_CAPABILITY values")
    parser.add_argument("--check", type=int, default=25, help="steps between accuracy checks")
    parser.add_argument("--set", dest="design", type=_parse_set, action="append", default=[],
                        help="a tier or task field of the design tried, e.g. lr=3e-3 or steps=400")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    children = {}
    for kernels in args.kernels:
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if kernels != "native":
            env["ATEN_CPU_CAPABILITY"] = kernels
        command = [sys.executable, __file__, "--child", "--tier", args.tier, "--seeds", str(args.seeds), "--first-seed",
                   str(args.first_seed), "--check", str(args.check)]
        command += [arg for key, value in args.design for arg in ("--set", f"{key}={value!r}")]
        children[kernels] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    print(f"{args.tier} design: {dict(args.design) or 'the tier as it is'}")
    for kernels, child in children.items():
        rows = [json.loads(line) for line in child.stdout]
        if child.wait() != 0:
            raise SystemExit(f"the {kernels} run failed")
        learned = [r for r in rows if r["learned"]]
        print(f"{kernels}: {len(learned)}/{len(rows)} seeds learned; CPU {sum(r['cpu_s'] for r in rows):.0f} s")
        losses = [r["val_loss"] for r in rows]
        print(f"  val_loss at the budget: mean {statistics.fmean(losses):.4f}, sd "
              f"{statistics.stdev(losses) if len(losses) > 1 else float('nan'):.4f}")
        for r in rows:
            absent = "" if r["absent_accuracy"] is None else (f" (absent {r['absent_accuracy']:.3f}, their part of "
                                                              f"val_loss {r['absent_loss']:.4f})")
            print(f"  seed {r['seed']:2d}: accuracy {r['accuracy']:.3f}{absent}, val_loss {r['val_loss']:.4f} at the "
                  f"budget, first >= criterion at step {r['learned_at']}, CPU {r['cpu_s']:.1f} s; val_loss by step: "
                  + ", ".join(f"{step} {loss:.3f}" for step, loss in r["curve"]))


if __name__ == "__main__":
    main()
