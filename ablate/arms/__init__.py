"""Attention arms: register a class, get it by name. Built-in arms are SPEC.md §1's twelve.

    from ablate.arms import Arm, register_arm, get_arm, list_arms

    @register_arm("my-arm")
    class MyArm(Arm):
        description = "..."
        def value_gate(self, v, x): ...
"""

from ablate.arms.attention import AttentionRecord, attention, reference_attention
from ablate.arms.base import SLOTS, Arm, ArmContext, get_arm, list_arms, register_arm
from ablate.arms import builtin as _builtin  # noqa: F401  (registers the built-in arms, in order)

__all__ = [
    "SLOTS",
    "Arm",
    "ArmContext",
    "AttentionRecord",
    "attention",
    "get_arm",
    "list_arms",
    "reference_attention",
    "register_arm",
]
