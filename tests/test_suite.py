"""How the suite itself runs: every test in one tier (unit, run or system), the system tier's files first
(tests/conftest.py), `make test` running every tier and mark, and the `ablate` command in this process giving what
the real one gives (tests/datafix.py)."""

from __future__ import annotations

import json
import os
import re

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conftest import COLLECTED, TIER_ORDER, file_rank
from datafix import REPO, ablate_cli


@pytest.mark.unit
def test_the_tiers_are_registered_marks():
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [line.split(":")[0] for line in markers if line.split(":")[0] in TIER_ORDER] == list(TIER_ORDER)


@pytest.mark.unit
def test_every_collected_test_carries_exactly_one_tier(request):
    """unit (in this process, no training), run (trains in this process) or system (subprocesses, SLURM, several
    processes, kernel sets): none or two is a mistake to fix where the test is written."""
    collected = request.config.stash[COLLECTED]  # every test this session collected, those -m or -k left out too
    assert request.node.nodeid in collected
    wrong = {nodeid: tiers for nodeid, tiers in collected.items() if len(tiers) != 1}
    assert not wrong, f"each test needs exactly one of the marks {', '.join(TIER_ORDER)}: {wrong}"


@pytest.mark.unit
def test_this_session_runs_the_system_files_first_then_run_then_unit(request):
    """The hook in tests/conftest.py sorted this very session's items (each xdist worker collects them so): a
    file's tests stay together, and a file runs with the first tier any of its tests carries."""
    items = request.session.items
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    starts = [next(i for i, item in enumerate(items) if item.nodeid.startswith(name + "::")) for name in files]
    ends = [max(i for i, item in enumerate(items) if item.nodeid.startswith(name + "::")) for name in files]
    assert all(end - start + 1 == sum(item.nodeid.startswith(name + "::") for item in items)
               for name, start, end in zip(files, starts, ends))  # each file's tests together
    rank = file_rank(items)
    assert [rank[name] for name in files] == sorted(rank[name] for name in files)


@pytest.mark.unit
def test_make_test_hands_out_whole_files_in_the_collected_order_and_runs_every_tier_and_mark():
    makefile = (REPO / "Makefile").read_text()
    workers = re.search(r"^PYTEST_WORKERS := (.*)$", makefile, re.M).group(1).split()
    assert workers == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # xdist's count reorder: off
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    pytest_line = next(line for line in recipe.splitlines() if "pytest" in line)
    options = pytest_line.split(" pytest ", 1)[1]
    assert "$(PYTEST_WORKERS)" in options and "-m " not in options  # every tier, slow, slurm and benchmark run


@pytest.mark.unit
def test_every_test_file_that_runs_a_benchmark_script_marks_it():
    """`pytest -m benchmark` selects the tests that hold benchmarks/ scripts (still part of make test)."""
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        if re.search(r"REPO / \"benchmarks\"", text):
            assert "pytest.mark.benchmark" in text, path.name


# ---------------------------------------------------------------------------------------------- the command in-process
@pytest.mark.system
@pytest.mark.parametrize("args", [
    ("table", "TABLE", "--format", "json"),  # output on stdout
    ("table", "TABLE", "--metric", "nope"),  # a one-line error, exit 2
    ("submit", "nope"),  # an unknown experiment, with the valid ones
    ("run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "zero"),  # argparse's own exit 2
    ("status",),  # argparse: a required argument missing
], ids=["table", "table-error", "submit-error", "argparse-error", "missing-argument"])
def test_the_command_in_this_process_gives_what_the_real_one_gives(tmp_path, args):
    table = tmp_path / "t.csv"
    table.write_text("tier,arm,seed,val_loss\n10M,baseline,0,4.0\n10M,sink-logit,0,3.9\n")
    argv = [str(table) if a == "TABLE" else a for a in args] + ["--results", str(tmp_path / "r")]
    here = ablate_cli(*argv, check=False)
    there = ablate_cli(*argv, check=False, process=True)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)


@pytest.mark.unit
def test_the_command_in_this_process_puts_back_what_it_changes(tmp_path, sample_data):
    """An experiment file registers an arm and a command changes the folder and the environment: none of it
    outlives the call (a later test's arms="all" or working folder would otherwise depend on the order)."""
    import torch

    from ablate.arms import list_arms

    file = tmp_path / "registers.py"
    file.write_text("from ablate.arms import Arm, register_arm\n"
                    "from ablate.experiment import Experiment\n\n"
                    "@register_arm('test-registered-by-a-file')\n"
                    "class Registered(Arm):\n"
                    "    description = 'an arm an experiment file registers'\n\n"
                    "EXPERIMENT = Experiment(name='registers', tiers=['smoke'], arms=['test-registered-by-a-file'],\n"
                    f"    seeds=1, overrides={{'max_steps': 1, 'data_dir': {str(sample_data)!r}}})\n")
    arms, cwd, env, threads = list_arms(), os.getcwd(), dict(os.environ), torch.get_num_threads()
    for _ in range(2):  # twice: the file registers its arm again, as in a fresh process
        shown = ablate_cli("submit", file, "--dry-run", "--results", tmp_path / "r", cwd=tmp_path, env={"X_TEST": "1"})
        assert "smoke/test-registered-by-a-file/seed0" in shown.stdout
    assert list_arms() == arms and os.getcwd() == cwd and dict(os.environ) == env
    assert torch.get_num_threads() == threads


@pytest.mark.run
def test_a_log_line_of_the_command_reaches_its_stderr_as_in_a_process(tmp_path, sample_data):
    args = ("run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "1", "--data", sample_data, "--no-progress",
            "--threads", "1", "--results", tmp_path)
    first = ablate_cli(*args)
    assert "INFO ablate." in first.stderr  # the command's log lines, in the format main() sets up
    again = ablate_cli(*args)
    assert json.loads(again.stdout) == json.loads(first.stdout) and "nothing to do" in again.stderr
