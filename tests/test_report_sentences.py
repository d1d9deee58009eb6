"""The report's sentences never print an empty list or a wrong count: over the summary.md of the demo's grid (one
pipeline-check tier, every study arm) and of the testbed part `make demo` runs (one tier, baseline and sink-logit,
one declared comparison)."""

import re

import pytest

from ablate.arms.names import BUILTIN_ARMS
from tests.analysis_fixtures import write_run
from tests.datafix import ablate_cli


def _summary(results, experiment: str) -> str:
    ablate_cli("report", experiment, "--results", results)
    return (results / experiment / "report" / "summary.md").read_text()


def _no_empty_lists(text: str) -> None:
    assert "()" not in text and not re.search(r"\(\s*[;,]", text) and "effect(s)" not in text, text


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    for i, arm in enumerate(BUILTIN_ARMS):
        for seed in range(2):
            write_run(results, "demo", "smoke", arm, seed, 6.0 + 0.01 * i + 0.003 * seed, curve_points=3)
    for seed in range(12):
        write_run(results, "testbed", "abstain-stream", "baseline", seed, 1.0 + 0.01 * (seed % 3), curve_points=3)
        write_run(results, "testbed", "abstain-stream", "sink-logit", seed, 0.98 + 0.01 * ((seed + 1) % 3),
                  curve_points=3)
    return results


def test_the_demos_summary_prints_no_empty_list(results):
    text = _summary(results, "demo")
    _no_empty_lists(text)
    assert "learning rate and batch" not in text  # one tier: there is no scale to be confounded


def test_the_testbeds_summary_counts_the_one_comparison_that_ran_once(results):
    text = _summary(results, "testbed")
    _no_empty_lists(text)
    assert "none of the 2 tested" not in text and "none of the 1 tested effect;" in text, text
