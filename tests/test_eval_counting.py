"""Every reader counts the store's runs the same way, and damaged evaluation inputs are
one line naming the file and the way out (--task-data lines, eval.json)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import json
import shutil

import pytest

from ablate.analysis.load import load_runs
from ablate.analysis.report import write_report
from ablate.analysis.build import build_table
from ablate.clean import clean
from ablate.cli import main
from ablate.errors import AblateError
from ablate.evals.results import read_eval
from ablate.evals.run import runs_to_evaluate
from ablate.experiment import Experiment
from ablate.analysis.probes import summarise_injections, summarise_probes
from ablate.status import status
from ablate.store import atomic_write_json, is_run_dir, iter_run_dirs, run_dir
from analysis_fixtures import write_run
from test_eval import write_task_data
from test_eval_weights import weights_of, write_eval

pytestmark = pytest.mark.unit

ARMS, SEEDS = ("baseline", "sink-logit"), (0, 1)
ASIDE = "seed0.old-20250101-000000-000000"


def write_probes(folder, tier: str, arm: str, seed: int, mass: float) -> None:
    run, weights = {"tier": tier, "arm": arm, "seed": seed}, weights_of(arm, seed)  # of the run's final weights
    atomic_write_json(folder / "probe.json", {"run": run, "weights_sha256": weights,
                                              "summary": {"first_key_mass": mass}})
    atomic_write_json(folder / "inject.json", {"run": run, "arm": arm, "weights_sha256": weights,
                                               "by_cutoff": {"p25": {"rows": [
        {"junk": "structural", "eps": 0.4, "increase": mass}]}}})


@pytest.fixture
def store(tmp_path):
    """Two arms x two seeds, each with probe.json, inject.json and eval.json, and for every arm a copy of
    seed 0 kept aside by `--force` (with all its files, and other numbers)."""
    for arm in ARMS:
        for seed in SEEDS:
            folder = write_run(tmp_path, "study", "10M", arm, seed, 4.0 - 0.01 * seed - 0.005 * (arm != "baseline"),
                               curve_points=2, weights_sha256=weights_of(arm, seed))
            write_probes(folder, "10M", arm, seed, 0.1 + 0.01 * seed)
            write_eval(folder, 0.3 + 0.01 * seed + 0.02 * (arm != "baseline"), weights_of(arm, seed))
        aside = shutil.copytree(folder.with_name("seed0"), folder.with_name(ASIDE))
        write_probes(aside, "10M", arm, 0, 0.9)  # the aside copy names seed 0, as the run it was
    return tmp_path / "study"


def test_one_function_decides_which_folders_are_runs(store):
    runs = list(iter_run_dirs(store))
    assert [p.relative_to(store).as_posix() for p in runs] == [
        f"10M/{arm}/seed{seed}" for arm in ARMS for seed in SEEDS]
    assert list(iter_run_dirs(store, holding="probe.json")) == runs
    assert not is_run_dir(store / "10M" / "baseline" / ASIDE) and is_run_dir(store / "10M" / "baseline" / "seed0")
    assert not is_run_dir(store / ".hidden" / "baseline" / "seed0")


def test_a_copy_kept_aside_is_counted_by_no_reader(store):
    # probe and injection summaries (the report's probes.md): one run per seed, the aside copy's 0.9 nowhere
    probes = summarise_probes(store)
    assert "| 10M | baseline | 2 | 10.5% ± 0.7 |" in probes and "| 10M | sink-logit | 2 |" in probes
    injections = summarise_injections(store)
    assert "| 10M | baseline | structural | 2 | +0.105 ± 0.007 |" in injections
    report = write_report(store)
    assert "| 10M | sink-logit | 2 |" in (report / "probes.md").read_text()
    assert "90.0%" not in (report / "probes.md").read_text()
    # tables (loss and downstream) and the report's overview
    assert load_runs(store).frame.height == 4
    assert build_table(load_runs(store, metric="hellaswag/acc_norm"), "paired").frame["n"].to_list() == [2]
    assert "Runs: 4 of 4 completed and counted" in (report / "summary.md").read_text()
    # status, eval and clean
    experiment = Experiment(name="study", tiers=["10M"], arms=list(ARMS), seeds=2)
    rows = status(experiment, store.parent)
    assert len(rows) == 4 and all(r.state == "completed" and r.eval == "evaluated" for r in rows)
    folders, _ = runs_to_evaluate(experiment, store.parent)
    assert all(is_run_dir(f) for f in folders)
    listed = clean(store, dry_run=True)
    assert sorted(i.path.name for i in listed.kept_aside) == [ASIDE, ASIDE]
    assert not any(ASIDE in str(i.path) for i in listed.removed)


def test_a_probe_file_naming_another_run_is_left_out(store):
    folder = store / "10M" / "sink-logit" / "seed1"
    shutil.copy(store / "10M" / "sink-logit" / "seed0" / "probe.json", folder / "probe.json")
    assert "| 10M | sink-logit | 1 |" in summarise_probes(store)


# ------------------------------------------------------------------------- damaged inputs: one line
def bare_run(tmp_path):
    """A completed run whose weights are never loaded (the damaged input is found first)."""
    folder = run_dir(tmp_path / "results", "x", "smoke", "baseline", 0)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.pt").write_bytes(b"never loaded")
    atomic_write_json(folder / "summary.json", {"status": "completed", "val_loss": 4.0})
    return folder


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("line,expected", [
    ("{not json", "line 2 is not JSON"),
    ('["a", "list"]', "line 2 is a JSON list, not an object"),
    ('{"title": "no text column"}', "line 2: its columns lack text; lambada_openai needs text"),
])
def test_a_task_data_file_damaged_after_its_first_line_is_one_line(tmp_path, capsys, line, expected):
    folder = bare_run(tmp_path)
    data = write_task_data(tmp_path / "tasks")
    path = data / "lambada_openai.jsonl"
    path.write_text(path.read_text().splitlines()[0] + "\n" + line + "\n")
    code = main(["eval", str(folder), "--tasks", "lambada_openai", "--task-data", str(data)])
    err = one_error_line(capsys)
    assert code == 2 and str(path) in err and expected in err
    assert not (folder / "eval.json").exists()


@pytest.mark.parametrize("text,expected", [
    ("{\"tasks\": {\"hellaswag\": ", "JSONDecodeError"),
    ("[1, 2]", "it holds a list, not a dict"),
    (json.dumps({"tasks": {"hellaswag": {"metrics": {"acc": {"value": 0.3}}}}}), "task 'hellaswag' has no 'settings'"),
    (json.dumps({"tasks": ["hellaswag"]}), "'tasks' is a list"),
])
def test_a_damaged_eval_json_is_one_line_for_eval_table_and_status(tmp_path, capsys, text, expected):
    folder = bare_run(tmp_path)
    (folder / "eval.json").write_text(text)
    with pytest.raises(AblateError, match="move it aside and run `ablate eval"):
        read_eval(folder)
    data = write_task_data(tmp_path / "tasks")
    assert main(["eval", str(folder), "--tasks", "lambada_openai", "--task-data", str(data)]) == 2
    err = one_error_line(capsys)
    assert str(folder / "eval.json") in err and expected in err and "move it aside" in err
    assert (folder / "eval.json").read_text() == text  # nothing overwritten

    store = write_run(tmp_path / "store", "study", "10M", "baseline", 0, 4.0, weights_sha256=weights_of("b", 0))
    write_run(tmp_path / "store", "study", "10M", "sink-logit", 0, 3.9, weights_sha256=weights_of("s", 0))
    (store / "eval.json").write_text(text)
    assert main(["table", str(store.parents[2]), "--metric", "hellaswag/acc_norm"]) == 2
    err = one_error_line(capsys)
    assert str(store / "eval.json") in err and expected in err
    experiment = Experiment(name="study", tiers=["10M"], arms=["baseline", "sink-logit"], seeds=1)
    with pytest.raises(AblateError, match="eval.json is damaged"):
        status(experiment, tmp_path / "store")
