"""Cluster profiles: `slurm/NAME.toml` (./slurm first, then the checkout's), the resources of one run."""

from __future__ import annotations

import tomllib
from pathlib import Path

from ablate.errors import AblateError
from ablate.paths import find_file, names_in

PROFILE_KEYS = {
    "partition": str, "account": str, "qos": str, "gpus_per_run": int, "cpus_per_run": int, "mem_gb": (int, float),
    "time_min": int, "constraint": str, "signal_delay_s": int, "array_parallelism": int, "extra_sbatch": list,
    "gpu": str,  # the GPU model (a key of ablate.tiers.GPUS), read by `ablate plan --profile`
    "processes_per_run": int,  # data-parallel processes of one run (default: gpus_per_run, else 1)
}


def available_profiles() -> list[str]:
    return names_in("slurm", ".toml")


def load_profile(name: str) -> dict:
    path = Path(name) if Path(name).suffix == ".toml" and Path(name).is_file() else find_file("slurm", f"{name}.toml")
    if path is None:
        raise AblateError(f"unknown profile {name!r}; valid profiles: {', '.join(available_profiles()) or '(none)'}"
                          " (files slurm/NAME.toml)")
    with open(path, "rb") as handle:
        profile = tomllib.load(handle)
    for key, value in profile.items():
        if key not in PROFILE_KEYS:
            raise AblateError(f"profile {path}: unknown key {key!r}; valid keys: {', '.join(PROFILE_KEYS)}")
        if not isinstance(value, PROFILE_KEYS[key]):
            raise AblateError(f"profile {path}: {key} = {value!r} has the wrong type")
    profile = {"partition": "", "account": "", "qos": "", "gpus_per_run": 0, "cpus_per_run": 1, "mem_gb": 4,
               "time_min": 60, "constraint": "", "signal_delay_s": 120, "array_parallelism": 64, "extra_sbatch": [],
               **profile, "name": path.stem}
    profile["processes_per_run"] = check_processes(path, profile)
    return profile


def check_processes(path: Path, profile: dict) -> int:
    """A run's data-parallel processes: one per GPU (`gpus_per_run`), or `processes_per_run` CPU processes
    (gloo) on a profile without GPUs; each gets cpus_per_run / processes CPUs."""
    gpus, chosen = profile["gpus_per_run"], profile.get("processes_per_run")
    processes = chosen if chosen is not None else max(1, gpus)
    if processes < 1 or (gpus and processes != gpus):
        raise AblateError(f"profile {path}: processes_per_run = {chosen} must be ≥ 1 and, with GPUs, equal "
                          f"gpus_per_run ({gpus}): one process per GPU")
    if profile["cpus_per_run"] < processes:
        raise AblateError(f"profile {path}: cpus_per_run = {profile['cpus_per_run']} is fewer than the run's "
                          f"{processes} processes; give each process at least one CPU")
    return processes
