"""`ablate eval`: downstream tasks through lm-evaluation-harness, for one run folder or an experiment's grid."""

from __future__ import annotations

from pathlib import Path

from ablate.errors import AblateError
from ablate.paths import results_folder
from ablate.evals.tasks import DEFAULT_BOOTSTRAP_ITERS, TASKS, file_layout


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="downstream tasks (lm-evaluation-harness) on the final weights of completed runs → eval.json "
                     "and per-item results in eval_items/<task>.jsonl")
    parser.add_argument("target", metavar="RUN_DIR|EXPERIMENT",
                        help="a run folder RESULTS/<experiment>/<tier>/<arm>/seed<k>; an experiments/*.py file "
                             "or its name (every completed run of its grid); or an experiment folder such as "
                             "results/adhoc (every completed run in it)")
    parser.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help=f"tasks: {', '.join(TASKS)}")
    parser.add_argument("--tier", nargs="+", dest="tiers", help="EXPERIMENT: only these tiers")
    parser.add_argument("--arms", nargs="+", help="EXPERIMENT: only these arms")
    parser.add_argument("--seeds", nargs="+", type=int, help="EXPERIMENT: only these seeds")
    parser.add_argument("--results", help="EXPERIMENT: results folder (default: $ABLATE_RESULTS, else the "
                                          "checkout's results/)")
    parser.add_argument("--limit", type=int,
                        help="documents per task (default: all; a limited result pairs only with the same limit)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default 16); recorded "
                                                                   "with the results as an execution "
                             "setting: scores agree across batch sizes to float32 rounding, so it never affects "
                             "pairing")
    parser.add_argument("--task-data", metavar="DIR",
                        help="read the tasks' documents from local JSON-lines files instead of the Hub: "
                             f"{file_layout()}")
    parser.add_argument("--bootstrap-iters", type=int, default=DEFAULT_BOOTSTRAP_ITERS,
                        help=f"bootstrap draws for the stderr of perplexities (default {DEFAULT_BOOTSTRAP_ITERS:,}, "
                             "lm-eval's; 0: no stderr for any metric)")
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.set_defaults(func=eval_command)


def eval_command(args) -> int:
    from ablate.evals.run import evaluate_run, require_lm_eval

    require_lm_eval()
    folders = _targets(args)
    options = {"limit": args.limit, "batch_size": args.batch_size, "task_data": args.task_data,
               "bootstrap_iters": args.bootstrap_iters, "device": args.device}
    for index, folder in enumerate(folders):
        data = evaluate_run(folder, args.tasks, **options)
        if index == 0:  # the header once the first run is scored: an error never follows an empty table
            print("| run | task | metric | value | stderr |")
            print("|---|---|---|---:|---:|")
        for task in dict.fromkeys(args.tasks):
            for metric, row in data["tasks"][task]["metrics"].items():
                stderr = "–" if row["stderr"] is None else f"{row['stderr']:.4g}"
                print(f"| {_label(folder)} | {task} | {metric} | {row['value']:.6g} | {stderr} |", flush=True)
    return 0


def _label(folder: Path) -> str:
    return "/".join(Path(folder).parts[-3:])


def _targets(args) -> list[Path]:
    """The run folders to evaluate: the one given; or the completed runs (others listed) of an experiment's grid
    or of an experiment folder, the sources `ablate table` reads (a table file holds no weights)."""
    from ablate.evals.run import folder_runs_to_evaluate, runs_to_evaluate
    from ablate.experiment import named_experiment, results_of
    from ablate.store import iter_run_dirs

    target = Path(args.target)
    if target.suffix.lower() in (".csv", ".parquet"):
        raise AblateError(f"{args.target} is a table of scores, not weights to evaluate; give a run folder, an "
                          "experiment folder or an experiment's name")
    if target.is_dir() and next(iter_run_dirs(target), None) is None:  # no <tier>/<arm>/seed<k> inside: one run
        if args.tiers or args.arms or args.seeds or args.results:
            raise AblateError("--tier/--arms/--seeds/--results select runs of an EXPERIMENT, not of a run folder")
        return [target]
    experiment = None if target.is_dir() else named_experiment(args.target)
    if experiment is not None:
        from ablate.status import with_queued_seeds  # the library loads in the handler: see ablate.cli

        where = results_folder(args.results)
        experiment = with_queued_seeds(experiment, where)  # seeds a sequential design added
        folders, skipped = runs_to_evaluate(experiment, where, args.tiers, args.arms, args.seeds)
        name = experiment.name
    else:
        where = results_of(args.target, args.results)
        folders, skipped = folder_runs_to_evaluate(where, args.tiers, args.arms, args.seeds)
        name = where.name
    for line in skipped:
        print(f"skipped {line}")
    if not folders:
        raise AblateError(f"no completed run of {name!r} under {where} to evaluate")
    return folders
