"""The files four small runs leave, for comparing a refactor's runs with those before it, key by key.

A smoke corpus run, an LR sweep's run (a corpus run at 2 × the tier's lr, with its selection split), and two task
runs (abstain-stream, filter-norm). Each gives its config.json, summary.json and (a task run) eval.json.

Two uses:
* `tests/test_typed_reads.py` holds the key sets and every value that no machine changes against
  tests/run_artefacts.json (`python tests/run_artefacts.py --record` writes it again, on purpose only);
* `python tests/run_artefacts.py --dump FILE` writes everything, floats and weights hashes included, so that two
  trees on one machine (one kernel set) can be compared byte for byte (`--compare A B`).

Left out of every comparison (the key stays, its value does not), as they differ between two runs of the same
code: the clocks (`started`,
`finished`, `wall_seconds`, eval.json's `evaluated_at`), the commit (`git_commit`) and the stack's versions
(`versions`, `numerics_history`: the machine and its libraries). The data folder's path is written as <data>.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "run_artefacts.json"
CLOCKS = ("started", "finished", "wall_seconds", "evaluated_at", "git_commit", "versions", "numerics_history")
# Values that depend on the arithmetic (the CPU's kernel set) or on the arms' source files: held by key and type in
# the golden file, compared exactly only between two trees on one machine (`--compare`).
# eval.json's metric `value`s are a task run's signature and accuracies: arithmetic too (two Intel CPUs, both AVX-512,
# give the signature's masses and norms apart in their ninth digit).
ARITHMETIC = ("val_loss", "selection_loss", "val_loss_auc", "val_accuracy", "absent_accuracy", "signature",
              "init_fingerprint", "init_fingerprint_common", "weights_sha256", "arm_source", "arm_sources",
              "value")
STEPS = {"smoke": 4, "lr-sweep": 4, "abstain-stream": 12, "filter-norm": 12}


def make_runs(results: Path, data: Path) -> dict[str, dict]:
    """Train the four runs into `results`; {name: {"config", "summary", "eval"}} as read back from their folders."""
    from ablate.experiment import Experiment, LRSweep, RunSpec
    from ablate.train import run

    sweep = Experiment(name="lrx", tiers=("smoke",), arms=("baseline",), seeds=1,
                       lr_sweep=LRSweep(factors=(2,), tiers=("smoke",), seeds=1)).sweep_runs()[0]
    specs = {"smoke": RunSpec("golden", "smoke", "baseline", 0, {"max_steps": STEPS["smoke"]}),
             "lr-sweep": RunSpec(sweep.experiment, sweep.tier, sweep.arm, sweep.seed,
                                 {**sweep.overrides, "max_steps": STEPS["lr-sweep"]}, sweep.lr_factor),
             "abstain-stream": RunSpec("golden", "abstain-stream", "sink-logit", 1,
                                       {"max_steps": STEPS["abstain-stream"]}),
             "filter-norm": RunSpec("golden", "filter-norm", "baseline", 0, {"max_steps": STEPS["filter-norm"]})}
    found = {}
    for name, spec in specs.items():
        corpus = spec.tier in ("smoke",)
        run(spec, results, data_dir=str(data) if corpus else None, progress=False, threads=1)
        folder = spec.folder(results)
        found[name] = {part: _read(folder / f"{part}.json") for part in ("config", "summary", "eval")}
    return json.loads(json.dumps(found).replace(str(data.resolve()), "<data>"))


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def without_clocks(value):
    """The files with the values of the clock, commit and stack keys left out, at any depth (the keys stay)."""
    if isinstance(value, dict):
        return {k: "<clock>" if k in CLOCKS else without_clocks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


def portable(value):
    """What every machine writes alike: the arithmetic's values replaced by their type's name."""
    if isinstance(value, dict):
        return {k: (type(v).__name__ if k in ARITHMETIC else portable(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    if argv[:1] == ["--compare"]:
        before, after = (without_clocks(json.loads(Path(p).read_text())) for p in argv[1:3])
        differences = [(name, part, key) for name in before for part in before[name]
                       for key in sorted(set(before[name][part] or {}) | set(after[name][part] or {}))
                       if (before[name][part] or {}).get(key, "<absent>") != (after[name][part] or {}).get(key,
                                                                                                          "<absent>")]
        print("identical but for the clocks" if before == after else f"differences: {differences}")
        return 0 if before == after else 1
    from datafix import prepared_sample

    with tempfile.TemporaryDirectory() as tmp:
        runs = make_runs(Path(tmp) / "results", prepared_sample(Path(tmp)))
    if argv[:1] == ["--dump"]:
        Path(argv[1]).write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    elif argv[:1] == ["--record"]:
        GOLDEN.write_text(json.dumps(portable(without_clocks(runs)), indent=1, sort_keys=True) + "\n")
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(sys.argv[1:]))
