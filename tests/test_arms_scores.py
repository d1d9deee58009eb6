"""The query-key and score-bias slots, and their registered examples (qk-norm, temperature, alibi): formulas, the
bias beside the phantom key, init, decay, parameter matching, `arms="all"` (fused = reference and decoding = the full
forward, composed with the phantom key and the routing slot: tests/test_arms_check.py; their place in the registry,
parameter counts, the fused kernel and `ablate arms`: tests/test_arms.py, beside the study's arms)."""

import math

import pytest
import torch

from ablate.arms import ArmContext, attention, get_arm, study_arms
from ablate.arms.examples import QKNorm, alibi_slopes
from ablate.arms.names import BUILTIN_ARMS
from ablate.sizing import MATCH_TOLERANCE, _meta_counts, model_config
from ablate.tiers import TIERS
from test_arms import C, D, EXAMPLES, H, HKV, make_arm, qkvx, randomise_arm_parameters, small_model
from test_arms_check import AlibiSink

pytestmark = pytest.mark.unit



def make_composed(cls, seed=0):
    arm = cls(ArmContext(H, HKV, D, C, n_layer=1, layer=0)).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in arm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.7)
    return arm


def test_examples_are_registered_after_the_study_and_left_out_of_all():
    # (their place in the registry, after the study's twelve: tests/test_arms.py)
    # what arms="all" means: of the package's arms, the study's (an arm a test module registers joins it too)
    assert [a for a in study_arms() if get_arm(a).__module__.startswith("ablate.")] == list(BUILTIN_ARMS)
    assert not set(study_arms()) & set(EXAMPLES)
    from ablate.experiment import load_experiment

    demo_arms = load_experiment("demo").arm_names()
    assert [a for a in demo_arms if get_arm(a).__module__.startswith("ablate.")] == list(BUILTIN_ARMS)
    assert get_arm("qk-norm").slots() == get_arm("temperature").slots() == ("query-key",)
    assert get_arm("alibi").slots() == ("score-bias",)
    assert all(not get_arm(name).example for name in BUILTIN_ARMS) and all(get_arm(n).example for n in EXAMPLES)


def test_alibi_reference_is_the_formula_and_the_bias_changes_the_output():
    q, k, v, x = qkvx(seed=3)
    arm = make_arm("alibi")
    o, record = attention(arm, q, k, v, x, fused=False)
    i, j = torch.arange(11).view(-1, 1), torch.arange(11).view(1, -1)
    slopes = torch.tensor([2.0 ** (-8 * h / H) for h in range(1, H + 1)], dtype=torch.float64).view(-1, 1, 1)
    logits = q @ k.repeat_interleave(H // HKV, 1).transpose(-2, -1) / math.sqrt(D) - slopes * (i - j)
    weights = torch.softmax(logits.masked_fill(j > i, float("-inf")), dim=-1)
    torch.testing.assert_close(record.weights, weights)
    torch.testing.assert_close(o, weights @ v.repeat_interleave(H // HKV, 1))
    assert not torch.allclose(o, attention(make_arm("baseline"), q, k, v, x, fused=False)[0])
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)], dtype=torch.float64))


class RowShift(AlibiSink):
    """A bias of 2 on every (query, key) pair: the real keys' logits shift, the phantom's must not."""

    def score_bias(self, query_pos, key_pos):
        return torch.full((H, len(query_pos), len(key_pos)), 2.0, dtype=torch.float64)


@pytest.mark.parametrize("fused", [True, False])
def test_the_bias_leaves_the_phantom_logit_alone(fused):
    """o = Σ e^(l+c) v / (e^b + e^c Z) = o_plain · e^c / (m + e^c (1 − m)), m the plain phantom mass."""
    q, k, v, x = qkvx(seed=5)
    plain_arm, shifted_arm = make_composed(AlibiSink), make_composed(RowShift)
    with torch.no_grad():
        plain_arm.slopes.zero_()  # the sink alone
    plain, record = attention(plain_arm, q, k, v, x, fused=False)
    mass, c = record.phantom_mass.unsqueeze(-1), 2.0
    assert (mass > 0.05).any()
    expected = plain * math.exp(c) / (mass + math.exp(c) * (1 - mass))
    torch.testing.assert_close(attention(shifted_arm, q, k, v, x, fused=fused)[0], expected)


def test_temperature_and_qk_norm_are_their_formulas():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, H, 5, D, generator=gen, dtype=torch.float64), torch.randn(2, HKV, 5, D, generator=gen,
                                                                                    dtype=torch.float64)
    temp = make_arm("temperature")
    q2, k2 = temp.query_key(q, k)
    torch.testing.assert_close((q2 @ k.transpose(-2, -1).repeat_interleave(2, 1)),
                               (q @ k.transpose(-2, -1).repeat_interleave(2, 1))
                               / temp.log_temperature.exp().view(-1, 1, 1))
    assert k2 is k
    norm = make_arm("qk-norm")
    qn, kn = norm.query_key(q, k)
    torch.testing.assert_close(qn, q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm.q_norm_weight)
    torch.testing.assert_close(kn, k / k.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * norm.k_norm_weight)


def test_query_key_slot_comes_before_rope():
    """A per-channel norm weight does not commute with RoPE's rotation: the model applies the slot first."""
    model = small_model("qk-norm").double()
    randomise_arm_parameters(model)
    attn = model.blocks[0].attn
    x = torch.randn(1, 6, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    seen = []
    attn.arm.query_key = lambda q, k: seen.append(q) or QKNorm.query_key(attn.arm, q, k)
    attn(x, *model.rope(0, 6, torch.float64))
    q = attn.c_attn(x)[..., : H * D].view(1, 6, H, D).transpose(1, 2)
    torch.testing.assert_close(seen[0], q)  # the projection as it is, not yet rotated


def test_temperature_starts_as_the_baseline_and_alibi_s_slopes_are_not_saved():
    """(Their parameter counts, decay and init: tests/test_arms.py's table.)"""
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(small_model("temperature")(idx).logits, small_model("baseline")(idx).logits,
                               rtol=0, atol=0)  # T_h = 1 at the start: the baseline, bit for bit
    assert "slopes" not in small_model("alibi").state_dict().__repr__()  # fixed: not in checkpoints


@pytest.mark.parametrize("tier", ["smoke", "10M", "124M"])
def test_examples_are_parameter_matched_like_the_others(tier):
    base = _meta_counts(model_config(TIERS[tier], "baseline"))["non_embedding"]
    for name in EXAMPLES:
        config = model_config(TIERS[tier], name, match_params=True)
        assert config == model_config(TIERS[tier], name)  # within the tolerance: the baseline's width
        gap = _meta_counts(config)["non_embedding"] / base - 1
        assert 0 <= gap <= MATCH_TOLERANCE and (gap > 0) is (name != "alibi"), (name, gap)

