"""`benchmarks/gpu_check.py`'s flex section: every arm whose attention a fused SDPA call cannot express (a score
modifier or a normaliser replacing softmax: on CUDA compiled flex_attention, on a CPU the reference path)
against the reference path in float32 without TF32 (values and every gradient), its bf16 error, and its step
time against the baseline's at the same shape.

Which arms: found by what the arm classes say, so this file needs no change when such arms are registered: an
arm that defines a hook method (`FLEX_HOOKS`) the base `Arm` leaves undefined or unfilled, whose `slots()`
name such a hook (`HOOK_SLOTS`), or whose declared path (a class attribute or class/static method in
`PATH_ATTRIBUTES`) mentions flex; `--flex-arms` adds arms by name. With none found the section says so and why.
"""

from __future__ import annotations

import inspect
import time

import torch

from ablate.arms import Arm, get_arm, list_arms
from gpu_arms import accuracy, build, no_tf32, speed, twin

FLEX_HOOKS = ("score_modifier", "score_mod", "modify_score", "normaliser", "normalizer", "normalise", "normalize")
HOOK_SLOTS = ("score-modifier", "score modifier", "score_modifier", "normaliser", "normalizer")
PATH_ATTRIBUTES = ("path", "attention_path", "kernel_path", "paths", "kernel")
VALUE_TOLERANCE = 1e-3  # largest |Δ| over the largest |reference|: float32 against float32, summation order only
GRADIENT_TOLERANCE = 1e-2  # the same per parameter's gradient, after 18 layers of backward


def overridden_hooks(cls: type) -> list[str]:
    """The hook methods the class defines that the base `Arm` does not define, or defines and the class replaces."""
    return [hook for hook in FLEX_HOOKS
            if callable(getattr(cls, hook, None)) and getattr(cls, hook) is not getattr(Arm, hook, None)]


def declared_path(cls: type) -> str | None:
    """The path the class declares (an attribute's value, or a class/static method's answer for "cuda"), or None."""
    for name in PATH_ATTRIBUTES:
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if raw is inspect.getattr_static(Arm, name, None):  # the base's own answer (`Arm.path`): nothing declared
            continue
        if isinstance(raw, (classmethod, staticmethod)):
            method = getattr(cls, name)
            for call in (lambda: method("cuda"), method):
                try:
                    return str(call())
                except Exception:  # another signature: try the next form
                    continue
        elif isinstance(raw, (str, tuple, list, dict)) or type(raw).__name__.endswith("Enum"):
            return str(raw)
    return None


def flex_candidates(registry: dict[str, type], named: list[str] | None = None) -> dict[str, str]:
    """{arm: why it is checked} for the arms of `registry` ({name: class}) found as the module docstring says,
    then the `named` ones."""
    found = {}
    for name, cls in registry.items():
        hooks = overridden_hooks(cls)
        slots = [s for s in getattr(cls, "slots", lambda: ())() if s in HOOK_SLOTS]
        path = declared_path(cls)
        if hooks or slots or (path and "flex" in path.lower()):
            found[name] = "; ".join(part for part in (hooks and f"hooks {', '.join(hooks)}",
                                                      slots and f"slots {', '.join(slots)}",
                                                      path and f"path {path}") if part)
    for name in named or ():
        found.setdefault(name, "named by --flex-arms")
    return found


def paths_agree(model, data: torch.Tensor, device) -> dict:
    """The model's own path (flex_attention on CUDA for these arms) against the reference path, float32 without
    TF32, same weights and batch: the largest relative error of the logits and of every parameter's gradient."""
    reference = twin(model, fused=False)
    with no_tf32():
        out, ref = model(data[:, :-1], data[:, 1:]), reference(data[:, :-1], data[:, 1:])
        out.loss.backward()
        ref.loss.backward()
    value = float((out.logits - ref.logits).detach().abs().max() / ref.logits.detach().abs().max().clamp_min(1e-30))
    ref_grads = dict(reference.named_parameters())
    errors = {name: float((p.grad - ref_grads[name].grad).abs().max()
                          / ref_grads[name].grad.abs().max().clamp_min(1e-30))
              for name, p in model.named_parameters() if p.grad is not None and ref_grads[name].grad is not None}
    missing = [name for name, p in model.named_parameters() if (p.grad is None) != (ref_grads[name].grad is None)]
    worst = max(errors, key=errors.get) if errors else None
    model.zero_grad(set_to_none=True)
    gradient = errors[worst] if worst else None
    return {"max_relative_logit_error": value, "max_relative_gradient_error": gradient, "worst_gradient": worst,
            "gradients_missing_on_one_path": missing, "loss_own_path": float(out.loss),
            "loss_reference": float(ref.loss),
            "agree": value <= VALUE_TOLERANCE and gradient is not None and gradient <= GRADIENT_TOLERANCE
            and not missing}


def flex_row(arm: str, why: str, shp: dict, data: torch.Tensor, device, args, peak, baseline_step_s) -> dict:
    model = build(arm, shp, device)
    row = {"why": why, "path": declared_path(get_arm(arm))}
    parts = (("paths", lambda: paths_agree(model, data[:2], device)),
             ("accuracy", lambda: accuracy(model, data, device)),
             ("speed", lambda: speed(model, data, device, args.warmup, args.timed, peak)))
    for name, part in parts:
        try:
            row[name] = part()
        except Exception as err:  # recorded; the other parts and arms go on
            row[name] = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
    if baseline_step_s and "step_s" in row["speed"]:
        row["speed"]["step_ratio_to_baseline"] = row["speed"]["step_s"] / baseline_step_s
    return row


def flex_section(shp: dict, data: torch.Tensor, device, args, peak, baseline_step, deadline: float) -> dict:
    """Every candidate arm (`flex_candidates`) until `deadline` (time.perf_counter()); with none, the reason.
    `baseline_step()` gives the baseline's step time at this shape (called only when there are candidates)."""
    candidates = flex_candidates({name: get_arm(name) for name in list_arms()}, args.flex_arms)
    if not candidates:
        return {"skipped": "no registered arm defines a score-modifier or normaliser hook or declares a flex path "
                           f"(looked for methods {', '.join(FLEX_HOOKS)}; slots {', '.join(HOOK_SLOTS)}; path "
                           f"attributes {', '.join(PATH_ATTRIBUTES)})", "registered": list_arms()}
    rows, baseline_step_s = {}, baseline_step()
    for arm, why in candidates.items():
        if time.perf_counter() > deadline:
            rows[arm] = {"why": why, "skipped": "the flex section's time (--flex-s) or the budget ran out"}
            continue
        try:
            rows[arm] = flex_row(arm, why, shp, data, device, args, peak, baseline_step_s)
        except Exception as err:
            rows[arm] = {"why": why, "error": f"{type(err).__name__}: {str(err)[:500]}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"arms": rows, "baseline_step_s": baseline_step_s, "value_tolerance": VALUE_TOLERANCE,
            "gradient_tolerance": GRADIENT_TOLERANCE}
