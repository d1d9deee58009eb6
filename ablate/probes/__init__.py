"""Probes on trained checkpoints: sink diagnostics, junk injection, and a synthetic abstention task.

Import-light: this package's top level pulls in no torch, so `ablate report` can call the two
summaries below without loading models. The heavy parts live in submodules:

* `ablate.probes.diagnostics` — `probe_model`, `probe_run` (probe.json + heatmap);
* `ablate.probes.injection` — `inject_model`, `inject_run` (inject.json);
* `ablate.probes.synthetic` — `SyntheticTask`, `synthetic_batch`, `train_synthetic`, `run_synthetic`;
* `ablate.probes.synthetic_report` — synthetic.json → the report's table and synthetic.png (torch-free);
* `ablate.probes.cli` — `ablate probe`, `ablate inject`, `ablate synthetic`.
"""

from ablate.probes.summary import summarise_injections, summarise_probes

__all__ = ["summarise_injections", "summarise_probes"]
