"""The synthetic abstention task: a pure function of its seed, and the direction the study reports.

Trained with the same seed (same shared init, same batches), the baseline parks the mass of queries
that find nothing on the first key (a sink), while sink-logit puts it on the phantom key.

Thresholds, measured with train_synthetic's defaults (2 layers, 2 heads, d_model 64, 1500 steps,
weight decay 0.1, CPU, one thread). FKM = first-key mass and PM = phantom mass, as `probe_model`
summarises them (mean over layers and heads, queries i ≥ 1); "last" = the retrieval layer alone:

    seed | baseline FKM (last) | sink-logit FKM (last) | ratio | sink-logit PM (last) | exposure b / s
    -----|---------------------|-----------------------|-------|----------------------|---------------
      0  |    0.277 (0.298)    |     0.117 (0.042)     |  2.4  |    0.347 (0.646)     | 0.369 / 0.072
      1  |    0.165 (0.176)    |     0.032 (0.008)     |  5.2  |    0.441 (0.872)     | 0.215 / 0.090
      2  |    0.316 (0.318)    |     0.300 (0.158)     |  1.05 |    0.094 (0.152)     | 0.096 / 0.125
      3  |    0.308 (0.219)    |     0.253 (0.139)     |  1.2  |    0.437 (0.374)     | 0.196 / 0.122
      4  |    0.439 (0.467)    |     0.305 (0.369)     |  1.4  |    0.070 (0.118)     | 0.432 / 0.146

The direction holds in every seed; its size varies from seed to seed (in some, sink-logit's first
layer also parks mass on BOS, a free constant read). The test uses seed 0 and asks for a ratio above
1.5, a gap above 0.08, a phantom mass above 0.2 and lower exposure: each about half of seed 0's
margin, so a change in the arms or the probes that erases the effect fails the test, while the
deterministic single-thread run reproduces the measured numbers exactly.
"""

from __future__ import annotations

import pytest
import torch

from ablate.probes.diagnostics import probe_model
from ablate.probes.synthetic import IGNORE, SyntheticTask, synthetic_batch, synthetic_validation, train_synthetic

SEED = 0
MIN_RATIO = 1.5  # baseline first-key mass / sink-logit first-key mass
MIN_GAP = 0.08  # baseline first-key mass − sink-logit first-key mass
MIN_PHANTOM = 0.2  # sink-logit mean phantom mass
MIN_ACCURACY = 0.8  # both models must have learned the task, or the comparison means nothing


def test_batches_are_a_pure_function_of_the_seed_and_answer_correctly():
    task = SyntheticTask()
    inputs, targets = synthetic_batch(task, 64, 7)
    again, _ = synthetic_batch(task, 64, 7)
    assert torch.equal(inputs, again) and not torch.equal(inputs, synthetic_batch(task, 64, 8)[0])
    assert inputs.shape == targets.shape == (64, task.seq_len) and inputs.max() < task.vocab_size
    assert (inputs[:, 0] == task.BOS).all() and (targets[:, : 1 + task.n_pairs] == IGNORE).all()
    for b in range(64):
        stored = {}
        for token in inputs[b, 1 : 1 + task.n_pairs].tolist():
            key, value = divmod(token - task.first_pair, task.n_values)
            stored[key] = task.first_value + value
        for position in range(1 + task.n_pairs, task.seq_len):
            key = inputs[b, position].item() - task.first_query
            assert targets[b, position].item() == stored.get(key, task.NONE)
    share_absent = (targets == task.NONE).sum() / (targets != IGNORE).sum()
    assert 0.4 < share_absent < 0.6


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = {arm: train_synthetic(arm, SEED) for arm in ("baseline", "sink-logit")}
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    batches = synthetic_validation(SyntheticTask(), 64, 4)
    return runs, {arm: probe_model(run.model, batches)["summary"] for arm, run in runs.items()}


def test_both_arms_learn_the_task(trained):
    runs, _ = trained
    for arm, run in runs.items():
        assert run.val_accuracy > MIN_ACCURACY, (arm, run.val_accuracy)
        assert run.absent_accuracy > MIN_ACCURACY, (arm, run.absent_accuracy)


def test_baseline_builds_a_sink_and_sink_logit_abstains_on_the_phantom(trained):
    _, summary = trained
    baseline, sink = summary["baseline"]["first_key_mass"], summary["sink-logit"]["first_key_mass"]
    report = f"first-key mass baseline {baseline:.3f}, sink-logit {sink:.3f}; phantom {summary['sink-logit']['phantom_mass']}"
    assert baseline > MIN_RATIO * sink, report
    assert baseline - sink > MIN_GAP, report
    assert summary["baseline"]["phantom_mass"] is None
    assert summary["sink-logit"]["phantom_mass"] > MIN_PHANTOM, report
    # the sink's read is the quiet one only where there is a sink to hide
    assert summary["sink-logit"]["exposure"] < summary["baseline"]["exposure"], report
