"""The testbed's whole default grid under two CPU kernel sets: its wall time, its seeds learned, its decisions.

    python benchmarks/testbed_kernels.py --results /tmp/tbk [--kernels native avx2] [--parallel 2] [--tier T ...]
                                         [--arms A ...] [--experiment testbed_dose | FILE.py]

For each kernel set in turn (`ATEN_CPU_CAPABILITY`; native: unset, the machine's own) runs
`ablate submit testbed --executor local` into RESULTS/<kernels>, one grid after the other so that each has the
machine to itself, and prints its wall time, the kernel set its runs recorded, per tier and arm the seeds that
learned (answer accuracy at the budget ≥ the report's criterion), every declared prediction's Δ, p_holm and
decision, and at the end whether the decisions are the same under every kernel set. A folder that already
holds a grid is reused as it is (submit never trains a finished run twice): give a fresh RESULTS to time one.
Exit status 1 when the decisions differ. `--tier` and `--arms` run a part of the grid, and an experiment file a
testbed of one's own (tests/test_testbed.py runs two arms and two seeds this way under two kernel sets; the whole
grid is this script's, docs/method.md "Numerics").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def _grid(kernels: str, results: Path, parallel: int, tiers: list[str], experiment: str = "testbed",
          arms: list[str] = ()) -> float:
    """`ablate submit EXPERIMENT --executor local` under the kernel set `kernels` (native: the machine's own) into
    `results`; its wall time in seconds."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernels.lower() != "native":
        env["ATEN_CPU_CAPABILITY"] = kernels.lower()
    command = [sys.executable, "-m", "ablate.cli", "submit", experiment, "--executor", "local", "--parallel",
               str(parallel), "--results", str(results)] + (["--tier", *tiers] if tiers else []) + (
                   ["--arms", *arms] if arms else [])
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _name(experiment: str) -> str:
    """The results subfolder of an experiment given by name or file."""
    from ablate.experiment import load_experiment

    return load_experiment(experiment).name


def _read(folder: Path, experiment: str = "testbed") -> tuple[set[str], dict[tuple[str, str], str], list[dict]]:
    """(the kernel sets the runs recorded, seeds learned per (tier, arm), the declared table's rows with their
    decision), of the runs the tables count in `folder` (RESULTS/<kernels>/<experiment's name>)."""
    from ablate.analysis.hypotheses import Declared, declared_table, fixed_decision
    from ablate.analysis.load import load_runs
    from ablate.analysis.testbed import LEARNED_ACCURACY, task_runs
    from ablate.experiment import load_experiment

    runs = load_runs(folder)
    by_tier = task_runs(runs)
    summaries = [s for by_arm in by_tier.values() for arm_runs in by_arm.values() for s in arm_runs]
    kernels = {s.versions["numerics"]["cpu_capability"] for s in summaries}  # typed summaries (`RunSummary`)
    counts = {(tier, arm): f"{sum(s.val_accuracy >= LEARNED_ACCURACY for s in arm_runs)}/{len(arm_runs)}"
              for tier, by_arm in by_tier.items() for arm, arm_runs in by_arm.items()}
    table = declared_table(runs, Declared.of(load_experiment(experiment).hypotheses))
    rows = [{**row, "decision": fixed_decision(row)} for row in table.frame.iter_rows(named=True)]
    return kernels, counts, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="a folder for the grids, one subfolder per kernel set")
    parser.add_argument("--kernels", nargs="+", default=["native", "avx2"], help="ATEN_CPU_CAPABILITY values")
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tier", nargs="+", default=[], help="these of the testbed's tiers only (default: all)")
    parser.add_argument("--arms", nargs="+", default=[], help="these of the testbed's arms only (default: all)")
    parser.add_argument("--experiment", default="testbed", help="testbed, the graded testbed_dose, or a file")
    args = parser.parse_args()
    decisions = {}
    for kernels in args.kernels:
        folder = Path(args.results) / kernels
        load = os.getloadavg()[0]
        wall = _grid(kernels, folder, args.parallel, args.tier, args.experiment, args.arms)
        recorded, counts, rows = _read(folder / _name(args.experiment), args.experiment)
        print(f"{kernels}: wall {wall / 60:.1f} min (--parallel {args.parallel}; load average {load:.1f} at the "
              f"start, {os.getloadavg()[0]:.1f} at the end); runs recorded kernels "
              f"{', '.join(sorted(recorded))}")
        for (tier, arm), count in sorted(counts.items()):
            print(f"  learned {tier:17s} {arm:11s} {count}")
        for row in rows:
            print(f"  {row['tier']:17s} {row['comparison']:32s} Δ {row['mean']:+.2e}  p_holm "
                  f"{row['p_holm'] if row['p_holm'] is None else format(row['p_holm'], '.3g')}  {row['decision']}")
        decisions[kernels] = {(r["tier"], r["comparison"]): r["decision"] for r in rows}
    same = len({tuple(sorted(d.items())) for d in decisions.values()}) == 1
    print("decisions the same under every kernel set" if same else "DECISIONS DIFFER between kernel sets")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
