"""`ablate submit`: an experiment's grid to SLURM job arrays, or run here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ablate.cli.hints import Selection
from ablate.paths import results_folder


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("submit", help="submit an experiment's grid (SLURM job arrays, or this machine)")
    parser.add_argument("experiment", help="an experiments/*.py file or its name")
    parser.add_argument("--tier", nargs="+", dest="tiers", metavar="TIER", help="only these tiers (default: all)")
    parser.add_argument("--arms", nargs="+", metavar="ARM", help="only these arms (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="K", help="only these seed indices (default: all)")
    parser.add_argument("--executor", default="slurm", help="slurm (default): job arrays; local: run here")
    parser.add_argument("--profile", default="local", help="cluster profile slurm/NAME.toml (default: local)")
    parser.add_argument("--parallel", type=int, help="local executor: runs at a time (default: CPU count)")
    parser.add_argument("--data", help="prepared data folder for every run (default: each tier's data_dir)")
    parser.add_argument("--match-params", dest="match_params", action="store_true", default=None,
                        help="narrow the MLP of arms that add parameters to the baseline's count")
    parser.add_argument("--no-match-params", dest="match_params", action="store_false",
                        help="run arms that add parameters unmatched (overrides the experiment)")
    parser.add_argument("--document-mask", action="store_true", default=None,
                        help="every run: each token attends within its document only (split at <|endoftext|>), as "
                             "`ablate run --document-mask`; part of each run's identity; not on task tiers")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS, else the checkout's results/)")
    parser.add_argument("--dry-run", action="store_true", help="print runs, resources and GPU-hours; submit nothing")
    parser.add_argument("--rerun-stale", action="store_true",
                        help="completed runs whose arm's code changed since they trained (`ablate status` says "
                             "stale): move them aside, as `run --force` does, and train the current code")
    parser.add_argument("--eval", nargs="+", metavar="TASK", dest="eval_tasks",
                        help="also evaluate the runs with lm-evaluation-harness (lambada_openai hellaswag wikitext): "
                             "after training, or now for completed runs")
    parser.add_argument("--eval-limit", type=int, help="--eval: documents per task (default: all)")
    parser.add_argument("--task-data", help="--eval: folder of local task files (see `ablate eval --help`)")
    lr = parser.add_argument_group("every arm at its own learning rate (an experiment that declares lr_sweep=)")
    lr.add_argument("--sweep", action="store_true",
                    help="queue the LR sweep: arms × the sweep's lr factors × its seeds (`ablate plan "
                         "EXPERIMENT --sweep`)")
    lr.add_argument("--tuned", action="store_true",
                    help="queue the confirmatory runs: the grid's seeds at each arm's best LR of the finished sweep "
                         "(chosen on the selection loss; an arm whose best is the shared lr reuses its grid runs)")
    sequential = parser.add_argument_group("sequential seeds (an experiment that declares hypotheses=)")
    sequential.add_argument("--sequential", action="store_true",
                            help="queue seeds look by look: the first submit records the design in the ledger and "
                                 "queues the first look; each later one queues the next look only for tiers with a "
                                 "declared comparison still undecided")
    sequential.add_argument("--looks", type=int, metavar="K", help="--sequential: looks (first submit only)")
    sequential.add_argument("--max-seeds", type=int, metavar="N", help="--sequential: seeds at the last look")
    sequential.add_argument("--alpha", type=float, default=None, help="--sequential: family-wise error (default 0.05)")
    parser.add_argument("--amend", action="store_true",
                        help="record the experiment file's changed design (comparisons, tiers, seeds, family) as a "
                             "new, dated version of the design the first submit froze; the report names it")
    parser.set_defaults(func=submit_command)


def _resolve(args):
    """(the experiment, its file, the results folder) the arguments name."""
    from ablate.experiment import experiment_file, load_experiment  # the library loads in the handler: see ablate.cli

    from ablate.status import with_queued_seeds

    file = experiment_file(args.experiment)
    results = results_folder(args.results)
    return with_queued_seeds(load_experiment(file), results), str(file), results


def _hint(args) -> str:
    """The status command for what the user just did, with the options that chose the runs."""
    return Selection.of(args).status_command()


def submit_command(args) -> int:
    try:
        return _submit_and_tell(args)
    except KeyboardInterrupt as err:  # Ctrl-C: one line, exit 130 (the runs it stopped resume on the next submit)
        stopped = getattr(err, "keys", [])
        again = Selection.of(args).submit_command()
        what = (f"{len(stopped)} run(s) stopped at a step boundary with a checkpoint "
                f"({', '.join(stopped)}), no further "
                f"run started; `{again}` resumes the grid") if stopped else f"see `{_hint(args)}`"
        print(f"ablate: interrupted: {what}", file=sys.stderr)
        return 130


def sequential_counts(design, folder, tiers) -> dict[str, int]:
    """Per tier the seeds the design needs queued now, from the completed runs in `folder`."""
    from ablate.analysis.hypotheses import Declared, seeds_to_queue  # the library loads in the handler
    from ablate.analysis.load import load_runs
    from ablate.store import iter_run_dirs

    runs = load_runs(folder) if Path(folder).is_dir() and next(iter_run_dirs(folder), None) else None
    return seeds_to_queue(runs, Declared.of(design.comparisons, design.family, design.boundaries), tiers)


def lr_runs(args, experiment, results):
    """The runs `--sweep` or `--tuned` queue instead of the grid (None: the grid)."""
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli

    if not (args.sweep or args.tuned):
        return None
    if args.sequential or args.seeds or (args.sweep and args.tuned):
        raise AblateError("--sweep and --tuned choose their own seeds: give one of them, without --seeds "
                          "or --sequential")
    if args.sweep:
        return experiment.sweep_runs(args.tiers, args.arms)
    from ablate.analysis.lr import lr_table, sweep_runs
    from ablate.store import Status

    sweep = experiment.declared_sweep()
    folder = results / experiment.name
    table = lr_table(folder, sweep.margin, sweep.delta, sweep=sweep)
    best = table.best_factors()
    wanted = {tier: list(dict.fromkeys(args.arms or experiment.arm_names())) for tier in args.tiers or sweep.tiers}
    done = {(r.tier, r.arm, r.factor, r.seed) for r in sweep_runs(folder)
            if r.status in (Status.COMPLETED, Status.DIVERGED)}
    unfinished = {f"{s.tier}/{s.arm}" for s in experiment.sweep_runs(args.tiers, args.arms)
                  if (s.tier, s.arm, s.lr_factor, s.seed) not in done}  # a best LR of part of the sweep is no best
    lacking = sorted(unfinished | {f"{tier}/{arm}" for tier, arms in wanted.items() for arm in arms
                                   if arm not in best.get(tier, {})})
    if lacking:
        raise AblateError(f"no best LR yet for {', '.join(lacking)}: their sweep runs are not all finished (see "
                          f"`ablate status {args.experiment} --sweep`, `ablate table {args.experiment} --kind lr`)")
    return experiment.confirmatory_runs({tier: {arm: best[tier][arm] for arm in arms} for tier, arms in wanted.items()})


def _submission(args, results, sequential: dict | None, grid):
    """What the command line asks `ablate.dispatch.submit` for."""
    from ablate.dispatch import Submission  # the library loads in the handler: see ablate.cli
    from ablate.runconfig import RunOptions

    return Submission(
        results=results, executor=args.executor, profile=args.profile, tiers=args.tiers, arms=args.arms,
        seeds=args.seeds, parallel=args.parallel, dry_run=args.dry_run,
        options=RunOptions(data_dir=str(Path(args.data).resolve()) if args.data else None,
                           match_params=args.match_params, document_mask=True if args.document_mask else None),
        eval_tasks=args.eval_tasks, rerun_stale=args.rerun_stale,
        eval_options={k: v for k, v in {"limit": args.eval_limit, "task_data": args.task_data}.items()
                      if v is not None},
        **({"seeds_by_tier": sequential["counts"], "sequential": sequential["record"]} if sequential else {}),
        **({"grid": grid} if grid is not None else {}), amend=args.amend)


def _submit_and_tell(args) -> int:
    from ablate.dispatch import submit

    from ablate.armcheck import refuse_unsound

    experiment, file, results = _resolve(args)
    refuse_unsound(experiment.arm_names(), file)  # the arms its file registers: causal and finite, before any run
    grid = lr_runs(args, experiment, results)
    experiment, sequential = _sequential(args, experiment, results)
    report = submit(experiment, file, _submission(args, results, sequential, grid))
    for key, aside in (report.get("stale") or {}).items():
        print(f"{key}: stale (its arm's code changed since it trained): " + (
            f"kept aside in {aside}, trained again" if aside else "would be moved aside and trained again"))
    skipped = ", ".join(f"{n} {k}" for k, n in report["skipped"].items() if n) or "none"
    if args.dry_run:
        _tell_dry_run(experiment, report, skipped)
        return 0
    evals = report.get("evals") or {}
    if evals:
        failed_evals = [k for k, v in evals.items() if str(v).startswith("failed")]
        print(f"{experiment.name}: evaluation {'queued' if args.executor == 'slurm' else 'done'} for {len(evals)} runs"
              + (f", {len(failed_evals)} failed ({', '.join(failed_evals)})" if failed_evals else ""))
    if not report["to_submit"]:
        print(f"{experiment.name}: nothing to submit ({skipped}); see `{_hint(args)}`")
        return 1 if any(str(v).startswith("failed") for v in evals.values()) else 0
    if args.executor == "slurm":
        print(f"{experiment.name}: queued {len(report['jobs'])} runs (skipped: {skipped}); "
              f"follow with `{_hint(args)}`")
        return 0
    failed = [k for k, code in report["jobs"].items() if code != 0]
    diverged = report.get("diverged") or []  # an outcome, not a failure: the tables count it as a diverged seed
    print(f"{experiment.name}: {'finished' if failed or diverged else 'completed'}: ran {len(report['jobs'])} runs "
          f"here, {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else "")
          + f", {len(diverged)} diverged" + (f" ({', '.join(diverged)})" if diverged else "")
          + (f"; see `{_hint(args)}`" if failed or diverged else ""))
    return 1 if failed else 0

def _sequential(args, experiment, results):
    """`--sequential`: (the experiment at the design's seeds, the design's record and counts), said in one line;
    otherwise (the experiment, None)."""
    import dataclasses  # the library loads in the handler: see ablate.cli

    if not args.sequential:
        return experiment, None
    if args.seeds:
        from ablate.errors import AblateError

        raise AblateError("--sequential chooses the seeds look by look; drop --seeds")
    from ablate.sequential import design_to_follow

    tiers = args.tiers or experiment.tiers
    design, new = design_to_follow(experiment, results / experiment.name, args.looks, args.max_seeds, args.alpha,
                                   tiers)
    counts = sequential_counts(design, results / experiment.name, tiers)
    experiment = dataclasses.replace(experiment, seeds=design.max_seeds)
    print(f"{experiment.name}: sequential design ({'new' if new else 'recorded'}): looks at "
          + ", ".join(str(look["seeds"]) for look in design.boundaries["looks"]) + " seeds; "
          + "; ".join(f"{tier}: {f'seeds 0–{n - 1}' if n else 'decided, nothing to queue'}"
                      for tier, n in counts.items()))
    return experiment, {"record": design.to_record() if new else None, "counts": counts}


def _tell_dry_run(experiment, report: dict, skipped: str) -> None:
    """What a real submit would queue and its resources; what would not fit the cluster last (the last thing read)."""
    print(f"{experiment.name}: {len(report['to_submit'])} of {report['runs']} runs would be submitted "
          f"(skipped: {skipped}); estimated {report['gpu_hours']:.1f} GPU-hours")
    if report["resources"]:
        print("resources per run: " + json.dumps({k: v for k, v in report["resources"].to_dict().items()
                                                  if v not in ("", [])}))
    for key in report["to_submit"]:
        print(f"  {key}")
    for line in report.get("misfits", []):
        print(f"does not fit the cluster (sinfo), so a real submit refuses it: {line}")
