"""The `ablate` command: one module per area under `ablate.cli`, each adding its subcommands.

This package is the only place with argparse and `print`. Building the parser imports no torch: each
handler imports the library it drives when it runs.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
import sysconfig

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
    "ablate.cli.generate",
    "ablate.cli.evals",
    "ablate.cli.testbed",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ablate", description="Matched ablations of attention mechanisms in small language models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--traceback", action="store_true",
                        help="on an unexpected error, the full Python traceback (by default: one line, where it arose)")
    parser.add_argument("--version", action="version", version=f"ablate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # one line, with the option meant (argparse's own error is its usage text and no suggestion)
        print(f"ablate: error: {unrecognized(parser, args, extras)}", file=sys.stderr)
        return 2
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
            return unexpected(err, args)
        print(f"ablate: error: {disk_full(err.filename or 'a file', err)}", file=sys.stderr)  # a writer not wrapped
        return 2
    except Exception as err:  # a user's arm, or a bug: one line where it arose; the traceback one flag away
        return unexpected(err, args)


def unexpected(err: Exception, args: argparse.Namespace) -> int:
    """An error no AblateError foresaw: `--traceback` raises it (Python prints the traceback); otherwise one line,
    `Type: message (at FILE:LINE)`, and where the traceback is."""
    if args.traceback:
        raise err
    import traceback  # reason: only a failing command needs it

    library = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(library)]
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""  # the innermost frame of ours or yours
    notes = "; ".join(getattr(err, "__notes__", ()))
    first = (str(err).strip().splitlines() or [""])[0]
    print(f"ablate: error: {type(err).__name__}: {first}{at}; {notes + '; ' if notes else ''}the full traceback: "
          f"`ablate --traceback {args.command or ''} …`", file=sys.stderr)
    return 1


def unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> str:
    """argparse's `unrecognized arguments`, with the closest option of the command for each mistyped one."""
    commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    command = commands.get(getattr(args, "command", None) or "", parser)
    valid = sorted({s for a in command._actions for s in a.option_strings if s.startswith("--")})
    guesses = []
    for given in (e.split("=", 1)[0] for e in extras if e.startswith("-")):
        close = difflib.get_close_matches(given, valid, n=1, cutoff=0.6)
        guesses.append(f"{given}: did you mean {close[0]}?" if close else
                       f"{given}: not an option of `ablate{' ' + args.command if args.command else ''}`")
    text = f"unrecognized arguments: {' '.join(extras)}"
    return text + ("; " + "; ".join(guesses) if guesses else "") + (
        f" (its options: `ablate {args.command} -h`)" if args.command else "")


if __name__ == "__main__":
    sys.exit(main())
