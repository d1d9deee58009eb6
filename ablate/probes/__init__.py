"""Probes on trained checkpoints: sink diagnostics and junk injection.

Import-light: this package's top level pulls in no torch, so `ablate report` can call the two
summaries below without loading models. The heavy parts live in submodules:

* `ablate.probes.diagnostics` — `probe_model`, `probe_run` (probe.json + heatmap);
* `ablate.probes.injection` — `inject_model`, `inject_run` (inject.json);

Their tables and figures in the report are the analysis's (`ablate.analysis.probes`; the testbed's,
`ablate.analysis.testbed`); the commands are `ablate.cli.probes`.
"""
