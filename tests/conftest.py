"""Shared fixtures.

`slurm_cluster` makes sure the single-node SLURM test cluster of `slurm/local-cluster.sh` is up
(starting it when it is not, e.g. when pytest is run without `make test`) and fails, with the
script's output and log tails, when it cannot be brought up: a SLURM test must never silently skip.

Every test carries exactly one tier mark (pyproject.toml's markers; tests/test_suite.py holds it): `unit` (in this
process, no training), `run` (trains in this process, through the shared session fixtures here and in datafix.py)
or `system` (subprocesses, SLURM, several processes, kernel sets). The suite runs the files with a system test
first, then those with a run test, then the rest (`TIER_ORDER`): with `make test`'s two workers each taking a whole
file at a time in the collected order (`--dist loadfile`), the long files never start last. `pytest -m unit` (or
run, or system) runs one tier.
"""

from __future__ import annotations

import dataclasses
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

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "slurm" / "local-cluster.sh"
LOCAL_PROFILE = REPO / "slurm" / "local.toml"


TIER_ORDER = ("system", "run", "unit")  # the order the suite runs the tiers in, by file


def tiers_of(item) -> list[str]:
    """The tier marks a test carries (exactly one, tests/test_suite.py holds)."""
    return [tier for tier in TIER_ORDER if item.get_closest_marker(tier)]


COLLECTED = pytest.StashKey[dict]()  # nodeid → its tier marks, for every test collected (selected or not)


def pytest_itemcollected(item):
    item.config.stash.setdefault(COLLECTED, {})[item.nodeid] = tiers_of(item)


def file_rank(items) -> dict[str, int]:
    """Per test file, the position in TIER_ORDER of the first tier any of its tests carries."""
    rank: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        here = min([TIER_ORDER.index(tier) for tier in tiers_of(item)], default=len(TIER_ORDER))
        rank[name] = min(rank.get(name, here), here)
    return rank


@pytest.hookimpl(trylast=True)  # after pytest has grouped the items of parametrized module fixtures
def pytest_collection_modifyitems(config, items):
    """The files with a system test first, then those with a run test, then the rest; within each, the collected
    order (each file's tests together and in pytest's order). Every xdist worker collects, and sorts, the same."""
    rank = file_rank(items)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # a stable sort


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


STRAIGHT_ARM, STRAIGHT_STEPS = "sink-logit", 24


@pytest.fixture(scope="session")
def straight_run(tmp_path_factory, finished_runs) -> dict:
    """The summary of one smoke run trained straight through (STRAIGHT_ARM, seed 0, STRAIGHT_STEPS steps, one
    thread, the session's sample data), trained once per session (per xdist worker) for every resume test: a run of
    the same settings that was interrupted and resumed must end bit for bit where this one did."""
    from ablate.store import read_json, run_dir

    into = finished_runs(tmp_path_factory.mktemp("straight"), (STRAIGHT_ARM, 0), steps=STRAIGHT_STEPS)
    return read_json(run_dir(into, "study", "smoke", STRAIGHT_ARM, 0) / "summary.json")
