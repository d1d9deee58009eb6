"""Where a run's numbers came from: the commit of the checkout, the versions of the stack, the time.

Torch-free at import: only `versions` loads the training stack, inside the call (a training run has it loaded
already; nothing else pays for it).
"""

from __future__ import annotations

import datetime as dt
import platform
import subprocess

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
    """The versions a run's numbers depend on: ablate, Python, torch, lightning, numpy, CUDA, the device."""
    import lightning  # reason: the versions a run reports are those of the stack it imported (torch-free module)
    import numpy  # reason: as above
    import torch  # reason: as above (and the CUDA version and device name are torch's to tell)

    return {"ablate": ablate.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "lightning": lightning.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


def now() -> str:
    """The current UTC time, to the second, as ISO 8601: the summary's started/finished stamps."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
