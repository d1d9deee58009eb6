"""The synthetic abstention task: a pure function of its seed, and what every machine shows after training.

Trained with the same seed (same shared init, same batches), the two arms differ only in their attention.
What they learn within the demo's budget (`DEFAULT_STEPS` at `DEFAULT_LR`) is chaotic: the same seed on
another CPU kernel set (`ATEN_CPU_CAPABILITY`) or another vendor's CPU ends elsewhere, because the last
bits of rounding grow over 600 steps. Measured at seed 0 (2 layers, 2 heads, d_model 64, one thread), the
retrieval layer's first-key mass FK and sink-logit's phantom mass PM at absent-key answers:

    machine, kernel set        | baseline acc / loss / FK | sink-logit acc / loss / FK / PM
    ---------------------------|--------------------------|--------------------------------
    AMD EPYC, AVX2 (recorded)  | 0.855 / 0.373 / 0.467    | 0.979 / 0.076 / 0.000 / 0.844
    Intel Xeon, AVX2           | 0.952 / 0.134 / 0.497    | 0.861 / 0.380 / 0.449 / 0.123
    Intel Xeon, AVX512         | 0.639 / 0.983 / 0.001    | 0.803 / 0.573 / 0.020 / 0.134
    Intel Xeon, DEFAULT        | 0.766 / 0.648 / 0.122    |

Seeds 1 and 2 scatter as widely (Intel Xeon, AVX2 and AVX512: baseline accuracy 0.51-0.77, first-key mass
0.002-0.128; sink-logit seed 1 accuracy 0.86-0.87, phantom mass 0.002-0.006). So no test asserts which arm is
better, that the baseline builds a sink or that sink-logit abstains on its phantom: none of these holds at
every seed and kernel set (the task that makes the mechanism robust on a CPU is its own piece of work). What
holds, with margin, in every run measured (three seeds; AMD AVX2, Intel AVX2, AVX512, DEFAULT): both arms learn
to answer NONE where the key is absent (NONE accuracy 0.93-1.00 in the Intel runs; asked: above 0.8) and their
validation loss falls to at most 0.33 of the first training step's loss (asked: below half); and the attention split at
answers accounts for all the mass, with a phantom share only where there is a phantom key.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from ablate.errors import AblateError

from ablate.model import GPT
from ablate.probes.diagnostics import PROBE_FILE
from ablate.probes.synthetic import (ATTENTION_BATCH_SIZE, ATTENTION_BATCHES, IGNORE, SyntheticTask, answer_attention,
                                     default_model_config, run_synthetic, synthetic_batch, synthetic_validation,
                                     train_synthetic)
from ablate.store import synthetic_results_path as results_path

SEED = 0
MIN_ABSENT_ACCURACY = 0.8  # NONE where the key is absent: measured ≥ 0.93 at every seed and kernel set
MAX_LOSS_SHARE = 0.5  # the validation loss against the first training step's: measured ≤ 0.33


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
    """Both arms at the demo's defaults (steps, lr, task), and where their retrieval layer looks at answers."""
    torch.set_num_threads(1)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = {arm: train_synthetic(arm, SEED) for arm in ("baseline", "sink-logit")}
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    task = SyntheticTask()
    batches = synthetic_validation(task, ATTENTION_BATCH_SIZE, ATTENTION_BATCHES)
    return runs, {arm: answer_attention(run.model, task, batches) for arm, run in runs.items()}


@pytest.mark.slow
def test_both_arms_learn_to_abstain_at_every_kernel_set(trained):
    runs, _ = trained
    for arm, run in runs.items():
        assert run.absent_accuracy > MIN_ABSENT_ACCURACY, (arm, run.absent_accuracy)
        assert run.val_loss < MAX_LOSS_SHARE * run.losses[0], (arm, run.val_loss, run.losses[0])


@pytest.mark.slow
def test_the_attention_split_of_trained_models_accounts_for_all_mass(trained):
    _, attention = trained
    for arm, shares in attention.items():
        for case in ("absent", "present"):
            total = sum(v for v in shares[case].values() if v is not None)
            assert total == pytest.approx(1.0, abs=1e-6), (arm, case, shares)
        assert shares["absent"]["queried_pair"] is None and shares["present"]["queried_pair"] > 0
    assert attention["baseline"]["absent"]["phantom"] is None
    assert attention["sink-logit"]["absent"]["phantom"] > 0 and attention["sink-logit"]["present"]["phantom"] > 0


def test_run_synthetic_writes_results_run_folders_and_probes(tmp_path):
    threads = torch.get_num_threads()
    results = run_synthetic(["baseline", "sink-logit"], [3], steps=3, out=tmp_path, progress=False)
    assert torch.get_num_threads() == threads
    assert json.loads(results_path(tmp_path).read_text()) == json.loads(json.dumps(results))
    assert results["steps"] == 3 and [(r["arm"], r["seed"]) for r in results["runs"]] == [("baseline", 3),
                                                                                         ("sink-logit", 3)]
    for run in results["runs"]:
        run_dir = tmp_path / "synthetic" / "runs" / run["arm"] / "seed3"
        probe = json.loads((run_dir / PROBE_FILE).read_text())
        assert (probe["run"] == {"tier": "synthetic", "arm": run["arm"], "seed": 3} and probe["summary"]
                == run["summary"])
        assert (run_dir / "checkpoints" / "model.pt").is_file() and (run_dir / "summary.json").is_file()
        assert set(run["attention"]) == {"absent", "present"}
    # run again: reused, not retrained or overwritten; other settings are refused
    import ablate.probes.synthetic as synthetic

    mtime = results_path(tmp_path).stat().st_mtime_ns
    original = synthetic.train_and_save_synthetic
    synthetic.train_and_save_synthetic = None  # would fail if called
    try:
        again = run_synthetic(["baseline", "sink-logit"], [3], steps=3, out=tmp_path, progress=False)
        with pytest.raises(AblateError, match="other settings"):
            run_synthetic(["baseline"], [3], steps=4, out=tmp_path, progress=False)
    finally:
        synthetic.train_and_save_synthetic = original
    assert again == json.loads(json.dumps(results)) and results_path(tmp_path).stat().st_mtime_ns == mtime


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


def test_cli_help_states_the_default_budget(capsys):
    import re

    from ablate.cli import main
    from ablate.probes.synthetic import DEFAULT_STEPS

    with pytest.raises(SystemExit):
        main(["synthetic", "--help"])
    assert re.search(rf"default\s+{DEFAULT_STEPS}:", capsys.readouterr().out)
