"""`ablate status`: one row per run of an experiment, and the counts per state."""

from __future__ import annotations

import json

from ablate.paths import results_folder


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "status", help="one row per run of an experiment (or of `ablate run`'s ad-hoc runs), and the counts per state",
        description="One row per run: of an experiment's grid (its file or name), or, for a name with no "
                    "experiment file, of the run folders under RESULTS/NAME (`ablate status adhoc`: the runs of "
                    "`ablate run`).")
    parser.add_argument("experiment", help="an experiments/*.py file or its name; or adhoc (the runs of `ablate run`)")
    parser.add_argument("--tier", nargs="+", dest="tiers", metavar="TIER", help="only these tiers (default: all)")
    parser.add_argument("--arms", nargs="+", metavar="ARM", help="only these arms (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, metavar="K", help="only these seed indices (default: all)")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS or ./results)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_status)


def _runs(args):
    """(the name, the specs) the arguments name: an experiment's grid, filtered as `submit` filters it, or the
    run folders of a name without an experiment file (`adhoc`)."""
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli
    from ablate.experiment import experiment_file, load_experiment
    from ablate.status import folder_runs
    from ablate.store import check_results_folder

    results = check_results_folder(results_folder(args.results))
    text = str(args.experiment)
    folder = results / text
    try:
        file = experiment_file(text)
    except AblateError:
        if text.endswith(".py") or not folder.is_dir():
            if text == "adhoc":
                raise AblateError(f"no ad-hoc runs under {str(folder)!r}: `ablate run` makes them there "
                                  "(check --results)") from None
            raise
    else:
        experiment = load_experiment(file)
        return experiment.name, experiment.runs(args.tiers, args.arms, args.seeds), False
    specs = folder_runs(results, text, args.tiers, args.arms, args.seeds)
    present = folder_runs(results, text)
    for flag, given, names in (("--tier", args.tiers, {s.tier for s in present}),
                               ("--arms", args.arms, {s.arm for s in present}),
                               ("--seeds", args.seeds, {s.seed for s in present})):
        unknown = [v for v in given or [] if v not in names]
        if unknown:
            raise AblateError(f"{flag} {' '.join(map(str, unknown))}: no such run under {str(folder)!r}; "
                              f"there: {', '.join(map(str, sorted(names))) or '(no runs)'}")
    return text, specs, True


def _status(args) -> int:
    from ablate.status import STATES, status  # the library loads in the handler: see ablate.cli

    name, specs, adhoc = _runs(args)
    rows = status(name, results_folder(args.results), specs)
    counts = {state: sum(r["state"] == state for r in rows) for state in STATES}
    if args.json:
        print(json.dumps({"experiment": name, "adhoc": adhoc, "runs": rows, "counts": counts}, indent=2))
        return 0
    print(f"{'tier':<6} {'arm':<15} {'seed':>4}  {'state':<13} {'job':<14} {'steps':>13} {'elapsed':>9} {'eta':>9} "
          f"{'val_loss':>9}")
    for r in rows:
        loss = f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"
        steps = f"{r['steps']}/{r['total_steps']}" if r["total_steps"] else (str(r["steps"]) if r["steps"] else "-")
        print(f"{r['tier']:<6} {r['arm']:<15} {r['seed']:>4}  {r['state']:<13} {r['job_id'] or '-':<14} "
              f"{steps:>13} {_duration(r['elapsed_s']):>9} {_duration(r['eta_s']):>9} {loss:>9}")
        if r["error"]:
            print(f"        {'error' if r['state'] in ('failed', 'diverged') else 'why'}: {r['error']}")
        if r.get("eval"):
            print(f"        eval: {r['eval']}")
    print("  ".join(f"{state}: {n}" for state, n in counts.items() if n) + f"  (total {len(rows)})")
    again = ("the same `ablate run` command (with its --experiment, --tier, --arm, --seed)" if adhoc else
             f"`ablate submit {args.experiment}{f' --results {args.results}' if args.results else ''}`")
    if counts["failed"]:
        print(f"failed runs keep their traceback in RESULTS/{name}/<tier>/<arm>/seed<k>/run.log; "
              f"{again} {'resumes' if adhoc else 'resubmits'} them")
    if counts["cancelled"]:
        print(f"cancelled runs resume from their last checkpoint with {again}")
    if counts["unknown"]:
        print("unknown: SLURM could not say (see each run's reason); check `squeue` and `sacct` before submitting")
    return 0


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
