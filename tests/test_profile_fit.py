"""A cluster profile against the cluster: sinfo's view of a partition, checked before anything is queued,
and sbatch's refusals as one line naming the profile setting behind them."""

from dataclasses import replace

import pytest
import submitit

from ablate.dispatch import map_array
from ablate.errors import AblateError
from ablate.profiles import (Profile, gpus_in_gres, load_profile, parse_sinfo, profile_misfits, sbatch_refusal,
                             slurm_minutes)
from datafix import REPO, ablate_cli

PROFILE = Profile("mycluster", partition="debug", gpus_per_run=0, cpus_per_run=1, mem_gb=2, time_min=20)


@pytest.mark.unit
def test_sinfo_lines_give_each_partition_s_most_per_node():
    text = ("debug*|(null)|20480|4|infinite\n"
            "gpu|gpu:a100:4(S:0-1),shard:8|512000|64|2-00:00:00\n"
            "gpu|gpu:h100:8(S:0-1)|1024000+|96+|1-12:00:00\n"
            "short|gpu:2|64000|16|30:00\n")
    assert parse_sinfo(text) == {
        "debug": {"gpus": 0, "mem_mb": 20480, "cpus": 4, "time_min": None, "default": True},
        "gpu": {"gpus": 8, "mem_mb": 1024000, "cpus": 96, "time_min": 2880, "default": False},
        "short": {"gpus": 2, "mem_mb": 64000, "cpus": 16, "time_min": 30, "default": False}}
    assert gpus_in_gres("(null)") == 0 and gpus_in_gres("gpu:tesla:2,mps:100") == 2
    assert [slurm_minutes(t)
            for t in ("45", "2:00:00", "1-12", "1-00:30:00", "UNLIMITED")] == [45, 120, 2160, 1470, None]


@pytest.mark.unit
def test_each_setting_the_partition_cannot_give_is_one_line_naming_it():
    debug = parse_sinfo("debug*|(null)|20480|4|1:00:00\n")
    assert profile_misfits(PROFILE, debug) == []
    too_much = replace(PROFILE, gpus_per_run=1, cpus_per_run=8, mem_gb=64, time_min=1440)
    misfits = profile_misfits(too_much, debug)
    assert [m.split(" =")[0] for m in misfits] == ["gpus_per_run", "cpus_per_run", "mem_gb", "time_min"]
    assert misfits[0].startswith("gpus_per_run = 1: partition 'debug' has no GPUs")
    assert "20480 MB" in misfits[2] and "60 minutes" in misfits[3]
    two = parse_sinfo("gpu|gpu:4|64000|8|infinite\ndebug*|(null)|20480|4|infinite\n")
    assert profile_misfits(replace(PROFILE, partition="", gpus_per_run=1), two)[0].startswith(
        "gpus_per_run = 1: partition 'debug'")  # no partition given: SLURM's default one
    assert profile_misfits(replace(PROFILE, partition="gpu"), debug) == [
        "partition = 'gpu': no such partition; partitions: debug"]


@pytest.mark.unit
@pytest.mark.parametrize("said, setting", [
    ("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification", "gpus_per_run = 1"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", "partition = 'gpu'"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "account = 'myproject'"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     "time_min = 1440"),
    ("sbatch: error: Memory specification can not be satisfied", "mem_gb = 64"),
    ("sbatch: error: Batch job submission failed: More processors requested than permitted", "cpus_per_run = 8"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", "qos = 'normal'"),
])
def test_an_sbatch_refusal_names_the_profile_setting_behind_it(said, setting):
    profile = replace(PROFILE, partition="gpu", account="myproject", qos="normal", gpus_per_run=1, cpus_per_run=8,
                      mem_gb=64, time_min=1440)
    line = sbatch_refusal(profile, said)
    assert f"check {setting} in profile 'mycluster'" in line and "\n" not in line
    assert said.rpartition("error: ")[2] in line


def _gpu_profile(tmp_path):
    (tmp_path / "slurm").mkdir()
    text = (REPO / "slurm" / "local.toml").read_text().replace("gpus_per_run = 0", "gpus_per_run = 1")
    assert "gpus_per_run = 1" in text
    path = tmp_path / "slurm" / "cpuonly.toml"
    path.write_text(text)
    return path


@pytest.mark.system
@pytest.mark.slurm
def test_a_gpu_profile_on_the_cpu_only_partition_is_refused_in_one_line_before_anything_is_queued(
        tmp_path, sample_data, slurm_cluster):
    profile = _gpu_profile(tmp_path)
    results = tmp_path / "results"
    args = ["submit", "demo", "--tier", "smoke", "--arms", "baseline", "--seeds", "0", "--data", sample_data,
            "--profile", profile, "--results", results]
    refused = ablate_cli(*args, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()], refused.stderr
    assert ("gpus_per_run = 1: partition 'debug' has no GPUs" in refused.stderr
            and "nothing was queued" in refused.stderr)
    assert not (results / "demo" / "ledger.json").exists() and not (results / "demo" / "slurm").exists()
    preview = ablate_cli(*args, "--dry-run")
    assert "1 of 1 runs would be submitted" in preview.stdout
    assert "a real submit refuses it: gpus_per_run = 1: partition 'debug' has no GPUs" in preview.stdout


@pytest.mark.system
@pytest.mark.slurm
def test_sbatch_s_own_refusal_is_one_line_naming_the_setting(tmp_path, slurm_cluster):
    """Past the sinfo check (a partition may change between the check and sbatch): the real sbatch refusal."""
    profile = load_profile(str(_gpu_profile(tmp_path)))
    executor = submitit.AutoExecutor(folder=tmp_path / "logs" / "%j", cluster="slurm")
    executor.update_parameters(slurm_partition="debug", timeout_min=5, gpus_per_node=1, mem_gb=1)
    with pytest.raises(AblateError) as refused:
        map_array(executor, print, [1], profile)
    line = str(refused.value)
    assert "\n" not in line and "gres" in line and "check gpus_per_run = 1 in profile 'cpuonly'" in line


@pytest.mark.unit
def test_a_toml_syntax_error_in_a_profile_is_one_line_naming_the_file_line_and_column(tmp_path):
    (tmp_path / "slurm").mkdir()
    profile = tmp_path / "slurm" / "half.toml"
    profile.write_text('partition = "debug"\naccount = "lab\ncpus_per_run = 2\n')  # one unclosed quote
    with pytest.raises(AblateError) as refused:
        load_profile(str(profile))
    assert str(refused.value).startswith(f"profile {profile}, line 2, column 15: not valid TOML (")
    shown = ablate_cli("plan", "demo", "--profile", "half", cwd=tmp_path, check=False)  # ./slurm first
    assert shown.returncode == 2 and "Traceback" not in shown.stderr and len(shown.stderr.strip().splitlines()) == 1
    assert "slurm/half.toml, line 2, column 15: not valid TOML" in shown.stderr
