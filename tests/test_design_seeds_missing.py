"""A declared comparison with fewer seeds run than its fixed design is not final and never supported; the table and
the report name the missing seeds, in the row and in the summary (issue 54, item 6). A diverged seed has run; a seed
moved aside is missing."""

from __future__ import annotations

import json

from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import declared_for, fixed_decision, supported
from ablate.analysis.load import load_runs
from ablate.analysis.report import declared_section, flags_section, make_report
from ablate.experiment import Comparison, Experiment
from ablate.store import run_dir
from analysis_fixtures import write_store
import pytest

pytestmark = pytest.mark.unit

EFFECT = (0.020, 0.022, 0.019, 0.021, 0.018, 0.020, 0.023, 0.019)


def losses(seeds) -> dict:
    out = {}
    for seed in seeds:
        out[("10M", "baseline", seed)] = 4.0 + 0.01 * seed
        out[("10M", "sink-logit", seed)] = 4.0 + 0.01 * seed - EFFECT[seed]
    return out


def experiment(seeds: int) -> Experiment:
    return Experiment(name="opt", tiers=("10M",), arms=("baseline", "sink-logit"), seeds=seeds,
                      hypotheses=[Comparison("zero_option", "baseline", "sink-logit")])


def declared_row(folder, seeds: int):
    table = build_table(load_runs(folder), "declared", declared=declared_for(experiment(seeds), folder))
    return table, table.frame.row(0, named=True)


def test_three_of_eight_seeds_is_not_final_and_the_report_names_the_five_missing(tmp_path):
    folder = write_store(tmp_path / "results", "opt", losses(range(3)))
    table, row = declared_row(folder, 8)
    assert row["n"] == 3 and row["p_holm"] < 0.05  # as strong as a supported effect would be
    assert row["missing_seeds"] == "3, 4, 5, 6, 7" and "seeds missing" in row["marks"]
    assert fixed_decision(row) == "not final" and not any(supported(table).values())
    assert any("seed(s) 3, 4, 5, 6, 7 of the design's 8 not run" in note for note in table.notes)
    ctx = make_report(folder, [flags_section, declared_section], declared=declared_for(experiment(8), folder))
    summary = (folder / "report" / "summary.md").read_text()
    supported_list = summary.split("## Supported effects")[1].split("##")[0]
    named = "10M zero_option (baseline − sink-logit): n = 3, seeds 3, 4, 5, 6, 7 missing"
    assert "- none" in supported_list and named in supported_list  # the summary names them
    assert "decision not final (seeds 3, 4, 5, 6, 7 of the design missing)" in summary  # and the row
    assert ctx.tables["declared"].frame["missing_seeds"].to_list() == ["3, 4, 5, 6, 7"]
    full = write_store(tmp_path / "full", "opt", losses(range(8)))
    table, row = declared_row(full, 8)
    assert "missing_seeds" not in table.frame.columns and fixed_decision(row) == "supported"


def test_a_seed_moved_aside_is_missing_and_a_diverged_seed_has_run(tmp_path):
    folder = write_store(tmp_path / "results", "opt", losses(range(5)))
    assert fixed_decision(declared_row(folder, 5)[1]) == "supported"
    aside = run_dir(tmp_path / "results", "opt", "10M", "sink-logit", 1)
    aside.rename(aside.with_name("seed1.old-20260101-000000-1"))  # as `run --force` keeps a run aside
    table, row = declared_row(folder, 5)
    assert row["n"] == 4 and row["missing_seeds"] == "1" and fixed_decision(row) == "not final"
    assert not any(supported(table).values())
    diverged = run_dir(tmp_path / "results", "opt", "10M", "sink-logit", 3) / "summary.json"
    summary = json.loads(diverged.read_text())
    diverged.write_text(json.dumps({**summary, "status": "diverged", "val_loss": None, "diverged_step": 500}))
    table, row = declared_row(folder, 5)
    assert row["n"] == 3 and row["missing_seeds"] == "1"  # seed 3 diverged: run, handled by the diverged-arm rule
