"""PEP 562 lazy exports: a package names what it offers; each name's module loads on first use.

Why: `ablate --help`, the analysis and `ablate.arms.names` must not pay for torch, tiktoken or datasets.
"""

from __future__ import annotations

import importlib


def lazy_exports(package: str, namespace: dict, exports: dict[str, str], first: str | None = None):
    """Return (__getattr__, __dir__) for `package`; `first` is a module imported before any name."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if first:
            importlib.import_module(first)
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
