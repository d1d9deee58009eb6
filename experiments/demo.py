"""The demo: every registered arm × 2 seeds on the smoke tier, on the shipped sample (`make demo`).

The smoke tier is a pipeline check: it shows the machinery working, not an effect (docs/method.md).
"""

from ablate.experiment import Experiment

EXPERIMENT = Experiment(
    name="demo",
    description="every registered arm, 2 seeds, smoke tier (CPU, minutes)",
    tiers=("smoke",),
    arms="all",
    seeds=2,
)
