"""The mechanism testbed: does an arm abstain where a non-empty read hurts by construction? Tiny models, on a CPU.

Task abstain-stream (`ablate.data.stream`): a stream of pair tokens p(k, v) with no BOS; each position asks for
its own key's value at the key's previous occurrence, NONE at its first. The model reads strictly earlier
positions, with one attention layer and no MLP (`ablate.taskmodel`), so a query that finds nothing has no
content-free place to put its mass: every read it can make is a pair's value, which pulls the answer away from
NONE. A phantom key (sink-logit, off-by-one) reads nothing. The task's sizes, budget and schedule were chosen on
the baseline alone; the predictions below were declared, with the seed count from `ablate plan testbed --power`
on a baseline pilot, before any other arm ran on the task (docs/method.md, "The mechanism testbed", with the
date and the declaring commit). Each is Δ = L_minuend − L_subtrahend per seed of the validation loss at the
fixed budget (positive: the subtrahend lowers it), two-sided paired t, Holm over the tier's three.

`control_park_position` is the positive control: sink-token prepends a learned token to every sequence, an
earlier position of every query, so the baseline's attention plus that token is a stable place to park, the very
thing the task removes. A design that cannot detect it cannot test an arm.

The signature (phantom mass and the mass on the first key, at absent against present keys; the norm of the
head's read) is eval.json's task `abstain`: `ablate table testbed --metric abstain/phantom_absent`.
Task value-junk (`ablate.data.valuejunk`, tiers value-junk-norm and value-junk-direction): Filter with the junk in
the value path only. A pair p(k, v) twice, then its query q(k); one copy, drawn from the batch and marked by no
token, has its read replaced after the value projection by a decoy's read plus a marker of ε × the head's median
read norm: a random direction per read (norm) or one fixed direction per run (direction). Routing cannot tell
the copies apart, so a softmax head reads the decoy with the value; a value gate that closes the junk read does
not. `control_junk_oracle` is the positive control: oracle-gate (`ablate.arms.testbed`) zeroes the junk reads by
the task's own mask. Declared on the baseline alone, as the Abstain half was (docs/method.md, with the date and
the declaring commit); the signature (gate on junk and clean reads, junk's weight) is eval.json's task `filter`:
`ablate table testbed --metric filter/gate_junk`.
The first testbed's tasks (Abstain with BOS, Filter) and their declarations: experiments/testbed_v1.py.
Your own arm: `ablate testbed --arm my-arm --arm-file my_arms.py` (the file that registers it, loaded as an
experiment file is), or an experiment file of your own (docs/testbed.md).
"""

import ablate.arms.testbed  # noqa: F401 (registers oracle-gate, the value-junk task's positive control)
from ablate.experiment import Comparison, Experiment

STREAM = ("abstain-stream",)
VALUE_JUNK = ("value-junk-norm", "value-junk-direction")
DIRECTION = ("value-junk-direction",)
JUNK_ARMS = ("baseline", "oracle-gate", "norm-gate", "proj-gate")

EXPERIMENT = Experiment(
    name="testbed",
    description="does an arm abstain where every read is content, does a gate filter junk routing cannot see: the "
                "abstain-stream and value-junk tasks, each with a positive control (CPU)",
    tiers=STREAM + VALUE_JUNK,
    arms={"abstain-stream": ("baseline", "sink-token", "sink-logit", "off-by-one"),
          "value-junk-norm": JUNK_ARMS, "value-junk-direction": JUNK_ARMS},
    seeds={"abstain-stream": 12, "value-junk-norm": 8, "value-junk-direction": 8},
    hypotheses=(
        Comparison("control_park_position", "baseline", "sink-token", tiers=STREAM),
        Comparison("stream_sink_logit", "baseline", "sink-logit", tiers=STREAM),
        Comparison("stream_off_by_one", "baseline", "off-by-one", tiers=STREAM),
        Comparison("control_junk_oracle", "baseline", "oracle-gate", tiers=VALUE_JUNK),
        Comparison("junk_direction_proj_gate", "baseline", "proj-gate", tiers=DIRECTION),
        Comparison("junk_direction_proj_over_norm", "norm-gate", "proj-gate", tiers=DIRECTION),
    ),
)
