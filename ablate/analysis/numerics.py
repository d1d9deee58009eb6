"""Which rows pair runs made on different kernel sets or devices: allowed, but said beside the row.

A run's summary records what computed its numbers (`ablate.provenance.numerics`: the CPU kernel set, the GPU).
That is execution, not identity: no fingerprint hashes it, so a mixed SLURM partition still gives matched
pairs. But two kernel sets round differently (a smoke run's losses drift apart by up to 2.5e-3 within 30
steps, docs/method.md "Numerics"), so a row that mixes them is marked, and a note names the kinds per row.
"""

from __future__ import annotations

import polars as pl

MIXED_NUMERICS = "mixed-numerics"
MIXED_NUMERICS_NOTE = ("the row pairs or averages runs computed on different CPU kernel sets or devices "
                       "(numerics are execution, not identity: the pairing holds, the last bits of each loss do not)")
NUMERICS = "numerics"  # the Runs column: `numerics_label` of each run, null when not recorded


def numerics_label(versions_of_run: dict | None, history: list | None = None) -> str | None:
    """One short name for what computed a run, for a table to compare: "cuda NVIDIA H100 (sm 9.0)" or
    "cpu AVX512"; None for a run recorded before provenance had `numerics`. A run resumed under another kernel set
    (`history`: every numerics it trained under) is named by all of them: "cpu AVX2 + cpu AVX512". Here, not in
    ablate.provenance: the analysis stays torch-free."""
    labels = sorted({_label(n) for n in history or [] if isinstance(n, dict)})
    if len(labels) > 1:
        return " + ".join(labels)
    found = (versions_of_run or {}).get("numerics")
    if not isinstance(found, dict):
        return labels[0] if labels else None
    return _label(found)


def _label(found: dict) -> str:
    device = found.get("gpu")
    if isinstance(device, dict) and device.get("name"):
        return f"cuda {device['name']} (sm {device.get('capability')})"
    return f"cpu {found.get('cpu_capability')}"


def mixed_numerics(completed: pl.DataFrame, tier: str, arms) -> str | None:
    """"cpu AVX2 ×2, cpu AVX512 ×1" when the counted runs of `arms` in `tier` were made on more than one kind
    of kernels or device; None when they agree (or record nothing, as a table file's runs)."""
    if NUMERICS not in completed.columns:
        return None
    labels = completed.filter((pl.col("tier") == tier) & pl.col("arm").is_in(list(arms)))[NUMERICS].drop_nulls()
    counts = labels.value_counts(sort=True)
    if counts.height < 2:
        return None
    return ", ".join(f"{label} ×{n}" for label, n in sorted(counts.iter_rows()))
