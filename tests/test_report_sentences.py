"""The report's sentences never print an empty list or a wrong count: over the summary.md of the demo's grid (one
pipeline-check tier, every study arm) and of the testbed part `make demo` runs (one tier, baseline and sink-logit,
one declared comparison)."""

import re

import pytest

from ablate.arms.names import BUILTIN_ARMS
from tests.analysis_fixtures import write_run
from tests.datafix import ablate_cli

pytestmark = pytest.mark.unit


def _summary(results, experiment: str) -> str:
    ablate_cli("report", experiment, "--results", results)
    return (results / experiment / "report" / "summary.md").read_text()


def _no_empty_lists(text: str) -> None:
    assert "()" not in text and not re.search(r"\(\s*[;,]", text) and "effect(s)" not in text, text


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from ablate.design import record_design
    from ablate.experiment import named_experiment

    results = tmp_path_factory.mktemp("results")
    record_design(results / "testbed", named_experiment("testbed"))  # as `make demo`'s submit does, before its runs
    for i, arm in enumerate(BUILTIN_ARMS):
        for seed in range(2):
            write_run(results, "demo", "smoke", arm, seed, 6.0 + 0.01 * i + 0.003 * seed, curve_points=3)
    task = {"signature": {f"{name}_{case}": 0.1 for name in ("phantom", "first_key", "output_norm")
                          for case in ("absent", "present")}, "val_accuracy": 1.0, "val_loss_auc": 1.0}
    for seed in range(12):
        write_run(results, "testbed", "abstain-stream", "baseline", seed, 1.0 + 0.01 * (seed % 3), curve_points=3,
                  **task)
        write_run(results, "testbed", "abstain-stream", "sink-logit", seed, 0.98 + 0.01 * ((seed + 1) % 3),
                  curve_points=3, **task)
    return results


def test_the_demos_summary_prints_no_empty_list(results):
    text = _summary(results, "demo")
    _no_empty_lists(text)
    assert "learning rate and batch" not in text  # one tier: there is no scale to be confounded


def test_the_testbeds_summary_counts_the_one_comparison_that_ran_once(results):
    text = _summary(results, "testbed")
    _no_empty_lists(text)
    assert "none of the 2 tested" not in text and "none of the 1 tested effect;" in text, text


def _demo_recipe() -> list[str]:
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    return [line.strip().replace("$(BIN)/", "") for line in recipe.splitlines()[1:] if line.strip()]


def test_make_demo_ends_on_the_comparison_it_ran_at_the_designs_seeds(results):
    """The testbed part runs its one declared comparison at the design's 12 seeds (no --seeds), and the demo's last
    screen is that comparison, then one line saying the others belong to the full testbed and how to run it."""
    import shlex

    recipe = _demo_recipe()
    submit = next(line for line in recipe if line.startswith("ablate submit testbed"))
    assert "--seeds" not in submit and "--arms baseline sink-logit" in submit
    last = shlex.split(recipe[-1])
    assert last[:2] == ["ablate", "table"]
    out = ablate_cli(*last[1:], "--results", results).stdout
    rows = [line for line in out.splitlines() if line.startswith("| abstain-stream")]
    assert len(rows) == 1 and "stream_sink_logit" in rows[0] and "| 12 |" in rows[0]
    assert "not run" not in out.split("\n\n")[-2] and "Skipped" not in out
    assert out.strip().splitlines()[-1].startswith("The other 6 declared comparison rows belong to the full testbed, "
                                                   "not run here: control_park_position (abstain-stream)")
    assert "`ablate submit testbed --executor local` runs them" in out.strip().splitlines()[-1]


def test_the_readme_names_only_figures_make_demo_makes(results):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    named = set(re.findall(r"[\w.-]+\.png", readme))
    _summary(results, "demo"), _summary(results, "testbed")
    made = {p.name for experiment in ("demo", "testbed") for p in (results / experiment / "report").glob("*.png")}
    assert named and named <= made, named - made
