"""The suite's order: the longest test file first, then the files that mostly wait on SLURM, then the others
longest first; each file's tests together.

Why: `make test` runs two workers (`-n 2 --dist loadfile --no-loadscope-reorder`), and xdist hands each worker a
whole test file at a time in the order collected. Handing out the longest files first keeps a long file from
starting last and running alone while the other worker idles (greedy longest-first); keeping a file's tests
together keeps its module-scoped fixtures (a trained run, a gpu_check run) built once, not once per worker.
The files that wait on the test cluster (a requeue takes ~11 s, a job's start a few) leave their worker's core
idle; the longest file (the testbed's kernel-set test) trains in two processes of its own, so they go beside it,
where its second process uses the core they leave (measured idle time at the end of the suite before: ~55
core-seconds, most of it while a SLURM file waited beside a one-process file).

The durations are tests/durations.json (seconds per test file, from a whole-suite run); refresh it with
`pytest -n 2 --dist loadfile --no-loadscope-reorder --record-durations` after a change that moves them a lot.
A file it does not name counts as UNKNOWN_S.
"""

from __future__ import annotations

import json
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
UNKNOWN_S = 5.0  # a new file: somewhere in the middle, not first


def file_of(nodeid: str) -> str:
    """'tests/test_x.py::test_y[a]' → 'tests/test_x.py' (the unit xdist's loadfile hands a worker)."""
    return nodeid.split("::", 1)[0]


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file; {} when the file is missing (the collected order then stands)."""
    try:
        return {name: float(seconds) for name, seconds in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def longest_first(nodeids: list[str], durations: dict[str, float], waiting: frozenset[str] = frozenset()) -> list[int]:
    """The positions of `nodeids` in run order: the longest file, then the `waiting` files (those that mostly wait
    on SLURM), then the rest; within each, files by duration, longest first (ties: as collected), and within a
    file the collected order (pytest's, which groups parametrized module fixtures)."""
    first_seen: dict[str, int] = {}
    for position, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), position)
    longest = min(first_seen, key=lambda name: (-durations.get(name, UNKNOWN_S), first_seen[name]), default=None)

    def key(position: int) -> tuple[int, float, int, int]:
        name = file_of(nodeids[position])
        group = 0 if name == longest else 1 if name in waiting else 2
        return group, -durations.get(name, UNKNOWN_S), first_seen[name], position

    return sorted(range(len(nodeids)), key=key)


def file_totals(seconds_by_nodeid: dict[str, float]) -> dict[str, float]:
    """Per-test seconds (setup, call and teardown summed) → per-file seconds, rounded, longest first."""
    totals: dict[str, float] = {}
    for nodeid, seconds in seconds_by_nodeid.items():
        totals[file_of(nodeid)] = totals.get(file_of(nodeid), 0.0) + seconds
    return {name: round(s, 1) for name, s in sorted(totals.items(), key=lambda item: (-item[1], item[0]))}
