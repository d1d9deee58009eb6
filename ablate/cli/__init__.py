"""The `ablate` command: one module per area under `ablate.cli`, each adding its subcommands.

This package is the only place with argparse and `print`. Building the parser imports no torch: each
handler imports the library it drives when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ablate import __version__
from ablate.errors import DISK_FULL, AblateError, disk_full

# Each module defines `add_commands(subparsers)`; its handlers take the parsed args and return an exit code.
COMMAND_MODULES = (
    "ablate.cli.arms",
    "ablate.cli.data",
    "ablate.cli.plan",
    "ablate.cli.run",
    "ablate.cli.submit",
    "ablate.cli.status",
    "ablate.cli.clean",
    "ablate.cli.analysis",
    "ablate.cli.probes",
    "ablate.cli.evals",
    "ablate.cli.testbed",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ablate", description="Matched ablations of attention mechanisms in small language models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"ablate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except AblateError as err:
        print(f"ablate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: a run checkpoints at its step boundary first (ablate.train.StopRequests)
        print("ablate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ablate status --json | head`: the reader left; that is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        if err.errno not in DISK_FULL:
            raise
        print(f"ablate: error: {disk_full(err.filename or 'a file', err)}", file=sys.stderr)  # a writer not wrapped
        return 2


if __name__ == "__main__":
    sys.exit(main())
