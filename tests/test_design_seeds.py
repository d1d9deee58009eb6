"""Only the design's seeds count in the declared family (item 10, optional stopping): seeds added beyond a fixed
design are listed as outside it, never counted."""

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import Declared, declared_for
from ablate.analysis.load import load_runs
from ablate.experiment import Comparison, Experiment
from analysis_fixtures import write_store
import pytest

pytestmark = pytest.mark.unit

ZERO = ("zero_option", "baseline", "sink-logit")


def losses(seeds: int) -> dict:
    """A small, noisy effect; seeds 3 and 4 chosen to pull p below α."""
    effect = {0: 0.004, 1: -0.003, 2: 0.006, 3: 0.02, 4: 0.021}
    out = {}
    for seed in range(seeds):
        out[("10M", "baseline", seed)] = 4.0 + 0.01 * seed
        out[("10M", "sink-logit", seed)] = 4.0 + 0.01 * seed - effect[seed]
    return out


def test_seeds_beyond_a_fixed_design_are_outside_the_declared_table(tmp_path):
    folder = write_store(tmp_path / "results", "opt", losses(5))
    runs = load_runs(folder)
    experiment = Experiment(name="opt", tiers=("10M",), arms=("baseline", "sink-logit"), seeds=3,
                            hypotheses=[Comparison(*ZERO)])
    declared = declared_for(experiment, folder)
    assert declared.seed_count("10M") == 3
    table = build_table(runs, "declared", declared=declared)
    row = table.frame.row(0, named=True)
    assert row["n"] == 3  # seeds 0, 1, 2 only
    assert any("10M: seed(s) 3, 4 lie outside the design (the experiment's seeds: seeds 0–2)" in n
               for n in table.notes)
    three = build_table(load_runs(write_store(tmp_path / "three", "opt", losses(3))), "declared", declared=declared)
    assert row["p_holm"] == three.frame.row(0, named=True)["p_holm"]  # as if seeds 3 and 4 had never run
    unbounded = build_table(runs, "declared", declared=Declared.of([Comparison(*ZERO)]))
    assert unbounded.frame.row(0, named=True)["n"] == 5  # declarations read without their experiment: every seed
