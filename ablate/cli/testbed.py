"""`ablate testbed`: does my arm abstain? The testbed's grid for the baseline and one's own arm(s), here."""

from __future__ import annotations

from ablate.cli.arms import load_arm_file
from ablate.paths import results_folder

# Where `ablate testbed` puts its runs (the baselines it compares with included) unless --results says: a folder of its
# own under the results folder, so that an arm of one's own never joins the shared testbed's runs (results/testbed),
# which `make demo` and `ablate report testbed` read.
OWN_RESULTS = "testbed-arms"


def add_commands(subparsers) -> None:
    parser = subparsers.add_parser(
        "testbed", help="run the mechanism testbed (experiments/testbed.py) for the baseline and your arm(s) here",
        description="The testbed's default grid (its tier and seeds) for the baseline and each --arm, run on this "
                    "machine as `ablate submit testbed --arms baseline ARM --executor local` runs it; then the "
                    "declared table, the paired table and the testbed's seeds learned and signature per arm.")
    parser.add_argument("--arm", action="append", required=True, metavar="NAME",
                        help="an arm to run beside the baseline (repeat for more); a built-in, or one --arm-file "
                             "registers")
    parser.add_argument("--arm-file", metavar="FILE.py",
                        help="a Python file that registers your arm(s) (`@register_arm(\"my-arm\")`), loaded the "
                             "way an experiment file is: its folder is on the import path while it loads")
    parser.add_argument("--tier", action="append", metavar="TIER",
                        help="only this task tier of the testbed (repeat for more; default: all of its tiers)")
    parser.add_argument("--steps", type=int, metavar="N",
                        help="a smaller budget for a quick look (its runs go to testbed_stepsN, apart from the "
                             "default budget's)")
    parser.add_argument("--seed-count", type=int, metavar="K", help="the first K seeds only (default: the testbed's)")
    parser.add_argument("--parallel", type=int, help="runs at a time (default: CPU count)")
    parser.add_argument("--document-mask", action="store_true",
                        help="as `ablate submit --document-mask`; refused: the testbed's tiers are task tiers, whose "
                             "synthetic tokens have no <|endoftext|> to split documents at")
    parser.add_argument("--results", help=f"results folder (default: {OWN_RESULTS}/ in $ABLATE_RESULTS, else in the "
                                          "checkout's results/: a folder of its own, with the baselines it compares "
                                          "with, apart from the shared testbed's runs)")
    parser.set_defaults(func=testbed_command)


def _experiment(args):
    """(the testbed, the testbed with the baseline and the asked arms: a smaller budget or fewer seeds where
    asked, and the declared comparisons whose arms both run)."""
    import dataclasses  # the library loads in the handler: see ablate.cli

    from ablate.errors import AblateError
    from ablate.experiment import load_experiment

    testbed = load_experiment("testbed")
    arms = tuple(dict.fromkeys(("baseline", *args.arm)))
    tiers = tuple(dict.fromkeys(args.tier or testbed.tiers))
    unknown = [t for t in tiers if t not in testbed.tiers]
    if unknown:
        raise AblateError(f"--tier {unknown[0]!r} is not a tier of the testbed; valid tiers: "
                          f"{', '.join(testbed.tiers)}")
    changes = {"arms": arms, "tiers": tiers, "hypotheses": named_comparisons(testbed, arms, tiers)}
    for name, value in (("--steps", args.steps), ("--seed-count", args.seed_count), ("--parallel", args.parallel)):
        if value is not None and value < 1:
            raise AblateError(f"{name} {value}: give a positive whole number")
    if args.steps:
        changes |= {"name": f"testbed_steps{args.steps}", "overrides": {**testbed.overrides, "steps": args.steps,
                                                                        "val_interval": min(args.steps, 10)}}
    if args.seed_count:
        changes["seeds"] = args.seed_count
    return testbed, dataclasses.replace(testbed, **changes)


def named_comparisons(testbed, arms, tiers) -> tuple:
    """The testbed's declared comparisons whose two arms both run, at one of the tiers that run."""
    return tuple(h for h in testbed.hypotheses
                 if {h.minuend, h.subtrahend} <= set(arms) and any(h.at(tier) for tier in tiers))


def _other_budget(testbed, experiment) -> str | None:
    """Why a quick look's tables judge nothing (`--steps`): the predictions are declared at the testbed's own budget;
    None at that budget."""
    from ablate.config import resolve_config  # the library loads in the handler: see ablate.cli

    def budgets(grid) -> set[int]:
        return {resolve_config(s).steps for s in grid.runs() if s.arm == "baseline" and s.seed == 0}

    declared, looked = budgets(testbed), budgets(experiment)
    if looked == declared:
        return None
    return (f"a quick look at {', '.join(map(str, sorted(looked)))} steps: the testbed's predictions are declared at "
            f"its budget of {', '.join(map(str, sorted(declared)))} steps, so every row here is exploratory "
            "(unadjusted p, p_holm empty, never called supported)")


def testbed_command(args) -> int:
    from ablate.analysis.build import build_table  # the library loads in the handler: see ablate.cli
    from ablate.analysis.hypotheses import declared_for, exploratory_table
    from ablate.armcheck import refuse_unsound
    from ablate.analysis.kinds import KINDS
    from ablate.analysis.load import load_runs
    from ablate.analysis.testbed import task_runs, testbed_markdown
    from ablate.dispatch import Submission, preflight, submit
    from ablate.experiment import experiment_file
    from ablate.runconfig import RunOptions
    from ablate.tiers import get_tier

    file = load_arm_file(args.arm_file) if args.arm_file else experiment_file("testbed")
    testbed, experiment = _experiment(args)
    options = RunOptions(document_mask=True if args.document_mask else None)
    if args.document_mask:  # the option's own refusal (a task tier has no documents), before a word or a run
        specs = experiment.runs()
        preflight(experiment, specs, {t: get_tier(t) for t in dict.fromkeys(s.tier for s in specs)}, "local", options)
    refuse_unsound(args.arm, args.arm_file)  # a user's arm: causal and finite, before any run of the grid
    results = results_folder(args.results) if args.results else results_folder(None) / OWN_RESULTS
    print(f"runs in {results / experiment.name} (the baseline's too; the shared testbed's stay apart; "
          f"later: `ablate table testbed --results {results}`)")
    report = submit(experiment, str(file), Submission(results=results, executor="local", parallel=args.parallel,
                                                      options=options, declaration=testbed))  # its whole design
    failed = [k for k, code in (report.get("jobs") or {}).items() if code != 0]
    runs = load_runs(results / experiment.name)
    # The testbed's own declarations and family (m is the design's, whatever ran), as `ablate table testbed` reads
    # them: the design recorded at the folder's first submit, which the testbed must still declare.
    declared = declared_for(testbed, results / experiment.name)
    unnamed = [arm for arm in args.arm if arm != "baseline" and not any(
        arm in (h.minuend, h.subtrahend) for h in experiment.hypotheses)]
    if unnamed:
        print(f"no declared comparison of the testbed names {', '.join(unnamed)} at tier(s) "
              f"{', '.join(experiment.tiers)}: its rows in the paired table below are exploratory (unadjusted p, "
              "never called supported)")
    budget = _other_budget(testbed, experiment)
    for kind in (KINDS["declared"], KINDS["paired"]):
        if kind.needs_declared and not experiment.hypotheses:
            continue
        table = build_table(runs, kind, None, declared)
        print(kind.render(exploratory_table(table, budget) if budget else table, "md"))
    for tier, by_arm in task_runs(runs).items():
        print(testbed_markdown(tier, by_arm) + "\n")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}")
        _why(failed, experiment, results)
    return 1 if failed else 0


def _why(failed: list[str], experiment, results) -> None:
    """Each failed run's one-line error (a user's arm: the arm, the slot or hook, expected against got)."""
    from ablate.status import status  # the library loads in the handler: see ablate.cli
    from ablate.store import run_key

    for row in status(experiment, results, [s for s in experiment.runs() if s.key in failed]):
        print(f"  {run_key(row.tier, row.arm, row.seed)}: {row.error or 'see `ablate status`'}")
