"""Ctrl-C on a local submit stops the grid at a step boundary, and the next submit resumes it."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ablate.store import read_json, read_metrics, run_dir
from datafix import REPO, ablate_cli
import pytest

pytestmark = pytest.mark.system


def ctrl_c_after_first_step(args, folder, release: Path | None = None) -> tuple[int, str]:
    """Run `ablate ARGS` in its own process group (a shell's foreground job), press Ctrl-C (SIGINT to the
    whole group) once the run in `folder` has taken a step, then create `release` (a held arm's go-ahead:
    `held_arm_file`); (exit code, stderr).

    A shell's foreground job starts with Ctrl-C at its default whatever the shell inherited; so does this one.
    Without that, a suite started in the background (`make test &`: SIGINT ignored, and inherited) would start
    the command ignoring Ctrl-C, as `ablate` then rightly does (ablate.loop.StopRequests), and it ran to the end."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "ablate.cli", *map(str, args)], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 240
        while not [r for r in read_metrics(folder / "metrics.jsonl") if "train_loss" in r]:
            assert process.poll() is None and time.time() < deadline, "the run took no step"
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)
        if release is not None:
            release.touch()  # the signal is sent before the held arm takes its next step
        _, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, err


STEPS = 8  # the held arm below makes Ctrl-C land before the last step: a few steps are enough


def held_arm_source(run_folder, release) -> str:
    """Python registering `held-baseline`: the baseline, held once the run in `run_folder` has written its first
    step's row until `ctrl_c_after_first_step` has sent Ctrl-C and created `release`, so that Ctrl-C lands
    before the last step however loaded the machine is; once `release` exists, the plain baseline."""
    return ("import time\nfrom pathlib import Path\n\nfrom ablate.arms import Arm, register_arm\n\n"
            f"RUN, RELEASE = Path({str(run_folder)!r}), Path({str(release)!r})\n\n\n"
            "@register_arm('held-baseline')\nclass HeldBaseline(Arm):\n"
            "    def output_gate(self, o, x):\n"
            "        metrics, deadline = RUN / 'metrics.jsonl', time.time() + 120\n"
            "        while (not RELEASE.exists() and metrics.exists()\n"
            "               and 'train_loss' in metrics.read_text() and time.time() < deadline):\n"
            "            time.sleep(0.01)\n"
            "        return o\n")


def held_arm_file(folder, run_folder, release) -> str:
    """A file registering `held-baseline` (`held_arm_source`)."""
    file = folder / "slow_arm.py"
    file.write_text(held_arm_source(run_folder, release))
    return str(file)


def dry_run_of_hint(line: str) -> tuple[list[str], str]:
    """The command between backticks in a printed hint, run with --dry-run: (the runs it lists, its output)."""
    command = shlex.split(line.split("`")[1])
    assert command[:2] == ["ablate", "submit"], line
    preview = ablate_cli(*command[1:], "--dry-run").stdout
    return [row.strip() for row in preview.splitlines() if row.startswith("  ")], preview


def test_ctrl_c_stops_a_local_grid_with_a_checkpoint_and_the_next_submit_resumes_it(tmp_path, sample_data):
    """…and each hint printed on the way (by the interrupted submit, by status) resumes exactly the runs the
    interrupted submit chose (--arms), where it ran them (--executor local), nothing else."""
    results, file, release = tmp_path / "results", tmp_path / "stopme.py", tmp_path / "ctrl-c-sent"
    first, second = (run_dir(results, "stopme", "smoke", arm, 0) for arm in ("held-baseline", "sink-logit"))
    file.write_text(
        held_arm_source(first, release) +
        "\nfrom ablate.experiment import Experiment\n"
        "EXPERIMENT = Experiment(name='stopme', tiers=['smoke'], arms=['held-baseline', 'sink-logit', 'off-by-one'],\n"
        "    seeds=1, overrides={'max_steps': %d, 'data_dir': %r, 'val_tokens': 512, 'final_val_tokens': 512})\n"
        % (STEPS, str(sample_data)))
    chosen = ["--arms", "held-baseline", "sink-logit"]
    code, err = ctrl_c_after_first_step(["submit", file, "--executor", "local", *chosen, "--parallel", "1",
                                         "--results", results], first, release)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    told = [line for line in err.splitlines() if line.startswith("ablate:")]
    assert len(told) == 1 and told[0].startswith("ablate: interrupted: 1 run(s) stopped at a step boundary"), err
    assert "smoke/held-baseline/seed0" in told[0] and "resumes" in told[0]
    listed, preview = dry_run_of_hint(told[0])  # the stopped run and the one not started, not off-by-one
    assert listed == ["smoke/held-baseline/seed0", "smoke/sink-logit/seed0"] and "resources per run" not in preview
    # the interrupted run stopped at a step boundary with a checkpoint; the other run never started
    summary = read_json(first / "summary.json")
    assert (first / "checkpoints" / "state.pt").exists() and 1 <= summary["steps"] < STEPS
    assert "checkpointed at step" in (first / "run.log").read_text()
    assert not (second / "config.json").exists() and not (second / "metrics.jsonl").exists()
    rows = {r["arm"]: r for r in json.loads(ablate_cli("status", file, "--results", results, "--json").stdout)["runs"]}
    assert rows["held-baseline"]["state"] == "cancelled" and "ablate submit" in rows["held-baseline"]["error"]
    assert rows["held-baseline"]["eta_s"] is None and rows["sink-logit"]["state"] == "not-submitted"
    shown = ablate_cli("status", file, "--results", results).stdout
    assert "cancelled: 1" in shown and "resume from their last checkpoint" in shown
    hint = next(line for line in shown.splitlines() if line.startswith("cancelled runs resume"))
    listed, preview = dry_run_of_hint(hint)  # the cancelled run, run here again (a SLURM dry run lists resources)
    assert listed == ["smoke/held-baseline/seed0"] and "resources per run" not in preview, hint
    # the next submit resumes the interrupted run from its checkpoint and runs the rest
    again = ablate_cli("submit", file, "--executor", "local", *chosen, "--parallel", "1", "--results", results)
    assert "ran 2 runs here, 0 failed" in again.stdout
    assert f"resuming at step {summary['steps']} of {STEPS}" in (first / "run.log").read_text()
    rows = json.loads(ablate_cli("status", file, *chosen, "--results", results, "--json").stdout)["runs"]
    assert [r["state"] for r in rows] == ["completed", "completed"] and all(r["steps"] == STEPS for r in rows)


def test_ctrl_c_on_ablate_run_checkpoints_and_exits_130_in_one_line(tmp_path, sample_data):
    """A bare `ablate run` (no submit around it): SIGINT stops it at a step boundary with a checkpoint, the
    command says so in one line (exit 130, no traceback), and the same command resumes it."""
    results = tmp_path / "results"
    folder, release = run_dir(results, "adhoc", "smoke", "held-baseline", 0), tmp_path / "ctrl-c-sent"
    arm_file = held_arm_file(tmp_path, folder, release)
    command = ["run", "--tier", "smoke", "--arm", "held-baseline", "--arm-file", arm_file, "--max-steps", STEPS,
               "--data", sample_data, "--no-progress", "--threads", "1", "--results", results]
    code, err = ctrl_c_after_first_step(command, folder, release)
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    told = [line for line in err.splitlines() if line.startswith("ablate:")]
    assert told == ["ablate: interrupted"], err[-3000:]
    steps = read_json(folder / "summary.json")["steps"]
    assert (folder / "checkpoints" / "state.pt").exists() and 1 <= steps < STEPS
    again = ablate_cli(*command)
    assert json.loads(again.stdout)["status"] == "completed"
    assert f"resuming at step {steps} of {STEPS}" in (folder / "run.log").read_text()


def test_ctrl_c_after_the_last_run_ended_exits_0_completed(tmp_path, sample_data, capsys, monkeypatch, caplog):
    """A real SIGINT to this process once the grid's last run is recorded done: nothing is left to stop, so the
    submit is not `interrupted` (130) but completed (0), and the ledger marks no run interrupted."""
    from ablate.cli import main
    from ablate.store import read_ledger
    from ablate.workers import _LocalGrid

    file = tmp_path / "late.py"
    file.write_text("from ablate.experiment import Experiment\n"
                    "EXPERIMENT = Experiment(name='late', tiers=['smoke'], arms=['baseline'], seeds=1,\n"
                    f"    overrides={{'max_steps': 2, 'data_dir': {str(sample_data)!r}, 'val_tokens': 512,\n"
                    "    'final_val_tokens': 512})\n")
    recorded = _LocalGrid.finished_run

    def then_ctrl_c(self, bar, key, code, error, **extra):
        recorded(self, bar, key, code, error, **extra)
        os.kill(os.getpid(), signal.SIGINT)  # the handler run_local installed (Ctrl-C from the terminal)
        time.sleep(1)  # the main thread runs it while this worker thread is still alive

    monkeypatch.setattr(_LocalGrid, "finished_run", then_ctrl_c)
    code = main(["submit", str(file), "--executor", "local", "--parallel", "1", "--results", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert code == 0 and "interrupted" not in err, err
    assert "late: completed: ran 1 runs here, 0 failed" in out
    assert "Ctrl-C came after the last run ended" in caplog.text
    entry = read_ledger(tmp_path / "r" / "late").runs["smoke/baseline/seed0"]
    assert entry.exit_code == 0 and not entry.interrupted
