"""What the runs do with their arm's identity (issue 54, items 2, 3, 4, 9, 14): submit, the worker and `table` compute
one identity; a worker's cached helper records what it trained; a resume under edited arm code is refused; a run of
two versions is refused by the table; a completed run of older code is stale for submit, status, table and report;
an interrupted run whose identical data moved resumes."""

import dataclasses
import json
import shutil
import sys

import pytest

from ablate import modelio
from ablate.analysis.armcode import NOT_CHECKED, check_arm_code
from ablate.analysis.load import load_runs
from ablate.arms import get_arm
from ablate.arms.source import OLDER_SCHEME, arm_identity
from ablate.config import resolve_config
from ablate.errors import AblateError
from ablate.experiment import Experiment, RunSpec, load_experiment
from ablate.ranks import moved_data_only, prepare_run_dir
from ablate.store_summary import read_summary
from ablate.train import run
from ablate.runconfig import RunOptions
from ablate.workers import RunJob
from datafix import ablate_cli
from test_arm_source import EXPERIMENT_FILE, fresh_load, write_arm


def error_line(result) -> str:
    """The command's one-line refusal (exit 2), whatever log lines came before it."""
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ablate: error:")]
    assert len(lines) == 1 and result.stderr.rstrip().endswith(lines[0]), result.stderr
    return lines[0]


@pytest.fixture
def forget():
    names = []
    yield names.append
    for name in names:
        sys.modules.pop(name, None)


@pytest.mark.unit
def test_a_worker_records_the_helper_it_trained_with_and_table_sees_the_edit(tmp_path, forget):
    """Item 4 and 2: the worker's code path (RunJob: the experiment file again for each run) trains seed 0, gates.py
    is edited mid-grid, seed 1 trains with the cached gates: both record the identity they trained (the same);
    the code now (a fresh load, as `table` and `submit` do) is another, so `table` refuses the row, naming the arm.
    Fails if the identity is read from disk at each run."""
    forget("gates54w")
    path = write_arm(tmp_path / "exp", "gated-54w", "gates54w")
    fresh_load(path, "gates54w")
    baseline0, baseline1, seed0, seed1 = load_experiment(path).runs()
    job = RunJob(str(path), str(tmp_path / "results"), RunOptions(progress=False))
    job(baseline0), job(baseline1)
    first = job(seed0).arm_source
    (tmp_path / "exp" / "gates54w.py").write_text("GATE = 0.5\n")
    second = job(seed1).arm_source
    assert sys.modules["gates54w"].GATE == 1.0 and second == first  # recorded = trained
    folder = tmp_path / "results" / "gated-54w"
    assert ablate_cli("table", folder, check=False).returncode == 0  # gates54w still cached here: the same code
    fresh_load(path, "gates54w")  # what a new process sees: GATE = 0.5
    assert arm_identity(get_arm("gated-54w")) != first
    table = ablate_cli("table", path, "--results", tmp_path / "results", check=False)
    line = error_line(table)
    assert "arm 'gated-54w': its code changed since synthetic/gated-54w/seed0, synthetic/gated-54w/seed1" in line \
        and "--rerun-stale" in line


@pytest.mark.unit
def test_submit_status_table_and_report_judge_a_stale_run(tmp_path, forget):
    """Item 9 and 2: runs trained by `submit` (its local worker) are current for submit, status and table (one
    identity in every process); the arm edited afterwards: `submit` refuses in one line naming the stale runs and
    --rerun-stale, `status` marks them stale, `table` and `report` refuse the arm; `--rerun-stale` keeps them aside
    and trains the current code. Fails with the comparison taken out of any of them."""
    forget("gates54s")
    path = write_arm(tmp_path / "exp", "gated-54s", "gates54s")
    results = tmp_path / "results"
    common = ("--results", results)
    ablate_cli("submit", path, "--executor", "local", "--parallel", "1", *common)  # a worker process trains them
    recorded = json.loads((results / "gated-54s/synthetic/gated-54s/seed0/summary.json").read_text())["arm_source"]
    fresh_load(path, "gates54s")
    assert recorded == arm_identity(get_arm("gated-54s"))  # the worker's identity is this process's
    dry = ablate_cli("submit", path, "--executor", "local", "--dry-run", *common)
    assert "0 of 4 runs would be submitted" in dry.stdout
    assert not any(r["stale"] for r in json.loads(ablate_cli("status", path, "--json", *common).stdout)["runs"])
    ablate_cli("table", path, *common)
    (tmp_path / "exp" / "gates54s.py").write_text("GATE = 0.25\n")
    sys.modules.pop("gates54s", None)
    refused = ablate_cli("submit", path, "--executor", "local", "--dry-run", *common, check=False)
    assert ("2 completed run(s) trained another version of their arm's code than the code now (arm gated-54s): "
            "synthetic/gated-54s/seed0, synthetic/gated-54s/seed1; `--rerun-stale`") in error_line(refused)
    sys.modules.pop("gates54s", None)
    status = ablate_cli("status", path, "--json", *common)
    assert [r["arm"] for r in json.loads(status.stdout)["runs"] if r["stale"]] == ["gated-54s"] * 2
    sys.modules.pop("gates54s", None)
    assert "stale" in ablate_cli("status", path, *common).stdout
    for command in ("table", "report"):
        sys.modules.pop("gates54s", None)
        out = ablate_cli(command, path, *common, check=False)
        assert "arm 'gated-54s': its code changed since" in error_line(out)
    sys.modules.pop("gates54s", None)
    again = ablate_cli("submit", path, "--executor", "local", "--parallel", "1", "--rerun-stale", *common)
    assert again.stdout.count("kept aside in") == 2
    assert len(list((results / "gated-54s/synthetic/gated-54s").glob("seed0.old-*"))) == 1
    now = json.loads((results / "gated-54s/synthetic/gated-54s/seed0/summary.json").read_text())["arm_source"]
    assert now != recorded
    sys.modules.pop("gates54s", None)
    ablate_cli("table", path, *common)


@pytest.mark.run
def test_a_csv_or_an_older_scheme_is_said_not_checked(tmp_path):
    """Item 2/9: a CSV source records no arm code; a run of the older scheme is shown as not compared, never refused
    (and a mixed row is not refused as "differs" either)."""
    csv = tmp_path / "losses.csv"
    csv.write_text("tier,arm,seed,val_loss\nsmoke,baseline,0,3.5\n")
    assert any(NOT_CHECKED in note for note in check_arm_code(load_runs(csv), {}).notes)
    for spec in Experiment(name="study", tiers=("synthetic",), arms=("baseline",), seeds=2,
                           overrides={"steps": 3, "val_interval": 3}).runs():
        run(spec, tmp_path / "r", progress=False)
    folder = tmp_path / "r" / "study"
    summary = folder / "synthetic/baseline/seed1/summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "arm_source": "a" * 64, "arm_sources": None}))
    runs = check_arm_code(load_runs(folder), {"baseline": arm_identity(get_arm("baseline"))})
    assert f"{OLDER_SCHEME} (synthetic/baseline/seed1)" in runs.notes
    assert ablate_cli("table", folder).returncode == 0


@pytest.mark.run
def test_a_run_of_two_arm_versions_is_refused_by_the_table(tmp_path):
    """Item 3: a run that holds two identities (resumed by --force-less older code, or edited by hand) is no run of
    either. Fails without the refusal (`refuse_hybrid`)."""
    spec = Experiment(name="study", tiers=("synthetic",), arms=("baseline",), seeds=1,
                      overrides={"steps": 3, "val_interval": 3}).runs()[0]
    run(spec, tmp_path / "r", progress=False)
    folder = tmp_path / "r" / "study"
    summary = folder / "synthetic/baseline/seed0/summary.json"
    held = json.loads(summary.read_text())
    summary.write_text(json.dumps({**held, "arm_sources": ["v2:" + "1" * 64, held["arm_source"]]}))
    with pytest.raises(AblateError, match=r"trained under 2 versions of arm 'baseline'.s code .*no run of either"):
        load_runs(folder)


def started_run(tmp_path, arm: str, recorded: str, steps: int = 3):
    """A corpus run of `arm` that took `steps` steps under the arm identity `recorded`."""
    spec = RunSpec("resume", "smoke", arm, 0, {})
    config = resolve_config(spec, data_dir="data/sample")
    folder = spec.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    (folder / "summary.json").write_text(json.dumps({"status": "running", "steps": steps, "tier": "smoke",
                                                     "arm_source": recorded, "arm_sources": [recorded]}))
    return folder, config


@pytest.mark.unit
def test_a_resume_under_edited_arm_code_is_refused(tmp_path, forget):
    """Item 3: a run started under gate 1.0, the helper edited to 0.5: the same command is refused in one line;
    restored, it resumes; --force keeps it aside. A run of the older scheme resumes (not compared). Fails without
    the check in `prepare_run_dir`."""
    forget("gates54r")
    text = EXPERIMENT_FILE.format(name="gated-54r", helper="gates54r").replace('"synthetic"', '"smoke"')
    path = write_arm(tmp_path / "exp", "gated-54r", "gates54r", text=text)
    fresh_load(path, "gates54r")
    folder, config = started_run(tmp_path, "gated-54r", arm_identity(get_arm("gated-54r")))
    (tmp_path / "exp" / "gates54r.py").write_text("GATE = 0.5\n")
    fresh_load(path, "gates54r")
    with pytest.raises(AblateError, match=r"the arm's code changed since this run started .*: restore it, or "
                                          r"--force") as refused:
        prepare_run_dir(folder, config, force=False)
    assert "\n" not in str(refused.value)
    (tmp_path / "exp" / "gates54r.py").write_text("GATE = 1.0\n")
    fresh_load(path, "gates54r")
    assert prepare_run_dir(folder, config, force=False) == "resume"
    (tmp_path / "exp" / "gates54r.py").write_text("GATE = 0.5\n")
    fresh_load(path, "gates54r")
    assert prepare_run_dir(folder, config, force=True) == "fresh"
    older, config = started_run(tmp_path / "older", "gated-54r", "b" * 64)
    assert prepare_run_dir(older, config, force=False) == "resume"


@pytest.mark.run
def test_an_interrupted_run_resumes_from_its_moved_data(tmp_path, sample_data, monkeypatch):
    """Item 14: a run interrupted after its last checkpoint, its data (same data_id) moved to D2: `--data D2`
    resumes it and its summary records D2. Other data under the moved name, or another setting, is still refused.
    Fails without `moved_data_only`."""
    spec = RunSpec("moved", "smoke", "baseline", 0, {"max_steps": 2})
    options = {"progress": False, "threads": 1}

    def interrupted(*args, **kwargs):
        raise RuntimeError("interrupted while saving the final weights")

    monkeypatch.setattr(modelio, "save_model", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        run(spec, tmp_path / "results", data_dir=str(sample_data), **options)
    monkeypatch.undo()
    moved = tmp_path / "D2"
    shutil.copytree(sample_data, moved)
    summary = run(spec, tmp_path / "results", data_dir=str(moved), **options)
    assert summary.status == "completed" and summary.data_dir == str(moved)
    config = json.loads((spec.folder(tmp_path / "results") / "config.json").read_text())
    assert config["data_dir"] == str(sample_data)  # the run's config is as it started; the summary says where now
    held = read_summary(spec.folder(tmp_path / "results"))
    previous, current = {"steps": 4, "data_dir": str(sample_data)}, {"steps": 4, "data_dir": str(moved)}
    assert moved_data_only(previous, current, held)
    assert not moved_data_only(previous, current, dataclasses.replace(held, data_id="0" * 64))  # other data there
    assert not moved_data_only(previous, {**current, "steps": 5}, held)  # and another setting beside it
