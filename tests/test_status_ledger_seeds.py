"""status, clean, eval and the resume hints see every seed a sequential design queued; the results and data
defaults are the checkout's from any folder, and a results folder without the experiment says which it read;
a mid-run val_loss is marked as such; a user's own cluster profiles stay out of git."""

import argparse
import json
import shlex
import subprocess

import pytest

from ablate.cli.evals import _targets
from ablate.config import resolve_config
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.paths import default_results
from ablate.power import sequential_design
from ablate.sequential import SEQUENTIAL
from ablate.store import LedgerEntry, record_ledger
from analysis_fixtures import write_run
from datafix import REPO, ablate_cli

EXPERIMENT = """from ablate.experiment import Comparison, Experiment
EXPERIMENT = Experiment(name='seqs', tiers=['smoke'], arms=['baseline', 'sink-logit'], seeds=2,
    hypotheses=[Comparison('sink', 'sink-logit', 'baseline')], overrides={{'data_dir': {data!r}}})
"""


def _sequential_store(tmp_path, data):
    """Looks at 2 and 4 seeds, both queued: seeds 0–3 of both arms, sink-logit seed 3 stopped mid-run."""
    file = tmp_path / "seqs.py"
    file.write_text(EXPERIMENT.format(data=str(data)))
    results = tmp_path / "results"
    record = {"kind": SEQUENTIAL, "design": sequential_design(0.05, 1, 2, 4), "looks": 2, "max_seeds": 4,
              "alpha": 0.05, "family": "tier", "comparisons": [["sink", "sink-logit", "baseline"]]}
    entries = {}
    for arm in ("baseline", "sink-logit"):
        for seed in range(4):
            stopped = arm == "sink-logit" and seed == 3
            write_run(results, "seqs", "smoke", arm, seed, 3.2 if stopped else 3.5 - 0.01 * seed,
                      status="running" if stopped else "completed")
            entries[f"smoke/{arm}/seed{seed}"] = LedgerEntry("local", interrupted=stopped,
                                                             exit_code=None if stopped else 0)
    record_ledger(results / "seqs", {}, record)
    record_ledger(results / "seqs", entries, {"executor": "local", "runs": list(entries)})
    return file, results


@pytest.mark.system
def test_status_clean_eval_and_the_hint_count_the_seeds_a_sequential_design_queued(tmp_path, sample_data, capsys):
    file, results = _sequential_store(tmp_path, sample_data)
    rows = json.loads(ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]
    assert sorted((r["arm"], r["seed"]) for r in rows) == [(a, s) for a in ("baseline", "sink-logit") for s in range(4)]
    assert sum(r["state"] == "completed" for r in rows) == 7
    shown = ablate_cli("status", file, "--results", results).stdout
    assert "completed: 7  cancelled: 1  (total 8)" in shown
    cleaned = ablate_cli("clean", file, "--results", results, "--seeds", "3", "--dry-run", check=False, process=True)
    assert cleaned.returncode == 0, cleaned.stderr  # seed 3 is a seed of the experiment now
    args = argparse.Namespace(target=str(file), tiers=None, arms=None, seeds=None, results=str(results))
    with pytest.raises(AblateError, match="no completed run"):  # these fixture runs keep no final weights
        _targets(args)
    looked_at = [line for line in capsys.readouterr().out.splitlines() if line.startswith("skipped smoke/")]
    assert len(looked_at) == 8 and "skipped smoke/sink-logit/seed3: running" in looked_at  # eval: seeds 2, 3 too
    # the hint status prints resumes exactly the stopped run: its dry run lists it and nothing else
    hint = next(line for line in shown.splitlines() if line.startswith("cancelled runs resume"))
    command = shlex.split(hint.split("`")[1])
    assert command[:2] == ["ablate", "submit"] and "--executor" in command and "local" in command, hint
    preview = ablate_cli(*command[1:], "--dry-run")
    listed = [line.strip() for line in preview.stdout.splitlines() if line.startswith("  ")]
    assert listed == ["smoke/sink-logit/seed3"], preview.stdout


@pytest.mark.unit
def test_a_mid_run_val_loss_is_marked_and_a_final_one_is_not(tmp_path, sample_data):
    file, results = _sequential_store(tmp_path, sample_data)
    rows = {(r["arm"], r["seed"]): r for r in json.loads(
        ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]}
    assert rows[("sink-logit", 3)]["val_loss_final"] is False and rows[("baseline", 3)]["val_loss_final"] is True
    lines = ablate_cli("status", file, "--results", results).stdout.splitlines()
    stopped = next(line for line in lines if "sink-logit" in line and line.split()[2] == "3")
    done = next(line for line in lines if "baseline" in line and line.split()[2] == "3")
    assert stopped.rstrip().endswith("3.2000~") and done.rstrip().endswith("3.4700")
    assert any(line.startswith("~ a mid-run val_loss") for line in lines)


@pytest.mark.unit
def test_the_results_and_data_defaults_are_the_checkout_s_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("ABLATE_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_results() == REPO / "results"
    config = resolve_config(RunSpec("x", "smoke", "baseline", 0)).to_dict()
    assert config["data_dir"] == str((REPO / "data" / "sample").resolve())
    env = {"ABLATE_RESULTS": ""}
    here = ablate_cli("status", "demo", cwd=tmp_path, env=env, check=False)
    there = ablate_cli("status", "demo", cwd=REPO, env=env, check=False)
    assert (here.stdout, here.stderr) == (there.stdout, there.stderr)  # the same folder, whichever folder it runs in
    if not (REPO / "results" / "demo").is_dir():
        assert f"has no runs under {str((REPO / 'results').resolve())!r}" in here.stderr


@pytest.mark.unit
def test_a_results_folder_without_the_experiment_says_which_folder_it_read(tmp_path):
    typo = tmp_path / "reslts"
    typo.mkdir()
    shown = ablate_cli("status", "demo", "--results", "reslts", cwd=tmp_path, check=False)
    assert shown.returncode == 2 and shown.stdout == ""
    assert f"experiment 'demo' has no runs under {str(typo)!r} (looked for {str(typo / 'demo')!r})" in shown.stderr
    assert "--results" in shown.stderr and "$ABLATE_RESULTS" in shown.stderr


@pytest.mark.system
def test_own_cluster_profiles_are_ignored_by_git_and_the_shipped_examples_are_not():
    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0

    assert ignored("slurm/mycluster.toml") and ignored("slurm/gpu-a100.toml")
    assert not ignored("slurm/example.toml") and not ignored("slurm/local.toml")
