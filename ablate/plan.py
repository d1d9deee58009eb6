"""The cost of a grid: parameters, tokens, steps, FLOPs and GPU-hours of a grid, before anything runs.

A grid is an experiment's (tiers × arms × seeds, run-config overrides applied) or one given by
`--tier/--arms/--seed-count`. GPU-hours = training FLOPs / (peak bf16 throughput × MFU). The peak is
the chosen GPU's (`--gpu`, or the `gpu` of a cluster profile, default H100 SXM); the MFU is the one
`benchmarks/gpu_check.py` measured on that GPU when its `gpu_check.json` is found (`--gpu-check PATH`,
else ./gpu_check.json, else gpu_check.json at the repository root), otherwise an assumed 40%.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ablate.errors import AblateError
from ablate.arms import get_arm, list_arms
from ablate.paths import search_folders
from ablate.sizing import (_meta_counts, model_config, reference_attention_bytes,
                           run_micro_batch, run_peak_gb)
from ablate.arms.cost import attention_cost
from ablate.arms.kernel import blocked_rows
from ablate.family import Family
from ablate.tiers import DEFAULT_GPU, TIERS, Tier, get_gpu, get_tier, is_pipeline_check, tier_rank

ASSUMED_MFU = 0.40  # model-FLOPs utilisation a well-tuned small-GPT run reaches (nanoGPT/llm.c report 40-50%)
GPU_CHECK_FILE = "gpu_check.json"


REFERENCE_PRICE = ("an arm on the reference path: the model's FLOPs with the attention's own, the full (T, T) square "
                   "of q·k and p·v (12·n_layer·T·d per token, no causal saving) at the MFU, plus its (B, H, T, T) "
                   "tensors (the measured bytes saved and allocated per element) written and read once at the GPU's "
                   "memory bandwidth, plus the weights (bf16) read again by each extra accumulation pass its smaller "
                   "micro-batch takes")


PEAK_MEMORY = ("peak GB is the memory model's predicted peak per GPU at the micro-batch, without a margin; the "
               "micro-batch is chosen with a 1.25× margin on activations (ACTIVATION_SAFETY) within 90% of the GPU")


def reference_hours(tier: Tier, arm: str, steps: int, micro: int, baseline_micro: int, params: int,
                    speed: "Throughput", world_size: int = 1) -> float:
    """GPU-hours a run of an arm on the reference path adds over its fused-path price (REFERENCE_PRICE): the
    attention's own FLOPs beyond the Kaplan term the model's count has, its measured (B, H, T, T) traffic, and
    the extra accumulation passes of its micro-batch."""
    gpu = get_gpu(speed.gpu)
    sequences = steps * tier.global_batch
    extra_flops = 6 * tier.n_layer * tier.seq_len * tier.d_model * tier.seq_len * sequences  # 12·L·T·d less 6·L·T·d
    saved, working = reference_attention_bytes(tier, 1, arm, "cuda")
    traffic = 2 * (saved + tier.n_layer * working) * sequences
    local = tier.global_batch // world_size
    passes = steps * max(local // micro - local // baseline_micro, 0)
    weights = passes * 3 * 2 * params * world_size
    seconds = extra_flops / (gpu.peak_bf16_tflops * 1e12 * speed.mfu) + (traffic + weights) / (gpu.memory_tb_per_s
                                                                                                  * 1e12)
    return seconds / 3600


def training_flops(tier: Tier, params_non_embedding: int, padded_vocab: int, steps: int | None = None) -> float:
    """6·N·D with N = non-embedding weights + the output projection (tied, but still a matmul), plus
    Kaplan et al.'s attention term 6·n_layer·n_ctx·d_model per token (causal mask not discounted)."""
    per_token = 6 * (params_non_embedding
                     + padded_vocab * tier.d_model) + 6 * tier.n_layer * tier.seq_len * tier.d_model
    return float(per_token) * (tier.steps if steps is None else steps) * tier.tokens_per_step


@dataclass(frozen=True)
class Throughput:
    """What one GPU-hour buys: the GPU's peak and the MFU assumed or measured on it."""

    gpu: str = DEFAULT_GPU
    mfu: float = ASSUMED_MFU
    mfu_source: str = "assumed"

    @property
    def flops_per_hour(self) -> float:
        return get_gpu(self.gpu).peak_bf16_tflops * 1e12 * self.mfu * 3600

    def describe(self) -> str:
        g = get_gpu(self.gpu)
        return f"{g.peak_bf16_tflops:g} TFLOP/s peak bf16 ({g.name}) at {self.mfu:.0%} MFU ({self.mfu_source})"


def gpu_check_paths(explicit: str | Path | None = None) -> list[Path]:
    return [Path(explicit)] if explicit else [folder / GPU_CHECK_FILE for folder in search_folders(".")]


def throughput(gpu: str | None = None, gpu_check: str | Path | None = None) -> Throughput:
    """The GPU's peak, and the baseline MFU measured on that GPU if a gpu_check.json for it is found."""
    key = get_gpu(gpu or DEFAULT_GPU).key
    paths = gpu_check_paths(gpu_check)
    if gpu_check and not paths[0].is_file():
        raise AblateError(f"--gpu-check {gpu_check}: no such file")
    for path in paths:
        if not path.is_file():
            continue
        try:
            check = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise AblateError(f"{path} is not a gpu_check.json ({err})") from None
        mfu = check.get("plan_mfu")
        if check.get("gpu_key") == key and isinstance(mfu, (int, float)) and 0 < mfu <= 1:
            return Throughput(key, float(mfu), f"measured by gpu_check on {check.get('device', key)}, {path}")
    return Throughput(key, ASSUMED_MFU, "assumed")


def _priced(tier: Tier, overrides: dict) -> tuple[Tier, int, dict, bool]:
    """The tier, step count, model overrides and match flag a run with these run-config overrides has."""
    overrides = dict(overrides)
    model = dict(overrides.pop("model", {}))
    match = bool(overrides.pop("match_params", False))
    tier_fields = {k: v for k, v in overrides.items() if k in Tier.__dataclass_fields__ and k != "name"}
    tier = replace(tier, **tier_fields)
    steps = int(overrides.get("steps", tier.steps))
    if overrides.get("max_steps") is not None:
        steps = min(steps, int(overrides["max_steps"]))
    return tier, steps, model, match


def plan_rows(tier: Tier | str, arms: list[str] | None = None, seed_count: int | None = None, *,
              match_params: bool | None = None, overrides: dict | None = None, speed: Throughput | None = None,
              world_size: int = 1) -> dict:
    """Per-arm cost of one tier, a `Tier` or its name (parameters measured on the real model, built on the meta
    device).

    seed_count: runs per arm (default: the tier's). overrides: an experiment's run-config overrides for
    this tier ("model" fields, tier fields such as global_batch, max_steps, match_params, loss_chunk).
    world_size: GPUs per run (a profile's gpus_per_run), for the micro-batch the run gets on speed's GPU.
    """
    speed = speed or Throughput()
    tier, steps, model_overrides, match = _priced(get_tier(tier) if isinstance(tier, str) else tier, overrides or {})
    match = match if match_params is None else match_params  # an explicit choice beats the overrides
    arms = list(arms) if arms else list_arms()
    for arm in arms:
        get_arm(arm)
    seeds = tier.seeds if seed_count is None else seed_count
    if seeds < 0:
        raise AblateError(f"seed count {seeds} must be 0 or more")
    baseline = _meta_counts(model_config(tier, "baseline", **model_overrides))["non_embedding"]
    rows = []
    memory_gb = get_gpu(speed.gpu).memory_gb
    baseline_micro = run_micro_batch(tier, memory_gb, overrides or {}, world_size=world_size)
    for arm in arms:
        config = model_config(tier, arm, match_params=match, **model_overrides)
        counts = _meta_counts(config)
        flops = training_flops(tier, counts["non_embedding"], config.padded_vocab_size, steps)
        hours = flops / speed.flops_per_hour
        micro = run_micro_batch(tier, memory_gb, overrides or {}, world_size=world_size, arm=arm)
        cost = attention_cost(arm, "cuda")
        if cost.path == "reference":
            hours += reference_hours(tier, arm, steps, micro, baseline_micro, counts["total"], speed, world_size)
        rows.append({
            "tier": tier.name, "arm": arm, "params_total": counts["total"],
            "params_non_embedding": counts["non_embedding"], "params_arm_extra": counts["arm_extra"],
            "mlp_hidden": config.mlp_width, "params_vs_baseline": counts["non_embedding"] / baseline - 1,
            "tokens": steps * tier.tokens_per_step, "steps": steps, "train_flops": flops,
            "gpu_hours_per_run": hours, "seeds": seeds, "gpu_hours": hours * seeds,
            "micro_batch_for_gpu": micro, "attention": {**asdict(cost), "note": _path_note(cost, tier, micro)},
            "reference_block": _block(tier, arm, micro) if cost.path == "reference" else None,
            "peak_memory_gb": run_peak_gb(tier, micro, overrides or {}, world_size, arm, config.mlp_hidden),
        })
    return {
        "tier": tier.name, "assumption": speed.describe(), "match_params": match,
        "params_non_embedding_baseline": baseline,
        "hyperparameters": {k: v for k, v in asdict(tier).items() if k not in ("name",)},
        "micro_batch_for_gpu": baseline_micro, "reference_price": REFERENCE_PRICE, "peak_memory": PEAK_MEMORY,
        "runs": rows, "total_runs": len(rows) * seeds,
        "total_gpu_hours": sum(r["gpu_hours"] for r in rows),
        "total_train_flops": sum(r["train_flops"] * seeds for r in rows),
    }


def _block(tier: Tier, arm: str, micro: int) -> int | None:
    """The query rows per block the run's reference path takes at its micro-batch (`blocked_rows`, the kernel's own
    choice at that shape), or None for whole rows."""
    return blocked_rows(get_arm(arm), micro, tier.n_head, tier.seq_len)


def _path_note(cost, tier: Tier, micro: int) -> str:
    """The probe's line, and for the reference path how it runs at the tier's length and the run's micro-batch: in
    query blocks (the block `blocked_rows` takes), or whole rows, and why."""
    if cost.path != "reference":
        return cost.note
    block = _block(tier, cost.arm, micro)
    if block is not None:
        return (f"{cost.note}; blocks of {block} query rows at T = {tier.seq_len}, micro-batch {micro}, "
                "recomputed in the backward pass")
    why = get_arm(cost.arm).no_decoding or f"T = {tier.seq_len} is one block"
    return f"{cost.note}; whole rows ({why})"


def plan_grid(experiment=None, *, tiers=None, arms=None, seeds=None, seed_count: int | None = None,
              match_params: bool | None = None, speed: Throughput | None = None, world_size: int = 1) -> dict:
    """The whole grid: an Experiment's (filtered like `submit`: tiers, arms, seed indices), or the given
    tiers × arms (every registered arm by default) × seed_count (default: each tier's); world_size: GPUs
    per run (a profile's gpus_per_run)."""
    speed = speed or Throughput()
    plans = []
    if experiment is not None:
        specs = experiment.runs(tiers, arms, seeds)  # validates names and seed indices like `submit`
        match = bool(getattr(experiment, "match_params", False)) if match_params is None else match_params
        for tier in dict.fromkeys(s.tier for s in specs):
            tier_specs = [s for s in specs if s.tier == tier]
            arm_names = list(dict.fromkeys(s.arm for s in tier_specs))
            count = seed_count if seed_count is not None else len({s.seed for s in tier_specs})
            plans.append(plan_rows(tier, arm_names, count, match_params=match,
                                   overrides=experiment.tier_overrides(tier), speed=speed, world_size=world_size))
    else:
        if not tiers:
            raise AblateError("give an experiment or --tier; valid tiers: " + ", ".join(TIERS))
        if seeds is not None:
            raise AblateError("--seeds takes seed indices of an experiment; without one, use --seed-count N")
        plans = [plan_rows(t, arms, seed_count, match_params=match_params, speed=speed, world_size=world_size)
                 for t in tiers]
    return {
        "experiment": experiment.name if experiment is not None else None, "assumption": speed.describe(),
        "gpu": speed.gpu, "mfu": speed.mfu, "mfu_source": speed.mfu_source,
        "tiers": plans, "runs": [row for p in plans for row in p["runs"]],
        "total_runs": sum(p["total_runs"] for p in plans),
        "total_gpu_hours": sum(p["total_gpu_hours"] for p in plans),
        "total_train_flops": sum(p["total_train_flops"] for p in plans),
    }


def sweep_plan(experiment, *, tiers=None, arms=None, speed: Throughput | None = None) -> dict:
    """`plan --sweep`: the LR sweep's runs (tiers × arms × factors × sweep seeds) and their GPU-hours, beside the
    grid's, and what the confirmatory runs at each arm's best LR cost at most (the grid's seeds of the sweep's
    tiers, every arm off the shared LR; an arm whose best LR is the shared one adds nothing: its grid runs serve)."""
    speed = speed or Throughput()
    specs = experiment.sweep_runs(tiers, arms)
    sweep = experiment.lr_sweep
    plans = []
    for tier in dict.fromkeys(s.tier for s in specs):
        arm_names = list(dict.fromkeys(s.arm for s in specs if s.tier == tier))
        plans.append(plan_rows(tier, arm_names, len(sweep.factors) * sweep.seeds,
                               overrides=experiment.tier_overrides(tier),
                               match_params=bool(experiment.match_params), speed=speed))
    confirm = plan_grid(experiment, tiers=[p["tier"] for p in plans], arms=arms, speed=speed)
    grid = plan_grid(experiment, arms=arms, speed=speed)
    return {
        "experiment": experiment.name, "assumption": speed.describe(),
        "factors": list(sweep.factors), "seeds": sweep.seed_list,
        "lr": {p["tier"]: [experiment.base_lr(p["tier"]) * f for f in sweep.factors] for p in plans},
        "tiers": plans, "runs": [s.key for s in specs], "total_runs": len(specs),
        "total_gpu_hours": sum(p["total_gpu_hours"] for p in plans),
        "confirmatory_runs_at_most": confirm["total_runs"],
            "confirmatory_gpu_hours_at_most": confirm["total_gpu_hours"],
        "grid_runs": grid["total_runs"], "grid_gpu_hours": grid["total_gpu_hours"],
    }


POWER_BASIS = ("one more seed of the whole grid at that tier: every arm the experiment runs there, one run each "
               "(the grid's per-seed cost), since a seed of a matched design is a seed of every arm")


def _declared(experiment) -> dict:
    comparisons = experiment.comparisons() if experiment is not None else {}
    if not comparisons:
        name = experiment.name if experiment is not None else "(none)"
        raise AblateError(f"experiment {name!r} declares no comparisons to plan for; add hypotheses=[Comparison(name, "
                          "minuend, subtrahend), …] to its file (see experiments/sink_vs_filter.py)")
    return comparisons


def power_plan(experiment, effect: float, *, sd: float | None = None, pilots: dict | None = None, alpha: float = 0.05,
               target_power: float = 0.8, tiers=None, speed: Throughput | None = None) -> dict:
    """`plan --power`: per tier and declared comparison, the seeds a paired t needs (`ablate.power.power_rows`)
    and their GPU-hours at the grid's per-seed cost (POWER_BASIS); per tier the most any comparison needs,
    next to the experiment's fixed seed count. Each declared slope's power at the design, for both estimands, is
    `slope_powers`'s (the command adds it as "slopes")."""
    from ablate.power import pilot_warning, power_rows  # statsmodels loads only when power is planned

    speed = speed or Throughput()
    comparisons = _declared(experiment)
    chosen = list(dict.fromkeys(tiers or experiment.tiers))
    experiment.runs(chosen, seeds=[])  # unknown tiers: an error naming the valid ones
    # The experiment-wide family is sized over every tier, so its rows are planned for all and then chosen.
    planned = list(experiment.tiers) if experiment.family == "experiment" else chosen
    grid = plan_grid(experiment, tiers=planned, seed_count=1, speed=speed)
    per_seed = {t["tier"]: t["total_gpu_hours"] for t in grid["tiers"]}
    names = {tier: [c.name for c in comparisons[tier]] for tier in planned}
    declared = experiment.declared_family()
    family = {tier: declared.tier_size(tier) for tier in planned}
    rows = power_rows(names, effect, per_seed, sd=sd, pilots=pilots, alpha=alpha, target_power=target_power,
                      family=family)
    rows = [_with_sd_source(r, pilots) for r in rows if r["tier"] in chosen]
    summary = []
    for tier in chosen:
        tier_rows = [r for r in rows if r["tier"] == tier]
        seeds = max(r["seeds"] for r in tier_rows)
        conservative = [r["seeds_conservative"] for r in tier_rows if r["seeds_conservative"] is not None]
        fixed = experiment.seed_count(tier)
        summary.append({"tier": tier, "seeds": seeds, "gpu_hours": seeds * per_seed[tier],
                        "seeds_conservative": max(conservative) if conservative else None,
                        "fixed_seeds": fixed, "fixed_gpu_hours": fixed * per_seed[tier],
                        "gpu_hours_per_seed": per_seed[tier], "sd_sources": _sd_sources(tier_rows)})
    used = [pilots[(r["tier"], r["comparison"])] for r in rows if r["sd_source"] == "pilot"]
    warnings = sorted({w for p in used if (w := pilot_warning(p.n0))})
    return {"power": rows, "tiers": summary, "gpu_hours_basis": POWER_BASIS, "assumption": speed.describe(),
            "warnings": warnings, "slopes": [],
            "notes": _unused_pilot_notes(rows, pilots) + _family_note(experiment)}


def slope_powers(experiment, slope: float, sd: float | None, tier_sd: float | None, alpha: float = 0.05) -> list[dict]:
    """Each declared slope's power at the experiment's design (its evidence tiers of known size and their seed
    counts), for both estimands (`ablate.power.slope_power`): across these tier recipes and as a law of N with
    tier-level scatter `tier_sd` (default: half of `sd`). The test level is α/m, m the study-wide family's
    (`Experiment.declared_family`) with family="experiment"; with family="tier" the slopes are in no family and
    each is planned at α (exploratory)."""
    from ablate.power import slope_power  # kept with the power planning, as `power_plan` does

    if sd is None or not sd > 0 or not math.isfinite(slope):
        raise AblateError(f"--slope {slope!r} needs --sd S (the seed sd of one paired difference, nats) and a finite "
                          "slope in nats per decade of parameters")
    tier_sd = sd / 2 if tier_sd is None else tier_sd
    if not (math.isfinite(tier_sd) and tier_sd >= 0):
        raise AblateError(f"--tier-sd {tier_sd!r} must be a number ≥ 0 (nats: the tier means' scatter about the line)")
    family = experiment.declared_family()
    members = family.slopes or Family.of(experiment.hypotheses, experiment.tiers, "experiment").slopes
    m = family.largest if family.slopes else 1
    tiers = sorted((t for t in experiment.tiers if not is_pipeline_check(t) and math.isfinite(tier_rank(t))),
                   key=tier_rank)
    sizes = [math.log10(tier_rank(t)) for t in tiers]
    counts = [experiment.seed_count(t) for t in tiers]
    power = slope_power(sizes, counts, slope, sd, tier_sd, alpha / m)
    return [{"quantity": q, "slope": slope, "sd": sd, "tier_sd": tier_sd, "tiers": tiers, "seeds": counts,
             "family_size": m, "alpha_per_test": alpha / m, "in_family": bool(family.slopes), **power}
            for q in members]


def _family_note(experiment) -> list[str]:
    """With family="experiment": the m planned, what it counts, and why the report's may be smaller."""
    if experiment.family != "experiment":
        return []
    family = experiment.declared_family()
    m, slopes = family.largest, len(family.slopes)
    return [f"m = {m}: the {m - slopes} declared comparisons at every tier and the {slopes} scale slopes of the "
            "study-wide family (ablate.family: the design's members); the tables' Holm uses the same m, counting a "
            "comparison that did not run or has one seed at p = 1, so its decisions are final once all have run"]


def _with_sd_source(row: dict, pilots: dict | None) -> dict:
    """A power row as `plan --power` shows it: where its sd came from ("pilot", with the pilot's seed count, or
    "--sd"), and without the tier's GPU-hours, which belong to the tier (its rows do not add up)."""
    pilot = (pilots or {}).get((row["tier"], row["comparison"]))
    shown = {k: v for k, v in row.items() if k != "gpu_hours"}
    return shown | {"sd_source": "pilot" if pilot else "--sd", "pilot_seeds": pilot.n0 if pilot else None}


def _sd_sources(rows: list[dict]) -> str:
    """One tier's sd provenance in words: "pilot (3 seeds)", "--sd" or both, naming the comparisons of each."""
    parts = []
    for source in ("pilot", "--sd"):
        names = [r["comparison"] for r in rows if r["sd_source"] == source]
        if names:
            seeds = sorted({r["pilot_seeds"] for r in rows if r["sd_source"] == source}) if source == "pilot" else []
            label = f"pilot ({'/'.join(map(str, seeds))} seeds)" if seeds else source
            parts.append(label + ("" if len(names) == len(rows) else f" for {', '.join(names)}"))
    return "; ".join(parts)


def _unused_pilot_notes(rows: list[dict], pilots: dict | None) -> list[str]:
    """Says so when a pilot was given but no planned comparison took its sd, and what the pilot does hold."""
    if pilots is None or any(r["sd_source"] == "pilot" for r in rows):
        return []
    held = sorted({f"{tier}: {name}" for tier, name in pilots})
    return ["the pilot has no paired seeds (2 or more) of any planned comparison at tiers "
            f"{', '.join(dict.fromkeys(r['tier'] for r in rows))} (it holds {', '.join(held) or 'none'}), "
            "so every sd is --sd's"]


def sequential_plan(experiment, looks: int, max_seeds: int, alpha: float = 0.05, *, effect: float | None = None,
                    sd: float | None = None, tiers=None, speed: Throughput | None = None) -> dict:
    """`plan --sequential`: the group-sequential design every declared comparison follows (`ablate.power`), its
    GPU-hours per tier (at the first look and at the most, at the grid's per-seed cost), the command that
    starts it, and with `effect` and `sd` its power and expected seeds under that effect (by simulation,
    `ablate.power.sequential_operating`) beside the fixed design's power at the experiment's seed counts."""
    from ablate.power import power, sequential_design, sequential_operating  # kept with the power planning

    _declared(experiment)
    if (effect is None) != (sd is None):
        raise AblateError("--sequential with --effect needs --sd too (and --sd needs --effect): both give the "
                          "effect the design's power and expected seeds are simulated under")
    design = sequential_design(alpha, experiment.family_size(), looks, max_seeds)
    chosen = list(dict.fromkeys(tiers or experiment.tiers))
    experiment.runs(chosen, seeds=[])  # unknown tiers: an error naming the valid ones
    grid = plan_grid(experiment, tiers=chosen, seed_count=1, speed=speed or Throughput())
    per_seed = {t["tier"]: t["total_gpu_hours"] for t in grid["tiers"]}
    operating = sequential_operating(design, effect / sd) if effect is not None else None
    if effect is not None and not (effect > 0 and sd > 0):
        raise AblateError(f"--effect {effect!r} and --sd {sd!r} must both be positive numbers")
    rows = []
    for tier in chosen:
        fixed = experiment.seed_count(tier)
        row = {"tier": tier, "gpu_hours_per_seed": per_seed[tier],
               "gpu_hours_first_look": design["looks"][0]["seeds"] * per_seed[tier],
               "gpu_hours_max": max_seeds * per_seed[tier], "fixed_seeds": fixed,
               "fixed_gpu_hours": fixed * per_seed[tier]}
        if operating is not None:
            row.update(power=operating["power"], expected_seeds=operating["expected_seeds"],
                       expected_gpu_hours=operating["expected_seeds"] * per_seed[tier],
                       fixed_power=(float(power(effect / sd, fixed, design["alpha_per_comparison"]))
                                    if fixed >= 2 else None))
        rows.append(row)
    return {"sequential": design, "tiers": rows, "operating": operating, "gpu_hours_basis": POWER_BASIS,
            "assumption": grid["assumption"],
            "next": f"ablate submit {experiment.name} --sequential --looks {looks} --max-seeds {max_seeds}"
                    + (f" --alpha {alpha:g}" if alpha != 0.05 else "")}


# A downstream evaluation's by-item interval (`ablate table --metric M --by-item`) at n seeds, as a multiple of the
# width an oracle that knew the seed, item and residual variances would give: the range over the variance mixes of
# tests/test_items_coverage.py (50 and 200 items) of the median ratio; tests/test_plan_eval.py simulates it.
EVAL_MIN_SEEDS = 3
EVAL_WIDTH = {2: (2.5, 5.2), 3: (1.0, 2.0)}


def eval_advice(plan: dict, tasks) -> dict:
    """For a downstream evaluation of a grid (`submit --eval TASKS`, `ablate eval`): per tier of `plan` (a
    `plan_grid` result) its seeds and, below EVAL_MIN_SEEDS, why they are too few; the recommended seed count."""
    from ablate.evals.tasks import TASKS  # the task registry: imported only when a plan asks about evaluation

    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise AblateError(f"unknown task {unknown[0]!r} for --eval; valid tasks: {', '.join(TASKS)}")
    low, high = EVAL_WIDTH[2]
    at3 = EVAL_WIDTH[3]
    tiers = []
    for tier in plan["tiers"]:
        seeds = max((r["seeds"] for r in tier["runs"]), default=0)
        why = None
        if seeds == 1:
            why = "one seed: its by-item interval is items-only (it covers the items, not the training seeds)"
        elif seeds == 2:
            why = (f"two seeds: by-item intervals are {low:g}–{high:g}× an oracle's width ({at3[0]:g}–{at3[1]:g}× at "
                   "three)")
        tiers.append({"tier": tier["tier"], "seeds": seeds, "enough": seeds >= EVAL_MIN_SEEDS, "why": why})
    return {"tasks": list(tasks), "min_seeds": EVAL_MIN_SEEDS, "tiers": tiers,
            "recommendation": f"a downstream evaluation wants at least {EVAL_MIN_SEEDS} seeds per tier: the by-item "
                              f"interval at two seeds is {low:g}–{high:g}× an oracle's width, at three "
                              f"{at3[0]:g}–{at3[1]:g}×"}
