"""Qiu et al. (NeurIPS 2025): baseline against the SDPA-output gates (G1) and the value gate (G2).

The arms' formulas and initial values are in docs/method.md (section 3). As in the paper, the gated arms
are parameter-matched: an arm that adds parameters (g1-elementwise and g2-value add n_layer·d²) narrows
its MLP so its non-embedding parameters equal the baseline's. `ablate submit gated_attention
--no-match-params` runs the unmatched variant.
"""

from ablate.experiment import Experiment

EXPERIMENT = Experiment(
    name="gated_attention",
    description="baseline vs Qiu et al.'s gated attention (g1-elementwise, g1-headwise, g2-value)",
    tiers=("10M", "50M", "124M"),
    arms=("baseline", "g1-elementwise", "g1-headwise", "g2-value"),
    seeds=3,
    match_params=True,
)
