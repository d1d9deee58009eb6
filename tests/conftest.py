"""Shared fixtures.

`slurm_cluster` makes sure the single-node SLURM test cluster of `slurm/local-cluster.sh` is up
(starting it when it is not, e.g. when pytest is run without `make test`) and fails, with the
script's output and log tails, when it cannot be brought up: a SLURM test must never silently skip.
"""

from __future__ import annotations

import dataclasses
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
