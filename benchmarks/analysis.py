"""Time `ablate table` and `ablate report` on a store the size of the study.

Grid: nine arms × four tiers × three seeds = 108 runs, each with a metrics.jsonl of 1,000 validation
points interleaved with 1,000 training lines (fake but realistically shaped numbers). The target is
a report in under 2 seconds.

    .venv/bin/python benchmarks/analysis.py [--repeat 3] [--keep DIR]

Prints the in-process time of loading, each table and the whole report (imports already done), and
the wall time of the `ablate report` command in a fresh process (imports included).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from analysis_fixtures import NINE_ARMS, TIERS, write_run  # noqa: E402

SEEDS = 3
POINTS = 1000


def build_store(results: Path, experiment: str = "bench") -> Path:
    """Final losses: a tier level, a seed offset shared by the arms of a seed, a per-arm effect and noise."""
    rng = np.random.default_rng(0)
    level = dict(zip(TIERS, (4.21, 3.55, 3.38, 3.04)))
    effect = dict(zip(NINE_ARMS, (0.0, 0.012, 0.011, 0.002, 0.004, 0.006, -0.001, 0.014, 0.017)))
    for tier in TIERS:
        for seed in range(SEEDS):
            offset = rng.normal(0, 0.004)
            for arm in NINE_ARMS:
                loss = level[tier] + offset - effect[arm] + rng.normal(0, 0.0008)
                write_run(results, experiment, tier, arm, seed, float(loss), curve_points=POINTS, train_every=1)
    return results / experiment


def timed(fn, repeat: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is reported")
    parser.add_argument("--keep", default=None, help="build the store in DIR and keep it")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        results = Path(args.keep or tmp)
        start = time.perf_counter()
        folder = build_store(results)
        print(f"store: {folder} (108 runs × {POINTS} validation points), built in {time.perf_counter() - start:.1f} s")

        start = time.perf_counter()
        from ablate.analysis.load import load_runs  # timed: the import cost is part of the figure
        from ablate.analysis.report import write_report
        from ablate.analysis.build import build_table

        print(f"import ablate.analysis: {time.perf_counter() - start:.2f} s")
        load_s, runs = timed(lambda: load_runs(folder), args.repeat)
        print(f"load_runs:           {load_s:.3f} s")
        for kind in ("paired", "increments", "overlap"):
            seconds, _ = timed(lambda: build_table(runs, kind), args.repeat)
            print(f"table {kind:<12}   {seconds:.3f} s")
        report_s, out = timed(lambda: write_report(folder), args.repeat)
        print(f"write_report:        {report_s:.3f} s   (in process, best of {args.repeat}) -> {out}")

        command = [sys.executable, "-c", "import sys; from ablate.cli import main; sys.exit(main(sys.argv[1:]))"]
        cli_s, _ = timed(lambda: subprocess.run(command + ["report", str(folder)], cwd=REPO, check=True,
                                                capture_output=True), args.repeat)
        table_s, _ = timed(lambda: subprocess.run(command + ["table", str(folder), "--kind", "increments"], cwd=REPO,
                                                  check=True, capture_output=True), args.repeat)
        print(f"`ablate report`:     {cli_s:.3f} s   (fresh process, imports included)")
        print(f"`ablate table`:      {table_s:.3f} s   (fresh process, imports included)")
        verdict = "meets" if report_s < 2.0 else "MISSES"
        print(f"report {verdict} the 2 s target in process ({report_s:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
