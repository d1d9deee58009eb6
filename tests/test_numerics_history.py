"""A resumed run records every kernel set it trained under (minor item): a run half AVX2, half AVX512 is named by
both, so its row is marked mixed-numerics even when its last process ran where the others did."""

import json

from ablate.analysis.build import build_table
from ablate.analysis.load import load_runs
from ablate.store_summary import RunSummary, numerics_history
from analysis_fixtures import write_store
import pytest

pytestmark = pytest.mark.unit

AVX2, AVX512 = {"cpu_capability": "AVX2"}, {"cpu_capability": "AVX512"}


def test_a_resume_keeps_the_kernel_sets_before_it_and_a_fresh_start_does_not():
    older = RunSummary(versions={"numerics": AVX2})  # a summary written before the history existed
    assert numerics_history(older, AVX512, resumed=True) == [AVX2, AVX512]
    assert numerics_history(RunSummary(numerics_history=[AVX2, AVX512]), AVX2, resumed=True) == [AVX2, AVX512]
    assert numerics_history(older, AVX512, resumed=False) == [AVX512]


def test_a_run_resumed_under_another_kernel_set_marks_its_row_mixed(tmp_path):
    losses = {("10M", arm, seed): 4.0 - 0.01 * (arm == "sink-logit") + 0.001 * seed
              for arm in ("baseline", "sink-logit") for seed in range(3)}
    folder = write_store(tmp_path / "results", "mixed", losses)
    for path in folder.glob("10M/*/seed*/summary.json"):
        summary = json.loads(path.read_text())
        summary["versions"] = {"numerics": AVX512}
        if path.parent.parent.name == "sink-logit" and path.parent.name == "seed1":
            summary["numerics_history"] = [AVX2, AVX512]  # began under AVX2, resumed and ended under AVX512
        path.write_text(json.dumps(summary))
    table = build_table(load_runs(folder), "paired")
    row = table.frame.row(0, named=True)
    assert "mixed-numerics" in str(row["marks"]), row
    assert any("cpu AVX2 + cpu AVX512" in note for note in table.notes), table.notes
