"""What a new user reads in the first hour: where `plan --power` took each sd and what a tier costs, which
files are experiments, metric tables that state one convention and keep unevaluated runs apart, `eval` on every
source `table` takes, a report that leaves out what its arms cannot give, and an offline FineWeb-Edu prepare."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from ablate.analysis.build import build_table
from ablate.analysis.load import load_runs
from ablate.analysis.render import render
from ablate.cli import main
from ablate.errors import AblateError
from analysis_fixtures import reference_losses, write_run, write_store
from test_eval_table import write_evaluated_study

pytestmark = pytest.mark.unit


def plan_power(capsys, *args, json_out=True):
    code = main(["plan", "sink_vs_filter", "--power", "--effect", "0.003", *map(str, args),
                 *(["--json"] if json_out else [])])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if json_out and code == 0 else captured.out), captured.err


# ---------------------------------------------------------------- item 4: where each sd came from


def test_a_pilot_of_other_tiers_is_said_unused_and_draws_no_warning(tmp_path, capsys):
    """The demo's pilot (smoke tier only, 2 seeds) holds none of the study's tiers: every sd is --sd's."""
    losses = {(t, a, s): loss for (t, a, s), loss in reference_losses().items() if t == "10M" and s < 2}
    pilot = write_store(tmp_path / "results", "demo", {("smoke", a, s): v for (_, a, s), v in losses.items()})
    code, out, _ = plan_power(capsys, "--pilot", pilot, "--sd", "0.002")
    assert code == 0
    assert {r["sd_source"] for r in out["power"]} == {"--sd"} and {r["sd"] for r in out["power"]} == {0.002}
    assert out["warnings"] == []  # the pilot was not used, so its size is no warning
    assert len(out["notes"]) == 1 and "every sd is --sd's" in out["notes"][0] and "smoke" in out["notes"][0]
    code, text, _ = plan_power(capsys, "--pilot", pilot, "--sd", "0.002", json_out=False)
    assert "unreliable" not in text and "note: the pilot has no paired seeds" in text
    summaries = [line for line in text.splitlines() if re.match(r"tier \S+: ", line)]
    assert summaries and all(line.endswith("sd from --sd") for line in summaries)


def test_each_tier_says_which_sds_came_from_the_pilot(tmp_path, capsys):
    pilot = write_store(tmp_path / "results", "pilot")  # 3 seeds at 10M, one at 350M
    code, out, _ = plan_power(capsys, "--pilot", pilot, "--sd", "0.004")
    assert code == 0
    by_tier = {t: {r["sd_source"] for r in out["power"] if r["tier"] == t} for t in {r["tier"] for r in out["power"]}}
    assert by_tier["10M"] == {"pilot"} and by_tier["350M"] == {"--sd"}
    assert {r["pilot_seeds"] for r in out["power"] if r["tier"] == "10M"} == {3}
    summary = {t["tier"]: t["sd_sources"] for t in out["tiers"]}
    assert summary["10M"] == "pilot (3 seeds)" and summary["350M"] == "--sd"
    assert any("3-seed pilot's sd is unreliable" in w for w in out["warnings"]) and out["notes"] == []
    code, text, _ = plan_power(capsys, "--pilot", pilot, "--sd", "0.004", json_out=False)
    assert re.search(r"10M\s+zero_option\s+\S+\s+pilot \(3 seeds\)", text)
    assert re.search(r"350M\s+zero_option\s+0\.00400\s+--sd", text)
    summaries = {line.split(":")[0]: line for line in text.splitlines() if re.match(r"tier \S+: ", line)}
    assert summaries["tier 10M"].endswith("sd from pilot (3 seeds)") and summaries["tier 350M"].endswith("sd from --sd")


def test_a_missing_pilot_folder_says_no_such_folder(tmp_path, capsys):
    code, _, err = plan_power(capsys, "--pilot", tmp_path / "results" / "pilot", "--sd", "0.002")
    assert code == 2 and "no such folder" in err and "unknown experiment" not in err and err.count("\n") == 1


# ---------------------------------------------------------------- item 7: a tier's GPU-hours once


def test_plan_power_shows_a_tier_s_gpu_hours_once_not_on_every_row(capsys):
    code, out, _ = plan_power(capsys, "--sd", "0.004", "--tier", "10M", "124M")
    assert code == 0 and all("gpu_hours" not in r for r in out["power"])
    hours = {t["tier"]: f"{t['gpu_hours']:.1f} GPU-hours" for t in out["tiers"]}
    code, text, _ = plan_power(capsys, "--sd", "0.004", "--tier", "10M", "124M", json_out=False)
    rows = [line for line in text.splitlines() if re.match(r"(10M|124M)\s+(zero_option|filtering)", line)]
    assert len(rows) == 6 and "GPU-h" not in text.splitlines()[1]
    for tier, figure in hours.items():
        assert sum(line.startswith(f"tier {tier}:") and figure in line for line in text.splitlines()) == 1
        per_seed = next(t["gpu_hours_per_seed"] for t in out["tiers"] if t["tier"] == tier)
        assert not any(f"{per_seed * r['seeds']:.1f}" in line.split()[-1]
                       for line, r in zip(rows, out["power"]) if r["tier"] == tier)


# ---------------------------------------------------------------- item 8: only files that define EXPERIMENT


def test_an_arm_module_beside_the_experiments_is_not_an_experiment_and_is_not_run(tmp_path, monkeypatch, capsys):
    from ablate.experiment import available_experiments

    (tmp_path / "experiments").mkdir()
    ran = tmp_path / "ran"
    (tmp_path / "experiments" / "scalar_gate.py").write_text(
        f"from pathlib import Path\nPath({str(ran)!r}).write_text('executed')\nclass ScalarGate:\n    pass\n")
    (tmp_path / "experiments" / "mine.py").write_text(
        "from ablate.experiment import Experiment\nEXPERIMENT = Experiment(name='mine', description='x', "
        "tiers=('smoke',), arms=('baseline',), seeds=1)\n")
    monkeypatch.chdir(tmp_path)
    names = available_experiments()
    assert "mine" in names and "demo" in names and "scalar_gate" not in names
    assert main(["plan", "scalar_gate"]) == 2
    err = capsys.readouterr().err
    assert "unknown experiment 'scalar_gate'" in err and "defines no `EXPERIMENT" in err
    assert "scalar_gate," not in err.split("valid experiments:")[1] and err.count("\n") == 1
    assert not ran.exists()  # told apart by its syntax, never by running it


# ---------------------------------------------------------------- item 10: metric tables


@pytest.fixture
def evaluated(tmp_path):
    return write_evaluated_study(tmp_path)


def test_a_metric_table_states_one_sign_convention(evaluated):
    md = render(build_table(load_runs(evaluated, metric="hellaswag/acc_norm"), "paired"), "md")
    assert md.count("Δ =") == 1 and "negated" not in md and "positive: the arm is better" in md


def test_runs_not_evaluated_are_listed_apart_from_excluded_ones(evaluated):
    (evaluated / "10M" / "baseline" / "seed2" / "eval.json").unlink()
    write_run(evaluated.parent, "study", "10M", "sink-logit", 3, None, status="failed", curve_points=2)
    table = build_table(load_runs(evaluated, metric="hellaswag/acc_norm"), "paired")
    md = render(table, "md")
    excluded = md.split("Excluded runs")[1].split("\n\n", 2)[1]
    unevaluated = md.split("Not evaluated on hellaswag/acc_norm")[1].split("\n\n", 2)[1]
    assert "sink-logit seed 3" in excluded and "baseline seed 2" not in excluded
    assert unevaluated.strip() == "- 10M baseline seed 2"
    data = json.loads(render(table, "json"))
    assert [(r["arm"], r["seed"]) for r in data["not_evaluated"]] == [("baseline", 2)]
    assert [(r["arm"], r["seed"]) for r in data["excluded"]] == [("sink-logit", 3)]


def test_gold_logprob_without_by_item_says_it_needs_by_item(evaluated, capsys):
    assert main(["table", str(evaluated), "--metric", "hellaswag/gold_logprob"]) == 2
    err = capsys.readouterr().err
    assert "--by-item" in err and err.count("\n") == 1


def test_an_eval_error_prints_no_table_header_first(evaluated, capsys):
    pytest.importorskip("lm_eval")  # the `eval` extra, which `make test` installs
    run = evaluated / "10M" / "baseline" / "seed0"  # a run folder without its final weights
    assert main(["eval", str(run), "--tasks", "lambada_openai"]) == 2
    captured = capsys.readouterr()
    assert "no trained weights" in captured.err and "| run |" not in captured.out


def test_eval_takes_an_experiment_folder_as_table_does(evaluated, tmp_path, monkeypatch):
    from ablate.cli.evals import _targets
    from ablate.evals.run import weights_path

    for arm, seed in [("baseline", 0), ("sink-logit", 0)]:
        path = weights_path(evaluated / "10M" / arm / f"seed{seed}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"weights")
    args = argparse.Namespace(target=str(evaluated), tiers=None, arms=None, seeds=None, results=None)
    assert [p.relative_to(evaluated).as_posix()
            for p in _targets(args)] == ["10M/baseline/seed0", "10M/sink-logit/seed0"]
    args = argparse.Namespace(target=str(evaluated), tiers=None, arms=["sink-logit"], seeds=None, results=None)
    assert [p.relative_to(evaluated).as_posix() for p in _targets(args)] == ["10M/sink-logit/seed0"]
    monkeypatch.chdir(tmp_path)  # by name under --results, as `ablate table study --results .` reads it
    args = argparse.Namespace(target="study", tiers=None, arms=None, seeds=[0], results=str(tmp_path))
    assert len(_targets(args)) == 2
    args = argparse.Namespace(target=str(tmp_path / "x.csv"), tiers=None, arms=None, seeds=None, results=None)
    with pytest.raises(AblateError, match="not weights"):
        _targets(args)


# ---------------------------------------------------------------- item 11: the report


def test_a_report_without_combo_leaves_out_what_it_cannot_have_and_says_so_once(tmp_path, capsys):
    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M"
              and k[1] in ("baseline", "norm-gate", "off-by-one")}
    folder = write_store(tmp_path / "results", "mine", losses, curve_points=3)
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    summary = (folder / "report" / "summary.md").read_text()
    assert "## Crossover" not in summary and "## Scale" not in summary and "skipped: it needs arms" not in summary
    assert (summary.count("Left out") == 1 and "increments (needs baseline and sink-logit" in summary
            and "crossover (needs" in summary)
    assert not (folder / "report" / "increments.md").exists() and not (folder / "report" / "overlap.md").exists()
    assert "the increments of one tier" not in summary and "the arms of one tier against the reference" in summary
    assert "summary.md" in out and "paired.md" in out and "increments.md" not in out and "downstream.md" not in out


def test_the_report_message_names_downstream_md_when_it_is_written(evaluated, capsys):
    assert main(["report", str(evaluated)]) == 0
    out = capsys.readouterr().out
    assert "downstream.md" in out and (evaluated / "report" / "downstream.md").is_file()


def test_the_increments_table_has_the_p_holm_the_report_speaks_of(tmp_path):
    runs = load_runs(write_store(tmp_path / "results", "study"))
    for kind in ("increments", "overlap"):
        table = build_table(runs, kind)
        assert "p_holm" in table.columns
        tier = table.frame.filter(tier="10M")
        assert (tier["p_holm"] >= tier["p"]).all() and tier["p_holm"].max() <= 1
        assert "p_holm: Holm's step-down adjustment of p over the rows of one tier" in render(table, "md")


# ---------------------------------------------------------------- item 12: FineWeb-Edu offline


def test_fineweb_offline_leaves_nothing_behind_and_suggests_what_the_readme_says(tmp_path, monkeypatch, capsys):
    import datasets

    def offline(*args, **kwargs):  # what `datasets` raises offline, after its retries (not waited for here)
        raise ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    out = tmp_path / "data" / "fineweb-edu"
    assert main(["data", "prepare", "--source", "fineweb-edu", "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert not (tmp_path / "data").exists()
    errors = [line for line in err.splitlines() if line.startswith("ablate: error:")]
    assert len(errors) == 1 and "Traceback" not in err  # one line (beside the progress bar's)
    assert "--source parquet --path" in errors[0] and "--data-files" not in errors[0]
    page = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()  # where FineWeb-Edu is prepared
    assert "--source parquet --path" in page
