"""`ablate probe` and `ablate inject`. Heavy imports happen inside the handlers."""

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
    lines = [probe["evidence"], ""] if probe.get("evidence") else []
    lines += [f"{probe['arm']}: {shown}", "", "| layer | first-key mass per head | max abs residual |",
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
