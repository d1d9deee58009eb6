"""The mechanism testbed: does an arm abstain? Tiny models on the synthetic Abstain task, 5 seeds, on a CPU.

Half of the queries ask for a key that was never stored; the right answer there is NONE, and the retrieval
head has nothing to read (docs/method.md, "The mechanism testbed"). The task's sizes, budget and learning rate
were chosen on the baseline alone so that every seed learns it; the predictions below were declared before
any arm was run on it, and the report says which held. Each is Δ = L_minuend − L_subtrahend per seed of the
validation loss at the fixed budget (positive: the subtrahend learns the task to a lower loss), Holm over
the three. The mechanism's signature (phantom and first-key mass at absent against present keys, the retrieval
head's output norm) is in each run's eval.json: `ablate table testbed --metric abstain/phantom_absent`.

The Filter tiers (filter-norm, filter-direction) hold recall through junk reads of the queried key, marked by a
fresh noise token or by one MARK token in front (`ablate.data.filter`); each runs the baseline and the two value
gates. Their predictions, declared before any gate ran on the task, are restricted to their tier; the signature
(junk mass, junk weight after the gate, the gate on junk and clean reads, the read's norm) is eval.json's task
`filter`: `ablate table testbed --metric filter/junk_weight`.

Your own arm: `ablate testbed --arm my-arm --arm-file my_arms.py` (the file that registers it, loaded as an
experiment file is), or an experiment file of your own (docs/testbed.md).
"""

from ablate.experiment import Comparison, Experiment

ABSTAIN = ("synthetic",)  # the tier the Abstain comparisons are declared at
FILTER_ARMS = ("baseline", "norm-gate", "proj-gate")

EXPERIMENT = Experiment(
    name="testbed",
    description="does an arm abstain, does a gate filter: the Abstain and Filter tasks, 5 seeds per arm (CPU)",
    tiers=("synthetic", "filter-norm", "filter-direction"),
    arms={"synthetic": ("baseline", "sink-logit", "off-by-one", "renorm"),
          "filter-norm": FILTER_ARMS, "filter-direction": FILTER_ARMS},
    seeds=5,
    hypotheses=(
        Comparison("abstain_sink_logit", "baseline", "sink-logit", tiers=ABSTAIN),
        Comparison("abstain_off_by_one", "baseline", "off-by-one", tiers=ABSTAIN),
        Comparison("renorm_control", "baseline", "renorm", tiers=ABSTAIN),
        Comparison("filter_direction_proj_gate", "baseline", "proj-gate", tiers=("filter-direction",)),
        Comparison("filter_direction_proj_over_norm", "norm-gate", "proj-gate", tiers=("filter-direction",)),
        Comparison("filter_norm_norm_gate", "baseline", "norm-gate", tiers=("filter-norm",)),
        Comparison("filter_norm_norm_over_proj", "proj-gate", "norm-gate", tiers=("filter-norm",)),
    ),
)
