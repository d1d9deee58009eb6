"""`ablate probe`, `ablate inject` and `ablate synthetic`. Heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse

from ablate.errors import AblateError


def add_commands(subparsers) -> None:
    probe = subparsers.add_parser("probe", help="sink diagnostics of a trained run (probe.json + heatmap)")
    probe.add_argument("run_dir", metavar="RUN_DIR", help="a run folder RESULTS/<experiment>/<tier>/<arm>/seed<k>")
    _batch_options(probe)
    probe.set_defaults(func=probe_command)

    inject = subparsers.add_parser("inject", help="junk injection into quiet reads: loss increase over clean")
    inject.add_argument("run_dir", metavar="RUN_DIR", help="a run folder RESULTS/<experiment>/<tier>/<arm>/seed<k>")
    inject.add_argument("--cutoff", default="p25",
                        help="quiet reads: below the head's median or p25 norm (default p25)")
    inject.add_argument("--eps", nargs="+", default=["0.2", "0.4", "0.8", "1.6"], metavar="EPS",
                        help="doses ε, space-separated (default 0.2 0.4 0.8 1.6)")
    inject.add_argument("--junk", nargs="+", default=["structural", "gaussian", "random", "gate-direction"],
                        metavar="KIND", help="junk kinds, space-separated (default: all four)")
    inject.add_argument("--seed", type=int, default=0, help="seed of the junk draws (default 0)")
    _batch_options(inject)
    inject.set_defaults(func=inject_command)

    synthetic = subparsers.add_parser(
        "synthetic", help="train tiny models on the synthetic abstention task and probe them (a CPU demo)")
    synthetic.add_argument("--arms", nargs="+", default=["baseline", "sink-logit"], metavar="ARM",
                           help="arms, space-separated (default baseline sink-logit)")
    synthetic.add_argument("--seeds", nargs="+", default=["0"], metavar="K", help="seeds, space-separated (default 0)")
    synthetic.add_argument("--steps", type=int, default=None, help="training steps (default 600: neither arm "
                                                                   "saturates, about 25 s each on one CPU core)")
    synthetic.add_argument("--answer-noise", type=float, default=None,
                           help="share of stored-key answers drawn at random, a loss floor so the task cannot "
                                "saturate (default 0: with 0.1 the mechanism reverses, see ablate/probes/synthetic.py)")
    synthetic.add_argument("--out", default=None,
                           help="experiment folder: write OUT/synthetic/synthetic.json (drawn by `ablate report` "
                                "as synthetic.png) and run folders OUT/synthetic/runs/<arm>/seed<k>/ that "
                                "`ablate probe` and `ablate inject` read")
    synthetic.set_defaults(func=synthetic_command)


def _batch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batches", type=int, default=8, help="fixed validation batches (default 8)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")


def _listed(values: list[str], what: str) -> list[str]:
    """The values of a list option, given space-separated (`--eps 0.2 0.4`) or, as before, comma-separated
    (`--eps 0.2,0.4`)."""
    items = [item.strip() for value in values for item in value.split(",") if item.strip()]
    if not items:
        raise AblateError(f"--{what} is empty")
    return items


def _numbers(values: list[str], what: str, kind=float) -> list:
    try:
        return [kind(item) for item in _listed(values, what)]
    except ValueError as err:
        noun = "numbers" if kind is float else "integers"
        raise AblateError(f"--{what} {' '.join(values)!r} is not a list of {noun} (e.g. --{what} 0 1)") from err


def probe_command(args) -> int:
    from ablate.probes.diagnostics import HEATMAP_FILE, PROBE_FILE, probe_run
    from ablate.modelio import default_device

    probe = probe_run(args.run_dir, n_batches=args.batches, batch_size=args.batch_size,
                      device=args.device or default_device(), progress=True)
    print(format_probe(probe))
    print(f"\nwrote {args.run_dir}/{PROBE_FILE} and {args.run_dir}/{HEATMAP_FILE}")
    return 0


def format_probe(probe: dict) -> str:
    """Markdown: the summary line, then one row per layer with its per-head first-key mass."""
    summary = probe["summary"]
    shown = ", ".join(f"{key} {value:.4g}" for key, value in summary.items() if value is not None)
    lines = [f"{probe['arm']}: {shown}", "", "| layer | first-key mass per head | max abs residual |",
             "|---:|---|---:|"]
    for layer in probe["layers"]:
        masses = " ".join(f"{m:.3f}" for m in layer["first_key_mass"])
        lines.append(f"| {layer['layer']} | {masses} | {layer['max_abs_residual']:.3g} |")
    return "\n".join(lines)


def inject_command(args) -> int:
    from ablate.probes.injection import INJECT_FILE, Sweep, inject_run, injection_table
    from ablate.modelio import default_device

    sweep = Sweep(args.cutoff, tuple(_numbers(args.eps, "eps")), tuple(_listed(args.junk, "junk")), args.seed)
    result = inject_run(args.run_dir, sweep, n_batches=args.batches, batch_size=args.batch_size,
                        device=args.device or default_device(), progress=True)
    print(injection_table(result))
    print(f"\nwrote {args.run_dir}/{INJECT_FILE}")
    return 0


def synthetic_command(args) -> int:
    from ablate.arms import list_arms
    from ablate.errors import choice_error

    arms = _listed(args.arms, "arms")
    for arm in arms:
        if arm not in list_arms():
            raise choice_error("arm", arm, list_arms())
    seeds = _numbers(args.seeds, "seeds", int)
    from ablate.probes.synthetic import DEMO_ANSWER_NOISE, SyntheticTask, run_synthetic

    noise = DEMO_ANSWER_NOISE if args.answer_noise is None else args.answer_noise
    try:
        task = SyntheticTask(answer_noise=noise)
    except ValueError as err:
        raise AblateError(f"--answer-noise {noise}: {err}") from err
    results = run_synthetic(arms, seeds, steps=args.steps, out=args.out, task=task)
    print(f"loss floor {results['floor']['loss']:.4f}, accuracy ceiling {results['floor']['accuracy']:.1%}")
    print("| arm | seed | val loss | accuracy | NONE accuracy | absent key: first key | absent key: phantom |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run in results["runs"]:
        absent = run["attention"]["absent"]
        phantom = "–" if absent["phantom"] is None else f"{absent['phantom']:.1%}"
        print(f"| {run['arm']} | {run['seed']} | {run['val_loss']:.4f} | {run['val_accuracy']:.1%} "
              f"| {run['absent_accuracy']:.1%} | {absent['first_key']:.1%} | {phantom} |")
    if args.out:
        print(f"\nwrote {args.out}/synthetic/synthetic.json and run folders under {args.out}/synthetic/runs/")
    return 0
