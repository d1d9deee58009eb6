"""Every counted run of a row trained on the same data, and with the configuration its config.json says.

* data: summary.json's `data_id` (the split's shard checksums, what `ablate.data.shards.TokenShards` gives
  training) must agree across the seeds of a row; the folder's path may differ, the content may not;
* configuration: config.json is recomputed into its fingerprint and compared with summary.json's
  `config_fingerprint` (what the run trained with) by the tables, the report and status: a hand-edited
  config.json is a damaged run, never a 3-step run that trained 2 steps.

Store runs are hand-written (tests/analysis_fixtures.py, no training); the data folders are real prepared ones.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from ablate.analysis.load import load_runs
from ablate.cli import main
from ablate.data.shards import MANIFEST, TokenShards
from ablate.errors import AblateError
from ablate.status import folder_runs, status
from analysis_fixtures import write_run

pytestmark = pytest.mark.unit


def other_prepared_folder(source, target):
    """A copy of a prepared folder whose train tokens are reversed (a consistent manifest: other content)."""
    shutil.copytree(source, target)
    manifest = json.loads((target / MANIFEST).read_text())
    for shard in manifest["splits"]["train"]["shards"]:
        path = target / shard["file"]
        tokens = np.fromfile(path, dtype="<u2")[::-1].copy()
        tokens.tofile(path)
        shard["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (target / MANIFEST).write_text(json.dumps(manifest))
    return target


def write_pairs(results, data_of_seed, experiment="ident"):
    for seed, data_dir in enumerate(data_of_seed):
        data_id = TokenShards(data_dir, split="train").fingerprint  # what training records as data_id
        for arm, loss in (("baseline", 3.50 + 0.01 * seed), ("sink-logit", 3.49 + 0.01 * seed)):
            write_run(results, experiment, "10M", arm, seed, loss, curve_points=2, data_id=data_id,
                      data_dir=str(data_dir))
    return results / experiment


def test_seeds_trained_on_different_prepared_data_are_never_averaged(tmp_path, sample_data, capsys):
    other = other_prepared_folder(sample_data, tmp_path / "other")
    ids = [TokenShards(d, split="train").fingerprint for d in (sample_data, other)]
    assert ids[0] != ids[1]
    folder = write_pairs(tmp_path / "results", [sample_data, other])
    with pytest.raises(AblateError) as err:
        load_runs(folder)
    message = str(err.value)
    assert "data_id" in message and "different prepared data" in message
    assert "baseline/seed0" in message and "seed1" in message
    assert ids[0][:12] in message and ids[1][:12] in message
    assert main(["table", str(folder)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "data_id" in out.err


def test_the_same_data_in_another_folder_is_the_same_data(tmp_path, sample_data):
    copy = tmp_path / "copy"
    shutil.copytree(sample_data, copy)  # same shards, another path: data_dir is where they lay, not what they are
    runs = load_runs(write_pairs(tmp_path / "results", [sample_data, copy]))
    assert runs.completed.height == 4


def edit_steps(run_folder, steps):
    config = json.loads((run_folder / "config.json").read_text())
    config["steps"] = steps
    (run_folder / "config.json").write_text(json.dumps(config))


def test_a_hand_edited_config_is_refused_by_the_tables_and_damaged_in_status(tmp_path, capsys):
    folders = {}
    for seed in (0, 1):
        for arm, loss in (("baseline", 3.50 + 0.01 * seed), ("sink-logit", 3.49 + 0.01 * seed)):
            folders[arm, seed] = write_run(tmp_path, "edited", "10M", arm, seed, loss, curve_points=2)
    assert load_runs(tmp_path / "edited").completed.height == 4  # the fixture's files agree, as training's do
    for arm in ("baseline", "sink-logit"):  # "steps": 1000 → 3 in both runs of seed 1: they still agree as a pair
        edit_steps(folders[arm, 1], 3)
    with pytest.raises(AblateError, match=r"edited/10M/baseline/seed1 is damaged: its config.json is not the "
                                          r"configuration it trained with"):
        load_runs(tmp_path / "edited")
    assert main(["table", str(tmp_path / "edited")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "baseline/seed1 is damaged" in err
    assert main(["report", str(tmp_path / "edited")]) == 2
    assert "is damaged: its config.json" in capsys.readouterr().err
    rows = {(r.arm, r.seed): r for r in status("edited", tmp_path, folder_runs(tmp_path, "edited"))}
    assert rows["baseline", 1].state == "damaged" and rows["sink-logit", 1].state == "damaged"
    assert "not the configuration it trained with" in rows["baseline", 1].error
    assert rows["baseline", 0].state == "completed"


def test_a_run_without_a_config_fingerprint_is_unverified_not_damaged(tmp_path):
    """Older runs (no config_fingerprint): nothing to compare; the tables refuse them as unverified."""
    for arm in ("baseline", "sink-logit"):
        write_run(tmp_path, "old", "10M", arm, 0, 3.5, curve_points=2, config_fingerprint=None)
    with pytest.raises(AblateError, match="no config_fingerprint"):
        load_runs(tmp_path / "old")
    assert load_runs(tmp_path / "old", allow_unverified=True).frame["verified"].to_list() == [False, False]
    assert {r.state for r in status("old", tmp_path, folder_runs(tmp_path, "old"))} == {"completed"}
