"""Attention arms: register a class, get it by name. Built-in arms are the study's twelve, then thirteen
registered examples outside the study: three slot examples (`ablate.arms.examples`: qk-norm, temperature, alibi)
and ten hook examples (`ablate.arms.papers`: softcap, sigmoid, diff, forgetting, ssmax, value-residual,
sliding-window, stick-breaking, softpick, selective).

    from ablate.arms import Arm, register_arm, get_arm, list_arms

    @register_arm("my-arm")
    class MyArm(Arm):
        description = "..."
        def value_gate(self, v, x): ...

Names load on first use (PEP 562), so `ablate.arms.names` and the `ablate` command's parser stay
torch-free; the first use registers the built-in arms, in the study's order, and the examples, before
anything else.
"""

from __future__ import annotations

from ablate._lazy import lazy_exports

_EXPORTS = {
    "HOOKS": "ablate.arms.base",
    "SLOTS": "ablate.arms.base",
    "AttentionContext": "ablate.arms.base",
    "Arm": "ablate.arms.base",
    "ArmContext": "ablate.arms.base",
    "get_arm": "ablate.arms.base",
    "list_arms": "ablate.arms.base",
    "register_arm": "ablate.arms.base",
    "study_arms": "ablate.arms.base",
    "AttentionRecord": "ablate.arms.kernel",
    "attention": "ablate.arms.kernel",
    "reference_attention": "ablate.arms.kernel",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("ablate.arms", globals(), _EXPORTS, first="ablate.arms.examples")
