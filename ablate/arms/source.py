"""An arm's code as part of a run's identity: a hash of the files that define its class and of the file that
registers it.

An arm's name says which arm a run trained, not which code: a gate edited from 1.0 to 0.5 between two seeds
keeps its name, its config and every fingerprint, and a table would average the two arms as one. So each run
records `arm_source_hash` in its summary (`arm_source`), and the tables refuse a row whose seeds differ in it
(`ablate.analysis.matching`). Whole files, not the class's lines alone: a module-level constant or helper the
class reads is its code too. Any registered class is covered — a built-in arm, an example, or one loaded from a
file of one's own (`ablate.experiment.load_module`, `--arm-file`); the registering file is recorded by
`register_arm` (`registered_in`). Torch-free.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ARM_SOURCE = "arm_source"  # the summary key
UNREADABLE = "<no file>"


def registering_file(depth: int = 2) -> str | None:
    """The file of the module whose code called `register_arm(...)(cls)` (`depth` frames above this call)."""
    return sys._getframe(depth).f_globals.get("__file__")


def defining_files(cls: type) -> list[str]:
    """The files that define `cls` and its bases below the arms' common base (`Arm` and `object` are the house's,
    not the arm's), from the code of their methods, so that a class of a file loaded by path is found too."""
    files = []
    for klass in cls.__mro__:
        if klass.__module__ == "ablate.arms.base" or klass is object:
            continue
        module = sys.modules.get(klass.__module__)
        found = getattr(module, "__file__", None) if module is not None else None
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            if code is not None:
                found = code.co_filename
                break
        files.append(found or UNREADABLE)
    return files


def arm_source_hash(cls: type) -> str:
    """sha256 over the text of every file that defines the arm's class (and its own bases) and of the file that
    registered it, each named by its file name; an unreadable one counts by its name alone."""
    files = sorted(set(defining_files(cls) + [getattr(cls, "registered_in", None) or UNREADABLE]))
    digest = hashlib.sha256(b"ablate-arm-source;" + cls.__qualname__.encode())
    for name in files:
        digest.update(f";{Path(name).name};".encode())
        try:
            digest.update(Path(name).read_bytes())
        except OSError:
            digest.update(UNREADABLE.encode())
    return digest.hexdigest()
