"""Sink diagnostics on a trained model: where attention mass goes and how loud the reads are.

All figures are per layer and per *query* head, on fixed batches, from the reference attention path
(`model(idx, record=True)`), so every arm is measured by the same code. Definitions:

* **Queries.** Every mass figure averages over query positions i ≥ 1. Query 0 sees only key 0, so
  it would put all its (non-phantom) mass there whatever the model learned; including it would
  inflate first-key mass by ~1/T for every arm alike. For `sink-token` the records include the
  prepended token, so key 0 *is* the sink token and query 0 (the sink token itself) is the one left out.
* **first_key_mass**: mean over queries of p_i0, the weight on key position 0.
* **read_norm_ratio**: mean ‖v_0‖ over the head's median read norm ‖v_j‖ (all positions of all
  batches), reads taken *before* any gate. A sink's read is quiet: ratio < 1.
* **phantom_mass**: mean over queries of the phantom key's weight (arms with a denominator slot).
* **exposure**: mass on reads whose norm is below the head's 25th percentile read norm
  (pooled over all batches), over all mass (phantom included): what a head spends on its quietest
  quarter. `exposure_after_value_gate` weights each read by its mean value gate (value-slot arms):
  what of that mass still arrives after the gate.
* **gates**: mean and share below 0.1 of the value gate (per kv head, every key and channel), of the
  output gate (per query head, every query and channel) and of the routing gate g_j = exp(log g_j).
* **max_abs_residual**: the largest |x| in the residual stream after each layer (massive activations);
  the summary gives both the maximum over layers and `mean_layer_max_abs_residual`, the mean over
  layers of each layer's largest activation (the figure Qiu et al. report, 1,053 → 94 with gating).
* **key-0 importance** of a head is its first_key_mass; the summary counts the share of all
  (layer, head) pairs whose importance exceeds 0.3 (`KEY0_IMPORTANCE_THRESHOLD`): heads that are sinks.

Key/value quantities (read norms, value and routing gates) live on kv heads; under grouped-query
attention they are repeated for each query head of the group so every list has n_head entries.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ablate.modelio import final_weights_held, split_batch, validation_batches_for_run
from ablate.store import HEATMAP_FILE, PROBE_FILE, atomic_write_json
from ablate.tiers import evidence_note

log = logging.getLogger(__name__)

KEY0_IMPORTANCE_THRESHOLD = 0.3
GATE_NEAR_ZERO = 0.1
EXPOSURE_QUANTILE = 0.25
GATES = ("value_gate", "output_gate", "routing_gate")
RECORD_CHUNK = 2  # sequences per recorded forward pass


@dataclass
class _GateTally:
    total: torch.Tensor | None = None  # per head
    below: torch.Tensor | None = None
    count: int = 0

    def add(self, gate: torch.Tensor) -> None:
        """gate: (B, heads, T, ...) → sums over everything but the head axis."""
        per_head = gate.transpose(0, 1).reshape(gate.shape[1], -1).double()
        total, below = per_head.sum(1), (per_head < GATE_NEAR_ZERO).sum(1).double()
        self.total = total if self.total is None else self.total + total
        self.below = below if self.below is None else self.below + below
        self.count += per_head.shape[1]

    def result(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.total is None else (self.total / self.count, self.below / self.count)


@dataclass
class _LayerTally:
    """Running sums for one layer; quantile-based figures wait until every batch has been seen."""

    first_key: torch.Tensor | None = None  # (H,) Σ p_i0
    phantom: torch.Tensor | None = None  # (H,) Σ phantom mass
    n_queries: int = 0
    received: list = field(default_factory=list)  # per batch (B, H, Tk): Σ_i p_ij
    read_norms: list = field(default_factory=list)  # per batch (B, Hkv, Tk)
    mean_value_gate: list = field(default_factory=list)  # per batch (B, Hkv, Tk)
    gates: dict = field(default_factory=lambda: {name: _GateTally() for name in GATES})
    max_abs_residual: float = 0.0

    def add(self, record, residual: torch.Tensor) -> None:
        weights = record.weights[:, :, 1:].double()  # (B, H, Tq-1, Tk): queries i ≥ 1
        self.n_queries += weights.shape[0] * weights.shape[2]
        self.first_key = _acc(self.first_key, weights[..., 0].sum((0, 2)))
        if record.phantom_mass is not None:
            self.phantom = _acc(self.phantom, record.phantom_mass[:, :, 1:].double().sum((0, 2)))
        self.received.append(weights.sum(2).cpu())
        self.read_norms.append(record.reads.norm(dim=-1).double().cpu())
        if record.value_gate is not None:
            self.gates["value_gate"].add(record.value_gate)
            self.mean_value_gate.append(record.value_gate.mean(-1).double().cpu())
        if record.output_gate is not None:
            self.gates["output_gate"].add(record.output_gate)
        if record.routing_log_gate is not None:
            self.gates["routing_gate"].add(record.routing_log_gate.exp().unsqueeze(-1))
        self.max_abs_residual = max(self.max_abs_residual, residual.abs().max().item())

    def result(self, n_head: int) -> dict:
        norms = torch.cat([n.transpose(0, 1).reshape(n.shape[1], -1) for n in self.read_norms], dim=1)  # (Hkv, N)
        n_kv = norms.shape[0]
        kv_of_head = torch.arange(n_head) // (n_head // n_kv)
        median = norms.quantile(0.5, dim=1)
        low = norms.quantile(EXPOSURE_QUANTILE, dim=1)
        first_read = torch.cat([n[:, :, 0] for n in self.read_norms], dim=0).mean(0)  # (Hkv,) mean ‖v_0‖
        quiet_mass = torch.zeros(n_head, dtype=torch.float64)
        gated_mass = torch.zeros(n_head, dtype=torch.float64)
        for i, (received, norm) in enumerate(zip(self.received, self.read_norms)):
            quiet = (norm < low.view(1, -1, 1))[:, kv_of_head].double()  # (B, H, Tk)
            quiet_mass += (received * quiet).sum((0, 2))
            if self.mean_value_gate:
                gated_mass += (received * quiet * self.mean_value_gate[i][:, kv_of_head]).sum((0, 2))
        out = {
            "first_key_mass": self.first_key / self.n_queries,
            "read_norm_ratio": (first_read / median.clamp_min(1e-12))[kv_of_head],
            "phantom_mass": None if self.phantom is None else self.phantom / self.n_queries,
            "exposure": quiet_mass / self.n_queries,
            "exposure_after_value_gate": gated_mass / self.n_queries if self.mean_value_gate else None,
        }
        for name, tally in self.gates.items():
            stats = tally.result()
            per_kv = name != "output_gate"
            for suffix, value in zip(("mean", "near_zero"), stats or (None, None)):
                out[f"{name}_{suffix}"] = None if value is None else (value[kv_of_head] if per_kv else value)
        layer = {key: _to_list(value) for key, value in out.items()}
        layer["max_abs_residual"] = self.max_abs_residual
        return layer


def _acc(total, value):
    return value if total is None else total + value


def _to_list(value):
    return None if value is None else [round(float(v), 6) for v in value]


@torch.no_grad()
def probe_model(model, batches, *, progress: bool = False) -> dict:
    """Per-layer, per-head diagnostics of `model` on `batches` (module docstring); nothing is written."""
    if not batches:
        raise ValueError("probe_model needs at least one batch")
    model.eval()
    device = next(model.parameters()).device
    tallies = [_LayerTally() for _ in range(model.config.n_layer)]
    iterator = batches
    if progress:
        from tqdm.auto import tqdm  # a bar only when asked for

        iterator = tqdm(batches, desc="probe", unit="batch")
    batch_size = seq_len = 0
    for batch in iterator:
        inputs, _ = split_batch(batch)
        # A few sequences at a time: the records hold a (B, H, T, T) weight tensor per layer, ~0.5 GB
        # per layer for 8 sequences of 1024 at 350M. The figures are sums, so chunking changes nothing.
        for chunk in inputs.split(RECORD_CHUNK):
            out = model(chunk.to(device), record=True, head=False)  # the records only: no logits
            for tally, record, residual in zip(tallies, out.records, out.residuals):
                tally.add(record, residual)
            seq_len = out.records[0].weights.shape[-1]
            del out
        batch_size = inputs.shape[0]
    layers = [dict(layer=i, **tally.result(model.config.n_head)) for i, tally in enumerate(tallies)]
    return {
        "arm": model.config.arm,
        "n_batches": len(batches),
        "batch_size": batch_size,
        "positions": seq_len,
        "n_layer": model.config.n_layer,
        "n_head": model.config.n_head,
        "layers": layers,
        "summary": summarise_layers(layers),
        "definitions": {
            "queries": "positions i >= 1 (query 0 can only see key 0)",
            "key0_importance": f"first_key_mass; share of heads above {KEY0_IMPORTANCE_THRESHOLD}",
            "exposure": f"mass on reads below the head's {int(EXPOSURE_QUANTILE * 100)}th-percentile norm",
            "near_zero": f"share of gate values below {GATE_NEAR_ZERO}",
        },
    }


def summarise_layers(layers: list[dict]) -> dict:
    """Means over every (layer, head) of each figure; the largest residual; the share of sink heads."""
    summary: dict = {}
    for key in layers[0]:
        if key in ("layer", "max_abs_residual"):
            continue
        values = [v for layer in layers if layer[key] is not None for v in layer[key]]
        summary[key] = round(sum(values) / len(values), 6) if values else None
    summary["max_abs_residual"] = max(layer["max_abs_residual"] for layer in layers)
    summary["mean_layer_max_abs_residual"] = round(sum(layer["max_abs_residual"] for layer in layers) / len(layers), 6)
    masses = [v for layer in layers for v in layer["first_key_mass"]]
    summary["key0_importance_share"] = round(sum(v > KEY0_IMPORTANCE_THRESHOLD for v in masses) / len(masses), 6)
    return summary


def plot_first_key_mass(probe: dict, path: str | Path, title: str = ""):
    """Heatmap layer × head of first-key mass, its colour scale fitted to this run's values (a run whose masses
    are all near 0.05 shows its heads apart, not one dark square) and said in the figure: the range under the
    title, and each cell's value printed in it. Returns the figure (also written to `path`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib loads only when a figure is drawn
    from matplotlib.figure import Figure  # matplotlib loads only when a figure is drawn (a table needs none)

    grid = [layer["first_key_mass"] for layer in probe["layers"]]
    n_layer, n_head = len(grid), len(grid[0])
    low, high = min(min(row) for row in grid), max(max(row) for row in grid)
    vmin, vmax = (low, high) if high > low else (low - 0.005, high + 0.005)  # one value: a scale around it
    fig = Figure(figsize=(max(4.6, 1.8 + 0.55 * n_head), max(3.0, 1.6 + 0.4 * n_layer)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=vmin, vmax=vmax, cmap="viridis", aspect="auto")
    for layer, row in enumerate(grid):
        for head, value in enumerate(row):
            dark = (value - vmin) / (vmax - vmin) < 0.6
            ax.text(head, layer, f"{value:.3f}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_head))
    ax.set_yticks(range(n_layer))
    ax.set_title((title or f"first-key mass ({probe['arm']})")
                 + f"\ncolour scale {low:.3f} to {high:.3f} (this run's range, not 0 to 1)", fontsize=9)
    fig.colorbar(image, ax=ax, label="first-key mass")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the title whole, however few heads
    return fig


def probe_run(run_dir: str | Path, *, n_batches: int = 8, batch_size: int = 8, batches=None,
              device: str = "cpu", progress: bool = False) -> dict:
    """Probe a run's final weights; write RUN_DIR/probe.json (atomically, with the weights' sha256, which every
    reader checks) and the heatmap PNG, holding the run's lock throughout (`final_weights_held`)."""
    run_dir = Path(run_dir)
    with final_weights_held(run_dir, device) as (model, config, identity, weights_sha256):
        if batches is None:
            batches = validation_batches_for_run(config, n_batches, batch_size)
        probe = {"run": identity, "weights_sha256": weights_sha256, "evidence": evidence_note(identity["tier"]),
                 **probe_model(model, batches, progress=progress)}
        atomic_write_json(run_dir / PROBE_FILE, probe)
        label = " / ".join(str(v) if k != "seed" else f"seed {v}" for k, v in identity.items() if v is not None)
        evidence = "\npipeline check: no evidence" if probe["evidence"] else ""
        plot_first_key_mass(probe, run_dir / HEATMAP_FILE, title=f"first-key mass, {label}{evidence}")
    log.info("wrote %s and %s", run_dir / PROBE_FILE, run_dir / HEATMAP_FILE)
    return probe
