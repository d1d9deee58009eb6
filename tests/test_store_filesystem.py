"""The store against its filesystem, with no training: probes tied to the weights they read, a results folder
that is a dangling link, a full disk, names longer than the filesystem allows."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ablate.analysis.probes import summarise_injections, summarise_probes
from ablate.cli import main
from ablate.errors import AblateError, DiskFull
from ablate.lock import FileLock, LockHeld
from ablate.model import GPT
from ablate.modelio import load_model, save_model
from ablate.probes.diagnostics import PROBE_FILE, probe_run
from ablate.probes.injection import INJECT_FILE, Sweep, inject_run
from ablate.store import (NAME_ROOM, atomic_write_json, check_name, file_sha256, name_max, read_json, run_dir,
                          run_lock_path)
from test_probes_cli import make_run

SMALL = {"n_batches": 1, "batch_size": 4}


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("ablate: error:")]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ 3. probes and injections tied to the weights
def _replace_weights(folder: Path, seed: int) -> None:
    """What `ablate run --force` leaves: other final weights in the same folder."""
    model = load_model(folder / "checkpoints" / "model.pt")
    other = GPT(model.config)
    other.init_weights(seed)
    save_model(other, folder / "checkpoints" / "model.pt")


@pytest.mark.unit
def test_probe_and_inject_record_the_weights_and_readers_leave_stale_files_out(tmp_path):
    folder = make_run(tmp_path, "sink-logit", 0)
    probe_run(folder, **SMALL)
    inject_run(folder, Sweep(eps=(0.4,), junk=("gaussian",)), **SMALL)
    weights = file_sha256(folder / "checkpoints" / "model.pt")
    assert (read_json(folder / PROBE_FILE)["weights_sha256"] == read_json(folder / INJECT_FILE)["weights_sha256"]
            == weights)
    assert "| tiny | sink-logit | 1 |" in summarise_probes(tmp_path) and "Left out" not in summarise_probes(tmp_path)
    assert "gaussian" in summarise_injections(tmp_path)
    _replace_weights(folder, 7)  # the run replaced after its probe: the files describe weights that are gone
    for text, name in ((summarise_probes(tmp_path), PROBE_FILE), (summarise_injections(tmp_path), INJECT_FILE)):
        assert "| tiny | sink-logit |" not in text and "gaussian" not in text
        assert f"Left out: 1 {name} not of their run's final weights" in text and str(folder) in text
    # a file written before the hash was kept names none: stale too
    data = read_json(folder / PROBE_FILE)
    data.pop("weights_sha256")
    atomic_write_json(folder / PROBE_FILE, data)
    assert "Left out: 1 probe.json" in summarise_probes(tmp_path)


@pytest.mark.unit
def test_probe_and_inject_hold_the_run_lock_while_they_work(tmp_path):
    folder = make_run(tmp_path, "baseline", 0)
    with FileLock(run_lock_path(folder), what="run (training)"):  # e.g. `ablate run --force` replacing it
        with pytest.raises(LockHeld):
            probe_run(folder, **SMALL)
        with pytest.raises(LockHeld):
            inject_run(folder, Sweep(eps=(0.4,), junk=("gaussian",)), **SMALL)
    assert not (folder / PROBE_FILE).exists() and not (folder / INJECT_FILE).exists()
    seen = []
    import ablate.probes.diagnostics as diagnostics

    real = diagnostics.probe_model

    def probe_model(*args, **kwargs):
        seen.append(run_lock_path(folder).is_file())  # the lock is held while the probe computes
        return real(*args, **kwargs)

    diagnostics.probe_model = probe_model
    try:
        probe_run(folder, **SMALL)
    finally:
        diagnostics.probe_model = real
    assert seen == [True] and not run_lock_path(folder).exists()


@pytest.mark.unit
def test_damaged_foreign_or_replaced_weights_are_one_line(tmp_path, capsys):
    folder = make_run(tmp_path, "baseline", 0)
    args = ["--batches", "1", "--batch-size", "4", "--device", "cpu"]
    weights = folder / "checkpoints" / "model.pt"
    weights.write_bytes(b"not a torch file")
    assert main(["probe", str(folder), *args]) == 2
    assert "is damaged or is not weights ablate saved" in _one_line_error(capsys)
    import torch

    torch.save({"state_dict": {}}, weights)  # a torch file, but not ablate's
    assert main(["inject", str(folder), *args]) == 2
    assert "is damaged or is not weights ablate saved" in _one_line_error(capsys)
    other = make_run(tmp_path / "elsewhere", "sink-logit", 1)  # another run's weights copied in
    weights.write_bytes((other / "checkpoints" / "model.pt").read_bytes())
    assert main(["probe", str(folder), *args]) == 2
    assert "holds another model than the run's config.json" in _one_line_error(capsys)
    # a run whose summary keeps the hash of its weights: other bytes are refused before anything loads
    original = make_run(tmp_path / "kept", "baseline", 0)
    atomic_write_json(original / "summary.json", {"status": "completed", "val_loss": 4.0,
                                                  "weights_sha256": file_sha256(original / "checkpoints" / "model.pt")})
    _replace_weights(original, 3)
    assert main(["probe", str(original), *args]) == 2
    assert "is not the weights the run completed with" in _one_line_error(capsys)
    assert not (original / PROBE_FILE).exists()


# ------------------------------------------------------------------ 8. a results folder that is a dangling link
@pytest.mark.unit
def test_a_results_folder_that_is_a_dangling_link_is_one_line_in_run_submit_and_status(tmp_path, sample_data,
                                                                                     capsys):
    link = tmp_path / "scratch"
    link.symlink_to(tmp_path / "not-mounted")
    experiment = tmp_path / "linked.py"
    experiment.write_text("from ablate.experiment import Experiment\n"
                          "EXPERIMENT = Experiment(name='linked', tiers=('smoke',), arms=('baseline',), seeds=1)\n")
    for argv in (["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "1", "--results", str(link)],
                 ["submit", str(experiment), "--executor", "local", "--data", str(sample_data), "--results", str(link)],
                 ["status", str(experiment), "--results", str(link)],
                 ["status", "adhoc", "--results", str(link / "deeper")]):
        assert main(argv) == 2, argv
        line = _one_line_error(capsys)
        assert "is a symbolic link to" in line and "not-mounted" in line and "does not exist" in line, line
    assert not (tmp_path / "not-mounted").exists()  # nothing created through the link


# ------------------------------------------------------------------ 9. a full disk
def _fsync_failing_for(fragment: str):
    real = os.fsync

    def fsync(fd):
        if fragment in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    return fsync


@pytest.mark.unit
def test_a_full_disk_is_one_line_naming_the_file_and_nothing_is_lost(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    atomic_write_json(target, {"before": 1})
    monkeypatch.setattr(os, "fsync", _fsync_failing_for(".summary.json."))
    with pytest.raises(DiskFull) as caught:
        atomic_write_json(target, {"after": 2})
    message = str(caught.value)
    assert message.startswith("No space left on device writing ") and str(target) in message
    assert "nothing lost; rerun the same command once there is space" in message
    assert read_json(target) == {"before": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    # the lock: no torn lock file is left to refuse the rerun
    monkeypatch.setattr(os, "fsync", _fsync_failing_for(".seed0.lock"))
    with pytest.raises(DiskFull, match=r"\.seed0\.lock"):
        FileLock(tmp_path / ".seed0.lock").acquire()
    assert not (tmp_path / ".seed0.lock").exists()


@pytest.mark.run
def test_a_full_disk_during_a_run_is_one_line_and_the_same_command_then_completes(tmp_path, sample_data, capsys,
                                                                                   monkeypatch):
    argv = ["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "2", "--data", str(sample_data),
            "--no-progress", "--threads", "1", "--results", str(tmp_path)]
    monkeypatch.setattr(os, "fsync", _fsync_failing_for(".model.pt."))  # the final weights cannot be written
    assert main(argv) == 2
    line = _one_line_error(capsys)
    assert "No space left on device writing" in line and "model.pt" in line and "rerun the same command" in line
    monkeypatch.undo()
    assert main(argv) == 0
    assert read_json(run_dir(tmp_path, "adhoc", "smoke", "baseline", 0) / "summary.json")["status"] == "completed"


# ------------------------------------------------------------------ 10. names bounded by the filesystem
@pytest.mark.unit
def test_names_are_bounded_by_the_filesystems_limit_with_room_for_what_ablate_adds(tmp_path, capsys):
    longest = name_max() - NAME_ROOM
    assert check_name("tier", "t" * longest) == "t" * longest
    (tmp_path / f"eval-{'t' * longest}").mkdir()  # the longest name fits, with what ablate adds to it
    (tmp_path / f"{'t' * longest}.py").write_text("")
    with pytest.raises(AblateError, match=rf"at most {longest} characters"):
        check_name("experiment", "e" * (longest + 1))
    assert main(["run", "--experiment", "x" * 300, "--tier", "smoke", "--arm", "baseline", "--max-steps", "1",
                 "--results", str(tmp_path)]) == 2
    line = _one_line_error(capsys)
    assert "invalid experiment name" in line and "300 characters" in line
