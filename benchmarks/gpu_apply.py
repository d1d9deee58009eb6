"""Put a GPU run of `benchmarks/gpu_check.py` where the project reads it: the JSON where `ablate plan` finds its
measured MFU (gpu_check.json at the repository root, `ablate.plan.gpu_check_paths`), and its figures in
BENCHMARKS.md (section 6, the GPU path; section 11, every phase's memory on a GPU).

    python benchmarks/gpu_apply.py /path/to/gpu_check.json [--force]

BENCHMARKS.md's generated parts sit between `<!-- gpu_check ... -->` markers, so applying a later run replaces
them; the first time, they replace the "not run on a GPU yet" heading and sentences. An existing plan file with
other content is kept unless `--force` (a measurement is never overwritten silently). Reads JSON only (no torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADING = "## 6. The GPU path (`benchmarks/gpu_check.py`)"
FIRST_SENTENCE = ("**No GPU was lent to the session that built it: no GPU figure exists yet.** Goal figures for "
                  "when one\nis:")
PENDING = ("**On a GPU: pending.** No GPU was lent to this session: `benchmarks/gpu_check.py`'s per-tier memory\n"
           "figures (bf16, the estimate at \"bf16-mixed\" with its 2 GB for the CUDA context) have not been "
           "measured.\nRun `python benchmarks/gpu_check.py` on one and put its `memory <tier>:` lines here with "
           "the GPU's name.")
MARKS = {"figures": ("<!-- gpu_check figures: begin -->", "<!-- gpu_check figures: end -->"),
         "phases": ("<!-- gpu_check phases: begin -->", "<!-- gpu_check phases: end -->")}


class ApplyError(Exception):
    pass


def _pct(x) -> str:
    return "–" if x is None else f"{x:.1%}"


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _cell(text) -> str:
    """A table cell: one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _para(text: str) -> list[str]:
    return textwrap.wrap(text, 110, break_on_hyphens=False) + [""]


def long_table(long: dict) -> list[str]:
    ratios = long.get("step_ratio_to_baseline", {})
    lines = _para(f"{long['tier']} at its run configuration on this GPU: global batch {long['global_batch']} × "
                  f"{long['seq_len']}, micro-batch {long['micro_batch']}, loss chunk {long['loss_chunk']}, bf16, "
                  "fused AdamW, random tokens (`gpu_long.py`):") + [
             "| arm | mode | timed steps | s/step | tokens/s | MFU | × baseline | first step s | peak reserved / "
             "planned GB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for arm, modes in long["runs"].items():
        for mode, r in modes.items():
            if "step_s" not in r:
                lines.append(f"| {arm} | {mode} | {_cell(r.get('error') or r.get('skipped'))} ||||||||")
                continue
            ratio = 1.0 if arm == "baseline" else ratios.get(arm, {}).get(mode)
            memory = (f"{r['peak_reserved_gb']:.1f} / {r['estimate_gb']:.1f}" if "peak_reserved_gb" in r else "–")
            lines.append(f"| {arm} | {mode} | {r['timed_steps']} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
                         f"{_pct(r.get('mfu'))} | {_f(ratio, '.3f')} | {r['first_step_s']:.1f} | {memory} |")
    for arm, c in long.get("compile", {}).items():
        if "speedup" in c:
            lines += [""] + _para(f"Compiled against eager, {arm}: largest loss difference "
                                  f"{c['max_loss_difference']:.3g} over {c['steps_compared']} steps (same loss to "
                                  f"bf16: {c['same_loss_to_bf16']}), speed-up ×{c['speedup']:.2f}, first compiled "
                                  f"step {c['first_compiled_step_s']:.1f} s.")[:-1]
    return lines


def arms_table(arms: dict, report: dict) -> list[str]:
    lines = _para(f"Per arm at the {report.get('tier')} shape, micro-batch {report.get('micro_batch')} × "
                  f"{report.get('seq_len')} (`gpu_arms.py`): the fused path against the float32 reference path "
                  "(largest absolute logit error, the fused path in bf16 and in float32 without TF32), the SDPA "
                  "kernels with the math kernel forbidden, and training steps:") + [
             "| arm | max abs Δlogit bf16 | fp32 | flash | mem-efficient | ms/step bf16 | × baseline | MFU | "
             "peak GB | ms/step fp32 |", "|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for arm, r in arms.items():
        if "accuracy" not in r:
            lines.append(f"| {arm} | {_cell(r.get('error') or r.get('skipped'))} |||||||||")
            continue
        a, b, s, f = r["accuracy"], r["backend"], r["speed"], r.get("speed_fp32", {})
        lines.append(f"| {arm} | {_f(a.get('max_abs_logit_error'), '.3g')} | "
                     f"{_f(a.get('max_abs_logit_error_fp32_fused'), '.2g')} | {_cell(b.get('flash', '–'))[:70]} | "
                     f"{_cell(b.get('efficient', '–'))[:70]} | {_f(s.get('step_s') and s['step_s'] * 1e3, '.1f')} | "
                     f"{_f(s.get('step_ratio_to_baseline'), '.3f')} | {_pct(s.get('mfu'))} | "
                     f"{_f(s.get('peak_memory_gb'), '.1f')} | {_f(f.get('step_s') and f['step_s'] * 1e3, '.1f')} |")
    return lines


def flex_lines(flex: dict) -> list[str]:
    if "arms" not in flex:
        return _para(f"Score-modifier and normaliser arms through flex_attention (`gpu_flex.py`): "
                     f"{flex.get('skipped') or flex.get('error') or 'not run'}.")[:-1]
    lines = _para("Score-modifier and normaliser arms, their own path against the reference (float32, no TF32; "
                  "largest relative error) and step time (`gpu_flex.py`):") + [
             "| arm | why | values | gradients | agree | ms/step bf16 | × baseline |",
             "|---|---|---:|---:|---|---:|---:|"]
    for arm, r in flex["arms"].items():
        p, s = r.get("paths", {}), r.get("speed", {})
        lines.append(f"| {arm} | {_cell(r.get('why'))} | {_f(p.get('max_relative_logit_error'), '.2g')} | "
                     f"{_f(p.get('max_relative_gradient_error'), '.2g')} | "
                     f"{_cell(p.get('agree', p.get('error') or r.get('error') or r.get('skipped')))} | "
                     f"{_f(s.get('step_s') and s['step_s'] * 1e3, '.1f')} | "
                     f"{_f(s.get('step_ratio_to_baseline'), '.3f')} |")
    return lines


def figures_block(report: dict) -> str:
    d = report.get("hardware", {})
    lines = _para(f"**Measured on {report['device']}** (`{report['gpu_key']}`), torch {d.get('torch')}, CUDA "
                  f"{d.get('cuda')}: a bf16 8192³ matmul ran at {_f(d.get('measured_matmul_tflops'), '.0f')} "
                  f"TFLOP/s against the table's {report['peak_bf16_tflops']:g} (every MFU here is over the table's "
                  f"figure). Command: `python benchmarks/gpu_check.py {' '.join(report.get('argv', []))}`.")
    renders = (("long", long_table), ("arms", lambda a: arms_table(a["arms"], report)), ("flex", flex_lines))
    for name, render in renders:
        section = report.get(name, {})
        lines += (render(section) if section and "error" not in section else
                  [f"{name}: {_cell(section.get('error', 'not run'))}"]) + [""]
    lines += _para(f"`plan_mfu` = {_pct(report.get('plan_mfu'))} (the eager baseline at the run configuration; "
                   f"compiled {_pct(report.get('plan_mfu_compiled'))}): gpu_check.json at the repository root, "
                   f"which `ablate plan --gpu {report['gpu_key']}` reads.") + goal_lines(report.get("goals", {}))
    if report.get("errors"):
        lines += [""] + _para("Errors recorded: " + "; ".join(report["errors"]))[:-1]
    return "\n".join(lines).rstrip("\n")


def _verdict(value) -> str:
    return {True: "met", False: "NOT met", None: "not judged"}[value]


def goal_lines(goals: dict) -> list[str]:
    """The goals, one bullet each: met, not met, or not judged (not measured on a table GPU)."""
    lines = ["Goals:"]
    for name, value in goals.items():
        if isinstance(value, dict):
            text = ", ".join(f"{key} {_verdict(v)}" for key, v in value.items()) or "nothing measured"
        else:
            text = _verdict(value)
        lines.append(f"- {name.replace('_', ' ')}: {text}")
    return lines


def phases_block(report: dict) -> str:
    phases = report.get("phases", {})
    if "tiers" not in phases:
        why = phases.get("error", "the section did not run")
        return f"**On a GPU ({report['device']}):** not measured: {why}."
    lines = _para(f"**On a GPU ({report['device']}, {phases.get('gpu_memory_gb') or 0:.0f} GB as "
                  "`ablate.tiers.GPUS` says):** per tier, the micro-batch `micro_batch_for` picks, each phase's "
                  "peak reserved memory (bf16) against its estimate (`benchmarks/gpu_check.py`, phases section).") + [
             "| tier | micro-batch | phase | measured GB | estimate GB | fits |", "|---|---:|---|---:|---:|---|"]
    for tier, row in phases["tiers"].items():
        if "error" in row:
            lines.append(f"| {tier} | – | {_cell(row['error'])} ||||")
        for name, p in row.get("phases", {}).items():
            measured = "OOM" if p["measured_gb"] is None else f"{p['measured_gb']:.2f}"
            lines.append(f"| {tier} | {row.get('micro_batch', '–')} | {name} | {measured} | {p['estimate_gb']:.2f} | "
                         f"{p.get('fits')} |")
    return "\n".join(lines)


def put_block(text: str, marks: tuple[str, str], block: str, anchor: str, anchor_keep: str = "") -> str:
    """Replace the text between `marks`, or the first time `anchor` (keeping `anchor_keep` after the block)."""
    begin, end = marks
    framed = f"{begin}\n{block}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + framed + rest.split(end, 1)[1]
    if anchor not in text:
        raise ApplyError(f"BENCHMARKS.md has neither {begin} nor the text to replace: {anchor[:60]!r}…")
    return text.replace(anchor, framed + (f"\n\n{anchor_keep}" if anchor_keep else ""), 1)


def apply(report: dict, benchmarks: Path, plan_file: Path, force: bool = False) -> None:
    if not report.get("gpu_key"):
        raise ApplyError(f"{report.get('device')!s} is not a GPU of ablate.tiers.GPUS "
                         "(gpu_key is null): nothing to apply")
    mfu = report.get("plan_mfu")
    if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ApplyError(f"plan_mfu is {mfu!r}, not a fraction in (0, 1]: the long section did not time the eager "
                         "baseline; nothing applied")
    content = json.dumps(report, indent=1) + "\n"
    if plan_file.exists() and plan_file.read_text() != content and not force:
        raise ApplyError(f"{plan_file} exists with other content; pass --force to replace it")
    text = benchmarks.read_text()
    lines = text.split("\n")
    index = next((i for i, line in enumerate(lines) if line.startswith(HEADING)), None)
    if index is None:
        raise ApplyError(f"{benchmarks} has no heading {HEADING!r}")
    lines[index] = f"{HEADING} — measured on {report['device']}"
    text = "\n".join(lines)
    text = put_block(text, MARKS["figures"], figures_block(report), FIRST_SENTENCE, "Goal figures:")
    text = put_block(text, MARKS["phases"], phases_block(report), PENDING)
    plan_file.write_text(content)
    benchmarks.write_text(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the gpu_check.json a GPU run wrote")
    parser.add_argument("--benchmarks", default=str(REPO / "BENCHMARKS.md"), help="default: the repository's")
    parser.add_argument("--plan-file", default=str(REPO / "gpu_check.json"),
                        help="where `ablate plan` finds it (default: gpu_check.json at the repository root)")
    parser.add_argument("--force", action="store_true", help="replace a plan file with other content")
    args = parser.parse_args(argv)
    try:
        apply(json.loads(Path(args.report).read_text()), Path(args.benchmarks), Path(args.plan_file), args.force)
    except (ApplyError, OSError, json.JSONDecodeError) as err:
        print(f"gpu_apply: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.plan_file} and {args.benchmarks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
