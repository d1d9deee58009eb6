"""The one exception type the command line turns into a clear message instead of a traceback."""


class AblateError(ValueError):
    """A user-facing error: the message names the bad value and what would have been valid."""


def choice_error(kind: str, value: object, valid) -> AblateError:
    """`unknown arm 'foo'; valid arms: baseline, sink-logit, ...`"""
    valid = list(valid)
    return AblateError(f"unknown {kind} {value!r}; valid {kind}s: {', '.join(map(str, valid))}")
