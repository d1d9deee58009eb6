"""A minimal GPT in the nanoGPT style, and the harness's training step timed against it in one process.

    .venv/bin/python benchmarks/reference_gpt.py                  # 10M shape, B=2, T=512, 9 rounds, 1 thread
    .venv/bin/python benchmarks/reference_gpt.py --profile        # where the time goes, op by op
    .venv/bin/python benchmarks/reference_gpt.py --quick --json out.json
    .venv/bin/python benchmarks/reference_gpt.py --batch 4 --seq-len 256 --nanogpt nanoGPT/model.py

`--nanogpt PATH` also times karpathy/nanoGPT's own `model.py` (a local copy: `git clone
https://github.com/karpathy/nanoGPT`; nothing is downloaded here), built with bias=False and dropout 0 at the
same shape, with nanoGPT's step and its `configure_optimizers`. It is nanoGPT's architecture, not ablate's
(LayerNorm, exact GELU, learned positions instead of RoPE; its own random initial weights), so only its time
is compared.

The reference is the architecture of ablate's `baseline` arm written the plain way: pre-norm RMSNorm,
RoPE on the two halves of each head, `scaled_dot_product_attention(is_causal=True)`, a tanh-GELU MLP of
width 4·d, no biases, tied input/output embeddings, vocabulary padded to a multiple of 64. Before timing,
the harness's initial weights are copied into it and the two losses on the same batch must agree — a check
that the comparison is between the same model.

Steps compared (same batch, same AdamW hyperparameters and decay groups, gradient clipping at 1.0):
  harness    ablate's real step, as `ablate/train.py` runs it on CPU: Lightning Fabric (cpu, 32-true),
             `loss = model(x, y).loss * (rows / rows)`, `fabric.backward`, `fabric.clip_gradients`,
             `float(loss)`, `optimizer.step()`, `zero_grad(set_to_none=True)`;
  plain      the harness's model with a plain PyTorch step (no Fabric) — separates model from loop;
  reference  this file's GPT with nanoGPT's step (`loss.backward()`, `clip_grad_norm_`, `step`, `zero_grad`);
  nanogpt    (with --nanogpt) nanoGPT's model.py with the same step as reference.
The steps run interleaved, the order rotating every round; the figure is the median over rounds of
reference_time / harness_time in the same round (≥ 1.0: the harness is no slower).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))


# ================================================================================= the reference model
@dataclass
class ReferenceConfig:
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 1024
    n_layer: int = 8
    n_head: int = 5
    n_embd: int = 320
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


def rotate(x, cos, sin):
    """RoPE on the two halves of the head dim; cos, sin (T, hs/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MLP(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.ln_1 = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, config: ReferenceConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd, eps=config.norm_eps),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        hs = config.n_embd // config.n_head
        freqs = 1.0 / config.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        angles = torch.arange(config.block_size, dtype=torch.float64).unsqueeze(-1) * freqs  # (block, hs/2)
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.transformer.wte(idx)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x, cos, sin)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, eps=1e-8):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps)


# ================================================================================= the comparison
def harness_to_reference_names(name: str) -> str:
    """ablate's parameter names → this file's ('blocks.3.attn.c_attn.weight' → 'transformer.h.3.attn...')."""
    if name.startswith("blocks."):
        return "transformer.h." + name[len("blocks."):]
    return {"wte.weight": "transformer.wte.weight", "ln_f.weight": "transformer.ln_f.weight"}.get(name, name)


def build_pair(tier_name: str, seq_len: int):
    from ablate.model import GPT
    from ablate.sizing import model_config
    from ablate.tiers import TIERS

    tier = TIERS[tier_name]
    harness = GPT(model_config(tier, "baseline", max_seq_len=seq_len))
    harness.init_weights(seed=0)
    config = ReferenceConfig(vocab_size=harness.config.padded_vocab_size, block_size=seq_len, n_layer=tier.n_layer,
                             n_head=tier.n_head, n_embd=tier.d_model)
    reference = ReferenceGPT(config)
    state = {harness_to_reference_names(k): v for k, v in harness.state_dict().items()}
    missing, unexpected = reference.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied: loaded through wte
        raise RuntimeError(f"state mapping failed: missing {missing}, unexpected {unexpected}")
    return tier, harness, reference


def make_steps(tier, harness, reference, idx, targets):
    """Three closures, each one full optimiser step; see the module docstring."""
    import warnings

    from lightning_fabric import Fabric

    warnings.filterwarnings("ignore", message=".*`srun` command is available")
    opt_kwargs = dict(lr=tier.lr, betas=tier.betas, eps=1e-8)

    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    groups = [{k: v for k, v in g.items() if k != "names"} for g in harness.param_groups(tier.weight_decay)]
    fabric_model, fabric_opt = fabric.setup(harness, torch.optim.AdamW(groups, **opt_kwargs))
    rows = idx.shape[0]

    def harness_step():
        loss = fabric_model(idx, targets).loss * (rows / rows)
        fabric.backward(loss)
        fabric.clip_gradients(fabric_model, fabric_opt, max_norm=tier.grad_clip, error_if_nonfinite=False)
        value = float(loss.detach())
        fabric_opt.step()
        fabric_opt.zero_grad(set_to_none=True)
        return value

    import copy

    plain_model = copy.deepcopy(harness)
    plain_groups = [{k: v for k, v in g.items() if k != "names"} for g in plain_model.param_groups(tier.weight_decay)]
    plain_opt = torch.optim.AdamW(plain_groups, **opt_kwargs)

    def plain_step():
        loss = plain_model(idx, targets).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain_model.parameters(), tier.grad_clip)
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    ref_opt = reference.configure_optimizers(tier.weight_decay, tier.lr, tier.betas)

    def reference_step():
        _, loss = reference(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), tier.grad_clip)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return {"harness": harness_step, "plain": plain_step, "reference": reference_step}


def nanogpt_step(path: str, tier, vocab_size: int, seq_len: int, idx, targets):
    """One optimiser step of karpathy/nanoGPT's `model.py` (bias=False, dropout 0), the way its train.py runs it
    on CPU without gradient accumulation."""
    import contextlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    if spec is None or not Path(path).is_file():
        raise SystemExit(f"--nanogpt {path}: no such file; pass the model.py of a clone of karpathy/nanoGPT")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.GPTConfig(block_size=seq_len, vocab_size=vocab_size, n_layer=tier.n_layer, n_head=tier.n_head,
                              n_embd=tier.d_model, dropout=0.0, bias=False)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(sys.stderr):  # nanoGPT prints its parameter counts
        model = module.GPT(config)
        optimizer = model.configure_optimizers(tier.weight_decay, tier.lr, tier.betas, "cpu")

    def step():
        _, loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tier.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step, sum(p.numel() for p in model.parameters())


def profile_steps(steps: dict, rounds: int = 3, top: int = 15) -> dict:
    from torch.profiler import ProfilerActivity, profile

    tables = {}
    for name, step in steps.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                step()
        tables[name] = {e.key: e.self_cpu_time_total / 1e3 / rounds for e in prof.key_averages()}
    base = tables["reference"]
    for name in [n for n in tables if n != "reference"]:
        diff = sorted(((tables[name].get(k, 0.0) - base.get(k, 0.0), k) for k in set(tables[name]) | set(base)),
                      key=lambda item: -abs(item[0]))
        print(f"\n{name} vs reference: self CPU ms per step, largest differences")
        print(f"| op | reference | {name} | Δ |\n|---|---:|---:|---:|")
        for delta, key in diff[:top]:
            print(f"| `{key}` | {base.get(key, 0.0):.1f} | {tables[name].get(key, 0.0):.1f} | {delta:+.1f} |")
    return tables


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tier", default="10M")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (default 9)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke tier, T=64, 3 rounds")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--nanogpt", metavar="MODEL_PY", help="also time karpathy/nanoGPT's model.py (a local copy)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tier, args.seq_len, args.repeats, args.warmup = "smoke", 64, 3, 1
    torch.set_num_threads(args.threads)
    from arms import machine, machine_line

    info = machine()
    print(machine_line(info))
    tier, harness, reference = build_pair(args.tier, args.seq_len)
    tokens = torch.randint(0, tier.vocab_size, (args.batch, args.seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    with torch.no_grad():
        harness_loss = float(harness(idx, targets).loss)
        reference_loss = float(reference(idx, targets)[1])
    print(f"shape: tier {args.tier} (n_layer {tier.n_layer}, d_model {tier.d_model}, {tier.n_head} heads), batch "
          f"{args.batch} × T {args.seq_len}, float32; same weights → loss harness {harness_loss:.6f}, "
          f"reference {reference_loss:.6f} (|Δ| {abs(harness_loss - reference_loss):.1e})")
    if abs(harness_loss - reference_loss) > 1e-4:
        raise SystemExit("the reference is not the harness's architecture: losses differ")
    n_params = sum(p.numel() for p in reference.parameters())
    if n_params != sum(p.numel() for p in harness.parameters()):
        raise SystemExit("parameter counts differ")

    steps = make_steps(tier, harness, reference, idx, targets)
    if args.nanogpt:
        steps["nanogpt"], nanogpt_params = nanogpt_step(args.nanogpt, tier, harness.config.padded_vocab_size,
                                                        args.seq_len, idx, targets)
        print(f"nanoGPT's model.py ({args.nanogpt}, bias=False): {nanogpt_params:,} parameters")
    names = list(steps)
    for _ in range(args.warmup):
        for name in names:
            steps[name]()
    times = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
        print(f"  round {r + 1}/{args.repeats}", file=sys.stderr, flush=True)
    ratio = [ref / h for ref, h in zip(times["reference"], times["harness"])]
    ratio_plain = [ref / p for ref, p in zip(times["reference"], times["plain"])]
    ratio_nanogpt = [n / h for n, h in zip(times.get("nanogpt", []), times["harness"])]
    result = {"machine": info, "tier": args.tier, "batch": args.batch, "seq_len": args.seq_len, "repeats": args.repeats,
              "command": " ".join(sys.argv), "params": n_params,
              "median_ms": {n: 1e3 * statistics.median(t) for n, t in times.items()},
              "times_ms": {n: [round(1e3 * x, 1) for x in t] for n, t in times.items()},
              "reference_over_harness": statistics.median(ratio),
              "reference_over_plain": statistics.median(ratio_plain),
              "ratio_min": min(ratio), "ratio_max": max(ratio)}
    if ratio_nanogpt:
        result.update(nanogpt_over_harness=statistics.median(ratio_nanogpt), nanogpt_ratio_min=min(ratio_nanogpt),
                      nanogpt_ratio_max=max(ratio_nanogpt), nanogpt=args.nanogpt)
    print("\n| step | median ms | reference / this (min–max) |\n|---|---:|---:|")
    print(f"| reference (nanoGPT style) | {result['median_ms']['reference']:.0f} | 1.000 |")
    print(f"| harness (ablate GPT + Fabric step, as train.py) | {result['median_ms']['harness']:.0f} | "
          f"**{result['reference_over_harness']:.3f}** ({min(ratio):.3f}–{max(ratio):.3f}) |")
    print(f"| ablate GPT, plain PyTorch step | {result['median_ms']['plain']:.0f} | "
          f"{result['reference_over_plain']:.3f} "
          f"({min(ratio_plain):.3f}–{max(ratio_plain):.3f}) |")
    if ratio_nanogpt:
        print(f"| karpathy/nanoGPT model.py (bias=False), its step | {result['median_ms']['nanogpt']:.0f} | "
              f"nanoGPT / harness **{result['nanogpt_over_harness']:.3f}** ({min(ratio_nanogpt):.3f}–"
              f"{max(ratio_nanogpt):.3f}) |")
    verdict = "meets" if result["reference_over_harness"] >= 1.0 else "misses"
    print(f"\nreference_time / harness_time = {result['reference_over_harness']:.3f}: {verdict} the goal ≥ 1.0")
    if ratio_nanogpt:
        verdict = "meets" if result["nanogpt_over_harness"] >= 1.0 else "misses"
        print(f"nanogpt_time / harness_time = {result['nanogpt_over_harness']:.3f} (the harness takes "
              f"{1 / result['nanogpt_over_harness']:.3f}× nanoGPT's time): {verdict} the goal ≥ 1.0")
    result["load_average_after"] = [round(x, 2) for x in __import__("os").getloadavg()]
    print(f"load average after: {', '.join(f'{x:.2f}' for x in result['load_average_after'])}")
    if args.profile:
        result["profile_self_cpu_ms_per_step"] = profile_steps(steps)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
