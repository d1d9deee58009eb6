"""Tiers: the GPT-2-shaped tiers, parameter-matched configs, the GPU table, the micro-batch estimate."""

import dataclasses

import pytest
import torch

import ablate.tiers as tiers_module
from ablate.arms import list_arms
from ablate.errors import AblateError
from ablate.model import GPT
from ablate.sizing import (MATCH_TOLERANCE, _meta_counts, matched_mlp_hidden, memory_estimate_gb, micro_batch_for,
                           model_config)
from ablate.tiers import GPUS, TIER_ORDER, TIERS, get_gpu, gpu_key_for

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


def non_embedding(tier, arm, match):
    return _meta_counts(model_config(TIERS[tier], arm, match_params=match))["non_embedding"]


ATTENTION_ONLY = [name for name, tier in TIERS.items() if tier.mlp_ratio == 0]  # no MLP to narrow


@pytest.mark.parametrize("tier", [name for name in TIERS if name not in ATTENTION_ONLY])
def test_matched_counts_within_half_a_percent_for_every_arm(tier):
    base = non_embedding(tier, "baseline", False)
    narrowed = []
    for arm in list_arms():
        config = model_config(TIERS[tier], arm, match_params=True)
        gap = _meta_counts(config)["non_embedding"] / base - 1
        assert abs(gap) <= MATCH_TOLERANCE, (arm, gap)
        unmatched = model_config(TIERS[tier], arm)
        if abs(non_embedding(tier, arm, False) / base - 1) > MATCH_TOLERANCE:
            narrowed.append(arm)
            assert config.mlp_hidden < 4 * TIERS[tier].d_model and config.mlp_hidden % 8 == 0
        else:  # an arm already within the tolerance keeps the baseline's config exactly
            assert config == unmatched and config.mlp_hidden is None
    # Qiu et al.'s elementwise and value gates add n_layer·d² (+8.3%): they are the ones narrowed
    assert {"g1-elementwise", "g2-value"} <= set(narrowed), narrowed


def test_matched_width_is_three_and_a_half_d_for_the_qiu_gates():
    for tier in ("50M", "124M", "350M", "124M-gpt2", "350M-gpt2", "10M", "smoke"):
        d = TIERS[tier].d_model
        assert model_config(TIERS[tier], "g2-value", match_params=True).mlp_hidden == 7 * d // 2, tier
    assert matched_mlp_hidden(model_config("124M", "g2-value")) % 64 == 0  # 2688: a multiple of 64


def test_meta_counts_equal_a_real_models_at_the_small_tiers():
    for tier in ("smoke", "10M"):
        config = model_config(tier, "g1-elementwise", match_params=True)
        assert GPT(config).param_counts() == _meta_counts(config)


def test_match_params_with_an_explicit_width_is_refused():
    with pytest.raises(AblateError, match="mlp_hidden=100 and match_params"):
        model_config("smoke", "g2-value", match_params=True, mlp_hidden=100)


def test_default_config_is_unchanged_by_the_new_width_field():
    config = model_config("124M", "baseline")
    assert config.mlp_hidden is None and config.mlp_width == 4 * 768
    assert tuple(GPT(model_config("smoke", "baseline")).blocks[0].mlp.c_fc.weight.shape) == (256, 64)


def test_gpt2_tiers_have_gpt2_shapes_and_the_same_budgets():
    for name, literal, layers, width, non_emb in (("124M-gpt2", "124M", 12, 768, 85e6),
                                                   ("350M-gpt2", "350M", 24, 1024, 302e6)):
        tier, ref = TIERS[name], TIERS[literal]
        assert (tier.n_layer, tier.d_model) == (layers, width)
        same = {f.name for f in dataclasses.fields(tier)} - {"name", "nominal_params", "n_layer"}
        assert all(getattr(tier, f) == getattr(ref, f) for f in same)
        assert abs(non_embedding(name, "baseline", False) / non_emb - 1) < 0.01
        assert abs(tier.nominal_params / non_emb - 1) < 0.01
    assert TIER_ORDER == ("smoke", "synthetic", "filter-norm", "filter-direction", "abstain-stream", "value-junk-norm",
                          "value-junk-direction", "stream-absent-60", "stream-absent-90", "stream-absent-95",
                          "junk-content-e010", "junk-content-e020", "junk-content-e050", "10M", "20M", "35M", "50M",
                          "80M", "124M-gpt2", "124M", "200M", "350M-gpt2", "350M")


def test_docstring_names_the_learning_rates_the_tiers_use():
    doc = tiers_module.__doc__
    assert TIERS["10M"].lr == 1.5e-3 and "1.5e-3 at 10M" in doc and "1e-3 at 50M" in doc
    assert "124M-gpt2" in doc and "85M" in doc and "302M" in doc


def test_gpu_table():
    assert get_gpu("a100").peak_bf16_tflops == 312 and get_gpu("a100").memory_gb == 40
    assert get_gpu("a100-80").memory_gb == 80
    assert get_gpu("h100").peak_bf16_tflops == 989 and get_gpu("h100").memory_gb == 80
    assert get_gpu("h200").peak_bf16_tflops == 989 and get_gpu("h200").memory_gb == 141
    with pytest.raises(AblateError, match="unknown gpu 'v100'; valid gpus: a100, a100-80, h100, h200"):
        get_gpu("v100")
    assert gpu_key_for("NVIDIA H100 80GB HBM3") == "h100" and gpu_key_for("NVIDIA H200") == "h200"
    assert gpu_key_for("NVIDIA A100-SXM4-40GB", 39.4) == "a100"
    assert gpu_key_for("NVIDIA A100-SXM4-80GB", 79.2) == "a100-80"
    assert gpu_key_for("Tesla V100-SXM2-16GB") is None and set(GPUS) == {"a100", "a100-80", "h100", "h200"}


def test_micro_batch_follows_the_gpu_memory():
    # the estimate reproduces the 10M tier's hand-chosen 64 on 80 GB, and halves it on a 40 GB A100
    assert micro_batch_for("10M", 80) == TIERS["10M"].micro_batch == 64
    assert micro_batch_for("10M", 40) == 32
    # the unchunked output layer is what limits it: 16 bytes × 50,304 × 65,536 tokens ≈ 53 GB
    full, chunked = memory_estimate_gb("10M", 64), memory_estimate_gb("10M", 64, loss_chunk=4096)
    assert full - chunked == pytest.approx(16 * 50304 * (65536 - 4096) / 1e9)
    assert micro_batch_for("10M", 40, loss_chunk=4096) == 128
    for tier in TIERS:
        for world in (1, 2):
            for gb in (40, 80, 141):
                micro = micro_batch_for(tier, gb, world_size=world)
                local = TIERS[tier].global_batch // world
                assert local % micro == 0 and memory_estimate_gb(tier, micro, world_size=world) <= 0.9 * gb
                if micro < local:  # the next divisor up would not fit
                    bigger = min(m for m in range(micro + 1, local + 1) if local % m == 0)
                    assert memory_estimate_gb(tier, bigger, world_size=world) > 0.9 * gb
    with pytest.raises(AblateError, match="does not fit 4 GB"):
        micro_batch_for("350M", 4)
    with pytest.raises(AblateError, match="world size 3 must divide"):
        micro_batch_for("10M", 80, world_size=3)


@pytest.mark.parametrize("tier", ATTENTION_ONLY)
def test_an_attention_only_tier_matches_the_small_arms_and_refuses_to_narrow_an_mlp_it_has_not(tier):
    """abstain-stream, the value-junk tiers and the graded testbed's have no MLP: an arm within the tolerance keeps
    the baseline's config; one that is not (g2-value, +d² per layer) is refused in one line, never built with a
    negative width."""
    assert ATTENTION_ONLY == ["abstain-stream", "value-junk-norm", "value-junk-direction", "stream-absent-60",
                              "stream-absent-90", "stream-absent-95", "junk-content-e010", "junk-content-e020",
                              "junk-content-e050"]
    for arm in ("sink-logit", "off-by-one", "sink-token", "norm-gate", "proj-gate", "renorm"):
        assert model_config(TIERS[tier], arm, match_params=True) == model_config(TIERS[tier], arm)
    with pytest.raises(AblateError, match="'g2-value' adds 4,096 non-embedding parameters and the model has no MLP"):
        model_config(TIERS[tier], "g2-value", match_params=True)
