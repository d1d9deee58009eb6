"""Names of the built-in arms in registry order, importable without torch (the analysis sorts by them, and
each arm's colour, marker and line style in every figure follow from its place: `ablate.analysis.plots`).

Read from `ablate/arms/builtin.py` itself, not listed: the names are the literal first argument of each
`@register_arm("…")` decorator there, in the order of the file, which is the order the registry holds them
in. So a new built-in arm is one edit (its class in builtin.py) and its order and style follow. The file is
parsed (`ast`), never executed: no torch is loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

BUILTIN_SOURCE = Path(__file__).with_name("builtin.py")


def registered_names(source: str, filename: str = "<source>") -> tuple[str, ...]:
    """The names of the classes that `source` registers with `@register_arm("name")`, in the order of the file.

    A decorator whose name is not a literal string is refused, naming its line: a built-in arm's name must be
    readable without running the file."""
    names = []
    for node in ast.parse(source, filename).body:
        for decorator in getattr(node, "decorator_list", ()):
            if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "register_arm"):
                continue
            first = decorator.args[0] if decorator.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                raise TypeError(f"{filename}:{decorator.lineno}: a built-in arm is registered with a literal name, "
                                "@register_arm(\"name\")")
            names.append(first.value)
    return tuple(names)


BUILTIN_ARMS = registered_names(BUILTIN_SOURCE.read_text(encoding="utf-8"), str(BUILTIN_SOURCE))
