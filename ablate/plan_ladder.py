"""`plan --power --slope`: the cheapest ladder (tiers × seeds, GPU-hours) on which each declared scale slope can be
decided as a law of N.

A slope "shrinks/grows with scale" is tested on its law interval (docs/method.md, "Scale model"), whose error is
the tier means' scatter about the line in log N on T − 2 degrees of freedom. With the study's four tiers that is
2 df (t ≈ 18 at α/17), and more seeds do not help: they shrink the seed noise in each tier mean, not the tiers'
scatter, nor its 2 df. More tiers do (docs/power.md, "Seeds do not buy a law; tiers do"). So the planner prices
candidate ladders (`LADDERS`, each tier at 20 tokens per parameter, `ablate.tiers.at_tokens_per_param`) × equal
seed counts (`SEED_CHOICES`) and proposes the cheapest whose law power (`ablate.power.slope_power`, at α/m of
that ladder's family) reaches the target for every declared slope. The slope, seed sd and tier scatter come from
`--slope/--sd/--tier-sd` or a pilot (`ablate.analysis.scale_pilot`: its fitted slope, pooled within-tier sd and
tier scatter from its lack of fit). More tiers cannot cure a curve that bends: the law treats a bend as scatter,
and a bend that is the truth stays in the error however many tiers measure it (`CAVEAT`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ablate.errors import AblateError
from ablate.plan import Throughput, plan_grid
from ablate.tiers import CHINCHILLA_TOKENS_PER_PARAM, DENSE_LADDER, LADDER, at_tokens_per_param, tier_rank

LADDERS = {"study (4 tiers)": LADDER, "6 tiers": ("10M", "20M", "50M", "124M", "200M", "350M"),
           "dense (8 tiers)": DENSE_LADDER}
SEED_CHOICES = (2, 3, 4, 5)  # seeds per tier (2: the least that gives every tier a spread of its own)
CAVEAT = ("more tiers cannot cure a curve that bends: the law of N counts the tier means' departure from a line as "
          "error, so where the true means bend (not scatter) about the line in log N, more tiers measure the bend "
          "more precisely but do not remove it, and no ladder makes a bending trend a law")


@dataclass(frozen=True)
class SlopeInput:
    """One declared slope's planning inputs: the slope to detect (nats per decade), the seed sd of one paired
    difference, the tier means' scatter about the line (nats), and where they came from."""

    quantity: str
    slope: float
    sd: float
    tier_sd: float
    source: str


def _check(inputs: list[SlopeInput]) -> None:
    for item in inputs:
        for name, value in (("slope", item.slope), ("sd", item.sd), ("tier sd", item.tier_sd)):
            if not math.isfinite(value) or (name != "slope" and value < 0) or (name == "sd" and value == 0):
                raise AblateError(f"{item.quantity}: {name} {value!r} cannot plan a ladder (from {item.source}); "
                                  "give --slope B, --sd S (> 0) and --tier-sd T (≥ 0)")


@lru_cache(maxsize=4096)
def _power(sizes: tuple, counts: tuple, slope: float, sd: float, tier_sd: float, level: float) -> dict:
    from ablate.power import slope_power  # kept with the power planning, as `power_plan` does

    return slope_power(sizes, counts, slope, sd, tier_sd, level)


def _design_power(experiment, tiers, counts, inputs, alpha) -> tuple[list[dict], int]:
    """Each input's powers at these tiers × counts, at α/m of `experiment`'s family (m 1 when the slopes are in
    none), and that m."""
    family = experiment.declared_family()
    m = family.largest if family.slopes else 1
    sizes = tuple(math.log10(tier_rank(t)) for t in tiers)
    rows = [{"quantity": i.quantity, "slope": i.slope, "sd": i.sd, "tier_sd": i.tier_sd, "source": i.source,
             **_power(sizes, tuple(counts), abs(i.slope), i.sd, i.tier_sd, alpha / m)} for i in inputs]
    return rows, m


def ladder_plan(experiment, inputs: list[SlopeInput], *, alpha: float = 0.05, target_power: float = 0.8,
                speed=None) -> dict:
    """Each candidate ladder × seeds: its tiers, seeds, GPU-hours (every arm of `experiment`, each tier at 20 tokens
    per parameter) and each declared slope's law power at α/m of its own family; `proposal` the cheapest candidate
    where every slope's law power reaches `target_power` (None when none does); `design` the experiment's own."""
    _check(inputs)
    speed = speed or Throughput()
    arms = experiment.arm_names()
    dense = replace(experiment, tiers=DENSE_LADDER, arms=arms, seeds=1,
                    overrides=at_tokens_per_param(DENSE_LADDER, CHINCHILLA_TOKENS_PER_PARAM), lr_sweep=None)
    per_seed = {t["tier"]: t["total_gpu_hours"] for t in plan_grid(dense, seed_count=1, speed=speed)["tiers"]}
    own = [t for t in experiment.tiers if t in per_seed]
    design_rows, design_m = _design_power(experiment, own, [experiment.seed_count(t) for t in own], inputs, alpha)
    candidates = []
    for name, tiers in LADDERS.items():
        ladder = replace(dense, tiers=tiers)
        for seeds in SEED_CHOICES:
            rows, m = _design_power(ladder, tiers, [seeds] * len(tiers), inputs, alpha)
            candidates.append({"ladder": name, "tiers": list(tiers), "seeds": seeds, "family_size": m,
                               "gpu_hours": seeds * sum(per_seed[t] for t in tiers),
                               "law_power": {r["quantity"]: r["law_power"] for r in rows},
                               "weakest": min(r["law_power"] for r in rows) if rows else None})
    reaching = [c for c in candidates if c["weakest"] is not None and c["weakest"] >= target_power]
    proposal = min(reaching, key=lambda c: c["gpu_hours"]) if reaching else None
    return {"design": {"tiers": own, "seeds": [experiment.seed_count(t) for t in own], "family_size": design_m,
                       "slopes": design_rows},
            "candidates": candidates, "proposal": proposal, "target_power": target_power,
            "tokens_per_param": CHINCHILLA_TOKENS_PER_PARAM, "assumption": speed.describe(), "caveat": CAVEAT}
