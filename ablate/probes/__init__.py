"""Probes on trained checkpoints: sink diagnostics, junk injection, and a synthetic abstention task.

Import-light: this package's top level pulls in no torch, so `ablate report` can call the two
summaries below without loading models. The heavy parts live in submodules:

* `ablate.probes.diagnostics` — `probe_model`, `probe_run` (probe.json + heatmap);
* `ablate.probes.injection` — `inject_model`, `inject_run` (inject.json);
* `ablate.probes.synthetic` — `SyntheticTask`, `synthetic_batch`, `train_synthetic`, `run_synthetic`;

Their tables and figures in the report are the analysis's (`ablate.analysis.probes`, `ablate.analysis.synthetic`);
the commands are `ablate.cli.probes`.
"""
