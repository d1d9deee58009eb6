"""Analysis of the run store: paired tables, increments, the 2×2 overlap, plots and the report.

Reads the store only; never imports training code or torch. The names below load their module on
first use, so that `ablate.analysis.cli` (imported by every `ablate` command) stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Runs": "load", "load_runs": "load", "load_curves": "load",
    "paired_differences": "stats", "summarise": "stats",
    "Table": "tables", "build_table": "tables", "paired_table": "tables", "increments_table": "tables",
    "overlap_table": "tables",
    "render": "render",
    "Crossover": "plots", "find_crossover": "plots",
    "ReportContext": "report", "SECTIONS": "report", "write_report": "report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ablate.analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ablate.analysis.{_EXPORTS[name]}"), name)
