"""`ablate plan`: parameters, tokens, steps, FLOPs and GPU-hours of a grid, before anything runs."""

from __future__ import annotations

import argparse
import json

from ablate.tiers import DEFAULT_GPU, GPUS, TIERS


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="parameters, tokens, steps, FLOPs and GPU-hours of an experiment's grid or of given tiers")
    parser.add_argument("experiment", nargs="?",
                        help="an experiments/*.py file or its name: price its grid (its tiers, arms, seeds)")
    parser.add_argument("--tier", nargs="+", dest="tiers", metavar="TIER",
                        help=f"tiers to price (with an experiment: a subset of its tiers); one of {', '.join(TIERS)}")
    parser.add_argument("--arms", nargs="+", metavar="ARM",
                        help="arms to price (default: the experiment's, or every registered arm)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="INDEX",
                        help="seed indices of the experiment to price, as in `submit` (needs an experiment)")
    parser.add_argument("--seed-count", type=int, metavar="N",
                        help="runs per arm (default: the experiment's seeds, or each tier's)")
    parser.add_argument("--match-params", action=argparse.BooleanOptionalAction, default=None,
                        help="narrow the MLPs of arms that add parameters to the baseline's count (within 0.5%%); "
                             "--no-match-params prices the unmatched variant (default: the experiment's choice)")
    parser.add_argument("--gpu", choices=sorted(GPUS),
                        help=f"GPU whose peak bf16 throughput prices an hour (default: the profile's, else {DEFAULT_GPU})")
    parser.add_argument("--profile", metavar="NAME",
                        help="cluster profile slurm/NAME.toml whose `gpu` key names the GPU")
    parser.add_argument("--gpu-check", metavar="PATH",
                        help="gpu_check.json with a measured MFU (default: ./gpu_check.json, else the repository's)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_plan)


def _plan(args) -> int:
    from ablate.experiment import load_experiment
    from ablate.plan import plan_grid, throughput
    from ablate.profiles import load_profile

    gpu = args.gpu
    if args.profile and not gpu:
        gpu = load_profile(args.profile).get("gpu") or None
    experiment = load_experiment(args.experiment) if args.experiment else None
    plan = plan_grid(experiment, tiers=args.tiers, arms=args.arms, seeds=args.seeds, seed_count=args.seed_count,
                     match_params=args.match_params, speed=throughput(gpu, args.gpu_check))
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    if plan["experiment"]:
        print(f"experiment {plan['experiment']}")
    for tier in plan["tiers"]:
        _print_tier(tier)
    print(f"grid: {plan['total_runs']} runs, {plan['total_train_flops']:.3g} FLOPs, "
          f"{plan['total_gpu_hours']:.1f} GPU-hours (assuming {plan['assumption']})")
    return 0


def _print_tier(plan: dict) -> None:
    h = plan["hyperparameters"]
    print(f"tier {plan['tier']}: {h['n_layer']} layers, d_model {h['d_model']}, {h['n_head']} heads, seq {h['seq_len']}, "
          f"batch {h['global_batch']} × {h['seq_len']} tokens, lr {h['lr']:g}, warm-up {h['warmup_steps']}, "
          f"cosine to {h['min_lr_ratio']:g}×, wd {h['weight_decay']:g}, clip {h['grad_clip']:g}; "
          f"micro-batch for the GPU {plan['micro_batch_for_gpu']}"
          + (" ; parameter-matched" if plan["match_params"] else ""))
    print(f"{'arm':<15} {'total':>12} {'non-emb':>12} {'vs base':>8} {'arm extra':>10} {'MLP':>6} {'tokens':>14} "
          f"{'steps':>7} {'FLOPs':>10} {'GPU-h/run':>10} {'seeds':>5}")
    for r in plan["runs"]:
        print(f"{r['arm']:<15} {r['params_total']:>12,} {r['params_non_embedding']:>12,} "
              f"{r['params_vs_baseline']:>+8.2%} {r['params_arm_extra']:>10,} {r['mlp_hidden']:>6} {r['tokens']:>14,} "
              f"{r['steps']:>7,} {r['train_flops']:>10.3g} {r['gpu_hours_per_run']:>10.2f} {r['seeds']:>5}")
    print(f"tier {plan['tier']}: {plan['total_runs']} runs, {plan['total_gpu_hours']:.1f} GPU-hours")

