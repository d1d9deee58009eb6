"""The demo: every registered arm × 2 seeds on the smoke tier, on the shipped sample (`make demo`);
"all" leaves out the registered examples outside the study (qk-norm, temperature, alibi).

The smoke tier is a pipeline check: it shows the machinery working, not an effect (docs/method.md).
The demo stops each run after 50 of the smoke tier's 100 steps (the schedule shortened to them), so
that `make demo` fits in a few minutes on two CPU cores; the mechanism is shown by the synthetic task.
"""

from ablate.experiment import Experiment, LRSweep

EXPERIMENT = Experiment(
    name="demo",
    description="every registered arm, 2 seeds, smoke tier (CPU, minutes)",
    tiers=("smoke",),
    arms="all",
    seeds=2,
    overrides={"max_steps": 50},
    lr_sweep=LRSweep(factors=(0.5, 1, 2), seeds=1, tiers=("smoke",)),  # `ablate submit demo --sweep`
)
