"""The mechanism testbed: does an arm abstain? Tiny models on the synthetic Abstain task, 5 seeds, on a CPU.

Half of the queries ask for a key that was never stored; the right answer there is NONE, and the retrieval
head has nothing to read (docs/method.md, "The mechanism testbed"). The task's sizes, budget and learning rate
were chosen on the baseline alone so that every seed learns it; the predictions below were declared before
any arm was run on it, and the report says which held. Each is Δ = L_minuend − L_subtrahend per seed of the
validation loss at the fixed budget (positive: the subtrahend learns the task to a lower loss), Holm over
the three. The mechanism's signature (phantom and first-key mass at absent against present keys, the retrieval
head's output norm) is in each run's eval.json: `ablate table testbed --metric abstain/phantom_absent`.

Your own arm: `ablate testbed --arm my-arm --arm-file my_arms.py` (the file that registers it, loaded as an
experiment file is), or an experiment file of your own (README, "The mechanism testbed").
"""

from ablate.experiment import Comparison, Experiment

EXPERIMENT = Experiment(
    name="testbed",
    description="does an arm abstain: the synthetic Abstain task, 5 seeds per arm (CPU, minutes)",
    tiers=("synthetic",),
    arms=("baseline", "sink-logit", "off-by-one", "renorm"),
    seeds=5,
    hypotheses=(
        Comparison("abstain_sink_logit", "baseline", "sink-logit"),
        Comparison("abstain_off_by_one", "baseline", "off-by-one"),
        Comparison("renorm_control", "baseline", "renorm"),
    ),
)
