"""Junk injection: add junk to quiet reads, before any gate sees them, and measure the loss.

The protocol is identical for every arm; only the arm decides what the junk meets afterwards.
For each batch:

1. A clean forward pass (a read hook that only looks) records every layer's reads v (B, Hkv, T, d)
   and the clean loss. Per layer and kv head, over the B×T reads of the batch: the median read norm
   m_h and the cutoff (median or 25th percentile). *Quiet* reads are those below the cutoff; the set
   is fixed by the clean pass, so every junk kind and dose hits the same positions.
2. For each junk kind and dose ε, a forward pass whose read hook adds ε · m_h · u to every quiet read,
   in every layer at once, where u is the junk direction of that read (norm 1 except Gaussian):

   * ``structural`` — the main condition: the clean read of the same layer and head at a random
     position of a *different* sequence of the batch (never the read's own sequence), scaled to norm 1,
     so the junk looks like real content;
   * ``gaussian`` — i.i.d. N(0, 1/d) coordinates: norm ≈ 1 on average but varying from read to read
     (expected squared norm exactly 1);
   * ``random`` — a uniformly random unit direction: the same norm as the others, no structure;
   * ``gate-direction`` — along the gate's own decision variable: w_h/‖w_h‖ for a projection gate
     (proj-gate, combo2; the sign that *opens* the gate), the read's own direction v_j/‖v_j‖ for a norm
     gate (norm-gate, combo, renorm: it raises the norm the gate thresholds). An arm may define
     ``junk_gate_direction(v) -> unit directions like v`` to join. Arms whose gates do not read v
     (baseline, sink arms, g1/g2) have no such direction: the sweep reports n/a for them, with the
     reason, instead of failing, so one command line serves every arm.

Randomness comes from one generator per (seed, batch, kind, layer), drawn on the CPU, so results do
not depend on the device, and every dose of a kind uses the same directions (only ε changes).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.arms.builtin import NormGate, ProjGate, Renorm
from ablate.errors import AblateError, choice_error
from ablate.modelio import final_weights_held, split_batch, validation_batches_for_run
from ablate.sizing import loss_chunk_for
from ablate.store import INJECT_FILE, atomic_write_json, read_json
from ablate.tiers import evidence_note

log = logging.getLogger(__name__)

JUNK_KINDS = ("structural", "gaussian", "random", "gate-direction")
CUTOFFS = {"median": 0.5, "p25": 0.25}
DEFAULT_EPS = (0.2, 0.4, 0.8, 1.6)


@dataclass
class LayerPlan:
    """One layer's quiet reads in one batch, fixed by the clean pass."""

    clean_reads: torch.Tensor  # (B, Hkv, T, d)
    quiet: torch.Tensor  # (B, Hkv, T) bool
    median_norm: torch.Tensor  # (Hkv,)


def gate_direction_kind(arm) -> str | None:
    """'custom', 'projection', 'norm', or None when the arm has no gate that reads v."""
    if hasattr(arm, "junk_gate_direction"):
        return "custom"
    if isinstance(arm, ProjGate):
        return "projection"
    if isinstance(arm, (NormGate, Renorm)):
        return "norm"
    return None


def no_gate_reason(arm_name: str) -> str:
    return (f"arm {arm_name!r} has no gate that reads v (gate-direction applies to proj-gate, combo2, norm-gate, "
            "combo, renorm)")


def gate_direction_problem(arms, arm_name: str) -> str | None:
    """Why gate-direction junk cannot be made for these layers' arms, or None when it can."""
    if gate_direction_kind(arms[0]) is None:
        return no_gate_reason(arm_name)
    if gate_direction_kind(arms[0]) == "projection":
        for layer, arm in enumerate(arms):
            if (arm.gate_w.detach().norm(dim=-1) == 0).any():
                return f"layer {layer}: a projection gate's w_h is zero (an untrained model?), so it has no direction"
    return None


def unit(t: torch.Tensor) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def structural_sources(shape: tuple[int, int, int], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """For every read (b, h, t) of a (B, Hkv, T) layer: a source sequence ≠ b and a source position.

    The source sequence is b + k (mod B) with k uniform on 1..B−1, i.e. uniform over the *other*
    sequences; the position is uniform over all T positions.
    """
    B, H, T = shape
    if B < 2:
        raise AblateError("structural junk needs batches of at least 2 sequences (it transplants from another one)")
    offset = torch.randint(1, B, shape, generator=generator)
    source_batch = (torch.arange(B).view(B, 1, 1) + offset) % B
    source_position = torch.randint(0, T, shape, generator=generator)
    return source_batch, source_position


def junk_directions(kind: str, plan: LayerPlan, arm, generator: torch.Generator) -> torch.Tensor | None:
    """Junk directions (B, Hkv, T, d) on the CPU, or None: "the read's own direction, at injection time"."""
    reads = plan.clean_reads
    B, H, T, d = reads.shape
    if kind == "structural":
        source_batch, source_position = structural_sources((B, H, T), generator)
        heads = torch.arange(H).view(1, H, 1).expand(B, H, T)
        return unit(reads[source_batch, heads, source_position])
    if kind == "gaussian":
        return torch.randn((B, H, T, d), generator=generator, dtype=reads.dtype) / d**0.5
    if kind == "random":
        return unit(torch.randn((B, H, T, d), generator=generator, dtype=reads.dtype))
    if kind == "gate-direction":
        how = gate_direction_kind(arm)
        if how == "projection":
            w = arm.gate_w.detach().float().cpu()  # (Hkv, d)
            if (w.norm(dim=-1) == 0).any():
                raise AblateError("the projection gate's w_h is zero (an untrained model?): its direction is undefined")
            return unit(w).view(1, H, 1, d).expand(B, H, T, d).to(reads.dtype)
        if how in ("norm", "custom"):
            return None
        raise AblateError(no_gate_reason(arm.name))
    raise choice_error("junk kind", kind, JUNK_KINDS)


def _stream_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") & (2**63 - 1)


@torch.no_grad()
def clean_pass(model, inputs, targets, quantile: float, loss_chunk: int = 0) -> tuple[float, list[LayerPlan]]:
    """Clean loss and each layer's plan (its reads captured by a hook that changes nothing)."""
    captured: list[torch.Tensor] = []

    def look(v, attn):
        captured.append(v.detach().float().cpu())
        return v

    with read_hooks(model, [look] * len(model.blocks)):
        loss = model(inputs, targets, loss_chunk=loss_chunk).loss.item()
    plans = []
    for reads in captured:
        norms = reads.norm(dim=-1)  # (B, Hkv, T)
        per_head = norms.transpose(0, 1).reshape(norms.shape[1], -1)
        median = per_head.quantile(0.5, dim=1)
        cutoff = per_head.quantile(quantile, dim=1)
        plans.append(LayerPlan(reads, norms < cutoff.view(1, -1, 1), median))
    return loss, plans


class read_hooks:
    """Context manager: install one read hook per layer, always removing them afterwards."""

    def __init__(self, model, hooks):
        self.blocks, self.hooks = list(model.blocks), hooks

    def __enter__(self):
        for block, hook in zip(self.blocks, self.hooks):
            if block.attn.read_hook is not None:
                raise RuntimeError("a read hook is already installed on this model")
            block.attn.read_hook = hook

    def __exit__(self, *exc):
        for block in self.blocks:
            block.attn.read_hook = None


def make_injector(plan: LayerPlan, direction: torch.Tensor | None, eps: float, arm):
    """The read hook adding ε·m_h·u to the quiet reads of one layer (u = direction, or the read's own)."""

    def inject(v, attn):
        scale = (eps * plan.median_norm).to(v.device, v.dtype).view(1, -1, 1, 1)
        mask = plan.quiet.to(v.device).unsqueeze(-1).to(v.dtype)
        if direction is None:
            custom = getattr(arm, "junk_gate_direction", None)
            u = custom(v) if custom is not None else unit(v)
        else:
            u = direction.to(v.device, v.dtype)
        return v + scale * mask * u

    return inject


def _checked_sweep(cutoff: str, junk, eps) -> list[float]:
    """The sweep's ε as floats, once the cutoff, the junk kinds and the ε are known to be valid."""
    if cutoff not in CUTOFFS:
        raise choice_error("cutoff", cutoff, CUTOFFS)
    for kind in junk:
        if kind not in JUNK_KINDS:
            raise choice_error("junk kind", kind, JUNK_KINDS)
    eps = [float(e) for e in eps]
    if any(e < 0 for e in eps):
        raise AblateError(f"ε must be ≥ 0, got {eps}")
    return eps


def _mean_row(kind: str, e: float, losses: list[float], clean: float) -> dict:
    loss = sum(losses) / len(losses)
    return {"junk": kind, "eps": e, "loss": loss, "increase": loss - clean}


@dataclass(frozen=True)
class Sweep:
    """What an injection sweep injects: at which reads (the quiet `cutoff`), how much (each ε), which junk
    kinds, and the seed of their random directions."""

    cutoff: str = "p25"
    eps: tuple = DEFAULT_EPS
    junk: tuple = JUNK_KINDS
    seed: int = 0


@torch.no_grad()
def inject_model(model, batches, *, cutoff: str = "p25", eps=DEFAULT_EPS, junk=JUNK_KINDS, seed: int = 0,
                 progress: bool = False, loss_chunk: int | None = None) -> dict:
    """Loss increase over clean for every (junk kind, ε), averaged over batches. Nothing is written.

    loss_chunk: the run's (`ablate.sizing.loss_chunk_for`: by default chunked on a GPU, whole on a CPU); each
    loss is then computed that many tokens at a time, as the training step does.

    Returns {"cutoff", "clean_loss", "injected_share", "rows": [{junk, eps, loss, increase}],
    "not_applicable": {kind: reason}}; n/a kinds have rows with loss and increase None.
    """
    eps = _checked_sweep(cutoff, junk, eps)
    if not batches:
        raise ValueError("inject_model needs at least one batch")
    model.eval()
    device = next(model.parameters()).device
    loss_chunk = loss_chunk_for(loss_chunk, device)
    arms = [block.attn.arm for block in model.blocks]
    not_applicable = {}
    if "gate-direction" in junk:
        problem = gate_direction_problem(arms, model.config.arm)
        if problem:
            not_applicable["gate-direction"] = problem
    kinds = [kind for kind in junk if kind not in not_applicable]
    clean_losses, quiet_counts, read_counts = [], 0, 0
    losses = {(kind, e): [] for kind in kinds for e in eps}
    iterator = list(enumerate(batches))
    if progress:
        from tqdm.auto import tqdm  # a bar only when asked for

        iterator = tqdm(iterator, desc=f"inject ({cutoff})", unit="batch")
    for index, batch in iterator:
        inputs, targets = (t.to(device) for t in split_batch(batch))
        clean_loss, plans = clean_pass(model, inputs, targets, CUTOFFS[cutoff], loss_chunk)
        clean_losses.append(clean_loss)
        quiet_counts += sum(int(p.quiet.sum()) for p in plans)
        read_counts += sum(p.quiet.numel() for p in plans)
        for kind in kinds:
            directions = []
            for layer, (plan, arm) in enumerate(zip(plans, arms)):
                generator = torch.Generator().manual_seed(_stream_seed(seed, index, kind, layer))
                directions.append(junk_directions(kind, plan, arm, generator))
            for e in eps:
                hooks = [make_injector(p, u, e, a) for p, u, a in zip(plans, directions, arms)]
                with read_hooks(model, hooks):
                    losses[(kind, e)].append(model(inputs, targets, loss_chunk=loss_chunk).loss.item())
    clean = sum(clean_losses) / len(clean_losses)
    rows = [{"junk": kind, "eps": e, "loss": None, "increase": None} if kind in not_applicable
            else _mean_row(kind, e, losses[(kind, e)], clean) for kind in junk for e in eps]
    return {
        "cutoff": cutoff,
        "seed": seed,
        "n_batches": len(batches),
        "clean_loss": clean,
        "injected_share": quiet_counts / read_counts,
        "rows": rows,
        "not_applicable": not_applicable,
    }


def injection_table(result: dict) -> str:
    """Markdown: one row per junk kind, one column per ε, cells = loss increase over clean (nats)."""
    eps = sorted({row["eps"] for row in result["rows"]})
    kinds = list(dict.fromkeys(row["junk"] for row in result["rows"]))
    cell = {(row["junk"], row["eps"]): row["increase"] for row in result["rows"]}
    lines = [f"{result['evidence']}", ""] if result.get("evidence") else []
    lines += [
        f"loss increase over clean (nats); cutoff {result['cutoff']}, clean loss {result['clean_loss']:.4f}, "
        f"{result['injected_share']:.0%} of reads injected, {result['n_batches']} batches",
        "",
        "| junk | " + " | ".join(f"ε={e:g}" for e in eps) + " |",
        "|---|" + "---:|" * len(eps),
    ]
    for kind in kinds:
        values = [cell.get((kind, e)) for e in eps]
        lines.append(f"| {kind} | " + " | ".join("n/a" if v is None else f"{v:+.4f}" for v in values) + " |")
    for kind, reason in result["not_applicable"].items():
        lines.append(f"\nn/a {kind}: {reason}")
    return "\n".join(lines)


def inject_run(run_dir: str | Path, sweep: Sweep = Sweep(), *, n_batches: int = 8, batch_size: int = 8, batches=None,
               device: str = "cpu", progress: bool = False) -> dict:
    """Run the sweep on a run's final weights and merge it into RUN_DIR/inject.json (atomically).

    inject.json keeps one entry per cutoff: a later call with the other cutoff adds to the file, one
    with the same cutoff replaces that cutoff's entry.
    """
    path = Path(run_dir) / INJECT_FILE
    with final_weights_held(run_dir, device) as (model, config, identity, weights_sha256):
        if batches is None:
            batches = validation_batches_for_run(config, n_batches, batch_size)
        result = inject_model(model, batches, cutoff=sweep.cutoff, eps=sweep.eps, junk=sweep.junk, seed=sweep.seed,
                              progress=progress, loss_chunk=config.loss_chunk)
        result = {"evidence": evidence_note(identity["tier"]), **result}
        previous = read_json(path) if path.is_file() else {}
        previous = previous if isinstance(previous, dict) and previous.get("weights_sha256") == weights_sha256 else {}
        by_cutoff = dict(previous.get("by_cutoff", {}))  # entries of other weights than these are dropped
        by_cutoff[sweep.cutoff] = result
        atomic_write_json(path, {"run": identity, "arm": model.config.arm, "weights_sha256": weights_sha256,
                                 "evidence": result["evidence"], "by_cutoff": by_cutoff})
    log.info("wrote %s", path)
    return result
