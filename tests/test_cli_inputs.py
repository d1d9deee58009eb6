"""What a new user trips over in the first hour: an arm in its own module, list options, status filters and
ad-hoc runs, parameter counts at an experiment's tiers, and what `ablate clean` keeps."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path


from ablate.cli import build_parser, main
from ablate.lock import FileLock
from ablate.store import run_lock_path
from ablate.tiers import get_tier
from datafix import ablate_cli
import pytest

GATE_MODULE = textwrap.dedent("""
    import torch
    from torch import nn
    from ablate.arms import Arm, register_arm

    @register_arm("first-hour-gate")
    class FirstHourGate(Arm):
        description = "one learned scalar gate per head on the reads (test)"
        no_weight_decay = frozenset({"gate_logit"})
        def __init__(self, ctx):
            super().__init__(ctx)
            self.gate_logit = nn.Parameter(torch.empty(ctx.n_kv_head))
        def value_gate(self, v, x):
            return torch.sigmoid(self.gate_logit).view(1, -1, 1, 1)
        def init_parameter(self, name, param, generator):
            nn.init.constant_(param, 4.0)
""")
EXPERIMENT = textwrap.dedent("""
    from first_hour_gate import FirstHourGate  # a module beside this file
    from ablate.experiment import Experiment

    EXPERIMENT = Experiment(name="first_hour", tiers=("smoke",), arms=("first-hour-gate",), seeds=1,
                            overrides={"max_steps": 2})
""")


def experiments_folder(tmp_path: Path) -> Path:
    """An experiments-like folder: the experiment file and the module it imports, side by side."""
    folder = tmp_path / "my_experiments"
    folder.mkdir()
    (folder / "first_hour_gate.py").write_text(GATE_MODULE)
    (folder / "first_hour.py").write_text(EXPERIMENT)
    return folder / "first_hour.py"


# ---------------------------------------------------------------------------------------------- 1. imports
@pytest.mark.unit
def test_an_experiment_file_imports_a_module_beside_it(tmp_path, capsys, monkeypatch):
    path = experiments_folder(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the experiment's folder: the import must not rely on the working folder
    path_before = list(sys.path)
    assert main(["arms", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    smoke = get_tier("smoke")  # one gate per key/value head and layer
    assert [(r["tier"], r["arm"], r["extra_params_per_layer"], r["extra_params_total"]) for r in rows] == [
        ("smoke", "first-hour-gate", smoke.n_kv_head, smoke.n_kv_head * smoke.n_layer)]
    assert sys.path == path_before  # the folder is on the import path only while the file loads
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(r["arm"], r["params_arm_extra"]) for r in plan["runs"]] == [
        ("first-hour-gate", rows[0]["extra_params_total"])]


@pytest.mark.system
def test_a_local_submit_trains_an_arm_from_a_module_beside_the_experiment(tmp_path, sample_data):
    """The local worker processes re-import the experiment file (as a SLURM task does): the module beside it
    is found there too, from a working folder that is not the experiment's."""
    path = experiments_folder(tmp_path)
    path.write_text(EXPERIMENT.replace('"max_steps": 2', '"max_steps": 2, "val_tokens": 512, "final_val_tokens": 512'))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    results = tmp_path / "results"
    ablate_cli("submit", path, "--executor", "local", "--parallel", "1", "--data", sample_data, "--results", results,
               cwd=cwd)
    status = json.loads(ablate_cli("status", path, "--results", results, "--json", cwd=cwd).stdout)
    assert [(r["arm"], r["state"], r["steps"]) for r in status["runs"]] == [("first-hour-gate", "completed", 2)]


@pytest.mark.unit
def test_a_failing_import_is_one_line_naming_the_file_and_the_module(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text("from no_such_gate_module import Gate\n")
    assert main(["arms", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(path) in err and "'no_such_gate_module'" in err and str(tmp_path) in err
    assert str(tmp_path) not in sys.path


# ---------------------------------------------------------------------------------------------- 2. lists
SCALAR_PLURALS = {  # plural names that hold one value: counts, a folder
    "tokens", "shard_tokens", "val_tokens", "workers", "max_steps", "results", "devices", "threads", "batches",
    "steps", "bootstrap_iters", "looks", "max_seeds"}  # looks, max_seeds: counts of a sequential design
SINGULAR_LISTS = {"eps", "junk", "source_arg"}  # list options whose name is not plural


def every_option(parser: argparse.ArgumentParser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_option(sub, (*path, name))
        elif action.option_strings and action.nargs != 0 and action.dest != "help":
            yield " ".join(path), action


@pytest.mark.unit
def test_every_list_option_takes_space_separated_values():
    lists, wrong = [], []
    for command, action in every_option(build_parser()):
        listlike = (action.dest.endswith("s") and action.dest not in SCALAR_PLURALS) or action.dest in SINGULAR_LISTS \
            or isinstance(action.default, (list, tuple)) or "comma" in (action.help or "")
        if listlike:
            lists.append(f"{command} {action.option_strings[0]}")
            if action.nargs not in ("+", "*") or "comma" in (action.help or ""):
                wrong.append(f"{command} {action.option_strings[0]} (nargs={action.nargs!r})")
    assert wrong == []
    assert {"inject --eps", "inject --junk", "status --tier", "status --arms",
            "status --seeds", "submit --seeds", "data prepare --source-arg"} <= set(lists)  # the walk saw them


def every_parser(parser: argparse.ArgumentParser, path: tuple = ()):
    """The parser and every subcommand's parser under it, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, path + (name,))


@pytest.mark.unit
def test_every_help_screen_prints(capsys):
    """`ablate --help` and each command's `--help` print their text and exit 0: a `%` in a help string (argparse
    expands `%(...)s`) broke the top-level screen once, through the table kinds' words."""
    seen = []
    for path, _ in every_parser(build_parser()):
        with pytest.raises(SystemExit) as stop:
            main([*path, "--help"])
        assert stop.value.code == 0, path
        assert "usage: ablate" in capsys.readouterr().out, path
        seen.append(" ".join(path))
    assert {"", "table", "submit", "data prepare"} <= set(seen)
    assert "25/50/75/100% of the budget" in " ".join(build_parser().format_help().split())


# ---------------------------------------------------------------------------------------------- 4. status
def fake_run(folder: Path, summary: dict | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def status_json(capsys, *args) -> dict:
    assert main(["status", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.unit
def test_an_option_typo_is_one_line_with_the_closest_option_of_the_command(capsys):
    assert main(["submit", "demo", "--excutor", "local"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "usage:" not in err
    assert "unrecognized arguments: --excutor local; --excutor: did you mean --executor?" in err
    assert main(["table", "demo", "--kindd", "paired", "--zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert "--kindd: did you mean --kind?" in err and "--zzzzzz: not an option of `ablate table`" in err


@pytest.mark.unit
def test_status_takes_the_filters_of_submit(tmp_path, capsys):
    (tmp_path / "demo").mkdir()  # the experiment's folder, before any of its runs
    rows = status_json(capsys, "demo", "--tier", "smoke", "--arms", "baseline", "sink-logit", "--seeds", "1",
                       "--results", tmp_path)["runs"]
    assert [(r["tier"], r["arm"], r["seed"], r["state"]) for r in rows] == [
        ("smoke", "baseline", 1, "not-submitted"), ("smoke", "sink-logit", 1, "not-submitted")]
    assert main(["status", "demo", "--tier", "10M", "--results", str(tmp_path)]) == 2
    assert "tier '10M' is not in experiment 'demo'; its tiers: smoke" in capsys.readouterr().err


@pytest.mark.unit
def test_status_adhoc_lists_the_run_folders_of_ablate_run(tmp_path, capsys):
    root = tmp_path / "adhoc"
    fake_run(root / "smoke" / "baseline" / "seed0", {"status": "completed", "val_loss": 7.25, "steps": 4,
                                                     "total_steps": 4})
    fake_run(root / "smoke" / "sink-logit" / "seed0", {"status": "running", "steps": 2, "total_steps": 4})
    live = fake_run(root / "10M" / "norm-gate" / "seed3", None)
    fake_run(root / "smoke" / "baseline" / "seed0.old-1", {"status": "completed", "val_loss": 9.0})  # kept aside
    with FileLock(run_lock_path(live), what="a live run"):
        rows = status_json(capsys, "adhoc", "--results", tmp_path)["runs"]
        assert [(r["tier"], r["arm"], r["seed"], r["state"]) for r in rows] == [
            ("10M", "norm-gate", 3, "running"), ("smoke", "baseline", 0, "completed"),
            ("smoke", "sink-logit", 0, "failed")]
        assert rows[1]["val_loss"] == 7.25 and "stopped without finishing" in rows[2]["error"]
    rows = status_json(capsys, "adhoc", "--results", tmp_path, "--tier", "smoke", "--arms", "sink-logit")["runs"]
    assert [(r["arm"], r["state"]) for r in rows] == [("sink-logit", "failed")]
    assert main(["status", "adhoc", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "completed: 1" in out and "the same `ablate run` command" in out and "ablate submit" not in out
    assert main(["status", "adhoc", "--results", str(tmp_path), "--tier", "124M"]) == 2
    err = capsys.readouterr().err
    assert "--tier 124M: no such run under" in err and "there: 10M, smoke" in err


@pytest.mark.unit
def test_status_on_a_folder_without_the_experiment_refuses_first_in_one_line_as_table_does(tmp_path, capsys):
    (tmp_path / "sink_vs_filter").mkdir()
    for command in ("status", "table"):
        assert main([command, "demo", "--results", str(tmp_path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, (command, out, err)
        assert (f"experiment 'demo' has no runs under {str(tmp_path.resolve())!r}" in err
                and "experiments with results there: sink_vs_filter" in err and "--results DIR" in err)
    assert main(["status", "demo", "--results", str(tmp_path), "--json"]) == 2
    assert capsys.readouterr().out == ""


@pytest.mark.unit
def test_status_without_runs_or_experiment_says_so(tmp_path, capsys):
    assert main(["status", "adhoc", "--results", str(tmp_path)]) == 2
    assert "no ad-hoc runs under" in capsys.readouterr().err
    assert main(["status", "no_such_thing", "--results", str(tmp_path)]) == 2
    assert "unknown experiment 'no_such_thing'; valid experiments:" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- 6. arms, clean
@pytest.mark.unit
def test_arms_counts_at_each_tier_of_the_experiment(capsys):
    assert main(["arms", "sink_vs_filter", "--json"]) == 0
    rows = {(r["tier"], r["arm"]): r for r in json.loads(capsys.readouterr().out)}
    assert rows["10M", "sink-logit"]["extra_params_per_layer"] == 5 and rows["350M", "sink-logit"]["n_head"] == 16
    assert rows["10M", "proj-gate"]["extra_params_per_layer"] == 325  # H(d+1) at d_model 320, not 768
    assert rows["124M", "proj-gate"]["extra_params_per_layer"] == 780 and rows["10M", "sink-token"]["d_model"] == 320
    assert main(["plan", "sink_vs_filter", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for run in plan["runs"]:  # the whole model's extra parameters, as `plan` counts them
        assert rows[run["tier"], run["arm"]]["extra_params_total"] == run["params_arm_extra"], run
    assert main(["arms", "sink_vs_filter"]) == 0
    out = capsys.readouterr().out
    assert "10M: d_model 320, 5 heads" in out and "350M: d_model 1024, 16 heads" in out
    assert main(["arms", "sink_vs_filter", "--d-model", "64", "--n-head", "2", "--json"]) == 0  # one given width
    assert {r["d_model"] for r in json.loads(capsys.readouterr().out)} == {64}


@pytest.mark.unit
def test_clean_says_what_it_kept_and_why_the_rest_remains(tmp_path, capsys):
    root = tmp_path / "demo" / "smoke"
    for arm in ("baseline", "sink-logit"):
        run = fake_run(root / arm / "seed0", {"status": "completed", "val_loss": 7.5})
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "model.pt").write_bytes(b"m" * 3000)
        (run / "checkpoints" / "state.pt").write_bytes(b"s" * 9000)
    assert main(["clean", "demo", "--results", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would keep the final weights of 2 run(s), 5.9 KiB" in out and "would remain:" in out
    assert main(["clean", "demo", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "total: freed 17.6 KiB in 2 item(s)" in out
    assert "kept the final weights of 2 run(s), 5.9 KiB" in out
    assert f"2.9 KiB  {root / 'baseline' / 'seed0' / 'checkpoints' / 'model.pt'}" in out
    remaining = next(line for line in out.splitlines() if line.startswith("remaining:"))
    records = sum(p.stat().st_size for p in root.rglob("*.json"))  # the configs and summaries
    assert "final weights 5.9 KiB" in remaining and f"records and logs {records} B" in remaining
    assert sorted(p.name for p in root.rglob("*.pt")) == ["model.pt", "model.pt"]
