"""Shared fixtures.

`slurm_cluster` makes sure the single-node SLURM test cluster of `slurm/local-cluster.sh` is up
(starting it when it is not, e.g. when pytest is run without `make test`) and fails, with the
script's output and log tails, when it cannot be brought up: a SLURM test must never silently skip.

The suite runs the longest test files first (tests/suite_order.py); `--record-durations` writes the
per-file seconds of the run it ends into tests/durations.json.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from datafix import prepared_sample
from suite_order import DURATIONS, file_of, file_totals, longest_first, read_durations

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "slurm" / "local-cluster.sh"
LOCAL_PROFILE = REPO / "slurm" / "local.toml"


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"write this run's seconds per test file into {DURATIONS.relative_to(REPO)}")


@pytest.hookimpl(trylast=True)  # after pytest has grouped the items of parametrized module fixtures
def pytest_collection_modifyitems(config, items):
    """The longest test file, the files with SLURM tests beside it, the rest longest first (every xdist worker
    collects, and orders, the same way: tests/suite_order.py)."""
    waiting = frozenset(file_of(item.nodeid) for item in items if item.get_closest_marker("slurm"))
    order = longest_first([item.nodeid for item in items], read_durations(), waiting)
    items[:] = [items[position] for position in order]


_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Every phase's seconds, per test (on the xdist controller, which sees every worker's reports)."""
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """With --record-durations, a whole run's per-file seconds (written once, by the controller or a plain run)."""
    if session.config.getoption("record_durations") and not hasattr(session.config, "workerinput"):
        DURATIONS.write_text(json.dumps(file_totals(_seconds), indent=1) + "\n")


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster: its profile (slurm/local.toml) and the `status` output."""

    profile_path: Path
    profile: dict
    status: str

    @property
    def partition(self) -> str:
        return self.profile["partition"]


def _cluster(command: str, timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), command],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        logs = subprocess.run(["bash", str(CLUSTER_SCRIPT), "logs"], capture_output=True, text=True).stdout
        pytest.fail(
            f"`bash {CLUSTER_SCRIPT.relative_to(REPO)} {command}` did not finish in {timeout:.0f} s\n"
            f"{out}{err}\n{logs}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The local SLURM cluster, started if needed; the test fails if it cannot be brought up."""
    status = _cluster("status", timeout=120)
    if status.returncode != 0:
        print("SLURM test cluster is not up; running slurm/local-cluster.sh start", file=sys.stderr)
        # a cold start installs the Debian packages: allow for a slow mirror
        start = _cluster("start", timeout=1200)
        if start.returncode != 0:
            pytest.fail(
                "could not start the SLURM test cluster "
                f"(`bash slurm/local-cluster.sh start` exited {start.returncode}):\n"
                f"{start.stdout}\n{start.stderr[-8000:]}",
                pytrace=False,
            )
        status = _cluster("status", timeout=120)
        if status.returncode != 0:
            pytest.fail(
                "the SLURM test cluster started but `status` reports it unhealthy:\n"
                f"{status.stdout}\n{status.stderr[-8000:]}",
                pytrace=False,
            )
    with open(LOCAL_PROFILE, "rb") as f:
        profile = tomllib.load(f)
    return SlurmCluster(profile_path=LOCAL_PROFILE, profile=profile, status=status.stdout)


@pytest.fixture
def submitit_folder(tmp_path: Path) -> Path:
    """A fresh submitit log folder per test (SLURM job ids restart at 1 when the cluster state is
    wiped, so folders must never be shared between tests or sessions)."""
    folder = tmp_path / "submitit"
    folder.mkdir()
    return folder


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory) -> Path:
    """The shipped sample as token shards, prepared once per session for every test that asks for it."""
    return prepared_sample(tmp_path_factory.mktemp("data"))



@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory, sample_data):
    """`finished_runs(into, ("baseline", 0), ("sink-logit", 0), experiment="study", steps=4)` copies finished smoke
    runs on the session's sample data into the results folder `into` and returns it: for a test that reads finished
    runs, or changes its own copy of them, and is not about training them. Each run is trained once per session
    (per xdist worker) into a folder no test writes to; a test gets copies, so nothing it does reaches another."""
    from ablate.experiment import RunSpec
    from ablate.store import run_dir

    trained = tmp_path_factory.mktemp("trained")

    def copy(into: Path, *runs: tuple[str, int], experiment: str = "study", steps: int = 4) -> Path:
        for arm, seed in runs:
            spec = RunSpec(experiment, "smoke", arm, seed, {"max_steps": steps})
            source = run_dir(trained / f"steps{steps}", experiment, "smoke", arm, seed)
            if not source.is_dir():
                from ablate.train import run

                summary = run(spec, trained / f"steps{steps}", data_dir=str(sample_data), progress=False, threads=1)
                assert summary.status == "completed", summary
            shutil.copytree(source, run_dir(into, experiment, "smoke", arm, seed))
        return into

    return copy
