"""Sizing counts an arm's attention path: the reference path's (B, H, T, T) tensors per layer enter the memory
estimate, `ablate plan` and the micro-batch `ablate submit` gives, so plan = submit holds for such an arm; the
fused and flex paths add nothing. And the estimate covers what the reference path measures on the CPU."""

import pytest
import torch

from ablate.arms import Arm
from ablate.arms.base import _REGISTRY
from ablate.sizing import (REFERENCE_SAVED_PER_LAYER, REFERENCE_WORKING, arm_memory_phases_gb, memory_phases_gb,
                           model_config, reference_attention_bytes)
from ablate.tiers import get_tier


class ReluNormaliser(Arm):
    """A normaliser with no elementwise log-weight: flex_attention cannot run it, so CUDA takes the reference path."""

    def normalise(self, logits, context):
        return torch.relu(logits) / context.train_len


@pytest.fixture
def relu_arm(monkeypatch):
    monkeypatch.setattr(ReluNormaliser, "name", "test-relu-normaliser")
    monkeypatch.setitem(_REGISTRY, "test-relu-normaliser", ReluNormaliser)
    return "test-relu-normaliser"


def test_the_reference_path_adds_its_square_tensors_to_every_phase(relu_arm):
    tier = get_tier("10M")
    square = 4 * tier.n_head * tier.seq_len ** 2  # bytes of one (1, H, T, T) float32 tensor
    assert ReluNormaliser.path("cuda") == "reference"
    fused = memory_phases_gb(tier, 8)
    assert arm_memory_phases_gb(tier, 8, "baseline") == fused == arm_memory_phases_gb(tier, 8, "diff")
    assert arm_memory_phases_gb(tier, 8, "softcap") == fused  # flex on CUDA: no T×T tensor kept
    for arm, device in ((relu_arm, "cuda"), ("softcap", "cpu"), ("forgetting", "cpu")):
        phases = arm_memory_phases_gb(tier, 8, arm, device=device)
        extra_train = (phases["train_step"] - fused["train_step"]) * 1e9
        assert extra_train == pytest.approx(1.25 * 8 * square * (tier.n_layer * REFERENCE_SAVED_PER_LAYER
                                                                 + REFERENCE_WORKING), rel=1e-9)
        assert (phases["evaluation"] - fused["evaluation"]) * 1e9 == pytest.approx(1.25 * 8 * square * 4, rel=1e-9)
        assert phases["eval_scoring"] > fused["eval_scoring"]
    assert reference_attention_bytes(tier, 8, "ssmax", "cuda") == (0, 0)


def test_plan_and_submit_agree_on_the_micro_batch_of_a_reference_path_arm(relu_arm):
    from ablate.dispatch import gpu_run_options
    from ablate.experiment import Experiment
    from ablate.plan import Throughput, plan_grid

    experiment = Experiment(name="sizing_reference", tiers=["10M"], arms=["baseline", relu_arm, "softcap"], seeds=1)
    plan = plan_grid(experiment, speed=Throughput("h100"))["tiers"][0]
    planned = {row["arm"]: row["micro_batch_for_gpu"] for row in plan["runs"]}
    profile = {"gpu": "h100", "gpus_per_run": 1}
    submitted = {spec.arm: gpu_run_options({}, spec, profile)["micro_batch"] for spec in experiment.runs()}
    assert planned == submitted
    assert planned["baseline"] == planned["softcap"] == plan["micro_batch_for_gpu"]
    assert planned[relu_arm] < planned["baseline"]  # the T×T tensors take room


def test_the_estimate_covers_the_reference_paths_measured_saved_tensors():
    """On the CPU (float32): the bytes autograd keeps for the backward pass of one layer's attention, over the
    fused baseline's, stay within REFERENCE_SAVED_PER_LAYER square tensors for each score-modifier/normaliser
    example."""
    from ablate.model import GPT

    B, T = 2, 64
    kept = {}
    for arm in ("baseline", "softcap", "sigmoid", "forgetting", "ssmax"):
        config = model_config("smoke", arm, n_layer=1, max_seq_len=T, vocab_size=64)
        model = GPT(config)
        storages = {}

        def pack(t):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            idx = torch.randint(0, 64, (B, T + 1), generator=torch.Generator().manual_seed(0))
            model(idx[:, :-1], idx[:, 1:])
        kept[arm] = sum(storages.values())
        square = 4 * B * config.n_head * T * T
        assert kept[arm] - kept["baseline"] <= REFERENCE_SAVED_PER_LAYER * square, arm
    assert kept["softcap"] > kept["baseline"]
