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
                        help="GPU whose peak bf16 throughput prices an hour (default: the profile's, else "
                             f"{DEFAULT_GPU})")
    parser.add_argument("--profile", metavar="NAME",
                        help="cluster profile slurm/NAME.toml whose `gpu` key names the GPU")
    parser.add_argument("--gpu-check", metavar="PATH",
                        help="gpu_check.json with a measured MFU (default: ./gpu_check.json, else the repository's)")
    parser.add_argument("--arm-file", metavar="FILE.py",
                        help="a Python file that registers your arm(s), loaded first: price them (--arms NAME)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--sweep", action="store_true",
                        help="the experiment's LR sweep (lr_sweep=LRSweep(...)): its runs and GPU-hours, beside the "
                             "grid's and the confirmatory runs'")
    parser.add_argument("--eval", nargs="+", metavar="TASK", dest="eval_tasks",
                        help="a downstream evaluation of the grid (as `submit --eval`): the seeds each tier has for "
                             "its by-item intervals; at least 3 are recommended")
    power = parser.add_argument_group("how many seeds (needs an experiment that declares hypotheses=)")
    power.add_argument("--power", action="store_true",
                       help="seeds a paired t-test needs per tier and declared comparison, and their GPU-hours")
    power.add_argument("--effect", type=float, metavar="E", help="--power: the true mean difference to detect, nats; "
                                                                 "--sequential: the effect its power "
                            "and expected seeds are simulated under (with --sd)")
    power.add_argument("--sd", type=float, metavar="S",
                       help="--power: the seed-to-seed sd of the paired differences, nats (with --pilot: for "
                            "comparisons the pilot lacks)")
    power.add_argument("--pilot", metavar="SOURCE",
                       help="--power: a results folder, experiment or CSV of a few seeds whose sd per "
                            "comparison is used")
    power.add_argument("--slope", type=float, metavar="B",
                       help="--power: a scale slope to detect, nats per decade of parameters: each declared "
                            "slope's power at the design, across these tier recipes and as a law of N (with --sd)")
    power.add_argument("--tier-sd", type=float, metavar="T",
                       help="--power --slope: the tier means' scatter about the line in log N, nats (default: "
                            "half of --sd)")
    power.add_argument("--alpha", type=float, default=0.05, help="family-wise error (default 0.05)")
    power.add_argument("--target-power", type=float, default=0.8, help="--power: wanted power (default 0.8)")
    power.add_argument("--sequential", action="store_true",
                       help="a group-sequential design: looks, |t| boundaries and alpha spent")
    power.add_argument("--looks", type=int, metavar="K", help="--sequential: number of looks")
    power.add_argument("--max-seeds", type=int, metavar="N", help="--sequential: seeds at the last look")
    power.add_argument("--results", default=None, help="--pilot: results folder (default: $ABLATE_RESULTS, else the "
                                                       "checkout's results/)")
    parser.set_defaults(func=plan_command)


def _needs(args, flag: str, *names: str) -> None:
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli

    missing = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is None]
    if missing:
        raise AblateError(f"{flag} needs {' and '.join(missing)}; e.g. `ablate plan sink_vs_filter "
                          + ("--power --effect 0.002 --sd 0.004`" if flag == "--power" else "--sequential --looks 3 "
                                                                                            "--max-seeds 12`"))


def _power(args, experiment) -> int:
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli
    from ablate.plan import power_plan, slope_powers, throughput

    _needs(args, "--power", "effect")
    if args.sd is None and args.pilot is None:
        raise AblateError("--power needs --sd S (an assumed seed sd of the paired differences, nats) or --pilot SOURCE")
    pilots = _pilots(args, experiment) if args.pilot else None
    plan = power_plan(experiment, args.effect, sd=args.sd, pilots=pilots, alpha=args.alpha,
                      target_power=args.target_power, tiers=args.tiers, speed=throughput(args.gpu, args.gpu_check))
    if args.slope is not None:
        if args.sd is not None or args.pilot is None:
            plan["slopes"] = slope_powers(experiment, args.slope, args.sd, args.tier_sd, args.alpha)
        plan["ladder"] = _ladder(args, experiment)
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    print(f"experiment {experiment.name}: seeds for a paired t-test to detect {args.effect:g} nats at "
          f"alpha {args.alpha:g}/m (Bonferroni over the declared family) with power {args.target_power:g}")
    print(f"{'tier':<6} {'comparison':<20} {'sd':>9} {'sd from':<16} {'m':>3} {'seeds':>6} {'conserv.':>8}")
    for r in plan["power"]:
        conservative = "–" if r["seeds_conservative"] is None else str(r["seeds_conservative"])
        source = f"pilot ({r['pilot_seeds']} seeds)" if r["sd_source"] == "pilot" else r["sd_source"]
        print(f"{r['tier']:<6} {r['comparison']:<20} {r['sd']:>9.5f} {source:<16} {r['family_size']:>3} "
              f"{r['seeds']:>6} {conservative:>8}")
    for t in plan["tiers"]:
        print(f"tier {t['tier']}: {_seeds(t['seeds'])} cover every declared comparison, {t['gpu_hours']:.1f} GPU-hours "
              f"(the fixed design: {_seeds(t['fixed_seeds'])}, {t['fixed_gpu_hours']:.1f} GPU-hours); "
              f"sd from {t['sd_sources']}")
    for r in plan["slopes"]:
        level = (f"alpha {r['alpha_per_test']:.3g} (m = {r['family_size']})" if r["in_family"]
                 else "alpha unadjusted (in no family: exploratory)")
        print(f"slope {r['quantity']}: {r['slope']:g} nats per decade at {'/'.join(map(str, r['seeds']))} seeds, "
              f"{level}: power across these tier recipes {_power_cell(r['recipe_power'])} ({r['recipe_df']} df), "
              f"as a law of N {_power_cell(r['law_power'])} (tier sd {r['tier_sd']:g})")
    if "ladder" in plan:
        _print_ladder(plan["ladder"])
    print(f"GPU-hours per seed: {plan['gpu_hours_basis']}; assuming {plan['assumption']}")
    for note in plan["notes"]:
        print(f"note: {note}")
    for warning in plan["warnings"]:
        print(f"warning: {warning}")
    return 0


def _ladder(args, experiment) -> dict:
    """The ladder proposal (`ablate.plan_ladder`) for each declared slope, from the pilot's slope, sd and tier
    scatter where it has them, else from --slope, --sd and --tier-sd."""
    from ablate.family import Family
    from ablate.plan import throughput
    from ablate.plan_ladder import SlopeInput, ladder_plan

    family = experiment.declared_family()
    members = family.slopes or Family.of(experiment.hypotheses, experiment.tiers, "experiment").slopes
    pilot = _pilot_slopes(args, experiment) if args.pilot else {}
    given = "--slope, --sd, --tier-sd"
    tier_sd = args.tier_sd if args.tier_sd is not None else (args.sd / 2 if args.sd is not None else None)
    inputs = []
    for quantity in members:
        found = pilot.get(quantity)
        if found is not None:
            inputs.append(SlopeInput(quantity, found.slope, found.sd,
                                     found.tier_sd if found.tier_sd is not None else (tier_sd or found.sd / 2),
                                     found.source))
        elif args.sd is not None:
            inputs.append(SlopeInput(quantity, args.slope, args.sd, tier_sd, given))
    return ladder_plan(experiment, inputs, alpha=args.alpha, target_power=args.target_power,
                       speed=throughput(args.gpu, args.gpu_check))


def _pilot_slopes(args, experiment) -> dict:
    from ablate.analysis.hypotheses import Declared, comparison_differences  # the library loads in the handler
    from ablate.analysis.load import load_runs
    from ablate.analysis.scale_pilot import pilot_slopes
    from ablate.experiment import results_of

    runs = load_runs(results_of(args.pilot, args.results))
    declared = Declared.of(experiment.hypotheses, experiment.family)
    return pilot_slopes(runs, comparison_differences(runs, declared)[0] if declared.comparisons else None)


def _print_ladder(ladder: dict) -> None:
    design = ladder["design"]
    for r in design["slopes"]:
        print(f"law of N, {r['quantity']}: power {_power_cell(r['law_power'])} at this design "
              f"({'/'.join(map(str, design['seeds']))} seeds, m = {design['family_size']}; slope {r['slope']:+.4g}, "
              f"sd {r['sd']:.3g}, tier sd {r['tier_sd']:.3g}, from {r['source']})")
    for c in ladder["candidates"]:
        print(f"  ladder {c['ladder']} × {c['seeds']} seeds: {c['gpu_hours']:.1f} GPU-hours, m = {c['family_size']}, "
              f"weakest law power {_power_cell(c['weakest'])}")
    best = ladder["proposal"]
    if best is None:
        print(f"proposal: no candidate ladder reaches law power {ladder['target_power']:g} for every declared slope")
    else:
        print(f"proposal: {', '.join(best['tiers'])} × {best['seeds']} seeds at {ladder['tokens_per_param']} tokens "
              f"per parameter, {best['gpu_hours']:.1f} GPU-hours: every declared slope's law power ≥ "
              f"{ladder['target_power']:g} (weakest {best['weakest']:.3f})")
    print(f"caveat: {ladder['caveat']}")


def _power_cell(value) -> str:
    return "– (not testable at this design)" if value is None else f"{value:.3f}"


def _pilots(args, experiment) -> dict:
    from ablate.analysis.hypotheses import Declared, pilot_differences  # the library loads in the handler
    from ablate.analysis.load import load_runs
    from ablate.experiment import results_of
    from ablate.power import Pilot

    runs = load_runs(results_of(args.pilot, args.results))
    differences = pilot_differences(runs, Declared.of(experiment.hypotheses, experiment.family))
    return {key: Pilot.from_differences(values) for key, values in differences.items() if len(values) >= 2}


def _sequential(args, experiment) -> int:
    from ablate.plan import sequential_plan, throughput  # the library loads in the handler: see ablate.cli

    _needs(args, "--sequential", "looks", "max_seeds")
    plan = sequential_plan(experiment, args.looks, args.max_seeds, args.alpha, effect=args.effect, sd=args.sd,
                           tiers=args.tiers, speed=throughput(args.gpu, args.gpu_check))
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    print(sequential_text(experiment.name, plan["sequential"]))
    operating = plan["operating"]
    if operating:
        print(f"under effect/sd = {args.effect:g}/{args.sd:g} ({operating['paths']:,} simulated studies, generator "
              f"seed {operating['seed']}): power {operating['power']:.3f}, expected seeds "
              f"{operating['expected_seeds']:.1f}")
    for t in plan["tiers"]:
        line = (f"tier {t['tier']}: {t['gpu_hours_first_look']:.1f} GPU-hours to the first look, at most "
                f"{t['gpu_hours_max']:.1f}")
        if operating:
            fixed = "–" if t["fixed_power"] is None else f"{t['fixed_power']:.3f}"
            line += (f"; expected {t['expected_gpu_hours']:.1f} (the fixed design: {_seeds(t['fixed_seeds'])}, "
                     f"{t['fixed_gpu_hours']:.1f} GPU-hours, power {fixed})")
        else:
            line += f" (the fixed design: {_seeds(t['fixed_seeds'])}, {t['fixed_gpu_hours']:.1f} GPU-hours)"
        print(line)
    if "ladder" in plan:
        _print_ladder(plan["ladder"])
    print(f"GPU-hours per seed: {plan['gpu_hours_basis']}; assuming {plan['assumption']}")
    print(f"next: {plan['next']}")
    return 0


def sequential_text(name: str, design: dict) -> str:
    lines = [f"experiment {name}: sequential design, {len(design['looks'])} looks, O'Brien–Fleming-type alpha "
             f"spending; each declared comparison at alpha {design['alpha']:g}/{design['family_size']} = "
             f"{design['alpha_per_comparison']:.4g}; |t| boundaries calibrated by simulation",
             f"{'look':>4} {'seeds':>6} {'|t| boundary':>13} {'alpha spent':>12}"]
    lines += [f"{k:>4} {look['seeds']:>6} {look['t_boundary']:>13.4g} {look['alpha_spent']:>12.3g}"
              for k, look in enumerate(design["looks"], start=1)]
    return "\n".join(lines)


def plan_command(args) -> int:
    from ablate.experiment import load_experiment
    from ablate.plan import plan_grid, throughput
    from ablate.profiles import load_profile

    gpu, world_size = args.gpu, 1
    if args.arm_file:
        from ablate.cli.arms import load_arm_file

        load_arm_file(args.arm_file)
    if args.profile:
        profile = load_profile(args.profile)
        gpu, world_size = gpu or profile.gpu or None, profile.processes_per_run
    experiment = load_experiment(args.experiment) if args.experiment else None
    if args.power or args.sequential:
        from ablate.errors import AblateError

        if experiment is None or (args.power and args.sequential):
            raise AblateError("--power and --sequential each plan an experiment's declared comparisons: give one "
                              "experiment and one of them, e.g. `ablate plan sink_vs_filter --power --effect "
                              "0.002 --sd 0.004`")
        args.gpu = gpu
        return _power(args, experiment) if args.power else _sequential(args, experiment)
    if args.sweep:
        return _sweep(args, experiment, throughput(gpu, args.gpu_check))
    plan = plan_grid(experiment, tiers=args.tiers, arms=args.arms, seeds=args.seeds, seed_count=args.seed_count,
                     match_params=args.match_params, speed=throughput(gpu, args.gpu_check), world_size=world_size)
    if args.eval_tasks:
        from ablate.plan import eval_advice

        plan["downstream"] = eval_advice(plan, args.eval_tasks)
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    if plan["experiment"]:
        print(f"experiment {plan['experiment']}")
    for tier in plan["tiers"]:
        _print_tier(tier)
    print(f"grid: {plan['total_runs']} runs, {plan['total_train_flops']:.3g} FLOPs, "
          f"{plan['total_gpu_hours']:.1f} GPU-hours (assuming {plan['assumption']})")
    if experiment is not None and experiment.lr_sweep is not None and not (args.tiers or args.arms or args.seeds):
        from ablate.plan import sweep_plan

        sweep = sweep_plan(experiment, speed=throughput(gpu, args.gpu_check))
        print(f"LR sweep: {sweep['total_runs']} runs, {sweep['total_gpu_hours']:.1f} GPU-hours; confirmatory runs at "
              f"each arm's best LR: at most {sweep['confirmatory_runs_at_most']} runs, "
              f"{sweep['confirmatory_gpu_hours_at_most']:.1f} GPU-hours (`ablate plan {experiment.name} --sweep`)")
    if args.eval_tasks:
        _print_downstream(plan["downstream"])
    return 0


def _print_downstream(advice: dict) -> None:
    print(f"downstream evaluation ({', '.join(advice['tasks'])}): {advice['recommendation']}")
    for tier in advice["tiers"]:
        if not tier["enough"]:
            print(f"warning: tier {tier['tier']} has {tier['why']}: give it {advice['min_seeds']} seeds (--seed-count "
                  f"{advice['min_seeds']}, or the experiment's seeds) before evaluating it downstream")


def _sweep(args, experiment, speed) -> int:
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli
    from ablate.plan import sweep_plan

    if experiment is None or args.seeds or args.seed_count:
        raise AblateError("--sweep prices an experiment's LR sweep: give the experiment (and at most --tier/--arms), "
                          "e.g. `ablate plan sink_vs_filter --sweep`")
    plan = sweep_plan(experiment, tiers=args.tiers, arms=args.arms, speed=speed)
    if args.json:
        print(json.dumps(plan, indent=2))
        return 0
    print(f"experiment {plan['experiment']}: LR sweep at {', '.join(f'{f:g}' for f in plan['factors'])} × the tier's "
          f"lr, seeds {', '.join(map(str, plan['seeds']))}")
    for tier in plan["tiers"]:
        lrs = ", ".join(f"{lr:g}" for lr in plan["lr"][tier["tier"]])
        print(f"tier {tier['tier']}: lr {lrs}")
        print(f"{'arm':<15} {'runs':>5} {'GPU-h/run':>10} {'GPU-h':>9}")
        for r in tier["runs"]:
            print(f"{r['arm']:<15} {r['seeds']:>5} {r['gpu_hours_per_run']:>10.2f} {r['gpu_hours']:>9.2f}")
    for key in plan["runs"]:
        print(f"  {key}")
    print(f"LR sweep: {plan['total_runs']} runs, {plan['total_gpu_hours']:.1f} GPU-hours; the grid: "
          f"{plan['grid_runs']} runs, {plan['grid_gpu_hours']:.1f} GPU-hours; confirmatory runs at each arm's best LR: "
          f"at most {plan['confirmatory_runs_at_most']} runs, {plan['confirmatory_gpu_hours_at_most']:.1f} GPU-hours "
          f"(an arm whose best LR is the shared one reuses its grid runs) (assuming {plan['assumption']})")
    return 0


def _print_tier(plan: dict) -> None:
    h = plan["hyperparameters"]
    print(f"tier {plan['tier']}: {h['n_layer']} layers, d_model {h['d_model']}, {h['n_head']} heads, seq "
          f"{h['seq_len']}, "
          f"batch {h['global_batch']} × {h['seq_len']} tokens, lr {h['lr']:g}, warm-up {h['warmup_steps']}, "
          f"cosine to {h['min_lr_ratio']:g}×, wd {h['weight_decay']:g}, clip {h['grad_clip']:g}; "
          f"micro-batch for the GPU {plan['micro_batch_for_gpu']}"
          + (" ; parameter-matched" if plan["match_params"] else ""))
    print(f"{'arm':<15} {'total':>12} {'non-emb':>12} {'vs base':>8} {'arm extra':>10} {'MLP':>6} {'tokens':>14} "
          f"{'steps':>7} {'FLOPs':>10} {'GPU-h/run':>10} {'seeds':>5} {'micro':>5} {'peak GB':>8} {'path':>9}")
    for r in plan["runs"]:
        print(f"{r['arm']:<15} {r['params_total']:>12,} {r['params_non_embedding']:>12,} "
              f"{r['params_vs_baseline']:>+8.2%} {r['params_arm_extra']:>10,} {r['mlp_hidden']:>6} {r['tokens']:>14,} "
              f"{r['steps']:>7,} {r['train_flops']:>10.3g} {r['gpu_hours_per_run']:>10.2f} {r['seeds']:>5} "
              f"{r['micro_batch_for_gpu']:>5} {r['peak_memory_gb']:>8.1f} {r['attention']['path']:>9}")
    reference = [r for r in plan["runs"] if r["attention"]["path"] == "reference"]
    for r in reference:
        print(f"  {r['attention']['note']}")
    if reference:
        print(f"  peak GB: the predicted peak per GPU at the micro-batch (the probe's float32 bytes; bf16 keeps 0.5–1× "
              f"of them); GPU-h of {plan['reference_price']}")
    print(f"  {plan['peak_memory']}")
    print(f"tier {plan['tier']}: {plan['total_runs']} runs, {plan['total_gpu_hours']:.1f} GPU-hours")


def _seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")
