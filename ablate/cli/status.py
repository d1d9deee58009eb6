"""`ablate status`: one row per run of an experiment, and the counts per state."""

from __future__ import annotations

import dataclasses
import json

from ablate.cli.hints import Selection
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
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS, else the checkout's results/)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--sweep", action="store_true",
                        help="the runs of the experiment's LR sweep (lr_sweep=) instead of its grid")
    parser.set_defaults(func=status_command)


def _runs(args):
    """(the name, the specs) the arguments name: an experiment's grid, filtered as `submit` filters it, or the
    run folders of a name without an experiment file (`adhoc`)."""
    from ablate.errors import AblateError  # the library loads in the handler: see ablate.cli
    from ablate.experiment import experiment_file, load_experiment, no_runs_error
    from ablate.status import folder_runs
    from ablate.store import check_name_length, check_results_folder

    results = check_results_folder(results_folder(args.results))
    text = check_name_length("experiment", str(args.experiment)) if not str(args.experiment).endswith(".py") \
        else str(args.experiment)
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
        from ablate.status import with_queued_seeds

        experiment = load_experiment(file)
        if not (results / experiment.name).is_dir():  # `table`'s refusal, first and in one line
            raise no_runs_error(experiment.name, results)
        experiment = with_queued_seeds(experiment, results)
        if args.sweep:
            if args.seeds:
                raise AblateError("--sweep lists the sweep's own seeds: drop --seeds")
            return experiment.name, experiment.sweep_runs(args.tiers, args.arms), False
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


def status_command(args) -> int:
    from ablate.status import STATES, status  # the library loads in the handler: see ablate.cli

    name, specs, adhoc = _runs(args)
    results = results_folder(args.results)
    register_arms()  # the built-ins too: a completed run of an arm whose code changed since is stale
    rows = status(name, results, specs)
    counts = {state: sum(r.state == state for r in rows) for state in STATES}
    if args.json:
        print(json.dumps({"experiment": name, "adhoc": adhoc, "runs": [r.to_dict() for r in rows], "counts": counts},
                         indent=2))
        return 0
    print(f"{'tier':<6} {'arm':<15} {'seed':>4}  {'state':<13} {'job':<14} {'steps':>13} {'elapsed':>9} {'eta':>9} "
          f"{'val_loss':>10}")
    for r in rows:
        arm = r.arm if r.lr_factor is None else f"{r.arm} ×{r.lr_factor:g}"  # a run of the LR sweep: its factor
        loss = "-" if r.val_loss is None else f"{r.val_loss:.4f}" + ("" if r.val_loss_final else "~")
        steps = f"{r.steps}/{r.total_steps}" if r.total_steps else (str(r.steps) if r.steps else "-")
        state = "stale" if r.stale else r.state
        print(f"{r.tier:<6} {arm:<15} {r.seed:>4}  {state:<13} {r.job_id or '-':<14} "
              f"{steps:>13} {_duration(r.elapsed_s):>9} {_duration(r.eta_s):>9} {loss:>10}")
        if r.error:
            print(f"        {'error' if r.state in ('failed', 'diverged') else 'why'}: {r.error}")
        if r.eval:
            print(f"        eval: {r.eval}")
    stale = sum(bool(r.stale) for r in rows)
    print("  ".join(f"{state}: {n}" for state, n in counts.items() if n) + f"  (total {len(rows)})"
          + (f"; {stale} of the completed are stale: `ablate submit ... --rerun-stale` retrains them" if stale else ""))
    if any(r.val_loss is not None and not r.val_loss_final for r in rows):
        print("~ a mid-run val_loss (the run's last evaluation so far), not its final loss")
    _hints(args, rows, results / name, counts, adhoc)
    return 0


def register_arms() -> None:
    """Every arm registered in this process, the built-ins with the experiment file's: what `status`, `table` and
    `report` compare a run's recorded arm identity with (`ablate.arms.source.registered_identity`)."""
    from ablate.arms import list_arms  # the library loads in the handler (torch: the arms' classes)

    list_arms()


def _hints(args, rows, folder, counts, adhoc) -> None:
    """What resumes the failed and cancelled runs: the same `ablate run`, or one `ablate submit` per way they
    were submitted (executor, profile, data folder, --document-mask), narrowed to them."""
    stopped = [r for r in rows if r.state in ("failed", "cancelled")]
    commands = (["the same `ablate run` command (with its --experiment, --tier, --arm, --seed)"] if adhoc else
                [f"`{command}`" for command in resume_commands(args, rows, stopped, folder)]) if stopped else []
    if counts["failed"]:
        print(f"failed runs keep their traceback in RESULTS/{folder.name}/<tier>/<arm>/seed<k>/run.log; "
              f"{' or '.join(commands)} {'resumes' if adhoc else 'resubmits'} them")
    if counts["cancelled"]:
        print(f"cancelled runs resume from their last checkpoint with {' or '.join(commands)}")
    if counts["unknown"]:
        print("unknown: SLURM could not say (see each run's reason); check `squeue` and `sacct` before submitting")


def resume_commands(args, rows, stopped, folder) -> list[str]:
    """`ablate submit` commands that resume the `stopped` rows as they were submitted: the ledger says each
    run's executor and its submission's profile, data folder and `--document-mask`; tiers, arms and seeds are
    narrowed to the stopped runs where they are fewer than the rows shown."""
    from ablate.store import read_ledger, run_key  # the library loads in the handler: see ablate.cli

    ledger = read_ledger(folder)
    groups: dict[tuple, list] = {}
    for row in stopped:
        groups.setdefault(ledger.submitted_with(run_key(row.tier, row.arm, row.seed)), []).append(row)
    commands = []
    for (executor, profile, data, document_mask), group in groups.items():
        narrowed = {}
        for field in ("tier", "arm", "seed"):
            wanted = list(dict.fromkeys(getattr(r, field) for r in group))
            narrowed[field] = wanted if len(wanted) < len({getattr(r, field) for r in rows}) else None
        given = Selection.of(args)
        commands.append(dataclasses.replace(
            given, tiers=narrowed["tier"] or given.tiers, arms=narrowed["arm"] or given.arms,
            seeds=narrowed["seed"] or given.seeds, executor=executor, profile=profile, data=data,
            document_mask=document_mask).submit_command())
    return commands


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
