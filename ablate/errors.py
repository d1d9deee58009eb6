"""The one exception type the command line turns into a clear message instead of a traceback."""

from __future__ import annotations

import contextlib
import errno
import os


class AblateError(ValueError):
    """A user-facing error: the message names the bad value and what would have been valid."""


def choice_error(kind: str, value: object, valid) -> AblateError:
    """`unknown arm 'foo'; valid arms: baseline, sink-logit, ...`"""
    valid = list(valid)
    return AblateError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(map(str, valid))}")


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, or the user's quota spent


class DiskFull(AblateError):
    """A write failed for want of space: every writer of the store writes atomically (or appends lines a
    reader skips when torn), so nothing already written is lost and the same command resumes."""


def disk_full(path: str | os.PathLike, err: OSError) -> DiskFull:
    return DiskFull(f"{os.strerror(err.errno)} writing {os.fspath(path)}: nothing lost; rerun the same command once "
                    "there is space")


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """While inside, a write that fails for want of space (ENOSPC, EDQUOT) is a DiskFull naming `path`."""
    try:
        yield
    except OSError as err:
        if err.errno in DISK_FULL:
            raise disk_full(path, err) from None
        raise


def error_line(text: str | None) -> str | None:
    """The one line that says what went wrong: `ablate: error: …` or a traceback's last `Type: message` line."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("ablate: error:"):
            return line.removeprefix("ablate: error:").strip()
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if ":" in line and head.replace(".", "").replace("_", "").isalnum() and head[:1].isupper() and " " not in head:
            return line
    return lines[-1][:300] if lines else None
