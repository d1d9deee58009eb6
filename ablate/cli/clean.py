"""`ablate clean`: free disk by removing what can be rebuilt from an experiment's results."""

from __future__ import annotations

from ablate.paths import results_folder


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "clean", help="free disk: remove what can be rebuilt (resume states of finished runs, temporaries, report)",
        description="Remove what can be rebuilt from an experiment's results: checkpoints/state.pt of finished "
                    "(completed or diverged) runs, stray .*.tmp files of interrupted writes, and the report/ folder "
                    "(only when no --tier/--arms/--seeds is given). Never removed: summary.json, metrics.jsonl, "
                    "config.json, run.log, eval.json, the final weights (checkpoints/model.pt), TensorBoard and "
                    "SLURM logs. Runs that are running (live lock) are skipped, and so are symbolic links: clean never "
                    "follows a link out of the results folder (each one is listed with where it leads).")
    parser.add_argument("experiment", help="an experiments/*.py file or its name")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS, else the checkout's results/)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, with sizes; remove nothing")
    parser.add_argument("--tier", nargs="+", dest="tiers", metavar="TIER", help="only these tiers (default: all)")
    parser.add_argument("--arms", nargs="+", metavar="ARM", help="only these arms (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="K", help="only these seed indices (default: all)")
    parser.add_argument("--aside", action="store_true",
                        help="also remove folders kept aside by `ablate run --force` (seed<k>.old-*): they hold "
                             "OLDER RESULTS that cannot be rebuilt")
    parser.set_defaults(func=clean_command)


def clean_command(args) -> int:
    from ablate.clean import clean, human  # the library loads in the handler: see ablate.cli
    from ablate.experiment import load_experiment
    from ablate.status import with_queued_seeds

    results = results_folder(args.results)
    experiment = with_queued_seeds(load_experiment(args.experiment), results)  # seeds a sequential design added
    if args.tiers or args.arms or args.seeds is not None:
        experiment.runs(args.tiers, args.arms, args.seeds)  # unknown names: an error naming the valid ones
    result = clean(results / experiment.name, tiers=args.tiers, arms=args.arms, seeds=args.seeds, aside=args.aside,
                   dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for item in result.removed:
        print(f"{verb} {human(item.size):>10}  {item.path}  ({item.why})")
    for folder, why in result.skipped:
        print(f"skipped {folder}: {why}")
    if result.kept_aside:
        print(f"kept {len(result.kept_aside)} folder(s) set aside by --force "
              f"({human(sum(i.size for i in result.kept_aside))}, older results; --aside removes them):")
        for item in result.kept_aside:
            print(f"  {human(item.size):>10}  {item.path}")
    keep = "would keep" if args.dry_run else "kept"
    weights = sum(item.size for item in result.kept_weights)
    if result.kept_weights:
        print(f"{keep} the final weights of {len(result.kept_weights)} run(s), {human(weights)} "
              f"(checkpoints/model.pt: probe, inject and eval read them, and nothing rebuilds them):")
        for item in result.kept_weights:
            print(f"  {human(item.size):>10}  {item.path}")
    if args.dry_run:
        print(f"total: {human(result.total)} in {len(result.removed)} item(s) would be freed "
              "(dry run: nothing removed)")
    else:
        print(f"total: freed {human(result.total)} in {len(result.removed)} item(s)")
    remain = f"{'would remain' if args.dry_run else 'remaining'}: {human(result.left)} in {result.root}"
    if args.tiers or args.arms or args.seeds is not None:  # the breakdown covers the runs cleaned, not the folder
        print(f"{remain} (every run of the experiment)")
        return 0
    aside = sum(item.size for item in result.kept_aside)
    records = max(0, result.left - weights - aside)
    print(f"{remain} (final weights {human(weights)}" + (f", folders set aside {human(aside)}" if aside else "")
          + f", records and logs {human(records)}: summaries, metrics, configs, run logs, evaluations, the ledger)")
    return 0
