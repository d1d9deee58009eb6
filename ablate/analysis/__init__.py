"""Analysis of the run store: paired tables, increments, the 2×2 overlap, plots and the report.

Reads the store only (layers below: store, tiers, identity, arm names, eval results); never imports
torch or training code (an import-linter contract in pyproject.toml holds this). The parts:

* `load`: a source (an experiment's folder of runs, or a CSV/parquet table) → `runs.Runs`, with
  `matching` refusing runs that differ in anything but the arm (and seed, across a row);
* `stats`, `tables`, `crossover`: paired differences, the tables, the crossover;
* `render`, `escape`, `plots`, `report`: markdown/CSV/LaTeX/JSON, figures, the report folder;
* `probes`, `synthetic`: the report's probe and synthetic-task sections.
"""
