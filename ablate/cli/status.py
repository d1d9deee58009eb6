"""`ablate status`: one row per run of an experiment, and the counts per state."""

from __future__ import annotations

import json

from ablate.paths import results_folder


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser("status", help="one row per run of an experiment, and the counts per state")
    parser.add_argument("experiment", help="an experiments/*.py file or its name")
    parser.add_argument("--results", help="results folder (default: $ABLATE_RESULTS or ./results)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_status)


def _status(args) -> int:
    from ablate.experiment import experiment_file, load_experiment  # the library loads in the handler: see ablate.cli
    from ablate.status import STATES, status

    experiment = load_experiment(experiment_file(args.experiment))
    rows = status(experiment, results_folder(args.results))
    counts = {state: sum(r["state"] == state for r in rows) for state in STATES}
    if args.json:
        print(json.dumps({"experiment": experiment.name, "runs": rows, "counts": counts}, indent=2))
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
    again = f"`ablate submit {args.experiment}{f' --results {args.results}' if args.results else ''}`"
    if counts["failed"]:
        print(f"failed runs keep their traceback in RESULTS/{experiment.name}/<tier>/<arm>/seed<k>/run.log; "
              f"{again} resubmits them")
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
