"""Cluster profiles: `slurm/NAME.toml` (./slurm first, then the checkout's), the resources of one run."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Profile:
    """The resources of one run on a cluster, as `slurm/NAME.toml` gives them (`load_profile`); every reader takes
    its attributes. A setting the file leaves out has the default here ("" = not passed to sbatch)."""

    name: str  # the file's stem: `--profile NAME`
    partition: str = ""
    account: str = ""
    qos: str = ""
    gpus_per_run: int = 0  # 0 = CPU only
    cpus_per_run: int = 1
    mem_gb: int | float = 4
    time_min: int = 60
    constraint: str = ""
    signal_delay_s: int = 120
    array_parallelism: int = 64
    extra_sbatch: tuple[str, ...] = ()  # raw "#SBATCH" option lines
    gpu: str = ""  # the GPU model (a key of ablate.tiers.GPUS); "" = not said
    processes_per_run: int = 1  # data-parallel processes of one run (`check_processes`)

    def to_dict(self) -> dict:
        """The settings as `submit --dry-run` shows them: the file's keys, then its name and the run's processes."""
        shown = {key: getattr(self, key) for key in PROFILE_KEYS if key not in ("gpu", "processes_per_run")}
        return {**shown, "extra_sbatch": list(self.extra_sbatch), **({"gpu": self.gpu} if self.gpu else {}),
                "name": self.name, "processes_per_run": self.processes_per_run}


def load_profile(name: str) -> Profile:
    path = Path(name) if Path(name).suffix == ".toml" and Path(name).is_file() else find_file("slurm", f"{name}.toml")
    if path is None:
        raise AblateError(f"unknown profile {name!r}; valid profiles: {', '.join(available_profiles()) or '(none)'}"
                          " (files slurm/NAME.toml)")
    settings = read_toml(path)
    for key, value in settings.items():
        if key not in PROFILE_KEYS:
            raise AblateError(f"profile {path}: unknown key {key!r}; valid keys: {', '.join(PROFILE_KEYS)}")
        if not isinstance(value, PROFILE_KEYS[key]):
            raise AblateError(f"profile {path}: {key} = {value!r} has the wrong type")
    profile = Profile(name=path.stem, **{**settings, "extra_sbatch": tuple(settings.get("extra_sbatch", ())),
                                         "processes_per_run": 1})
    return dataclasses.replace(profile, processes_per_run=check_processes(path, profile,
                                                                          settings.get("processes_per_run")))


def read_toml(path: Path) -> dict:
    """The profile file's table; a syntax error is one line naming the file, its line and column."""
    with open(path, "rb") as handle:
        try:
            return tomllib.load(handle)
        except tomllib.TOMLDecodeError as err:
            where = re.search(r"\(at line (\d+), column (\d+)\)$", str(err))  # tomllib says where in its message
            reason = str(err)[:where.start()].strip() if where else str(err)
            at = f", line {where[1]}, column {where[2]}" if where else ""
            raise AblateError(f"profile {path}{at}: not valid TOML ({reason}); "
                              "see slurm/example.toml for the syntax") from None


def check_processes(path: Path, profile: Profile, chosen: int | None) -> int:
    """A run's data-parallel processes: one per GPU (`gpus_per_run`), or `chosen` (the file's `processes_per_run`)
    CPU processes (gloo) on a profile without GPUs; each gets cpus_per_run / processes CPUs."""
    gpus = profile.gpus_per_run
    processes = chosen if chosen is not None else max(1, gpus)
    if processes < 1 or (gpus and processes != gpus):
        raise AblateError(f"profile {path}: processes_per_run = {chosen} must be ≥ 1 and, with GPUs, equal "
                          f"gpus_per_run ({gpus}): one process per GPU")
    if profile.cpus_per_run < processes:
        raise AblateError(f"profile {path}: cpus_per_run = {profile.cpus_per_run} is fewer than the run's "
                          f"{processes} processes; give each process at least one CPU")
    return processes


# ------------------------------------------------------------------------- the profile against the cluster
SINFO_FORMAT = "%P|%G|%m|%c|%l"  # partition, generic resources, memory per node (MB), CPUs per node, time limit

# sbatch's refusals (its stderr, lower case) → the profile setting behind each
SBATCH_REFUSALS = (
    ("generic resource", "gpus_per_run"), ("gres", "gpus_per_run"), ("qos", "qos"), ("account", "account"),
    ("partition", "partition"), ("time limit", "time_min"), ("memory", "mem_gb"),
    ("feature", "constraint"), ("constraint", "constraint"), ("processors", "cpus_per_run"),
    ("cpu count", "cpus_per_run"), ("cpus", "cpus_per_run"),
    ("node configuration", "cpus_per_run, mem_gb, gpus_per_run or constraint"),
)


def parse_sinfo(text: str) -> dict[str, dict]:
    """`sinfo -h -o '%P|%G|%m|%c|%l'` lines → {partition: {"gpus", "mem_mb", "cpus", "time_min", "default"}}:
    per node, the most any node group of the partition offers (time_min None: no limit). `debug*` is the
    default partition; `4+` means some nodes have more (4 is what every node has: the figure counted)."""
    partitions: dict[str, dict] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 5 or not parts[0]:
            continue
        name, gres, mem, cpus, limit = parts[:5]
        seen = {"gpus": gpus_in_gres(gres), "mem_mb": _number(mem), "cpus": _number(cpus),
                "time_min": slurm_minutes(limit), "default": name.endswith("*")}
        known = partitions.setdefault(name.rstrip("*"), seen)
        for key in ("gpus", "mem_mb", "cpus"):
            known[key] = max(known[key], seen[key])
        if known["time_min"] is not None:
            known["time_min"] = None if seen["time_min"] is None else max(known["time_min"], seen["time_min"])
    return partitions


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a sinfo gres field: `gpu:a100:4(S:0-1),shard:8` → 4, `(null)` → 0."""
    count = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) > 1:
            count += int(_number(fields[-1])) if fields[-1][:1].isdigit() else 1
    return count


def slurm_minutes(limit: str) -> int | None:
    """A SLURM time limit (`infinite`, `30`, `2:00:00`, `1-12:00:00`) in minutes, None for no limit."""
    if limit.lower() in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, clock = limit.rpartition("-")
    fields = [int(f) for f in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        return int(days) * 1440 + fields[0] * 60 + (fields[1] if len(fields) > 1 else 0)
    return fields[0] * 60 + fields[1] if len(fields) == 3 else fields[0]  # MM, MM:SS, HH:MM:SS


def _number(text: str) -> int:
    digits = text.rstrip("+").split("-")[0]
    return int(digits) if digits.isdigit() else 0


def profile_misfits(profile: Profile, partitions: dict[str, dict]) -> list[str]:
    """What the partition `sinfo` describes cannot give a run of the profile, one line per setting (empty: fits)."""
    name = profile.partition or next((p for p, known in partitions.items() if known["default"]), "")
    if name not in partitions:
        return [f"partition = {profile.partition!r}: no such partition; partitions: "
                f"{', '.join(partitions) or '(none)'}"]
    part = partitions[name]
    misfits = []
    if profile.gpus_per_run > part["gpus"]:
        misfits.append(f"gpus_per_run = {profile.gpus_per_run}: partition {name!r} has "
                       + (f"{part['gpus']} GPUs per node" if part["gpus"] else "no GPUs (gres: none); 0 = CPU only"))
    if profile.cpus_per_run > part["cpus"]:
        misfits.append(f"cpus_per_run = {profile.cpus_per_run}: partition {name!r} has {part['cpus']} CPUs per node")
    if part["mem_mb"] and profile.mem_gb * 1024 > part["mem_mb"]:
        misfits.append(f"mem_gb = {profile.mem_gb}: partition {name!r} has {part['mem_mb']} MB per node")
    if part["time_min"] is not None and profile.time_min > part["time_min"]:
        misfits.append(f"time_min = {profile.time_min}: partition {name!r} allows at most "
                       f"{part['time_min']} minutes")
    return misfits


def sbatch_refusal(profile: Profile, stderr: str) -> str:
    """sbatch's refusal as one line naming the profile setting behind it (and the profile's file)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "no message")
    said = said.split("error:", 1)[-1].strip()
    lowered = said.lower()
    setting = next((key for clue, key in SBATCH_REFUSALS if clue in lowered), None)
    shown = (f"{setting} = {getattr(profile, setting)!r}" if setting in PROFILE_KEYS else setting) if setting \
        else "the profile"
    return (f"sbatch refused the jobs ({said}): check {shown} in profile {profile.name!r} "
            f"(slurm/{profile.name}.toml)")
