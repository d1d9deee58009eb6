"""The demo: every registered arm × 2 seeds on the smoke tier, on the shipped sample (`make demo`);
"all" leaves out the registered examples outside the study (qk-norm, temperature, alibi).

The smoke tier is a pipeline check: it shows the machinery working, not an effect (docs/method.md).
The demo stops each run after 20 of the smoke tier's 100 steps (the schedule shortened to them), so
that `make demo` fits in four minutes on two CPU cores; the mechanism is shown by the synthetic task.
It validates every 2 steps so that each curve of its report has 11 points.
"""

from ablate.experiment import Experiment, LRSweep

EXPERIMENT = Experiment(
    name="demo",
    description="every registered arm, 2 seeds, smoke tier (CPU, minutes)",
    tiers=("smoke",),
    arms="all",
    seeds=2,
    # a validation every 2 steps (11 points per curve) on 512 tokens each; the final val_loss still scores the
    # tier's 8,192
    overrides={"max_steps": 20, "val_interval": 2, "val_tokens": 4 * 64 * 2},
    lr_sweep=LRSweep(factors=(0.5, 1, 2), seeds=1, tiers=("smoke",)),  # `ablate submit demo --sweep`
)
