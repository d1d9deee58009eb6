"""The graded testbed: each testbed mechanism at a graded dose, so that a comparison measures a size, not floor
against ceiling. Tiny models, on a CPU; beside `testbed` (experiments/testbed.py), whose design and results stay.

Why. In `testbed` every arm but the baseline reaches the task's floor (about 1e-7 nats), so each declared Δ is the
baseline's own loss (abstain-stream's three Δ are one number, value-junk-direction's three too): no comparison can
rank two mechanisms, and the baseline's loss, the same at every dose, could not choose one. Here the dose is graded
and the declared dose is chosen on the baseline alone, where it sits strictly between floor and ceiling:

* *Abstain, graded* (tiers stream-absent-*; `ablate.data.stream.GradedStreamTask`): the stream task with 8 keys, in
  which each position takes a key not yet in the window with probability `absent` (its query has nothing to read),
  else repeats one; the dose is the share of queries with nothing to read (`ablate.tiers.stream_absent_share`).
  Ceiling: a model that reads nothing, H(s) + (1 − s)·log 4.
* *Filter, marker from the content* (tiers junk-content-*; `ablate.data.valuejunk`, junk "content"): value-junk's
  junk read carries a marker ε·median·u*_{h,v′}, one fixed direction per head and decoy value, so the baseline
  can learn to discount the decoy from the mixed read, the more the larger ε; the dose is ε. Ceiling: a head that
  cannot tell the copies apart, log 2.

The rule (`ablate.analysis.testbed.pick_dose`), stated and applied before any arm but the baseline ran on these
tiers: of a baseline-only pilot's doses (`benchmarks/testbed_design.py --tier T --seeds 4 --kernels native --set
absent=A` or `--set dose=E`, seeds 0..3, native kernels; PILOT below), those whose every seed lies strictly
between floor (0) and ceiling; of them the one whose mean lies nearest the middle, as a share of the span. The
experiment runs that dose and one on each side of it; the declared comparisons are at the chosen dose only (the
others' rows are exploratory: the dose–response curve, `ablate report testbed_dose`). Declared, in one Holm family
per tier: the positive controls, each mechanism against the baseline, and comparisons that rank two mechanisms.
Four seeds a tier (96 runs: 29 minutes on 2 cores under a load average of 12 to 14). docs/method.md ("The graded
testbed") has the pilot, the rule's arithmetic, the predictions and what came out (the phantom arms remove about
half the baseline's loss at the declared stream dose; the park control fails there; no gate helps at the content
doses); docs/testbed.md the tables and the dose–response, rendered from tests/testbed_figures.json.
"""

import ablate.arms.testbed  # noqa: F401 (registers oracle-gate, the value-junk task's positive control)
from ablate.analysis.testbed import pick_dose
from ablate.experiment import Comparison, Experiment
from ablate.tiers import CONTENT_DOSES, STREAM_DOSES, TASKS, task_ceiling

# The baseline-only pilot: {dose: val_loss at the budget of seeds 0..3}, native kernels (docs/method.md)
PILOT_STREAM = {0.0: [0.1391, 0.1480, 0.1397, 0.1482], 0.3: [0.1955, 0.2099, 0.2119, 0.2190],  # absent → losses
                0.6: [0.2213, 0.2269, 0.2437, 0.2199], 0.9: [0.2636, 0.2416, 0.3383, 0.3453]}
PILOT_CONTENT = {0.0: [0.7102, 0.7144, 0.7164, 0.7151], 0.02: [0.6660, 0.6790, 0.6715, 0.6722],  # ε → losses
                 0.1: [0.0000, 0.0001, 0.0000, 0.0000], 0.5: [0.0000, 0.0000, 0.0000, 0.0000]}
STREAM_FIELDS = {"n_keys": 8, "n_values": 4, "window": 8}


def _declared(pilot: dict, tiers: dict, fields) -> str:
    """The tier of the dose the rule picks from the pilot."""
    dose = pick_dose(pilot, {d: task_ceiling(fields(d)) for d in pilot})
    (tier,) = [name for name, value in tiers.items() if value == dose]
    return tier


STREAM_DECLARED = _declared(PILOT_STREAM, STREAM_DOSES, lambda a: {**STREAM_FIELDS, "absent": a})
CONTENT_DECLARED = _declared(PILOT_CONTENT, CONTENT_DOSES, lambda e: {**TASKS[next(iter(CONTENT_DOSES))], "dose": e})
STREAM_ARMS = ("baseline", "sink-token", "sink-logit", "off-by-one")
JUNK_ARMS = ("baseline", "oracle-gate", "norm-gate", "proj-gate")
S, C = (STREAM_DECLARED,), (CONTENT_DECLARED,)

EXPERIMENT = Experiment(
    name="testbed_dose",
    description="the testbed's mechanisms at a graded dose (share of queries with nothing to read; a content-drawn "
                "junk marker of size ε), declared at the dose a baseline-only pilot chose (CPU)",
    tiers=tuple(STREAM_DOSES) + tuple(CONTENT_DOSES),
    arms={**dict.fromkeys(STREAM_DOSES, STREAM_ARMS), **dict.fromkeys(CONTENT_DOSES, JUNK_ARMS)},
    seeds=4,
    hypotheses=(
        Comparison("dose_control_park_position", "baseline", "sink-token", tiers=S),
        Comparison("dose_stream_sink_logit", "baseline", "sink-logit", tiers=S),
        Comparison("dose_stream_off_by_one", "baseline", "off-by-one", tiers=S),
        Comparison("dose_rank_sink_logit_over_off_by_one", "off-by-one", "sink-logit", tiers=S),
        Comparison("dose_rank_sink_token_over_sink_logit", "sink-logit", "sink-token", tiers=S),
        Comparison("dose_control_junk_oracle", "baseline", "oracle-gate", tiers=C),
        Comparison("dose_content_proj_gate", "baseline", "proj-gate", tiers=C),
        Comparison("dose_rank_proj_over_norm", "norm-gate", "proj-gate", tiers=C),
        Comparison("dose_rank_oracle_over_proj", "proj-gate", "oracle-gate", tiers=C),
    ),
)
