"""Probe metrics on hand-built attention with known answers, and junk injection's protocol."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.arms import AttentionRecord
from ablate.errors import AblateError
from ablate.model import GPT, GPTConfig
from ablate.probes.diagnostics import _LayerTally, probe_model, summarise_layers
from ablate.probes.injection import (
    LayerPlan,
    clean_pass,
    inject_model,
    junk_directions,
    make_injector,
    structural_sources,
)

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
VOCAB, T = 50, 12


def tiny_model(arm: str, seed: int = 0, **kw) -> GPT:
    config = dict(vocab_size=VOCAB, n_layer=2, n_head=2, d_model=32, max_seq_len=T, arm=arm)
    config.update(kw)
    model = GPT(GPTConfig(**config))
    model.init_weights(seed)
    return model.eval()


def token_batches(n: int = 2, b: int = 4, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(VOCAB, (b, T + 1), generator=gen) for _ in range(n)]


def layer_result(record: AttentionRecord, n_head: int = 1) -> dict:
    tally = _LayerTally()
    tally.add(record, torch.tensor([[[3.0, -7.5]]]))
    return tally.result(n_head)


def hand_record(weights, norms, **kw) -> AttentionRecord:
    """One sequence, one head; reads along the first axis with the given norms."""
    reads = torch.zeros(1, 1, len(norms), 4)
    reads[0, 0, :, 0] = torch.tensor(norms)
    return AttentionRecord(weights=weights, reads=reads, values=reads, **kw)


def causal_uniform(t: int) -> torch.Tensor:
    mask = torch.tril(torch.ones(t, t))
    return (mask / mask.sum(-1, keepdim=True)).view(1, 1, t, t)


# ---------------------------------------------------------------- diagnostics: known answers
def test_all_mass_on_key_zero_gives_first_key_mass_one():
    weights = torch.zeros(1, 1, 4, 4)
    weights[..., 0] = 1.0
    result = layer_result(hand_record(weights, [1.0, 2.0, 3.0, 4.0]))
    assert result["first_key_mass"] == [1.0]
    assert result["read_norm_ratio"] == [pytest.approx(1.0 / 2.5)]  # ‖v_0‖ = 1, median of 1..4 = 2.5
    assert result["exposure"] == [1.0]  # key 0 is the only read below the 25th percentile (1.75)
    assert result["phantom_mass"] is None and result["value_gate_mean"] is None
    assert result["max_abs_residual"] == 7.5


def test_uniform_attention_excludes_query_zero():
    result = layer_result(hand_record(causal_uniform(4), [1.0, 2.0, 3.0, 4.0]))
    # queries 1, 2, 3 put 1/2, 1/3, 1/4 on key 0 (query 0, which must put 1 there, is left out)
    assert result["first_key_mass"] == [pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3, abs=1e-6)]
    assert result["exposure"] == result["first_key_mass"]


def test_phantom_mass_and_a_gate_fixed_at_zero():
    weights = torch.zeros(1, 1, 4, 4)
    weights[..., 0] = 0.75
    record = hand_record(weights, [1.0, 2.0, 3.0, 4.0], phantom_mass=torch.full((1, 1, 4), 0.25),
                         value_gate=torch.zeros(1, 1, 4, 1), output_gate=torch.full((1, 1, 4, 4), 0.5))
    result = layer_result(record)
    assert result["phantom_mass"] == [0.25]
    assert result["first_key_mass"] == [0.75]
    assert result["exposure"] == [0.75]  # the routing mass still lands on the quiet read ...
    assert result["exposure_after_value_gate"] == [0.0]  # ... but none of it passes a closed gate
    assert result["value_gate_mean"] == [0.0] and result["value_gate_near_zero"] == [1.0]
    assert result["output_gate_mean"] == [0.5] and result["output_gate_near_zero"] == [0.0]


def test_summary_counts_sink_heads():
    layers = [{"layer": 0, "first_key_mass": [0.9, 0.1], "exposure": [0.2, 0.4], "phantom_mass": None,
               "max_abs_residual": 2.0},
              {"layer": 1, "first_key_mass": [0.35, 0.29], "exposure": [0.0, 0.2], "phantom_mass": None,
               "max_abs_residual": 5.0}]
    summary = summarise_layers(layers)
    assert summary["key0_importance_share"] == 0.5  # 0.9 and 0.35 exceed 0.3
    assert summary["first_key_mass"] == pytest.approx(0.41)
    assert summary["max_abs_residual"] == 5.0 and summary["phantom_mass"] is None
    assert summary["mean_layer_max_abs_residual"] == pytest.approx(3.5)  # (2 + 5) / 2, the figure Qiu et al. report


def test_probe_model_sees_a_closed_projection_gate():
    model = tiny_model("proj-gate")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.arm.gate_c.fill_(-50.0)  # σ(-50) ≈ 0: every read is shut out
    probe = probe_model(model, token_batches())
    summary = probe["summary"]
    assert summary["value_gate_mean"] < 1e-9 and summary["value_gate_near_zero"] == 1.0
    assert summary["exposure_after_value_gate"] < 1e-9 < summary["exposure"]
    assert summary["phantom_mass"] is None
    assert len(probe["layers"]) == 2 and all(len(layer["first_key_mass"]) == 2 for layer in probe["layers"])


def test_probe_model_on_sink_arms_and_gqa():
    probe = probe_model(tiny_model("sink-logit"), token_batches())
    # b_h = 0 at init and logits near 0: the phantom is one more key among ~T/2
    assert 0.05 < probe["summary"]["phantom_mass"] < 0.5
    gqa = probe_model(tiny_model("norm-gate", n_head=4, n_kv_head=2), token_batches())
    layer = gqa["layers"][0]
    assert len(layer["read_norm_ratio"]) == 4 and layer["read_norm_ratio"][0] == layer["read_norm_ratio"][1]
    sink_token = probe_model(tiny_model("sink-token"), token_batches())
    assert sink_token["positions"] == T + 1  # the prepended token is key 0


# ---------------------------------------------------------------- injection
def test_injection_with_zero_eps_changes_nothing():
    model = tiny_model("combo2")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.arm.gate_w.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
    result = inject_model(model, token_batches(), cutoff="median", eps=[0.0, 0.8])
    for row in result["rows"]:
        if row["eps"] == 0.0:
            assert row["loss"] == result["clean_loss"] and row["increase"] == 0.0, row
        else:
            assert row["increase"] != 0.0, row  # the same code does inject at ε > 0
    assert result["not_applicable"] == {}
    assert result["injected_share"] == pytest.approx(0.5, abs=0.05)
    assert all(block.attn.read_hook is None for block in model.blocks)


def test_structural_junk_comes_from_another_sequence():
    gen = torch.Generator().manual_seed(0)
    source_batch, source_position = structural_sources((4, 2, 16), gen)
    targets = torch.arange(4).view(4, 1, 1).expand(4, 2, 16)
    assert (source_batch != targets).all()
    assert set(source_batch.unique().tolist()) == {0, 1, 2, 3} and source_position.max() > 0
    reads = torch.randn(4, 2, 16, 8, generator=gen)
    plan = LayerPlan(reads, torch.ones(4, 2, 16, dtype=torch.bool), torch.ones(2))
    direction = junk_directions("structural", plan, None, torch.Generator().manual_seed(3))
    source_batch, source_position = structural_sources((4, 2, 16), torch.Generator().manual_seed(3))
    b, h, t = 2, 1, 5
    expected = reads[source_batch[b, h, t], h, source_position[b, h, t]]
    assert torch.allclose(direction[b, h, t], expected / expected.norm())
    with pytest.raises(AblateError, match="at least 2"):
        structural_sources((1, 2, 16), gen)


def test_gate_direction_junk_is_along_w_h():
    model = tiny_model("proj-gate")
    arm = model.blocks[0].attn.arm
    with torch.no_grad():
        arm.gate_w.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(2))
    inputs = token_batches(1)[0][:, :-1]
    _, plans = clean_pass(model, inputs, inputs, 0.5)
    plan = plans[0]
    direction = junk_directions("gate-direction", plan, arm, torch.Generator())
    v = plan.clean_reads
    delta = make_injector(plan, direction, 0.8, arm)(v, None) - v
    quiet = plan.quiet
    assert quiet.any() and (delta[~quiet] == 0).all()
    for h in range(2):
        moved = delta[:, h][quiet[:, h]]  # (n, d)
        cosine = torch.nn.functional.cosine_similarity(moved, arm.gate_w[h].detach().expand_as(moved), dim=-1)
        assert torch.allclose(cosine, torch.ones_like(cosine), atol=1e-5)
        assert torch.allclose(moved.norm(dim=-1), 0.8 * plan.median_norm[h].expand(len(moved)), rtol=1e-5)


def test_gate_direction_for_a_norm_gate_raises_the_norm_and_is_na_without_a_gate():
    model = tiny_model("norm-gate")
    arm = model.blocks[0].attn.arm
    inputs = token_batches(1)[0][:, :-1]
    _, plans = clean_pass(model, inputs, inputs, 0.25)
    plan = plans[0]
    v = plan.clean_reads
    injected = make_injector(plan, junk_directions("gate-direction", plan, arm, torch.Generator()), 0.4, arm)(v, None)
    grown = injected.norm(dim=-1) - v.norm(dim=-1)
    expected = (0.4 * plan.median_norm).view(1, -1, 1).expand_as(grown)
    assert torch.allclose(grown[plan.quiet], expected[plan.quiet], rtol=1e-4)
    result = inject_model(tiny_model("baseline"), token_batches(1), eps=[0.4], junk=["random", "gate-direction"])
    assert "no gate that reads v" in result["not_applicable"]["gate-direction"]
    na_row = [row for row in result["rows"] if row["junk"] == "gate-direction"][0]
    assert na_row["increase"] is None
    with pytest.raises(AblateError, match="no gate that reads v"):
        junk_directions("gate-direction", plan, tiny_model("baseline").blocks[0].attn.arm, torch.Generator())


def test_injection_is_deterministic_and_validates_its_choices():
    model = tiny_model("baseline")
    first = inject_model(model, token_batches(), eps=[0.4, 1.6], junk=["structural", "gaussian"], seed=5)
    again = inject_model(model, token_batches(), eps=[0.4, 1.6], junk=["structural", "gaussian"], seed=5)
    assert first == again
    assert first["injected_share"] == pytest.approx(0.25, abs=0.05)
    assert all(math.isfinite(row["increase"]) for row in first["rows"])
    with pytest.raises(AblateError, match="valid cutoffs: median, p25"):
        inject_model(model, token_batches(), cutoff="p10")
    with pytest.raises(AblateError, match="valid junk kinds"):
        inject_model(model, token_batches(), junk=["loud"])


def test_gate_direction_is_na_for_an_untrained_projection_gate():
    result = inject_model(tiny_model("proj-gate"), token_batches(1), eps=[0.4], junk=["gate-direction"])
    assert "w_h is zero" in result["not_applicable"]["gate-direction"]
