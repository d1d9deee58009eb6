"""`ablate run`: train one (tier, arm, seed) run, or resume it."""

from __future__ import annotations

import json
import sys

from ablate.cli.arms import load_arm_file

DIVERGED_EXIT = 3  # a run that ended diverged (an outcome, recorded as such; not a failure: that is 1, bad input 2)


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="train one (tier, arm, seed) run, or resume it",
        epilog=f"exit status: 0 completed, {DIVERGED_EXIT} diverged (a non-finite loss; the error says which layer and "
               "slot or hook made the first non-finite value), 1 failed, 2 bad input")
    parser.add_argument("--tier", required=True)
    parser.add_argument("--arm", required=True, help="a registered arm, or one --arm-file registers")
    parser.add_argument("--arm-file", metavar="FILE.py",
                        help="a Python file that registers your arm (`@register_arm(\"my-arm\")`), loaded first (give "
                             "it again to resume the run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq-len", type=int, metavar="T",
                        help="train at this sequence length instead of the tier's: a run of its own (its folder "
                             "…/<arm>/T<n>/seed<k>), so a sweep over T needs no experiment file per length")
    parser.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (schedule shortened)")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS, else the checkout's results/)")
    parser.add_argument("--experiment", default="adhoc", help="experiment name for the run folder (default adhoc)")
    parser.add_argument("--data", help="prepared data folder (default: the tier's)")
    parser.add_argument("--checkpoint-interval", type=int, help="steps between checkpoints (default: the tier's)")
    parser.add_argument("--devices", type=int, help="data-parallel processes (GPUs, or CPU processes with gloo)")
    parser.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    parser.add_argument("--document-mask", action="store_true", default=None,
                        help="each token attends within its document only (split at <|endoftext|>); part of the "
                             "run's identity; not on task tiers")
    parser.add_argument("--logger", choices=("none", "tensorboard", "wandb"))
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--force", action="store_true", help="keep an existing run folder aside and start again")
    parser.set_defaults(func=run_command)


def run_spec(args):
    """The run `ablate run` trains: a `--seq-len` other than the tier's is its own run (the length joins its key, as
    an LR sweep's factor does); the tier's own length is the tier's run."""
    from ablate.experiment import RunSpec
    from ablate.tiers import get_tier

    if args.seq_len is None or args.seq_len == get_tier(args.tier).seq_len:
        return RunSpec(args.experiment, args.tier, args.arm, args.seed)
    return RunSpec(args.experiment, args.tier, args.arm, args.seed, {"seq_len": args.seq_len}, seq_len=args.seq_len)


def run_command(args) -> int:
    from ablate.armcheck import refuse_unsound  # the library loads in the handler: `ablate --help` stays torch-free
    from ablate.store import Status
    from ablate.runconfig import RunOptions
    from ablate.train import run_as

    if args.arm_file:
        load_arm_file(args.arm_file)
    refuse_unsound([args.arm], args.arm_file)  # a user's arm: causal and finite, or refused before any folder exists
    spec = run_spec(args)
    options = RunOptions(data_dir=args.data, max_steps=args.max_steps, checkpoint_interval=args.checkpoint_interval,
                         devices=args.devices, compile=args.compile, logger=args.logger, threads=args.threads,
                         progress=args.progress, document_mask=args.document_mask)
    summary, child = run_as(spec, args.results, options, args.force)
    if not child:  # a data-parallel child reports nothing: its parent does
        print(json.dumps({k: getattr(summary, k) for k in ("tier", "arm", "seed", "status", "val_loss", "steps",
                                                          "init_fingerprint", "data_fingerprint", "config_fingerprint",
                                                          "val_fingerprint", "val_tokens_evaluated")}, indent=2))
    if summary.status == Status.DIVERGED and not child:
        print(f"ablate: run diverged: {summary.error}", file=sys.stderr)
        return DIVERGED_EXIT
    return 0 if summary.status in (Status.COMPLETED, Status.DIVERGED) else 1
