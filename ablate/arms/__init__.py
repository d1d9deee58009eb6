"""Attention arms: register a class, get it by name. Built-in arms are SPEC.md §1's twelve.

    from ablate.arms import Arm, register_arm, get_arm, list_arms

    @register_arm("my-arm")
    class MyArm(Arm):
        description = "..."
        def value_gate(self, v, x): ...

Names load on first use (PEP 562), so `ablate.arms.names` and the `ablate` command's parser stay
torch-free; the first use registers the built-in arms, in SPEC.md's order, before anything else.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SLOTS": "ablate.arms.base",
    "Arm": "ablate.arms.base",
    "ArmContext": "ablate.arms.base",
    "get_arm": "ablate.arms.base",
    "list_arms": "ablate.arms.base",
    "register_arm": "ablate.arms.base",
    "AttentionRecord": "ablate.arms.kernel",
    "attention": "ablate.arms.kernel",
    "reference_attention": "ablate.arms.kernel",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ablate.arms' has no attribute {name!r}")
    importlib.import_module("ablate.arms.builtin")  # registers the built-in arms first
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
