"""The testbeds' figures in the docs, from a recorded artefact of their grids (tests/testbed_figures.json).

Why: a figure pasted into docs/method.md or docs/testbed.md goes stale when the code changes and nobody reruns
the grid (the abstain-stream table quoted +0.0931 ± 0.0226 where the code gave +0.0924 ± 0.0214). So the docs'
testbed tables are rendered here, by the project's own table code, from the per-run numbers of one whole grid per
kernel set, and `tests/test_testbed_figures.py` holds them equal: the docs to this rendering (fast), and the
artefact to the current code (the kernel-set tests replay runs of it bit for bit on the machine kind it names).

    .venv/bin/python tests/testbed_figures.py --record testbed DIR/native/testbed DIR/avx2/testbed
    .venv/bin/python tests/testbed_figures.py --write-docs       # re-render every block in the docs

`--record` replaces the experiment's entries with the grids given (one per kernel set, e.g. the folders
`benchmarks/testbed_kernels.py` fills): do it when a change is meant to change the numbers, and say so in the
commit. A block in a docs page is `<!-- figures: EXPERIMENT KIND [TIER ...] -->` … `<!-- /figures -->`.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # kernel_replay, when run as a script

from kernel_replay import machine_kind  # noqa: E402

ARTEFACT = REPO / "tests" / "testbed_figures.json"
DOCS = (REPO / "docs" / "method.md", REPO / "docs" / "testbed.md")
BLOCK = re.compile(r"<!-- figures: ([^>]*?) -->\n(.*?)<!-- /figures -->", re.S)
# Per tier's task: the signature quantities an arms table shows beside the loss
SIGNATURE_KEYS = {"abstain": ("phantom_absent", "phantom_present", "first_key_absent"),
                  "filter": ("gate_junk", "gate_clean", "junk_weight")}


def artefact() -> dict:
    return json.loads(ARTEFACT.read_text())


def record(experiment: str, folders: list[Path]) -> None:
    """Replace `experiment`'s entries with the grids in `folders` (each an experiment folder of runs, one kernel
    set each): per run its loss, accuracy and signature, the kernel set and machine kind that computed them."""
    from ablate.store_summary import read_summary

    data = artefact() if ARTEFACT.exists() else {}
    data[experiment] = {}
    for folder in folders:
        rows, kernels = [], set()
        for path in sorted(folder.glob("*/*/seed*/summary.json")):
            summary = json.loads(path.read_text())
            if summary.get("status") != "completed":
                continue
            kernels.add(summary["versions"]["numerics"]["cpu_capability"])
            signature = read_summary(path.parent).signature or {}
            rows.append({"tier": summary["tier"], "arm": summary["arm"], "seed": summary["seed"],
                         "val_loss": summary["val_loss"], "val_accuracy": summary["val_accuracy"],
                         "signature": {k: v for k, v in signature.items() if v is not None}})
        if len(kernels) != 1:
            raise SystemExit(f"{folder}: runs of kernel sets {sorted(kernels)}; one grid per kernel set")
        data[experiment][kernels.pop()] = {"machine": machine_kind(), "runs": rows}
    ARTEFACT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def recorded_loss(experiment: str, kernel_set: str, tier: str, arm: str, seed: int = 0) -> float | None:
    """The recorded val_loss of one run under `kernel_set` ("AVX2"), or None where the record holds no grid of that
    kernel set on this machine kind (there the kernel-set tests bound the numbers instead)."""
    entry = artefact()[experiment].get(kernel_set)
    if entry is None or entry["machine"] != machine_kind():
        return None
    return {(r["tier"], r["arm"], r["seed"]): r["val_loss"] for r in entry["runs"]}.get((tier, arm, seed))


def kernel_sets(experiment: str) -> list[str]:
    """The kernel sets recorded for `experiment`, the widest first (AVX512, AVX2, DEFAULT)."""
    order = {"AVX512": 0, "AVX2": 1, "DEFAULT": 2}
    return sorted(artefact()[experiment], key=lambda k: order.get(k, 3))


def declared_rows(experiment: str, kernel_set: str) -> list[dict]:
    """The declared table's rows of the recorded grid, as `ablate table EXPERIMENT --kind declared` computes them,
    each with its decision."""
    from ablate.analysis.hypotheses import Declared, declared_table, fixed_decision
    from ablate.analysis.load import load_runs
    from ablate.experiment import load_experiment

    runs = artefact()[experiment][kernel_set]["runs"]
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / f"{experiment}.csv"
        csv.write_text("tier,arm,seed,val_loss\n" + "".join(
            f"{r['tier']},{r['arm']},{r['seed']},{r['val_loss']!r}\n" for r in runs))
        table = declared_table(load_runs(csv), Declared.of(load_experiment(experiment).hypotheses))
    return [{**row, "decision": fixed_decision(row)} for row in table.frame.iter_rows(named=True) if row["n"]]


def _p(value: float | None) -> str:
    return "–" if value is None else "< 1e-4" if value < 1e-4 else f"{value:.3g}"


def render_declared(experiment: str, tiers: list[str]) -> str:
    """Per declared comparison at `tiers`: Δ mean ± sd over seeds, seeds agreeing, p_holm and decision, under each
    recorded kernel set."""
    sets = kernel_sets(experiment)
    by_set = {k: {(r["tier"], r["comparison"]): r for r in declared_rows(experiment, k)} for k in sets}
    names = " / ".join(sets)
    lines = [f"| tier | comparison | Δ (nats), mean ± sd over seeds, {names} | seeds agreeing | p_holm | "
             f"decision, {names} |", "|---|---|---|---|---|---|"]
    for key, row in by_set[sets[0]].items():
        if tiers and key[0] not in tiers:
            continue
        rows = [by_set[k].get(key) for k in sets]
        cells = [key[0], f"{key[1]} ({row['minuend']} − {row['subtrahend']})",
                 " / ".join(f"{r['mean']:+.4f} ± {r['sd']:.4f}" for r in rows),
                 " / ".join(f"{r['agree']}/{r['n']}" for r in rows), " / ".join(_p(r["p_holm"]) for r in rows),
                 " / ".join(r["decision"] for r in rows)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3g} ± {sd:.2g}"


def render_arms(experiment: str, tiers: list[str]) -> str:
    """Per tier and arm, under the widest kernel set recorded: seeds, val_loss and the task's signature quantities,
    mean ± sd over seeds."""
    from ablate.analysis.testbed import LEARNED_ACCURACY
    from ablate.taskrun import task_name
    from ablate.data.filter import task_from_fields
    from ablate.tiers import TASKS, TIERS

    kernel_set = kernel_sets(experiment)[0]
    runs = artefact()[experiment][kernel_set]["runs"]
    lines, shown = [], None
    for tier in tiers:
        keys = SIGNATURE_KEYS[task_name(task_from_fields(TASKS[TIERS[tier].task]))]
        if keys != shown:  # a table per task kind: its own signature columns
            lines += ([""] if lines else []) + [
                f"| tier | arm | seeds learned | val_loss ({kernel_set}) | " + " | ".join(keys) + " |",
                "|---|---|---|---|" + "---|" * len(keys)]
            shown = keys
        arms = dict.fromkeys(r["arm"] for r in runs if r["tier"] == tier)
        for arm in arms:
            mine = [r for r in runs if r["tier"] == tier and r["arm"] == arm]
            learned = sum(r["val_accuracy"] >= LEARNED_ACCURACY for r in mine)
            cells = [tier, arm, f"{learned}/{len(mine)}", _mean_sd([r["val_loss"] for r in mine])]
            cells += [_mean_sd(values) if (values := [r["signature"][k] for r in mine if k in r["signature"]])
                      else "–" for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


RENDER = {"declared": render_declared, "arms": render_arms}


def render(spec: str) -> str:
    """A block's contents from its spec, "EXPERIMENT KIND [TIER ...]"."""
    experiment, kind, *tiers = spec.split()
    if kind == "dose":
        from ablate.analysis.testbed import dose_response_markdown

        return dose_response_markdown(_summaries(experiment, kernel_sets(experiment)[0]), tiers) + "\n"
    return RENDER[kind](experiment, tiers)


def _summaries(experiment: str, kernel_set: str) -> dict:
    """{tier: {arm: [(val_loss, val_accuracy), …]}} of the recorded grid."""
    out: dict = {}
    for r in artefact()[experiment][kernel_set]["runs"]:
        out.setdefault(r["tier"], {}).setdefault(r["arm"], []).append(r["val_loss"])
    return out


def blocks(text: str) -> list[tuple[str, str]]:
    """(spec, contents as written) of every figures block of a docs page."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def write_docs() -> None:
    """Re-render every block of an experiment the record holds (a block of one it does not hold is left as it is)."""
    recorded = set(artefact())

    def block(m) -> str:
        if m.group(1).split()[0] not in recorded:
            return m.group(0)
        return f"<!-- figures: {m.group(1)} -->\n{render(m.group(1))}<!-- /figures -->"

    for page in DOCS:
        page.write_text(BLOCK.sub(block, page.read_text()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--record"]:
        record(sys.argv[2], [Path(p) for p in sys.argv[3:]])
    elif sys.argv[1:] == ["--write-docs"]:
        write_docs()
    else:
        raise SystemExit(__doc__)
