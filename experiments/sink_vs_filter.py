"""The study: abstention (sink-logit) vs filtering (value gates) across four scales (docs/method.md).

Nine arms; seeds 3/3/3/1 over the tiers 10M/50M/124M/350M; every effect is a paired difference
(`ablate table sink_vs_filter --kind increments` gives the zero-option and filtering increments).
The three increments are its declared comparisons: p is Holm-adjusted over those three per tier, and
every other row of the tables is exploratory.
Data: `ablate data prepare --source fineweb-edu --config sample-10BT --tokens 6000000000 --out data/fineweb-edu`.
"""

from ablate.experiment import Comparison, Experiment, LRSweep

EXPERIMENT = Experiment(
    name="sink_vs_filter",
    description="abstention vs filtering: the nine arms of the study at four scales",
    tiers=("10M", "50M", "124M", "350M"),
    arms=("baseline", "sink-logit", "off-by-one", "sink-token", "norm-gate", "proj-gate", "renorm", "combo", "combo2"),
    seeds={"10M": 3, "50M": 3, "124M": 3, "350M": 1},
    hypotheses=(
        Comparison("zero_option", "baseline", "sink-logit"),
        Comparison("filtering_norm", "sink-logit", "combo"),
        Comparison("filtering_proj", "sink-logit", "combo2"),
    ),
    # every arm at its own learning rate at 10M: `ablate submit sink_vs_filter --sweep`, `table --kind lr`; two sweep
    # seeds per factor, so that whether an arm's optimum moved has an interval (docs/lr-sweeps.md)
    lr_sweep=LRSweep(factors=(0.25, 0.5, 1, 2, 4, 8), seeds=2, tiers=("10M",)),
)
