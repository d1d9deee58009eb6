"""Sizing counts an arm's attention path: the reference path's (B, H, T, T) tensors per layer enter the memory
estimate, `ablate plan` and the micro-batch `ablate submit` gives, so plan = submit holds for such an arm; the
fused and flex paths add nothing. The bytes per (B, H, T, T) element are the arm's own, measured on a small CPU
probe (`ablate.arms.cost`), and predict what a user's arm saves at another shape within 20%."""

import pytest
import torch

from ablate.arms import Arm
from ablate.arms.base import _REGISTRY
from ablate.arms.cost import attention_cost
from ablate.arms import get_arm
from ablate.arms.kernel import blocked_rows
from ablate.sizing import (arm_memory_phases_gb, memory_phases_gb, model_config, phase_bytes,
                           reference_attention_bytes)
from ablate.tiers import get_tier

pytestmark = pytest.mark.unit


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
    square = tier.n_head * tier.seq_len ** 2  # elements of one (1, H, T, T) tensor
    assert ReluNormaliser.path("cuda") == "reference"
    fused = memory_phases_gb(tier, 8)
    assert arm_memory_phases_gb(tier, 8, "baseline") == fused == arm_memory_phases_gb(tier, 8, "diff")
    assert arm_memory_phases_gb(tier, 8, "softcap") == fused  # flex on CUDA: no T×T tensor kept
    for arm, device in ((relu_arm, "cuda"), ("softcap", "cpu"), ("forgetting", "cpu")):
        phases = arm_memory_phases_gb(tier, 8, arm, device=device)
        cost = attention_cost(arm, device)
        assert cost.source == "measured" and cost.saved >= 4 and cost.allocated > cost.saved, cost
        saved, allocated = cost.bytes(8, tier.n_head, tier.seq_len)
        assert saved >= 8 * square * cost.saved and allocated >= 8 * square * cost.allocated
        # T = 1024: the blocked path (the block `blocked_rows` takes at B 8): no layer keeps a square; one block's
        # tensors are the work, taken when the output layer's peak is not: a phase's peak is the larger of the two
        block = blocked_rows(get_arm(arm), 8, tier.n_head, tier.seq_len)
        assert block is not None and block < tier.seq_len
        working = (saved + allocated) * block // tier.seq_len
        assert reference_attention_bytes(tier, 8, arm, device) == (0, working)
        parts = phase_bytes(tier, 8)
        out_train, out_eval = parts["train_step"].output, 1.25 * parts["evaluation"].output
        extra_train = (phases["train_step"] - fused["train_step"]) * 1e9
        assert extra_train == pytest.approx(max(1.25 * working - out_train, 0), rel=1e-6, abs=1e3)
        assert (phases["evaluation"] - fused["evaluation"]) * 1e9 == pytest.approx(max(1.25 * working - out_eval, 0),
                                                                                  rel=1e-6, abs=1e3)
        assert extra_train == 0 and 1.25 * working < out_train  # the max: no sum of peaks that never overlap
        chunked, base = (fn(tier, 8, loss_chunk=64) for fn in (lambda *a, **k: arm_memory_phases_gb(
            *a, arm, device=device, **k), memory_phases_gb))
        small_out = phase_bytes(tier, 8, loss_chunk=64)["train_step"].output
        assert 1.25 * working > small_out  # a small loss chunk: the attention's block is the larger
        assert (chunked["train_step"] - base["train_step"]) * 1e9 == pytest.approx(1.25 * working - small_out,
                                                                                  rel=1e-6)
        assert phases["eval_scoring"] >= fused["eval_scoring"] and chunked["eval_scoring"] > base["eval_scoring"]
    assert reference_attention_bytes(tier, 8, "ssmax", "cuda") == (0, 0)


def test_plan_and_submit_agree_on_the_micro_batch_of_a_reference_path_arm(relu_arm):
    from ablate.dispatch import gpu_run_options
    from ablate.runconfig import RunOptions
    from ablate.experiment import Experiment
    from ablate.plan import Throughput, plan_grid
    from ablate.profiles import Profile
    from ablate.tiers import get_tier

    experiment = Experiment(name="sizing_reference", tiers=["10M"], arms=["baseline", relu_arm, "softcap"], seeds=1)
    plan = plan_grid(experiment, speed=Throughput("h100"))["tiers"][0]
    planned = {row["arm"]: row["micro_batch_for_gpu"] for row in plan["runs"]}
    profile, tier = Profile("h", gpu="h100", gpus_per_run=1), get_tier("10M")
    submitted = {spec.arm: gpu_run_options(RunOptions(), spec, tier, profile).micro_batch
                 for spec in experiment.runs()}
    assert planned == submitted
    assert planned["baseline"] == planned["softcap"] == plan["micro_batch_for_gpu"]
    # blocks of 128 rows at T = 1024: one block's tensors, no T×T per layer; it fits the baseline's micro-batch
    assert planned[relu_arm] == planned["baseline"]


@pytest.mark.parametrize("arm,device", [("test-relu-normaliser", "cuda"), ("softcap", "cpu"), ("sigmoid", "cpu"),
                                        ("forgetting", "cpu"), ("stick-breaking", "cuda"), ("softpick", "cuda"),
                                        ("selective", "cuda")])
def test_the_plans_saved_bytes_are_within_20_percent_of_what_the_arm_saves(relu_arm, arm, device):
    """The bytes of the (…, T, T) tensors autograd keeps for the backward pass of a one-layer model of the arm
    (saved-tensor hooks, each storage once; the O(T) activations are the fused estimate's), at a shape other than
    the probe's (B 3, T 48, the smoke tier's heads of 32): the plan's predicted saved bytes
    (`reference_attention_bytes`) within 20% of them."""
    import dataclasses

    from ablate.model import GPT

    B, T = 3, 48  # within one block: the whole-row path, which keeps its squares
    config = model_config("smoke", arm, n_layer=1, max_seq_len=T, vocab_size=64)
    model = GPT(config)
    storages = {}

    def pack(t):
        if tuple(t.shape[-2:]) == (T, T):
            storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        idx = torch.randint(0, 64, (B, T + 1), generator=torch.Generator().manual_seed(0))
        model(idx[:, :-1], idx[:, 1:])
    tier = dataclasses.replace(get_tier("smoke"), n_layer=1, seq_len=T)
    predicted = reference_attention_bytes(tier, B, arm, device)[0]
    assert sum(storages.values()) > 4 * B * config.n_head * T * T
    assert predicted == pytest.approx(sum(storages.values()), rel=0.2), (predicted, storages)


def test_a_score_bias_counts_its_fused_mask_and_the_plans_peak_is_the_estimate_without_the_margin():
    """The fused path's additive (H, T, T) float32 mask of a score-bias arm (alibi) is kept in every layer, whatever
    the batch; the plan's predicted peak is the model's estimate at margin 1 (the 1.25 margin only chooses the
    micro-batch), and a score-bias arm's is above the baseline's by its masks."""
    from ablate.plan import plan_rows
    from ablate.sizing import LOSS_CHUNK, run_peak_gb

    tier = get_tier("10M")
    mask = tier.n_layer * 4 * tier.n_head * tier.seq_len ** 2
    assert reference_attention_bytes(tier, 8, "alibi", "cuda") == (mask, 0) == reference_attention_bytes(
        tier, 1, "alibi", "cpu")
    fused = memory_phases_gb(tier, 8)
    assert (arm_memory_phases_gb(tier, 8, "alibi")["train_step"] - fused["train_step"]) * 1e9 == pytest.approx(
        1.25 * mask, rel=1e-6)
    for arm in ("baseline", "alibi"):
        peak = run_peak_gb(tier, 8, {}, 1, arm, None)
        assert peak == max(arm_memory_phases_gb(tier, 8, arm, margin=1.0, loss_chunk=LOSS_CHUNK).values())
        assert peak < max(arm_memory_phases_gb(tier, 8, arm, loss_chunk=LOSS_CHUNK).values())  # the margin's
    rows = {r["arm"]: r for r in plan_rows("10M", ["baseline", "alibi"], 1)["runs"]}
    assert rows["alibi"]["micro_batch_for_gpu"] == rows["baseline"]["micro_batch_for_gpu"]
    assert (rows["alibi"]["peak_memory_gb"] - rows["baseline"]["peak_memory_gb"]) * 1e9 == pytest.approx(mask, rel=1e-6)
