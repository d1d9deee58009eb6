"""`benchmarks/gpu_check.py`'s judgements and printed summary: `plan_mfu`, the issue's goal figures, every error
the sections recorded, and one line or table per section. Reads the report only (no torch)."""

from __future__ import annotations

GOAL_MFU = 0.45
GOAL_STEP_RATIO = 1.05


def errors_in(node, path: str = "", kind: str = "error") -> list[str]:
    """'section.part: message' for every "error" (or "skipped") a section recorded, however deep."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get(kind), str):
            found.append(f"{path or 'report'}: {node[kind][:300]}")
        for key, value in node.items():
            if key != kind:
                found += errors_in(value, f"{path}.{key}" if path else str(key), kind)
    return found


def long_runs(report: dict) -> dict:
    return report.get("long", {}).get("runs", {})


def goals(report: dict) -> dict:
    """The issue's goal figures, judged only where they were measured on a GPU of the table (None otherwise)."""
    on_gpu = report.get("gpu_key") is not None
    seq = report.get("seq_len") or 1
    arms = report.get("arms", {}).get("arms", {})
    within = {}
    for arm, row in arms.items():
        ratio = row.get("speed", {}).get("step_ratio_to_baseline")
        allowed = GOAL_STEP_RATIO * ((seq + 1) / seq if arm == "sink-token" else 1)
        within[arm] = (ratio <= allowed) if (on_gpu and ratio is not None) else None
    base = long_runs(report).get("baseline", {})
    mfu = {mode: (row["mfu"] >= GOAL_MFU if on_gpu and row.get("mfu") is not None else None)
           for mode, row in base.items() if "mfu" in row}
    ratios = report.get("long", {}).get("step_ratio_to_baseline", {})
    long_within = {f"{arm} {mode}": (ratio <= GOAL_STEP_RATIO if on_gpu else None)
                   for arm, modes in ratios.items() for mode, ratio in modes.items()}
    compiled = report.get("long", {}).get("compile", {}).get("baseline", {})
    flex = report.get("flex", {}).get("arms", {})
    return {"baseline_mfu_at_least_45pct": mfu,
            "step_ratio_within_1.05_at_configuration": long_within,
            "step_time_within_1.05x_baseline_micro_batch_8": within,
            "compiled_faster": (compiled["speedup"] > 1) if on_gpu and "speedup" in compiled else None,
            "compiled_same_loss": compiled.get("same_loss_to_bf16"),
            "flex_paths_agree": {arm: row.get("paths", {}).get("agree") for arm, row in flex.items()},
            "phases_fit": report.get("phases", {}).get("all_fit")}


def finish(report: dict) -> None:
    """plan_mfu (the eager baseline's MFU at the run configuration, on a table GPU), goals, errors and ok."""
    eager = long_runs(report).get("baseline", {}).get("eager", {})
    compiled = long_runs(report).get("baseline", {}).get("compiled", {})
    on_gpu = report.get("gpu_key") is not None
    report["plan_mfu"] = eager.get("mfu") if on_gpu else None
    report["plan_mfu_compiled"] = compiled.get("mfu") if on_gpu else None
    matmul = report.get("hardware", {}).get("measured_matmul_tflops")
    peak = report.get("peak_bf16_tflops")
    if matmul and peak and report["plan_mfu"]:
        report["mfu_of_measured_matmul"] = report["plan_mfu"] * peak / matmul
    report["goals"] = goals(report)
    report["errors"] = [e for name, value in report.items() if name not in ("errors", "goals", "skipped")
                        for e in errors_in(value, name)]
    report["skipped"] = [e for name, value in report.items() if name not in ("errors", "goals", "skipped")
                         for e in errors_in(value, name, "skipped")]
    report["ok"] = not report["errors"] and report["goals"]["phases_fit"] is not False


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _num(x, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def arm_lines(arms: dict) -> list[str]:
    lines = [f"{'arm':<15} {'|Δlogit| bf16':>13} {'fp32':>8} {'flash':>6} {'effic.':>6} {'step ms':>8} {'× base':>7} "
             f"{'tok/s':>10} {'MFU':>6} {'peak GB':>8} {'fp32 ms':>8}"]
    for arm, row in arms.items():
        if "accuracy" not in row:
            lines.append(f"{arm:<15} {row.get('error') or row.get('skipped')}")
            continue
        a, b, s, f = row["accuracy"], row["backend"], row["speed"], row.get("speed_fp32", {})
        ok = {k: ("ok" if b.get(k) == "ok" else "no") for k in ("flash", "efficient")}
        lines.append(f"{arm:<15} {_num(a.get('max_abs_logit_error')):>13} "
                     f"{_num(a.get('max_abs_logit_error_fp32_fused')):>8} {ok['flash']:>6} {ok['efficient']:>6} "
                     f"{_num(s.get('step_s') and s['step_s'] * 1e3, '.1f'):>8} "
                     f"{_num(s.get('step_ratio_to_baseline'), '.3f'):>7} {_num(s.get('tokens_per_s'), '.0f'):>10} "
                     f"{_pct(s.get('mfu')):>6} {_num(s.get('peak_memory_gb'), '.1f'):>8} "
                     f"{_num(f.get('step_s') and f['step_s'] * 1e3, '.1f'):>8}")
    return lines


def phase_cell(name: str, phase: dict) -> str:
    measured = "OOM" if phase["measured_gb"] is None else f"{phase['measured_gb']:.2f}"
    return f"{name} {measured}/{phase['estimate_gb']:.2f} GB" + ("" if phase.get("fits") else " DOES NOT FIT")


def long_lines(long: dict) -> list[str]:
    lines = [f"long: {long['tier']} at its configuration: global batch {long['global_batch']} × {long['seq_len']}, "
             f"micro-batch {long['micro_batch']}, loss chunk {long['loss_chunk']}"]
    for arm, modes in long["runs"].items():
        for mode, row in modes.items():
            if "step_s" not in row:
                lines.append(f"  {arm} {mode}: {row.get('error') or row.get('skipped')}")
                continue
            memory = (f", peak {row['peak_reserved_gb']:.1f} GB reserved against {row['estimate_gb']:.1f} planned"
                      if "peak_reserved_gb" in row else "")
            lines.append(f"  {arm} {mode}: {row['timed_steps']} timed steps, {row['step_s']:.3f} s/step, "
                         f"{row['tokens_per_s']:,.0f} tok/s, MFU {_pct(row.get('mfu'))}, first step "
                         f"{row['first_step_s']:.1f} s{memory}")
    for arm, modes in long.get("step_ratio_to_baseline", {}).items():
        lines.append(f"  {arm} / baseline step: " + ", ".join(f"{m} {r:.3f}" for m, r in modes.items()))
    for arm, c in long.get("compile", {}).items():
        if "speedup" in c:
            lines.append(f"  compile {arm}: max loss difference {c['max_loss_difference']:.3g} over "
                         f"{c['steps_compared']} steps, speed-up ×{c['speedup']:.2f}, first compiled step "
                         f"{c['first_compiled_step_s']:.1f} s")
    return lines


def flex_lines(flex: dict) -> list[str]:
    if "arms" not in flex:
        return [f"flex: {flex.get('skipped') or flex.get('error')}"]
    lines = []
    for arm, row in flex["arms"].items():
        p, s = row.get("paths", {}), row.get("speed", {})
        if "max_relative_logit_error" not in p:
            lines.append(f"flex {arm}: {row.get('error') or row.get('skipped') or p.get('error')}")
            continue
        lines.append(f"flex {arm} ({row['why']}): values {p['max_relative_logit_error']:.2g}, gradients "
                     f"{_num(p['max_relative_gradient_error'], '.2g')} ({'agree' if p['agree'] else 'DISAGREE'}), "
                     f"step × base {_num(s.get('step_ratio_to_baseline'), '.3f')}")
    return lines


def print_summary(report: dict) -> None:
    """One line or table per section; a section that failed prints its error (never raises)."""
    d = report.get("hardware", {})
    print(f"{report.get('device')} ({report.get('gpu_key') or 'not a table GPU'}), torch {d.get('torch')}, "
          f"matmul {_num(d.get('measured_matmul_tflops'), '.0f')} TFLOP/s bf16 measured, "
          f"{_num(report.get('peak_bf16_tflops'), 'g')} table peak")
    parts = [("phases", lambda p: [f"memory {tier}: " + (row["error"] if "error" in row else
                                   f"micro-batch {row['micro_batch']}, " + ", ".join(
                                       phase_cell(n, ph) for n, ph in row["phases"].items()))
                                   for tier, row in p["tiers"].items()]),
             ("arms", lambda a: arm_lines(a["arms"])), ("flex", flex_lines), ("long", long_lines),
             ("ddp", lambda d: ["ddp: " + (d["skipped"] if "skipped" in d else
                                           f"{d['world_size']} processes ({d['backend']}), max relative gradient "
                                           f"error {d['max_relative_gradient_error']:.3g}")])]
    for name, lines in parts:
        if name not in report:
            continue
        try:
            print("\n".join(lines(report[name])))
        except Exception as err:  # a failed section has no figures: its error
            print(f"{name}: {report[name].get('error') or f'(summary failed: {err!r})'}")
    print(f"plan_mfu {_pct(report.get('plan_mfu'))} (eager), compiled {_pct(report.get('plan_mfu_compiled'))}")
    print(f"goals: {report.get('goals')}")
    for line in report.get("skipped", []):
        print(f"skipped {line}")
    for line in report.get("errors", []):
        print(f"ERROR {line}")
