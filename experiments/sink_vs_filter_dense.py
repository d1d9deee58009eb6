"""The study on the dense ladder: the nine arms at eight scales, each tier at 20 tokens per parameter.

A variant of `sink_vs_filter` (whose tiers, budgets, seeds and every recorded run stay as they are): its scale
claims are laws of N, decided on the tier means' scatter about a line in log N, and the study's four tiers leave
that scatter 2 degrees of freedom, so its headline slopes cannot come out supported (docs/power.md, "Seeds do not
buy a law; tiers do"). Here the tiers are 10M, 20M, 35M, 50M, 80M, 124M, 200M, 350M (the intermediate ones built
by the ladder's rules, `ablate/tiers.py`), two seeds each, every tier at 20 training tokens per nominal
non-embedding parameter (`at_tokens_per_param`: 124M and 350M train longer than in the study, 4,731 and 13,352
steps), and the declared comparisons and their slopes in one study-wide family.
`ablate plan sink_vs_filter_dense` prices it; `ablate plan sink_vs_filter_dense --power --effect E --sd S --slope B`
gives each declared slope's law power at this design.
Data: as the study's (`ablate data prepare --source fineweb-edu --config sample-10BT --tokens 8000000000 ...`:
350M at 20 tokens per parameter reads 7B tokens).
"""

from ablate.experiment import Comparison, Experiment
from ablate.tiers import CHINCHILLA_TOKENS_PER_PARAM, DENSE_LADDER, at_tokens_per_param

EXPERIMENT = Experiment(
    name="sink_vs_filter_dense",
    description="abstention vs filtering: the nine arms of the study on the dense ladder (8 tiers, 20 tokens/param)",
    tiers=DENSE_LADDER,
    arms=("baseline", "sink-logit", "off-by-one", "sink-token", "norm-gate", "proj-gate", "renorm", "combo", "combo2"),
    seeds=2,
    overrides=at_tokens_per_param(DENSE_LADDER, CHINCHILLA_TOKENS_PER_PARAM),
    hypotheses=(
        Comparison("zero_option", "baseline", "sink-logit"),
        Comparison("filtering_norm", "sink-logit", "combo"),
        Comparison("filtering_proj", "sink-logit", "combo2"),
    ),
    family="experiment",
)
