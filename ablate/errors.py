"""The one exception type the command line turns into a clear message instead of a traceback."""


class AblateError(ValueError):
    """A user-facing error: the message names the bad value and what would have been valid."""


def choice_error(kind: str, value: object, valid) -> AblateError:
    """`unknown arm 'foo'; valid arms: baseline, sink-logit, ...`"""
    valid = list(valid)
    return AblateError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(map(str, valid))}")


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
