"""The synthetic abstention task: a pure function of its seed, and the direction the study reports.

Trained with the same seed (same shared init, same batches), the baseline parks the mass of queries
that find nothing on the first key (a sink), while sink-logit puts it on the phantom key.

Where to look. Abstention is needed by the retrieval (last) layer at the answer positions whose key
was never stored. Measured there (2 layers, 2 heads, d_model 64, 1500 steps, weight decay 0.1, CPU,
one thread), first-key mass FK and sink-logit's phantom mass PM at absent / present-key answers:

    seed | baseline FK absent | sink-logit FK absent | ratio | PM absent | PM present | mean FKM b / s
    -----|--------------------|----------------------|-------|-----------|------------|---------------
      0  |       0.253        |        0.033         |  7.6  |   0.500   |   0.414    | 0.277 / 0.313
      1  |       0.136        |        0.031         |  4.3  |   0.111   |   0.068    | 0.165 / 0.045
      2  |       0.314        |        0.0000002     |  >1e5 |   0.331   |   0.196    | 0.316 / 0.202

The whole-model mean first-key mass (last column: over layers, heads and all queries, as `probe`
reports it) is not a stable test statistic: sink-logit's first layer sometimes parks mass on BOS, a
free constant read, and a float-rounding change in the fused kernel moved seed 0's from 0.117 to 0.313
while the retrieval layer kept its sign and size. The test uses seed 0 and asks for a ratio above 3,
a gap above 0.08, more phantom mass where the key is absent than where it is present, and a phantom
mass above 0.2 there: each well inside all three measured seeds (bar the last, seed 0's alone).
"""

from __future__ import annotations

import math

import pytest
import torch

from ablate.probes.diagnostics import probe_model
from ablate.model import GPT
from ablate.probes.synthetic import (IGNORE, SyntheticTask, answer_attention, default_model_config, synthetic_batch,
                                     synthetic_validation, train_synthetic)

SEED = 0
MIN_RATIO = 3.0  # baseline / sink-logit first-key mass, retrieval layer, absent-key answers
MIN_GAP = 0.08  # baseline − sink-logit first-key mass there
MIN_PHANTOM = 0.2  # sink-logit phantom mass there
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


def retrieval_layer_masses(model, task):
    """(first-key mass, phantom mass or None) of the last layer, at absent- and present-key answers."""
    first_key, phantom = {"absent": [], "present": []}, {"absent": [], "present": []}
    with torch.no_grad():
        for inputs, targets in synthetic_validation(task, 64, 4):
            record = model(inputs, record=True).records[-1]
            answers = {"absent": targets == task.NONE, "present": (targets != task.NONE) & (targets != IGNORE)}
            for kind, where in answers.items():
                first_key[kind].append(record.weights[..., 0].mean(1)[where])  # mean over heads
                if record.phantom_mass is not None:
                    phantom[kind].append(record.phantom_mass.mean(1)[where])
    mean = lambda parts: float(torch.cat(parts).mean()) if parts else None  # noqa: E731
    return {k: mean(v) for k, v in first_key.items()}, {k: mean(v) for k, v in phantom.items()}


def test_baseline_builds_a_sink_and_sink_logit_abstains_on_the_phantom(trained):
    runs, summary = trained
    task = SyntheticTask()
    base_fk, base_phantom = retrieval_layer_masses(runs["baseline"].model, task)
    sink_fk, sink_phantom = retrieval_layer_masses(runs["sink-logit"].model, task)
    report = f"absent-key answers, last layer: first-key mass baseline {base_fk}, sink-logit {sink_fk}; phantom {sink_phantom}"
    assert base_fk["absent"] > MIN_RATIO * sink_fk["absent"], report
    assert base_fk["absent"] - sink_fk["absent"] > MIN_GAP, report
    assert base_phantom["absent"] is None and summary["baseline"]["phantom_mass"] is None
    assert sink_phantom["absent"] > MIN_PHANTOM, report
    assert sink_phantom["absent"] > sink_phantom["present"], report  # it abstains where nothing is there


def test_answer_noise_sets_a_floor_and_leaves_the_rest_of_the_batch_alone():
    clean, noisy = SyntheticTask(), SyntheticTask(answer_noise=0.2)
    inputs, targets = synthetic_batch(clean, 256, 11)
    noisy_inputs, noisy_targets = synthetic_batch(noisy, 256, 11)
    assert torch.equal(inputs, noisy_inputs) and torch.equal(targets == clean.NONE, noisy_targets == clean.NONE)
    changed = (targets != noisy_targets).float().sum() / ((targets != IGNORE) & (targets != clean.NONE)).sum()
    assert 0.1 < changed < 0.2  # 20% redrawn, a quarter of those land on the true value again
    loss, accuracy = noisy.floor()
    q = 0.2 / 4
    assert loss == pytest.approx(0.5 * -((1 - 0.2 + q) * math.log(1 - 0.2 + q) + 3 * q * math.log(q)))
    assert accuracy == pytest.approx(0.5 + 0.5 * (1 - 0.2 + q)) and clean.floor() == (0.0, 1.0)


def test_answer_attention_shares_sum_to_one():
    task = SyntheticTask()
    for arm in ("baseline", "sink-logit"):
        model = GPT(default_model_config(task, arm, d_model=32))
        model.init_weights(0)
        shares = answer_attention(model.eval(), task, synthetic_validation(task, 16, 1))
        assert shares["absent"]["queried_pair"] is None and shares["present"]["queried_pair"] > 0
        for case in ("absent", "present"):
            total = sum(v for v in shares[case].values() if v is not None)
            assert total == pytest.approx(1.0, abs=1e-6), (arm, case, shares)
        assert (shares["absent"]["phantom"] is None) == (arm == "baseline")
