"""Markdown summaries of probe.json and inject.json across an experiment, by tier and arm over seeds.

Torch-free on purpose: `ablate report` calls these without loading models. Each reads the files the
probes wrote into run folders (RESULTS/<experiment>/<tier>/<arm>/seed<k>/) and returns "" when
there are none, so the report can leave the section out.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict
from pathlib import Path

from ablate.analysis.escape import markdown_cell
from ablate.arms.names import BUILTIN_ARMS
from ablate.errors import AblateError
from ablate.store import INJECT_FILE, PROBE_FILE, iter_run_dirs, read_json, run_of
from ablate.store_summary import final_weights_sha256
from ablate.tiers import tier_rank

log = logging.getLogger(__name__)

JUNK_ORDER = ("structural", "gaussian", "random", "gate-direction")  # the main condition first

# (key in probe.json's summary, column header, as a percentage?)
PROBE_COLUMNS = (
    ("first_key_mass", "first-key mass", True),
    ("read_norm_ratio", "‖v₀‖/median", False),
    ("phantom_mass", "phantom mass", True),
    ("exposure", "exposure", True),
    ("exposure_after_value_gate", "exposure after gate", True),
    ("value_gate_mean", "value gate mean", False),
    ("value_gate_near_zero", "value gate <0.1", True),
    ("output_gate_mean", "output gate mean", False),
    ("output_gate_near_zero", "output gate <0.1", True),
    ("max_abs_residual", "max |residual|", False),
    ("mean_layer_max_abs_residual", "mean over layers of max |residual|", False),
    ("key0_importance_share", "heads key-0 >0.3", True),
)


def _runs_with(experiment_dir, filename: str, stale: list[str] | None = None):
    """(tier, arm, seed, parsed json) for every run folder holding `filename`, skipping unreadable files.

    The run folders are the store's (`iter_run_dirs`: `<tier>/<arm>/seed<k>` only, never a folder kept aside
    by `--force`), and a run is named by its folder; a file that names another run (copied) is left out.
    So is a file of other weights than the run's final ones (its `weights_sha256`, which `ablate probe` and
    `ablate inject` record, is checked against the run's): its folder is added to `stale`.
    """
    for folder in iter_run_dirs(experiment_dir, holding=filename):
        path = folder / filename
        try:
            data = read_json(path)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        why = weights_problem(folder, data)
        if why is not None:
            log.warning("%s %s: left out of the summary", path, why)
            if stale is not None:
                stale.append(str(folder))
            continue
        named = run_of(folder)
        tier, arm, seed = named.tier, named.arm, named.seed
        run = data.get("run") if isinstance(data.get("run"), dict) else {}
        claimed = {"tier": run.get("tier", tier), "arm": run.get("arm", arm), "seed": run.get("seed", seed)}
        if (str(claimed["tier"]), str(claimed["arm"]), str(claimed["seed"])) != (tier, arm, str(seed)):
            log.warning("%s names the run %s, not the one of its folder: left out of the summary", path, claimed)
            continue
        yield tier, arm, seed, data


def weights_problem(folder: Path, data: dict) -> str | None:
    """Why a probe.json / inject.json is not of the run's final weights, or None when it is."""
    try:
        weights = final_weights_sha256(folder)
    except AblateError as err:
        return f"belongs to a damaged run ({err})"
    if weights is None:
        return "belongs to a run without final weights (not completed)"
    recorded = data.get("weights_sha256")
    if recorded != weights:
        found = "records no weights' sha256" if recorded is None else f"is of weights {str(recorded)[:12]}…"
        return f"{found}, not the run's final weights ({weights[:12]}…): stale, rerun the probe on this run"
    return None


def stale_note(stale: list[str], filename: str, command: str) -> list[str]:
    """The line a summary adds for the files it left out as stale (none: no line)."""
    if not stale:
        return []
    return ["", f"Left out: {len(stale)} {filename} not of their run's final weights (stale; `{command} RUN_DIR` "
                f"again): {', '.join(stale[:3])}{' …' if len(stale) > 3 else ''}."]


def _row(cells) -> str:
    """One markdown table row, every cell escaped: `max |residual|` or an arm read from a file stays one cell."""
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def _order(tier: str, arm: str):
    arm_rank = BUILTIN_ARMS.index(arm) if arm in BUILTIN_ARMS else len(BUILTIN_ARMS)
    return (tier_rank(tier), tier, arm_rank, arm)


def _cell(values: list[float], percent: bool) -> str:
    """Mean over seeds, ± sd (ddof 1) when there are several."""
    if not values:
        return "–"
    mean = statistics.fmean(values)
    scale, unit, digits = (100.0, "%", 1) if percent else (1.0, "", 3)
    if abs(mean) >= 100:
        digits = 0
    text = f"{mean * scale:.{digits}f}{unit}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values) * scale:.{digits}f}"
    return text


def summarise_probes(experiment_dir) -> str:
    """One row per (tier, arm): each probe figure's mean over seeds (± sd), and the number of seeds."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    stale: list[str] = []
    for tier, arm, _seed, probe in _runs_with(experiment_dir, PROBE_FILE, stale):
        if isinstance(probe.get("summary"), dict):
            groups[(tier, arm)].append(probe["summary"])
    if not groups:
        return "\n".join(stale_note(stale, PROBE_FILE, "ablate probe")).strip()
    used = [c for c in PROBE_COLUMNS if any(s.get(c[0]) is not None for runs in groups.values() for s in runs)]
    lines = [
        _row(["tier", "arm", "seeds", *(header for _, header, _ in used)]),
        "|---|---|---:|" + "---:|" * len(used),
    ]
    for tier, arm in sorted(groups, key=lambda key: _order(*key)):
        runs = groups[(tier, arm)]
        cells = []
        for key, _, percent in used:
            values = [float(s[key]) for s in runs if s.get(key) is not None and math.isfinite(float(s[key]))]
            cells.append(_cell(values, percent))
        lines.append(_row([tier, arm, len(runs), *cells]))
    lines.append("")
    lines.append("Means over layers and heads (queries i ≥ 1), then over seeds (± sd). Exposure: mass on reads "
                 "below the head's 25th-percentile norm. Max |residual|: the largest activation over layers; mean over "
                 "layers of max |residual|: "
                 "each layer's largest activation, averaged over layers. Heads key-0 >0.3: share of heads whose "
                 "first-key mass exceeds 0.3.")
    return "\n".join(lines + stale_note(stale, PROBE_FILE, "ablate probe"))


def summarise_injections(experiment_dir) -> str:
    """One table per cutoff: rows (tier, arm, junk), columns ε, cells the mean loss increase over seeds."""
    cells: dict[tuple, list[float]] = defaultdict(list)  # (cutoff, tier, arm, junk, eps) → increases
    not_applicable: set[tuple] = set()
    seeds: dict[tuple, set] = defaultdict(set)
    stale: list[str] = []
    for tier, arm, seed, data in _runs_with(experiment_dir, INJECT_FILE, stale):
        for cutoff, result in (data.get("by_cutoff") or {}).items():
            for row in result.get("rows", []):
                key = (cutoff, tier, arm, row["junk"], float(row["eps"]))
                if row.get("increase") is None:
                    not_applicable.add(key)
                else:
                    cells[key].append(float(row["increase"]))
                    seeds[(cutoff, tier, arm)].add(seed)
    keys = set(cells) | not_applicable
    note = "\n".join(stale_note(stale, INJECT_FILE, "ablate inject")).strip()
    if not keys:
        return note
    sections = []
    for cutoff in sorted({k[0] for k in keys}, key=lambda c: (c != "p25", c)):
        eps = sorted({k[4] for k in keys if k[0] == cutoff})
        rows = sorted({k[1:4] for k in keys if k[0] == cutoff},
                      key=lambda r: (*_order(r[0], r[1]), _junk_rank(r[2]), r[2]))
        lines = [
            f"Junk injection, cutoff {cutoff}: loss increase over clean (nats), mean over seeds (± sd).",
            "",
            _row(["tier", "arm", "junk", "seeds", *(f"ε={e:g}" for e in eps)]),
            "|---|---|---|---:|" + "---:|" * len(eps),
        ]
        for tier, arm, junk in rows:
            values = []
            for e in eps:
                key = (cutoff, tier, arm, junk, e)
                values.append("n/a" if key in not_applicable and not cells.get(key) else _increase(cells.get(key, [])))
            n = len(seeds.get((cutoff, tier, arm), ()))
            lines.append(_row([tier, arm, junk, n, *values]))
        sections.append("\n".join(lines))
    return "\n\n".join(sections + ([note] if note else []))


def _junk_rank(junk: str) -> int:
    return JUNK_ORDER.index(junk) if junk in JUNK_ORDER else len(JUNK_ORDER)


def _increase(values: list[float]) -> str:
    if not values:
        return "–"
    text = f"{statistics.fmean(values):+.3f}"
    return text + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")
