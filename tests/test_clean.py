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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_aside_removes_folders_kept_aside_unless_their_run_is_running(store):
    _, _, root, _ = store
    aside = root / "smoke" / "baseline" / "seed0.old-20250101-000000-000000"
    locked_aside = root / "smoke" / "baseline" / "seed2.old-x"
    shutil.copytree(aside, locked_aside)
    result = clean(root, aside=True)
    assert not aside.exists()
    assert aside in {item.path for item in result.removed}
    assert locked_aside.exists() and locked_aside in {folder for folder, _ in result.skipped}


@pytest.mark.unit
def test_filters_clean_only_the_chosen_runs_and_keep_the_report(store):
    _, _, root, _ = store
    result = clean(root, arms=["sink-logit"], seeds=[0])
    folder = root / "smoke" / "sink-logit" / "seed0"
    assert {item.path for item in result.removed} == {folder / ".summary.json.abc.tmp",
                                                       folder / "checkpoints" / ".state.pt.abc.tmp"}
    assert (root / "report" / "summary.md").exists()
    assert (root / "smoke" / "baseline" / "seed0" / "checkpoints" / "state.pt").exists()


@pytest.mark.unit
def test_damaged_summary_is_skipped_and_named(store):
    _, _, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"
    (folder / "summary.json").write_text("{torn")
    result = clean(root)
    assert (folder / "checkpoints" / "state.pt").exists()
    assert any(f == folder and "damaged" in why for f, why in result.skipped)


@pytest.mark.unit
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


@pytest.mark.unit
def test_cli_refuses_unknown_filters_and_missing_results(store, capsys):
    exp_file, results, _, _ = store
    assert main(["clean", str(exp_file), "--results", str(results), "--arms", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "baseline, sink-logit" in err
    assert main(["clean", str(exp_file), "--results", str(results / "elsewhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.unit
def test_file_names_match_the_writers():
    """Clean and the writers name the files through the store's one definition."""
    from ablate import clean as clean_module
    from ablate import modelio, store, train
    from ablate.analysis import report

    assert (clean_module.STATE, clean_module.FINAL_WEIGHTS, clean_module.REPORT_DIR) == (
        train.STATE, modelio.FINAL_WEIGHTS, report.REPORT_DIR) == (store.STATE, store.FINAL_WEIGHTS, store.REPORT_DIR)


@pytest.mark.unit
def test_human_sizes():
    assert [human(n) for n in (0, 1023, 1024, 5 * 1024**2, 3 * 1024**3)] == ["0 B", "1023 B", "1.0 KiB", "5.0 MiB",
                                                                            "3.0 GiB"]


@pytest.mark.system
def test_make_clean_demo_removes_only_the_demo(tmp_path):
    for path in ("results/demo/smoke/baseline/seed0", "data/sample", "results/other", "data/other"):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "f").write_text("x")
    out = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-C", str(tmp_path), "clean-demo"],
                         capture_output=True, text=True, check=True).stdout
    assert "removing results/demo" in out and "removing data/sample" in out
    assert not (tmp_path / "results/demo").exists() and not (tmp_path / "data/sample").exists()
    assert (tmp_path / "results/other/f").exists() and (tmp_path / "data/other/f").exists()


# ------------------------------------------------------------------ symbolic links: clean stays inside --results
def _outside_run(tmp_path: Path, name: str) -> Path:
    """A complete finished run outside the results folder (what a link may lead to)."""
    target = tmp_path / "elsewhere" / name
    make_run(target, {"status": "completed", "val_loss": 7.5})
    return target


def _clean_both_ways(exp_file: Path, results: Path, capsys) -> tuple[str, str]:
    """The output of a dry run, then of a real run, through the CLI."""
    assert main(["clean", str(exp_file), "--results", str(results), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert main(["clean", str(exp_file), "--results", str(results)]) == 0
    return dry, capsys.readouterr().out


def _assert_link_skipped(out: str, link: Path, target: Path) -> None:
    assert f"skipped {link}: a symbolic link (to {target})" in out, out
    assert "never follows links out of the results folder" in out
    assert not any(line.startswith(("would remove", "removed")) and (str(target) in line or str(link) in line)
                   for line in out.splitlines()), out


@pytest.mark.unit
def test_symlinked_checkpoints_are_skipped_and_their_target_survives(store, tmp_path, capsys):
    exp_file, results, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"
    target = _outside_run(tmp_path, "ckpt") / "checkpoints"
    shutil.rmtree(folder / "checkpoints")
    (folder / "checkpoints").symlink_to(target, target_is_directory=True)
    before = snapshot(target)
    dry, real = _clean_both_ways(exp_file, results, capsys)
    for out in (dry, real):
        _assert_link_skipped(out, folder / "checkpoints", target)
    assert snapshot(target) == before and {"state.pt", ".state.pt.abc.tmp"} <= set(before)
    assert (folder / "checkpoints").is_symlink()
    assert not (folder / ".summary.json.abc.tmp").exists()  # the run folder itself is still cleaned


@pytest.mark.unit
def test_symlinked_run_folder_is_skipped_and_its_target_survives(store, tmp_path, capsys):
    exp_file, results, root, _ = store
    folder = root / "smoke" / "sink-logit" / "seed2"
    target = _outside_run(tmp_path, "run")
    shutil.rmtree(folder)
    folder.symlink_to(target, target_is_directory=True)
    before = snapshot(target)
    dry, real = _clean_both_ways(exp_file, results, capsys)
    for out in (dry, real):
        _assert_link_skipped(out, folder, target)
    assert snapshot(target) == before and folder.is_symlink()


@pytest.mark.unit
@pytest.mark.parametrize("linked", ["tier", "arm"])
def test_symlinked_tier_or_arm_folder_is_skipped_with_its_runs_and_aside_folders(store, tmp_path, capsys, linked):
    exp_file, results, root, _ = store
    folder = root / "smoke" if linked == "tier" else root / "smoke" / "sink-logit"
    target = tmp_path / "elsewhere" / linked
    target.parent.mkdir()
    shutil.move(str(folder), str(target))  # the lock of the running run goes with it: its folder is not here
    folder.symlink_to(target, target_is_directory=True)
    aside = target / ("sink-logit" if linked == "tier" else "") / "seed0.old-x"
    make_run(aside, {"status": "completed", "val_loss": 7.5})
    before = snapshot(target)
    assert main(["clean", str(exp_file), "--results", str(results), "--aside", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert main(["clean", str(exp_file), "--results", str(results), "--aside"]) == 0
    real = capsys.readouterr().out
    for out in (dry, real):
        _assert_link_skipped(out, folder, target)
        assert out.count(f"skipped {folder}:") == 1  # one line for the link, not one per run behind it
    assert snapshot(target) == before


@pytest.mark.unit
def test_symlinked_state_tmp_report_and_aside_are_skipped_and_kept(store, tmp_path, capsys):
    exp_file, results, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"  # completed with weights: its real state.pt would go
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    links = {folder / "checkpoints" / "state.pt": outside / "state.pt",
             folder / "checkpoints" / ".model.pt.x.tmp": outside / "precious.bin",
             folder / ".config.json.y.tmp": outside / "notes.txt",
             root / "report": outside / "report",
             root / "smoke" / "baseline" / "seed1.old-z": outside / "aside"}
    for link, target in links.items():
        if target.name in ("report", "aside"):
            make_run(target, {"status": "completed", "val_loss": 7.5})
        else:
            target.write_bytes(b"keep me")
        if link.exists():
            shutil.rmtree(link) if link.is_dir() else link.unlink()
        link.symlink_to(target)
    before = snapshot(outside)
    assert main(["clean", str(exp_file), "--results", str(results), "--aside", "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert main(["clean", str(exp_file), "--results", str(results), "--aside"]) == 0
    real = capsys.readouterr().out
    for out in (dry, real):
        for link, target in links.items():
            _assert_link_skipped(out, link, target)
    assert snapshot(outside) == before
    assert all(link.is_symlink() for link in links)  # the links themselves are left too
    assert not (root / "smoke" / "baseline" / "seed0.old-20250101-000000-000000").exists()  # a real one goes


@pytest.mark.unit
def test_symlinked_model_pt_does_not_count_as_final_weights(store, tmp_path):
    _, _, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"
    (tmp_path / "model.pt").write_bytes(b"m")
    (folder / "checkpoints" / "model.pt").unlink()
    (folder / "checkpoints" / "model.pt").symlink_to(tmp_path / "model.pt")
    clean(root)
    assert (folder / "checkpoints" / "state.pt").is_file()  # the only weights that surely belong to the run


@pytest.mark.unit
def test_symlinked_experiment_folder_is_refused_in_one_line(store, tmp_path, capsys):
    exp_file, results, root, _ = store
    moved = tmp_path / "elsewhere" / "cleanme"
    moved.parent.mkdir()
    shutil.move(str(root), str(moved))
    root.symlink_to(moved, target_is_directory=True)
    before = snapshot(moved)
    assert main(["clean", str(exp_file), "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{root} is a symbolic link (to {moved})" in err and "--results" in err
    assert snapshot(moved) == before


@pytest.mark.unit
def test_a_folder_swapped_for_a_link_after_judging_is_left_alone(store, tmp_path, monkeypatch):
    from ablate import clean as clean_module

    _, _, root, _ = store
    folder = root / "smoke" / "baseline" / "seed0"
    target = _outside_run(tmp_path, "swap") / "checkpoints"
    judge = clean_module.run_items

    def judge_then_swap(run_folder):
        judged = judge(run_folder)
        if run_folder == folder:  # between the judgement and the removal, checkpoints/ becomes a link
            shutil.rmtree(folder / "checkpoints")
            (folder / "checkpoints").symlink_to(target, target_is_directory=True)
        return judged

    monkeypatch.setattr(clean_module, "run_items", judge_then_swap)
    before = snapshot(target)
    result = clean(root)
    assert snapshot(target) == before
    assert (folder / "checkpoints", clean_module.link_reason(folder / "checkpoints")) in result.skipped
    assert not any(item.path.is_relative_to(folder / "checkpoints") for item in result.removed)


@pytest.mark.unit
def test_an_lr_sweep_run_kept_aside_is_listed_and_removed_with_aside(store):
    """`--force` on a sweep run (<tier>/<arm>/lr<f>/seed<k>) keeps it aside beside its run: clean sees it too."""
    _, _, root, _ = store
    sweep_aside = root / "smoke" / "baseline" / "lr0.5" / "seed1000.old-20250101-000000-000000"
    make_run(sweep_aside, {"status": "completed", "val_loss": 7.5})
    listed = clean(root, dry_run=True)
    assert sweep_aside in {item.path for item in listed.kept_aside}
    assert sweep_aside.exists()
    assert sweep_aside not in {item.path for item in clean(root, arms=["sink-logit"], aside=True).removed}
    assert sweep_aside.exists()  # the arm filter reads the arm above the lr folder
    removed = clean(root, aside=True)
    assert sweep_aside in {item.path for item in removed.removed} and not sweep_aside.exists()
