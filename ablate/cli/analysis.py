"""`ablate table` and `ablate report`. Import-light: polars, scipy and matplotlib load inside the handlers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ablate.analysis.kinds import KINDS  # import-light: names and words only (no polars)

FORMATS = ("md", "csv", "latex", "json")


def add_commands(subparsers) -> None:
    table = subparsers.add_parser(
        "table",
        help="tables of the runs: " + "; ".join(kind.help for kind in KINDS.values()).replace("%", "%%"),
        description="Paired-seed tables (paired differences with p and Holm-adjusted p, increments, 2×2 overlap) from "
                    "a run store or a CSV/parquet file with columns tier, arm, seed, "
        "val_loss. Positive numbers mean the arm (or quantity) lowers the validation loss.",
    )
    table.add_argument("source", metavar="SOURCE",
                       help="experiment name or experiments/*.py file (runs under --results), an experiment "
                            "folder, or a .csv/.parquet file")
    table.add_argument("--kind", choices=list(KINDS), default="paired", help="which table (default: paired)")
    table.add_argument("--reference", default=None,
                       help="reference arm of the paired table (default: baseline)")
    table.add_argument("--format", choices=FORMATS, default="md", help="output format (default: md)")
    table.add_argument("--results", default=None, help="results folder (default: $ABLATE_RESULTS, else the "
                                                       "checkout's results/)")
    table.add_argument("--out", default=None, metavar="FILE", help="write to FILE instead of printing")
    table.add_argument("--metric", default=None, metavar="TASK/METRIC",
                       help="a downstream metric of `ablate eval` instead of the loss (e.g. hellaswag/acc_norm); "
                            "positive still means the arm is better")
    table.add_argument("--by-item", action="store_true",
                       help="with --metric: pair by item within each seed (the items both runs answered, from "
                            "RUN/eval_items/), then over seeds; its interval is the wider of a seed × item "
                            "random-effects one (two-way ANOVA, Satterthwaite df) and the seed-level t interval; "
                            "METRIC may be gold_logprob")
    table.add_argument("--allow-unverified", action="store_true",
                       help="pair older runs that carry no fingerprints (the footer names them)")
    table.add_argument("--tuned", action="store_true",
                       help="each arm at its own best LR of the LR sweep (the confirmatory runs), beside the shared-LR "
                            "table, and whether the picked LRs changed each declared comparison: a paired "
                            "difference-in-differences t over the seeds, its p in the study's family (sign and "
                            "significance agreement shown as description)")
    table.add_argument("--ran", action="store_true",
                       help="with --kind declared: only the comparisons that ran here, then one line naming the "
                            "others and the command that runs them (they still count in Holm's m)")
    table.set_defaults(func=table_command)

    report = subparsers.add_parser(
        "report",
        help="write the tables, figures and a summary to <experiment>/report/",
        description="Write paired/increments/overlap/losses tables (md and csv), paired.png, "
                    "increments.png, curves.png, "
        "testbed_<tier>.png (for a task tier's runs, experiments/testbed.py) and summary.md into the experiment's "
        "report/ folder.",
    )
    report.add_argument("experiment", metavar="EXPERIMENT", help="experiment name, experiments/*.py file, or folder")
    report.add_argument("--results", default=None, help="results folder (default: $ABLATE_RESULTS, else the "
                                                        "checkout's results/)")
    report.add_argument("--allow-unverified", action="store_true",
                        help="pair older runs that carry no fingerprints (the tables' footers name them)")
    report.set_defaults(func=report_command)


def table_command(args: argparse.Namespace) -> int:
    """Check the options against the kind, resolve SOURCE once (its experiment, executed once, and the folder or
    file it names), then make the table: by item, the LR sweep's or the tuned one, or the kind's own."""
    from ablate.analysis.kinds import check_options, get_kind  # the library loads in the handler: see ablate.cli
    from ablate.errors import AblateError
    from ablate.experiment import named_experiment, results_of

    kind = get_kind(args.kind)
    check_options(kind, [option for option, given in (("--reference", args.reference), ("--metric", args.metric),
                                                      ("--tuned", args.tuned), ("--by-item", args.by_item)) if given])
    if args.tuned and args.metric:
        raise AblateError("--tuned compares the validation loss at each arm's own best LR: drop --metric")
    if args.by_item and args.metric is None:
        raise AblateError("--by-item pairs a downstream metric by item: give --metric TASK/METRIC "
                          "(e.g. hellaswag/acc_norm or hellaswag/gold_logprob)")
    from ablate.analysis.load import RunFolders

    experiment = named_experiment(args.source)  # its file is executed once, here
    folder = results_of(args.source, args.results, experiment)
    folder = RunFolders.of(folder) if folder.is_dir() else folder  # a folder: listed and each file read once
    if args.by_item:
        return _by_item(args, folder)
    if kind.sweep or args.tuned:
        return _lr_command(args, kind, experiment, folder)
    return _kind_command(args, kind, experiment, folder)


def _kind_command(args: argparse.Namespace, kind, experiment, folder) -> int:
    """The kind's own table of the runs in `folder` (the experiment's declared comparisons adjusting p)."""
    from ablate.analysis.load import load_runs  # the library loads in the handler: see ablate.cli
    from ablate.analysis.build import build_table
    from ablate.analysis.hypotheses import declared_for

    runs = checked_arm_code(load_runs(folder, allow_unverified=args.allow_unverified, metric=args.metric))
    table = build_table(runs, kind, args.reference, declared_for(experiment, folder))
    elsewhere = None
    if args.ran:
        table, elsewhere = _ran_only(table, kind, args)
    text = kind.render(table, args.format)
    if elsewhere and args.format == "md":
        text = f"{text.rstrip()}\n\n{elsewhere}\n"
    elif elsewhere:  # a machine-readable output stays that; the line goes beside it
        print(elsewhere, file=sys.stderr)
    if args.format in ("csv", "latex"):  # formats that cannot carry the warnings themselves
        from ablate.analysis.escape import one_line

        for warning in table.warnings:
            print(f"warning: {one_line(warning)}", file=sys.stderr)
    return _emit(args, text)


def arms_now() -> dict[str, str | None]:
    """Each registered arm's identity now (the built-ins and the experiment file's): what a table's runs must have
    trained (`ablate.analysis.armcode`)."""
    from ablate.arms import list_arms  # the library loads in the handler (the arms' classes: torch)
    from ablate.arms.source import registered_identity

    return {name: registered_identity(name) for name in list_arms()}


def checked_arm_code(runs):
    """`runs` checked against each arm's code now (a CSV/parquet source: noted as not checked, nothing imported)."""
    from ablate.analysis.armcode import check_arm_code  # the library loads in the handler: see ablate.cli

    return check_arm_code(runs, arms_now() if runs.root is not None else {})


def _ran_only(table, kind, args: argparse.Namespace):
    """The declared table's rows that ran (n > 0), without the notes on the skipped ones, and one line naming the
    rest and how to run them (None when every one ran)."""
    import dataclasses  # the library loads in the handler: see ablate.cli

    import polars as pl

    from ablate.analysis.kinds import names_where
    from ablate.errors import AblateError

    if not kind.needs_declared:
        raise AblateError(f"--ran applies to --kind {' or '.join(names_where('needs_declared'))} only, not "
                          f"{kind.name}")
    ran = table.frame.filter(pl.col("n") > 0)
    rest = table.frame.filter(pl.col("n") == 0)
    notes = tuple(note for note in table.notes if "skipped" not in note)
    if rest.is_empty():
        return dataclasses.replace(table, frame=ran, notes=notes), None
    names = ", ".join(dict.fromkeys(f"{r['comparison']} ({r['tier']})" for r in rest.iter_rows(named=True)))
    line = (f"The other {rest.height} declared comparison row{'s' if rest.height > 1 else ''} belong to the full "
            f"{table.name}, not run here: "
            f"{names}; `ablate submit {args.source} --executor local` runs them (the not-run rows count in Holm's m "
            "at p = 1 until then, so these decisions are not final).")
    return dataclasses.replace(table, frame=ran, notes=notes), line


def lr_settings(experiment) -> tuple[float, float]:
    """(margin, δ) of the experiment's LR sweep (`experiment`: the one SOURCE names, or None), else the defaults."""
    from ablate.analysis.lr import DELTA, MARGIN  # the library loads in the handler: see ablate.cli

    sweep = experiment.lr_sweep if experiment is not None else None
    return (sweep.margin, sweep.delta) if sweep is not None else (MARGIN, DELTA)


def _lr_command(args: argparse.Namespace, kind, experiment, folder) -> int:
    """The LR sweep's own table (`kind.sweep`), or a tunable kind's table at the shared and the tuned LRs
    (`--tuned`), with the margin and δ of the experiment's LRSweep; `folder` (a `RunFolders`) read once."""
    import json  # the library loads in the handler: see ablate.cli

    from ablate.analysis.lr import lr_table, render_lr
    from ablate.analysis.hypotheses import declared_for
    from ablate.analysis.tuned import TUNING_NOTE, tuned_tables, tuning_text

    sweep = experiment.lr_sweep if experiment is not None else None
    table = lr_table(folder, *lr_settings(experiment), sweep=sweep, allow_unverified=args.allow_unverified)
    if kind.sweep:
        return _emit(args, render_lr(table, args.format))
    shared, tuned, survived, key = tuned_tables(folder, table.best_factors(), kind, args.reference,
                                                declared_for(experiment, folder), args.allow_unverified)
    if args.format == "json":
        text = json.dumps({"shared": json.loads(kind.render(shared, "json")),
                           "tuned": json.loads(kind.render(tuned, "json")), "tuning": survived}, indent=2) + "\n"
    else:
        text = (f"shared LR (every arm at the tier's lr):\n\n{kind.render(shared, args.format)}\n"
                f"each arm at its own best LR (the confirmatory runs):\n\n{kind.render(tuned, args.format)}\n"
                f"{TUNING_NOTE}:\n{tuning_text(survived, key)}")
    return _emit(args, text)


def _by_item(args: argparse.Namespace, folder) -> int:
    """The paired table of a downstream metric by item (`--by-item --metric`)."""
    from ablate.analysis.items import items_table, render_items  # the library loads in the handler: see ablate.cli
    from ablate.analysis.load import load_runs

    runs = load_runs(folder, allow_unverified=args.allow_unverified)
    table = items_table(runs, args.metric, args.reference or "baseline")
    text = render_items(table, args.format)
    if args.format in ("csv", "latex"):
        from ablate.analysis.escape import one_line

        for warning in table.warnings:
            print(f"warning: {one_line(warning)}", file=sys.stderr)
    return _emit(args, text)


def _emit(args: argparse.Namespace, text: str) -> int:
    from ablate.store import atomic_write_bytes

    if args.out:
        atomic_write_bytes(args.out, text.encode())
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def report_command(args: argparse.Namespace) -> int:
    from ablate.analysis.hypotheses import declared_for
    from ablate.analysis.report import make_report  # the library loads in the handler: see ablate.cli
    from ablate.experiment import named_experiment, results_of

    experiment = named_experiment(args.experiment)  # its file is executed once, here
    source = results_of(args.experiment, args.results, experiment)
    report = make_report(source, allow_unverified=args.allow_unverified, declared=declared_for(experiment, source),
                         lr_sweep=experiment.lr_sweep if experiment is not None else None,
                         arm_code=arms_now() if Path(source).is_dir() else None)
    names = [path.name for path in report.written]
    texts = [n for n in names if n.endswith(".md")]
    others = [n for n in names if not n.endswith(".md")]
    print(f"report written to {report.out_dir}/: {', '.join(texts)}"
          + (f" (and {', '.join(others)})" if others else ""))
    if report.left_out:
        print("left out: " + "; ".join(f"{what} ({why})" for what, why in report.left_out.items()))
    return 0
