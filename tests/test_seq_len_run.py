"""`ablate run --seq-len`: a run at a sequence length other than its tier's is a run of its own (the length joins
its folder key, as an LR sweep's factor does), trained at that length; the tier's own length is the tier's run."""

import json

import pytest
import torch

from ablate.errors import AblateError
from ablate.store import read_json, run_dir, run_key, run_of
from datafix import ablate_cli

torch.set_num_threads(1)


def _args(results, data, *extra):
    return ["run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "2", "--data", data, "--no-progress",
            "--threads", "1", "--results", results, *extra]


@pytest.mark.run
def test_a_swept_length_is_its_own_run_trained_at_that_length(tmp_path, sample_data):
    for length in (32, 64):  # 64 is the smoke tier's own length: the tier's run
        out = ablate_cli(*_args(tmp_path, sample_data, "--seq-len", length), timeout=300)
        assert json.loads(out.stdout)["status"] == "completed"
    swept = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0, seq_len=32)
    plain = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0)
    assert swept == tmp_path / "adhoc" / "smoke" / "baseline" / "T32" / "seed0"
    assert read_json(swept / "config.json")["seq_len"] == 32
    assert read_json(swept / "config.json")["model"]["max_seq_len"] == 32
    assert read_json(plain / "config.json")["seq_len"] == 64
    assert sorted(p.parent.relative_to(tmp_path).as_posix() for p in tmp_path.glob("**/summary.json")) == [
        "adhoc/smoke/baseline/T32/seed0", "adhoc/smoke/baseline/seed0"]


@pytest.mark.unit
def test_the_length_folder_reads_back_and_stays_out_of_the_grid(tmp_path):
    folder = run_dir(tmp_path, "study", "10M", "softcap", 2, seq_len=4096)
    assert folder.relative_to(tmp_path).as_posix() == "study/10M/softcap/T4096/seed2"
    name = run_of(folder)
    assert (name.experiment, name.tier, name.arm, name.seed, name.seq_len, name.lr_factor) == (
        "study", "10M", "softcap", 2, 4096, None)
    both = run_dir(tmp_path, "study", "10M", "softcap", 1, lr_factor=0.5, seq_len=2048)
    assert run_of(both).key == "10M/softcap/T2048/lr0.5/seed1" == run_key("10M", "softcap", 1, 0.5, 2048)
    assert run_of(run_dir(tmp_path, "study", "10M", "softcap", 0)).seq_len is None
    from ablate.store import iter_run_dirs
    (folder / "summary.json").parent.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    assert list(iter_run_dirs(tmp_path / "study")) == []  # a swept length is not a seed of the grid


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, -3])
def test_a_bad_length_is_one_line(tmp_path, bad):
    with pytest.raises(AblateError, match="sequence length"):
        run_dir(tmp_path, "study", "10M", "baseline", 0, seq_len=bad)
