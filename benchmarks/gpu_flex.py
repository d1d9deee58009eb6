"""`benchmarks/gpu_check.py`'s flex section: every arm whose attention a fused SDPA call cannot express (a score
modifier or a normaliser replacing softmax: on CUDA compiled flex_attention, on a CPU the reference path)
against the reference path in float32 without TF32 (values and every gradient), its bf16 error, and its step
time against the baseline's at the same shape.

Which arms: those whose own path on CUDA is flex_attention (`Arm.path("cuda") == "flex"`: a score modifier, a
normaliser with an elementwise log-weight, a mask), so this file needs no change when such arms are registered;
`--flex-arms` adds arms by name. With none found the section says so.
"""

from __future__ import annotations

import time

import torch

from ablate.arms import Arm, get_arm, list_arms
from gpu_arms import accuracy, build, no_tf32, speed, twin

VALUE_TOLERANCE = 1e-3  # largest |Δ| over the largest |reference|: float32 against float32, summation order only
GRADIENT_TOLERANCE = 1e-2  # the same per parameter's gradient, after 18 layers of backward


def flex_candidates(registry: dict[str, type], named: list[str] | None = None) -> dict[str, str]:
    """{arm: why it is checked} for the arms of `registry` ({name: class}) whose path on CUDA is flex, then the
    `named` ones."""
    found = {name: "path flex on CUDA" for name, cls in registry.items()
             if isinstance(cls, type) and issubclass(cls, Arm) and cls.path("cuda") == "flex"}
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
    row = {"why": why, "path": get_arm(arm).path(device.type)}
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
        return {"skipped": "no registered arm takes flex_attention on CUDA (Arm.path('cuda') == 'flex')",
                "registered": list_arms()}
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
