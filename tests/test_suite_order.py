"""How the suite itself runs: the longest test files first and each file's tests together
(tests/suite_order.py), the `ablate` command in this process giving what the real one gives (tests/datafix.py),
and `make test` scheduling by file, every mark included."""

from __future__ import annotations

import json
import os
import re

import pytest

from datafix import REPO, ablate_cli
from suite_order import DURATIONS, UNKNOWN_S, file_totals, longest_first, read_durations


def test_the_longest_file_runs_first_and_each_file_s_tests_stay_together_in_their_order():
    ids = ["tests/test_a.py::one", "tests/test_b.py::one", "tests/test_a.py::two[x]", "tests/test_c.py::one",
           "tests/test_b.py::two", "tests/test_new.py::one"]
    durations = {"tests/test_a.py": 3.0, "tests/test_b.py": 90.0, "tests/test_c.py": 3.0}
    order = [ids[i] for i in longest_first(ids, durations)]
    assert order == ["tests/test_b.py::one", "tests/test_b.py::two",  # 90 s
                     "tests/test_new.py::one",  # not in the file: UNKNOWN_S, between
                     "tests/test_a.py::one", "tests/test_a.py::two[x]", "tests/test_c.py::one"]  # a tie: as collected
    assert 3.0 < UNKNOWN_S < 90.0
    assert sorted(longest_first(ids, {})) == list(range(len(ids)))  # nothing known: files in the collected order


def test_the_files_that_wait_on_slurm_run_beside_the_longest_file_then_the_rest_longest_first():
    ids = ["tests/test_a.py::one", "tests/test_slurm_b.py::one", "tests/test_long.py::one", "tests/test_c.py::one",
           "tests/test_slurm_d.py::one", "tests/test_long.py::two"]
    durations = {"tests/test_a.py": 50.0, "tests/test_slurm_b.py": 20.0, "tests/test_long.py": 300.0,
                 "tests/test_c.py": 40.0, "tests/test_slurm_d.py": 30.0}
    waiting = frozenset({"tests/test_slurm_b.py", "tests/test_slurm_d.py"})
    order = [ids[i] for i in longest_first(ids, durations, waiting)]
    assert order == ["tests/test_long.py::one", "tests/test_long.py::two",  # the longest file
                     "tests/test_slurm_d.py::one", "tests/test_slurm_b.py::one",  # beside it: the waiting files
                     "tests/test_a.py::one", "tests/test_c.py::one"]  # then the others, longest first
    # the longest file is first even when it waits too; a waiting file no other outranks is not moved twice
    assert [ids[i] for i in longest_first(ids, durations, waiting | {"tests/test_long.py"})][:2] == [
        "tests/test_long.py::one", "tests/test_long.py::two"]


def test_recorded_durations_are_per_file_and_the_longest_first():
    assert file_totals({"tests/test_a.py::one": 1.25, "tests/test_b.py::x[1]": 4.0, "tests/test_a.py::two": 0.5,
                        "tests/test_b.py::x[2]": 0.04}) == {"tests/test_b.py": 4.0, "tests/test_a.py": 1.8}
    assert read_durations(DURATIONS.with_name("no-such-file.json")) == {}


def test_the_committed_durations_name_test_files_that_exist():
    durations = read_durations()
    assert durations and all(seconds >= 0 for seconds in durations.values())
    missing = [name for name in durations if not (REPO / name).is_file()]
    assert not missing, f"tests/durations.json names files that are gone: {missing}; refresh it (tests/suite_order.py)"
    assert list(durations.values()) == sorted(durations.values(), reverse=True)


def test_this_session_runs_the_files_in_the_recorded_order(request):
    """The hook in tests/conftest.py reordered this very session's items (each xdist worker collects them so)."""
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in request.session.items))
    waiting = {item.nodeid.split("::")[0] for item in request.session.items if item.get_closest_marker("slurm")}
    durations = read_durations()
    known = [durations.get(name, UNKNOWN_S) for name in files]
    assert known[0] == max(known)  # the longest file first, then the SLURM files beside it, then the rest
    rest = files[1:]
    tail = [name for name in rest if name not in waiting]
    assert rest == [name for name in rest if name in waiting] + tail
    for group in ([name for name in rest if name in waiting], tail):
        seconds = [durations.get(name, UNKNOWN_S) for name in group]
        assert seconds == sorted(seconds, reverse=True)


def test_make_test_hands_out_whole_files_in_the_suite_s_order_and_runs_every_mark():
    makefile = (REPO / "Makefile").read_text()
    workers = re.search(r"^PYTEST_WORKERS := (.*)$", makefile, re.M).group(1).split()
    assert workers == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]  # xdist's count reorder: off
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    pytest_line = next(line for line in recipe.splitlines() if "pytest" in line)
    options = pytest_line.split(" pytest ", 1)[1]
    assert "$(PYTEST_WORKERS)" in options and "-m " not in options  # slow, slurm and benchmark all run


def test_every_test_file_that_runs_a_benchmark_script_marks_it():
    """`pytest -m benchmark` selects the tests that hold benchmarks/ scripts (still part of make test)."""
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        if re.search(r"REPO / \"benchmarks\"", text):
            assert "pytest.mark.benchmark" in text, path.name


# ---------------------------------------------------------------------------------------------- the command in-process
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


def test_a_log_line_of_the_command_reaches_its_stderr_as_in_a_process(tmp_path, sample_data):
    args = ("run", "--tier", "smoke", "--arm", "baseline", "--max-steps", "1", "--data", sample_data, "--no-progress",
            "--threads", "1", "--results", tmp_path)
    first = ablate_cli(*args)
    assert "INFO ablate." in first.stderr  # the command's log lines, in the format main() sets up
    again = ablate_cli(*args)
    assert json.loads(again.stdout) == json.loads(first.stdout) and "nothing to do" in again.stderr
