"""A fixed design's declaration is frozen at the first submit (issue 54, item 5): the ledger keeps the experiment
file's whole declaration (never the subset one command submits); a table or report whose file now declares otherwise
refuses in one line naming what changed; `submit --amend` records a dated new version the report names; runs that
predate the recorded design are marked "design recorded after runs" in every table and the report."""

from __future__ import annotations

import argparse
import json

import pytest

import ablate.dispatch
from ablate.analysis.build import build_table
from ablate.analysis.hypotheses import declared_for, fixed_decision
from ablate.analysis.load import load_runs
from ablate.analysis.report import declared_section, flags_section, make_report
from ablate.cli import main
from ablate.cli.testbed import _experiment
from ablate.design import AFTER_RUNS, Declaration, record_design, recorded_versions
from ablate.dispatch import Submission, submit
from ablate.errors import AblateError
from ablate.experiment import Comparison, Experiment, load_experiment
from analysis_fixtures import write_store

pytestmark = pytest.mark.unit

THREE = (Comparison("zero_option", "baseline", "sink-logit"), Comparison("off_by_one", "baseline", "off-by-one"),
         Comparison("norm_gate", "baseline", "norm-gate"))
DIFFS = (0.008, 0.014, 0.011)  # each comparison alone: p ≈ 0.024; Holm over three: p_holm ≈ 0.07


def experiment(hypotheses=THREE, seeds: int = 3) -> Experiment:
    return Experiment(name="frozen", tiers=("10M",), arms=("baseline", "sink-logit", "off-by-one", "norm-gate"),
                      seeds=seeds, hypotheses=list(hypotheses))


def losses() -> dict:
    out = {}
    for seed, diff in enumerate(DIFFS):
        out[("10M", "baseline", seed)] = 4.0 + 0.01 * seed
        for arm in ("sink-logit", "off-by-one", "norm-gate"):
            out[("10M", arm, seed)] = 4.0 + 0.01 * seed - diff
    return out


def store_with_design(tmp_path, design: Experiment):
    """The design recorded at the first submit, then its runs."""
    folder = tmp_path / "results" / "frozen"
    folder.mkdir(parents=True)
    record_design(folder, design)
    return write_store(tmp_path / "results", "frozen", losses())


def declared(folder, design):
    return build_table(load_runs(folder), "declared", declared=declared_for(design, folder))


def test_deleting_comparisons_after_the_runs_is_refused_in_one_line_naming_what_changed(tmp_path, capsys):
    folder = store_with_design(tmp_path, experiment())
    table = declared(folder, experiment())
    assert [fixed_decision(r) for r in table.frame.iter_rows(named=True)] == ["not supported"] * 3
    with pytest.raises(AblateError, match=r"now declares another design .*comparisons: recorded \[zero_option "
                                          r"\(baseline − sink-logit\), off_by_one .*\], now \[zero_option "
                                          r"\(baseline − sink-logit\)\].*--amend") as err:
        declared_for(experiment(THREE[:1]), folder)
    assert "\n" not in str(err.value)
    alone = build_table(load_runs(folder), "declared", declared=declared_for(None, folder))  # the folder read alone
    assert alone.frame["p_holm"].to_list() == table.frame["p_holm"].to_list()  # decided under the record: m = 3
    other = Comparison("norm_gate", "sink-logit", "norm-gate")
    for changed in (experiment(seeds=5), experiment((*THREE[:2], other))):
        with pytest.raises(AblateError, match="now declares another design"):
            declared_for(changed, folder)
    (tmp_path / "frozen.py").write_text(
        "from ablate.experiment import Comparison, Experiment\n"
        "EXPERIMENT = Experiment(name='frozen', tiers=('10M',), arms=('baseline', 'sink-logit', 'off-by-one', "
        "'norm-gate'), seeds=3, hypotheses=[Comparison('zero_option', 'baseline', 'sink-logit')])\n")
    for command in ("table", "report"):
        code = main([command, str(tmp_path / "frozen.py"), "--results", str(tmp_path / "results")])
        err = capsys.readouterr().err
        assert code == 2 and "comparisons: recorded" in err and len(err.strip().splitlines()) == 1, err


def test_an_amendment_is_a_dated_version_and_the_tables_and_report_name_it(tmp_path):
    folder = store_with_design(tmp_path, experiment())
    with pytest.raises(AblateError, match="--amend"):
        record_design(folder, experiment(THREE[:1]))
    record_design(folder, experiment(THREE[:1]), amend=True)
    versions = recorded_versions(folder)
    assert [v.number for v in versions] == [1, 2] and versions[1].declaration.same_as(Declaration.of(
        experiment(THREE[:1])))
    with pytest.raises(AblateError, match="now declares another design"):
        declared_for(experiment(), folder)  # the file put back is another change: amend again
    design = declared_for(experiment(THREE[:1]), folder)
    amended = [n for n in design.notes if n.startswith("design amended: version 2 recorded on ")]
    assert amended and "comparisons: recorded [zero_option" in amended[0]
    runs = load_runs(folder)
    for kind in ("declared", "paired", "increments"):
        assert amended[0] in build_table(runs, kind, declared=design).notes
    make_report(folder, [flags_section, declared_section], declared=design)
    assert f"Design: {amended[0]}." in (folder / "report" / "summary.md").read_text()


def test_runs_before_the_design_are_marked_in_every_table_and_the_report(tmp_path):
    folder = write_store(tmp_path / "results", "frozen", losses())  # runs first (`ablate run`, an older ablate)
    for record in (False, True):
        if record:
            record_design(folder, experiment())  # the first submit, after the runs
            assert recorded_versions(folder)[0].runs_before == 12
        design = declared_for(experiment(), folder)
        marked = [n for n in design.notes if n.startswith(AFTER_RUNS)]
        assert len(marked) == 1
        runs = load_runs(folder)
        for kind in ("declared", "paired", "increments", "scale"):
            assert marked[0] in build_table(runs, kind, declared=design).notes, kind
        make_report(folder, [flags_section, declared_section], declared=design)
        assert AFTER_RUNS in (folder / "report" / "summary.md").read_text()
    clean = store_with_design(tmp_path / "clean", experiment())
    assert declared_for(experiment(), clean).notes == ()  # recorded before its runs: nothing to mark


def test_submit_records_the_whole_declaration_never_the_subset_it_submits(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(ablate.dispatch, "run_local", lambda experiment, file, todo, *rest: ran.extend(todo) or {})
    testbed, subset = _experiment(argparse.Namespace(arm=["sink-logit"], tier=["abstain-stream"], steps=None,
                                                     seed_count=1, parallel=None))
    assert Declaration.of(subset) != Declaration.of(testbed)
    submit(subset, None, Submission(results=tmp_path, executor="local", declaration=testbed))
    assert ran and {s.arm for s in ran} == {"baseline", "sink-logit"}  # the subset ran
    ledger = json.loads((tmp_path / "testbed" / "ledger.json").read_text())
    assert recorded_versions(tmp_path / "testbed")[0].declaration.same_as(Declaration.of(testbed))  # the whole one
    assert [s["kind"] for s in ledger["submissions"]] == ["fixed-design"]
    grid = load_experiment("testbed")
    submit(grid, None, Submission(results=tmp_path / "cli", executor="local", arms=("baseline",),
                                  tiers=("abstain-stream",)))
    assert recorded_versions(tmp_path / "cli" / "testbed")[0].declaration.same_as(Declaration.of(grid))  # not --arms
    assert experiment(THREE[::-1]).hypotheses != experiment().hypotheses and Declaration.of(
        experiment(THREE[::-1])).same_as(Declaration.of(experiment()))  # listed in another order: the same design


def test_ablate_testbed_hands_submit_the_whole_testbed(tmp_path, monkeypatch):
    asked = []

    def stop(experiment, file, request):
        asked.append((experiment, request))
        raise AblateError("stopped here")

    monkeypatch.setattr(ablate.dispatch, "submit", stop)
    assert main(["testbed", "--arm", "sink-logit", "--tier", "abstain-stream", "--seed-count", "1",
                 "--results", str(tmp_path)]) == 2
    (submitted, request), = asked
    assert request.declaration == load_experiment("testbed") and submitted.hypotheses != request.declaration.hypotheses
