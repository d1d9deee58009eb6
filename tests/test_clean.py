"""`ablate clean` removes only what can be rebuilt, never touches a running run, and `make clean-demo` works.

The run folders are built by hand (no training): what clean decides depends only on the files and
the summary's status, and building them takes milliseconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ablate.clean import clean, human
from ablate.cli import main
from ablate.lock import FileLock
from ablate.store import run_lock_path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = '''
from ablate.experiment import Experiment
EXPERIMENT = Experiment(name="cleanme", tiers=("smoke",), arms=("baseline", "sink-logit"), seeds=3)
'''
KEPT_NAMES = {"summary.json", "metrics.jsonl", "config.json", "run.log", "eval.json", "model.pt"}


def make_run(folder: Path, summary: dict, *, state: bool = True, weights: bool = True) -> None:
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text('{"step": 1, "train_loss": 9.0}\n')
    (folder / "config.json").write_text("{}")
    (folder / "run.log").write_text("INFO started\n")
    (folder / "eval.json").write_text("{}")
    (folder / "tb").mkdir()
    (folder / "tb" / "events.out.tfevents.1").write_bytes(b"e" * 10)  # logs cannot be rebuilt: kept
    (folder / ".summary.json.abc.tmp").write_bytes(b"t" * 7)
    (folder / "checkpoints" / ".state.pt.abc.tmp").write_bytes(b"t" * 11)
    if state:
        (folder / "checkpoints" / "state.pt").write_bytes(b"s" * 1000)
    if weights:
        (folder / "checkpoints" / "model.pt").write_bytes(b"m" * 300)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def store(tmp_path):
    """RESULTS/cleanme with one run of each kind; yields (experiment file, results, experiment dir, running run)."""
    exp_file = tmp_path / "cleanme.py"
    exp_file.write_text(EXPERIMENT)
    results = tmp_path / "results"
    root = results / "cleanme" / "smoke"
    completed = {"status": "completed", "val_loss": 7.5}
    make_run(root / "baseline" / "seed0", completed)
    make_run(root / "baseline" / "seed1", {"status": "diverged", "error": "loss is nan"}, weights=False)
    make_run(root / "baseline" / "seed2", {"status": "running"})
    make_run(root / "sink-logit" / "seed0", {"status": "completed", "val_loss": None})  # resumes to evaluate
    make_run(root / "sink-logit" / "seed1", completed, weights=False)  # state.pt holds the only final weights
    make_run(root / "sink-logit" / "seed2", completed, state=False)  # already dropped it on completion
    make_run(root / "baseline" / "seed0.old-20250101-000000-000000", completed)
    report = results / "cleanme" / "report"
    report.mkdir()
    (report / "summary.md").write_text("x" * 50)
    (report / "paired.png").write_bytes(b"p" * 70)
    running = root / "baseline" / "seed2"
    with FileLock(run_lock_path(running), what="test run"):
        yield exp_file, results, results / "cleanme", running


def expected_removals(root: Path) -> set[Path]:
    smoke = root / "smoke"
    removed = {root / "report"}
    for folder in [smoke / "baseline" / "seed0", smoke / "baseline" / "seed1"] + [
            smoke / "sink-logit" / f"seed{k}" for k in range(3)]:
        removed |= {folder / ".summary.json.abc.tmp", folder / "checkpoints" / ".state.pt.abc.tmp"}
    removed |= {smoke / "baseline" / "seed0" / "checkpoints" / "state.pt",
                smoke / "baseline" / "seed1" / "checkpoints" / "state.pt"}
    return removed


def test_dry_run_lists_and_removes_nothing(store):
    _, _, root, running = store
    before = snapshot(root)
    result = clean(root, dry_run=True)
    assert snapshot(root) == before
    assert {item.path for item in result.removed} == expected_removals(root)
    assert result.total == 2 * 1000 + 5 * (7 + 11) + 50 + 70
    assert [folder for folder, _ in result.skipped] == [running]
    assert "running" in result.skipped[0][1] and "pid" in result.skipped[0][1]
    assert [item.path.name for item in result.kept_aside] == ["seed0.old-20250101-000000-000000"]


def test_clean_keeps_what_cannot_be_rebuilt_and_skips_the_running_run(store):
    _, _, root, running = store
    before = snapshot(root)
    running_before = snapshot(running)
    result = clean(root)
    after = snapshot(root)
    gone = {root / name for name in set(before) - set(after)}
    assert gone == {p for p in expected_removals(root) if p.is_relative_to(root / "smoke")} | {
        root / "report" / "summary.md", root / "report" / "paired.png"}
    assert not (root / "report").exists()
    assert result.total == 2 * 1000 + 5 * (7 + 11) + 50 + 70
    for name, data in before.items():  # every summary, metrics, config, run.log, eval.json, model.pt, log kept as is
        if Path(name).name in KEPT_NAMES or "/tb/" in name:
            assert after[name] == data
    assert snapshot(running) == running_before  # the locked run: not one file touched
    assert [folder for folder, _ in result.skipped] == [running]
    smoke = root / "smoke"
    assert (smoke / "sink-logit" / "seed0" / "checkpoints" / "state.pt").exists()  # not finished: resumes from it
    assert (smoke / "sink-logit" / "seed1" / "checkpoints" / "state.pt").exists()  # no model.pt: keep the weights
    aside = smoke / "baseline" / "seed0.old-20250101-000000-000000"
    prefix = str(aside.relative_to(root)) + "/"
    assert snapshot(aside) == {k.removeprefix(prefix): v for k, v in before.items() if k.startswith(prefix)}
    assert len(snapshot(aside)) == 10  # the folder kept aside, stray temporaries and resume state included
    assert sorted(p.name for p in root.rglob("*.lock")) == [".seed2.lock"]  # clean released the locks it took


def test_aside_removes_folders_kept_aside_unless_their_run_is_running(store):
    _, _, root, _ = store
    aside = root / "smoke" / "baseline" / "seed0.old-20250101-000000-000000"
    locked_aside = root / "smoke" / "baseline" / "seed2.old-x"
    shutil.copytree(aside, locked_aside)
    result = clean(root, aside=True)
    assert not aside.exists()
    assert aside in {item.path for item in result.removed}
    assert locked_aside.exists() and locked_aside in {folder for folder, _ in result.skipped}


def test_filters_clean_only_the_chosen_runs_and_keep_the_report(store):
    _, _, root, _ = store
    result = clean(root, arms=["sink-logit"], seeds=[0])
    folder = root / "smoke" / "sink-logit" / "seed0"
    assert {item.path for item in result.removed} == {folder / ".summary.json.abc.tmp",
                                                       folder / "checkpoints" / ".state.pt.abc.tmp"}
    assert (root / "report" / "summary.md").exists()
    assert (root / "smoke" / "baseline" / "seed0" / "checkpoints" / "state.pt").exists()


def test_damaged_summary_is_skipped_and_named(store):
    _, _, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"
    (folder / "summary.json").write_text("{torn")
    result = clean(root)
    assert (folder / "checkpoints" / "state.pt").exists()
    assert any(f == folder and "damaged" in why for f, why in result.skipped)


def test_cli_prints_items_and_total(store, capsys):
    exp_file, results, root, running = store
    total = human(2 * 1000 + 5 * (7 + 11) + 50 + 70)
    assert main(["clean", str(exp_file), "--results", str(results), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"total: {total} in 13 item(s) would be freed (dry run: nothing removed)" in out
    assert f"would remove {human(1000):>10}  {root / 'smoke/baseline/seed0/checkpoints/state.pt'}" in out
    assert f"skipped {running}: running" in out
    assert "--aside removes them" in out and "seed0.old-20250101-000000-000000" in out
    assert (root / "report").exists()
    assert main(["clean", str(exp_file), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"total: freed {total} in 13 item(s)" in out
    assert not (root / "report").exists()
    assert main(["clean", str(exp_file), "--results", str(results)]) == 0
    assert "total: freed 0 B in 0 item(s)" in capsys.readouterr().out


def test_cli_refuses_unknown_filters_and_missing_results(store, capsys):
    exp_file, results, _, _ = store
    assert main(["clean", str(exp_file), "--results", str(results), "--arms", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "baseline, sink-logit" in err
    assert main(["clean", str(exp_file), "--results", str(results / "elsewhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_file_names_match_the_writers():
    from ablate import clean as clean_module
    from ablate.analysis.report import REPORT_DIR
    from ablate.modelio import FINAL_WEIGHTS
    from ablate.train import STATE_FILE

    assert (clean_module.STATE_FILE, clean_module.FINAL_WEIGHTS, clean_module.REPORT_DIR) == (
        STATE_FILE, FINAL_WEIGHTS, REPORT_DIR)


def test_human_sizes():
    assert [human(n) for n in (0, 1023, 1024, 5 * 1024**2, 3 * 1024**3)] == ["0 B", "1023 B", "1.0 KiB", "5.0 MiB",
                                                                            "3.0 GiB"]


def test_make_clean_demo_removes_only_the_demo(tmp_path):
    for path in ("results/demo/smoke/baseline/seed0", "data/sample", "results/other", "data/other"):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "f").write_text("x")
    out = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-C", str(tmp_path), "clean-demo"],
                         capture_output=True, text=True, check=True).stdout
    assert "removing results/demo" in out and "removing data/sample" in out
    assert not (tmp_path / "results/demo").exists() and not (tmp_path / "data/sample").exists()
    assert (tmp_path / "results/other/f").exists() and (tmp_path / "data/other/f").exists()
