"""Where a run's numbers came from: the commit of the checkout, the versions of the stack, the time.

Torch-free at import: only `versions` loads the training stack, inside the call (a training run has it loaded
already; nothing else pays for it).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import re
import subprocess
import sys
from pathlib import Path

import ablate
from ablate.paths import REPO_ROOT


def git_commit() -> str | None:
    """HEAD of the checkout, with "-dirty" when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    """The versions a run's numbers depend on: ablate, Python, torch, lightning, numpy, CUDA, the device, and
    `numerics` (what computed them: kernel set, CPU, BLAS, threads, GPU). Execution, not identity: the summary
    records them, no fingerprint hashes them, so runs on two kinds of machine still pair (and tables say so)."""
    import numpy  # reason: the versions a run reports are those of the stack it imported (torch-free module)
    import torch  # reason: as above (and the CUDA version and device name are torch's to tell)

    return {"ablate": ablate.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "lightning": lightning_version(), "numpy": numpy.__version__, "platform": platform.platform(),
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "numerics": numerics(torch)}


def lightning_version() -> str:
    """Lightning Fabric's version: the imported package's, or the installed one's where this process never imported
    it (a task run trains without Fabric)."""
    imported = sys.modules.get("lightning_fabric")
    return imported.__version__ if imported is not None else importlib.metadata.version("lightning-fabric")


def numerics(torch) -> dict:
    """What made the numbers, beyond versions: a CPU's kernel set (`ATEN_CPU_CAPABILITY` picks another) decides
    the last bits of every loss, and so do the BLAS build, the thread count and, on CUDA, the device and libraries."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": cpu_model(),
            "machine": platform.machine(), "threads": torch.get_num_threads(),
            "build": build_libraries(torch.__config__.show()), "gpu": gpu(torch)}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_BUILD_LINES = {  # what of `torch.__config__.show()` can change a number: the libraries under the kernels
    "mkl": re.compile(r"Math Kernel Library Version (\S+)"),
    "onednn": re.compile(r"(?:MKL-DNN|oneDNN) v(\S+)"),
    "openmp": re.compile(r"OpenMP (\d+)"),
}
_BUILD_SETTINGS = ("BLAS_INFO", "LAPACK_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP")


def build_libraries(show: str) -> dict:
    """torch's build report (`torch.__config__.show()`) parsed to what matters for numerics: the BLAS and LAPACK
    it calls, the MKL and oneDNN versions, OpenMP; absent entries are left out (another build, another report)."""
    found = {name: match.group(1) for name, pattern in _BUILD_LINES.items() if (match := pattern.search(show))}
    settings = dict(re.findall(r"\b([A-Z_]+)=([^,\s]*)", show))
    found.update({key.lower(): settings[key] for key in _BUILD_SETTINGS if key in settings})
    return found


def gpu(torch) -> dict | None:
    """On CUDA: the device's name, compute capability, and the cuDNN and NCCL versions; None without CUDA.
    Each is read on its own: a build without NCCL (or a driver that refuses a query) leaves that one None."""
    if not torch.cuda.is_available():
        return None

    def read(query):
        try:
            return query()
        except Exception:  # noqa: BLE001 (reason: provenance must never stop a run; what it cannot read is None)
            return None

    capability = read(lambda: torch.cuda.get_device_capability(0))
    nccl = read(lambda: torch.cuda.nccl.version())
    return {"name": read(lambda: torch.cuda.get_device_name(0)),
            "capability": f"{capability[0]}.{capability[1]}" if capability else None,
            "count": read(torch.cuda.device_count), "cudnn": read(torch.backends.cudnn.version),
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}


def now() -> str:
    """The current UTC time, to the second, as ISO 8601: the summary's started/finished stamps."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
