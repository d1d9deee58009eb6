"""The arm library against algebra: limit identities, Lemma 3.1, init, decay, the cache's contents (fused = reference
and decoding = the full forward for every arm: tests/test_arms_check.py)."""

import dataclasses
import math
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

from ablate.arms import Arm, ArmContext, attention, get_arm, list_arms
from ablate.arms.names import BUILTIN_ARMS
from ablate.arms.papers import SSMAX_INIT
from ablate.errors import AblateError
from ablate.model import GPT, GPTConfig

pytestmark = pytest.mark.unit

H, HKV, D, C = 4, 2, 8, 32
EXAMPLES = ("qk-norm", "temperature", "alibi")  # registered after the study's arms, left out of arms="all"


def small_model(arm, fused=True, **kw):
    cfg = dict(vocab_size=97, n_layer=2, n_head=H, n_kv_head=HKV, d_model=C, max_seq_len=32, arm=arm, fused=fused)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def randomise_arm_parameters(model, seed=1, scale=0.7):
    """Arm parameters away from their init, so the test covers the whole parameter space, not one point."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if model.is_arm_parameter(name):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale)


def make_arm(name, seed=0, dtype=torch.float64):
    arm = get_arm(name)(ArmContext(H, HKV, D, C, n_layer=1, layer=0)).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in arm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.7)
    return arm


def qkvx(T=11, B=2, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)

    def make(*s):
        return (torch.randn(*s, generator=gen, dtype=torch.float64) * scale).requires_grad_()
    return make(B, H, T, D), make(B, HKV, T, D), make(B, HKV, T, D), make(B, T, C)


def test_registry_has_the_twelve_arms_in_spec_order():
    """The study's twelve in the spec's order, then the registered examples (tests/test_arms_scores.py)."""
    package_arms = [a for a in list_arms() if get_arm(a).__module__.startswith("ablate.")]  # not a test's own
    assert tuple(package_arms[:15]) == BUILTIN_ARMS + EXAMPLES
    with pytest.raises(AblateError, match="unknown arm 'nope'.*baseline.*g2-value"):
        get_arm("nope")


def run_arm(name, q, k, v, x, fused=True, **params):
    arm = make_arm(name)
    with torch.no_grad():
        for key, value in params.items():
            getattr(arm, key).fill_(value)
    return attention(arm, q, k, v, x, fused=fused)[0]


@pytest.mark.parametrize("fused", [True, False])
def test_limit_identities(fused):
    q, k, v, x = qkvx()
    base = run_arm("baseline", q, k, v, x, fused)
    # sink-logit with b_h → −∞ is the baseline
    torch.testing.assert_close(run_arm("sink-logit", q, k, v, x, fused, sink_bias=-1e4), base)
    # off-by-one is sink-logit with b_h = 0
    torch.testing.assert_close(run_arm("off-by-one", q, k, v, x, fused),
                               run_arm("sink-logit", q, k, v, x, fused, sink_bias=0.0))
    # any gate with g ≡ 1 is the baseline
    torch.testing.assert_close(run_arm("norm-gate", q, k, v, x, fused, tau=-1e3), base)
    torch.testing.assert_close(run_arm("proj-gate", q, k, v, x, fused, gate_w=0.0, gate_c=1e3), base)
    # the sink with a finite logit really changes the output (the identities above are not vacuous)
    assert not torch.allclose(run_arm("sink-logit", q, k, v, x, fused, sink_bias=0.0), base)
    # sink formula: o = o_base · σ(lse − b)
    b = 0.3
    lse = torch.logsumexp((q @ k.repeat_interleave(2, 1).transpose(-2, -1) / math.sqrt(D)).masked_fill(
        torch.ones(11, 11, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
    torch.testing.assert_close(run_arm("sink-logit", q, k, v, x, fused, sink_bias=b),
                               base * torch.sigmoid(lse - b).unsqueeze(-1))


class ConstantRouting(Arm):
    """Renorm with a constant gate (not registered: used to test the routing slot)."""

    def routing_log_gate(self, v, x):
        return torch.full(v.shape[:-1], math.log(0.3), dtype=v.dtype)


@pytest.mark.parametrize("fused", [True, False])
def test_renorm_with_constant_gate_is_baseline(fused):
    q, k, v, x = qkvx()
    arm = ConstantRouting(ArmContext(H, HKV, D, C, 1, 0))
    torch.testing.assert_close(attention(arm, q, k, v, x, fused=fused)[0], run_arm("baseline", q, k, v, x, fused))
    # and with a gate that saturates at 1 the renorm arm itself is the baseline
    torch.testing.assert_close(run_arm("renorm", q, k, v, x, fused, tau=-1e3), run_arm("baseline", q, k, v, x, fused))


def test_lemma_3_1_value_slot_is_routing_slot_times_z():
    """Σ_j p_ij g_j v_j = Z_i Σ_j p'_ij v_j with Z_i = Σ_j p_ij g_j ≤ 1, for the same gate g_j."""
    q, k, v, x = qkvx(seed=4)
    gate_arm, routing_arm, base_arm = make_arm("norm-gate", 2), make_arm("renorm", 2), make_arm("baseline")
    with torch.no_grad():
        routing_arm.tau.copy_(gate_arm.tau)
    value_out, value_rec = attention(gate_arm, q, k, v, x, fused=False)
    routing_out, _ = attention(routing_arm, q, k, v, x, fused=False)
    _, base_rec = attention(base_arm, q, k, v, x, fused=False)
    g = value_rec.value_gate.squeeze(-1).repeat_interleave(H // HKV, 1)  # (B, H, T)
    z = (base_rec.weights * g.unsqueeze(2)).sum(-1, keepdim=True)  # Z_i
    assert (z <= 1 + 1e-12).all() and (z < 0.999).any()
    torch.testing.assert_close(value_out, z * routing_out)
    torch.testing.assert_close(value_out, attention(gate_arm, q, k, v, x, fused=True)[0])


# ---------------------------------------------------------------------------------------------- the arms' table
def gates_open(name: str, floor: float = 0.98):
    """A value gate starts open: at least `floor` on large reads."""
    torch.manual_seed(0)
    gate = small_model(name).blocks[0].attn.arm.value_gate(torch.randn(2, HKV, 16, D) * 10, torch.randn(2, 16, C))
    assert gate.min() >= floor, (name, gate.min())


def zero_sink_bias(name: str):
    assert small_model(name).blocks[0].attn.arm.sink_bias.abs().max() == 0  # b_h = 0


def qiu_gate_at_one_half(name: str):
    """Qiu et al.: W_θ ~ N(0, 0.02), so the gate starts near σ(0) = 0.5."""
    arm = small_model(name).blocks[1].attn.arm
    assert abs(arm.gate_proj.weight.std().item() - 0.02) < 0.004
    assert 0.45 < torch.sigmoid(arm.gate_proj(F.rms_norm(torch.randn(2, 16, C), (C,)))).mean() < 0.55


def norm_gate_init(name: str):
    gates_open(name)
    assert torch.allclose(small_model(name).blocks[0].attn.arm.tau, torch.tensor(-0.5))  # −4/β


def combo2_init(name: str):
    zero_sink_bias(name)
    gates_open(name)


def diff_init(name: str):
    model = small_model(name, n_layer=3)
    for layer, block in enumerate(model.blocks):
        assert block.attn.arm.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
        assert torch.equal(block.attn.arm.norm_weight, torch.ones(D))
    lambdas = torch.cat([p.detach() for n, p in model.named_parameters() if ".lambda_" in n])
    assert 0.05 < lambdas.std().item() < 0.2  # N(0, 0.1)


def forgetting_init(name: str):
    arm = small_model(name).blocks[0].attn.arm
    assert torch.equal(arm.gate_b, torch.zeros(H)) and abs(arm.gate_w.std().item() - 0.02) < 0.005


def sink_token_init(name: str):
    """The sink token decays like the embeddings; its d_model parameters are not non-embedding ones."""
    decay, no_decay = small_model(name).param_groups(0.1)
    assert "sink_token" in decay["names"] and "wte.weight" in decay["names"]
    assert "blocks.0.ln_1.weight" in no_decay["names"] and "blocks.0.attn.c_attn.weight" in decay["names"]
    assert small_model(name).param_counts()["non_embedding"] == small_model("baseline").param_counts()["non_embedding"]


def equal_to(layer: int, **values):
    """Each named arm parameter of block `layer` starts equal to its value."""
    def check(name: str):
        arm = small_model(name).blocks[layer].attn.arm
        for attribute, value in values.items():
            assert torch.equal(getattr(arm, attribute), value), (name, attribute)
    return check


@dataclasses.dataclass(frozen=True)
class ArmParameters:
    """What an arm adds to the baseline at the small model with H query heads (d = C / H): `per_layer` in each
    layer from layer `first` on and `once` beside the layers; which of its own parameters weight decay reaches (the
    others are in the no-decay group); the check of its initial values."""

    per_layer: int
    decays: frozenset[str] = frozenset()
    init: Callable[[str], None] | None = None
    first: int = 0
    once: int = 0


d = C // H  # no GQA in the table's model (n_kv_head=H): H applies to every slot
QIU = frozenset({"gate_proj.weight"})
ARM_PARAMETERS = {
    "baseline": ArmParameters(0), "off-by-one": ArmParameters(0), "alibi": ArmParameters(0),
    "sink-logit": ArmParameters(H, init=zero_sink_bias), "sink-token": ArmParameters(0, once=C, init=sink_token_init),
    "norm-gate": ArmParameters(H, init=norm_gate_init), "proj-gate": ArmParameters(H * (d + 1), init=gates_open),
    "renorm": ArmParameters(H), "combo": ArmParameters(2 * H, init=zero_sink_bias),
    "combo2": ArmParameters(H * (d + 2), init=combo2_init),
    "g1-elementwise": ArmParameters(C * H * d, QIU, qiu_gate_at_one_half),
    "g1-headwise": ArmParameters(C * H, QIU, qiu_gate_at_one_half),
    "g2-value": ArmParameters(C * H * d, QIU, qiu_gate_at_one_half),
    "qk-norm": ArmParameters(2 * d, init=equal_to(0, q_norm_weight=torch.ones(d), k_norm_weight=torch.ones(d))),
    "temperature": ArmParameters(H, init=equal_to(1, log_temperature=torch.zeros(H))),
    "softcap": ArmParameters(0), "sigmoid": ArmParameters(0), "diff": ArmParameters(3 * D, init=diff_init),
    "forgetting": ArmParameters(H * (C + 1), frozenset({"gate_w"}), forgetting_init),
    "ssmax": ArmParameters(H, init=equal_to(0, scale=torch.full((H,), SSMAX_INIT))),
    "value-residual": ArmParameters(2, first=1, init=equal_to(1, mix=torch.full((2,), 0.5))),  # (λ₁, λ₂) after layer 0
    "sliding-window": ArmParameters(0), "stick-breaking": ArmParameters(0), "softpick": ArmParameters(0),
    "selective": ArmParameters(0), "oracle-gate": ArmParameters(0),
}


def package_arms() -> list[str]:
    return [name for name in list_arms() if get_arm(name).__module__.startswith("ablate.")]  # not a test's own


def test_the_table_names_every_arm_of_the_package():
    assert set(package_arms()) <= set(ARM_PARAMETERS), set(package_arms()) - set(ARM_PARAMETERS)


@pytest.mark.parametrize("name", package_arms())
def test_an_arm_s_parameter_count_weight_decay_and_init(name):
    """Every arm of the package in one table (ARM_PARAMETERS): its extra parameters beside the baseline's (and the
    total moves by as many), which of its parameters decay, and its initial values."""
    expected, n_layer = ARM_PARAMETERS[name], 2
    model, base = small_model(name, n_kv_head=H), small_model("baseline", n_kv_head=H).param_counts()
    extra = expected.per_layer * (n_layer - expected.first) + expected.once
    assert model.param_counts()["arm_extra"] == extra
    assert model.param_counts()["total"] == base["total"] + extra
    decay, no_decay = model.param_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {n.split(".arm.", 1)[1] for n in decay["names"] if ".arm." in n} == expected.decays
    assert not set(decay["names"]) & set(no_decay["names"])
    if expected.init:
        expected.init(name)


@pytest.mark.parametrize("fused", [True, False])
def test_off_by_one_is_finite_and_exact_for_huge_logits(fused):
    for sign in (1.0, -1.0):
        q, k, v, x = qkvx(T=7)
        with torch.no_grad():  # logits of ±1e4: q·k/√d = ±1e4 on every pair
            q.copy_(torch.ones_like(q) * math.sqrt(1e4 * math.sqrt(D) / D))
            k.copy_(torch.ones_like(k) * sign * math.sqrt(1e4 * math.sqrt(D) / D))
        o = run_arm("off-by-one", q, k, v, x, fused)
        o.sum().backward()
        assert torch.isfinite(o).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
        # exact: weights e^{l}/(1 + Σ e^{l}) computed in log space
        above = torch.ones(7, 7, dtype=torch.bool).triu(1)
        logits = torch.full((7, 7), sign * 1e4, dtype=torch.float64).masked_fill(above, float("-inf"))
        log_den = torch.logsumexp(torch.cat([logits, torch.zeros(7, 1, dtype=torch.float64)], 1), dim=1, keepdim=True)
        weights = torch.exp(logits - log_den)
        expected = weights @ v.detach().repeat_interleave(2, 1)
        torch.testing.assert_close(o.detach(), expected)


def test_sink_token_adds_one_position_and_is_excluded_from_the_loss():
    idx = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(0))
    inputs, targets = idx[:, :-1], idx[:, 1:]
    model = small_model("sink-token")
    out = model(inputs, targets, record=True)
    assert out.logits.shape[:2] == (2, 9)  # text positions only
    assert out.records[0].weights.shape[-1] == 10  # one extra position inside the layers
    expected = F.cross_entropy(out.logits.view(-1, out.logits.shape[-1]), targets.reshape(-1))
    torch.testing.assert_close(out.loss, expected)  # the targets are the text targets, unchanged
    out.loss.backward()
    assert model.sink_token.grad.abs().sum() > 0  # the token does take part
    # every other arm: same targets, no extra position
    base = small_model("baseline")(inputs, targets, record=True)
    assert base.records[0].weights.shape[-1] == 9
    # with identical shared weights, only the prepended token makes the difference
    assert not torch.allclose(out.logits, base.logits)


def test_value_slot_cache_holds_gated_reads():
    model = small_model("proj-gate").eval()
    randomise_arm_parameters(model)
    idx = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        record = model(idx, record=True).records[0]
        cache = model.new_cache()
        model(idx, cache=cache)
    torch.testing.assert_close(cache.layers[0].values, record.values)
    assert not torch.allclose(record.values, record.reads)


def test_same_seed_same_shared_weights_across_arms():
    a, b, c = small_model("baseline"), small_model("combo2"), small_model("baseline")
    a.init_weights(7), b.init_weights(7), c.init_weights(8)
    shared_b = dict(b.shared_named_parameters())
    for name, p in a.shared_named_parameters():
        assert torch.equal(p, shared_b[name]), name
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_arms_command_lists_every_arm(capsys):
    from ablate.cli import main

    assert main(["arms", "--d-model", "64", "--n-head", "2"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN_ARMS:
        assert name in out
    assert "denominator" in out and "value" in out and "66" in out  # proj-gate: H(d+1) = 2·33
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}  # the examples: their slot and count
    assert rows["qk-norm"][1:3] == ["query-key", "64"]  # 2·d = 2·32
    assert rows["temperature"][1:3] == ["query-key", "2"]
    assert rows["alibi"][1:3] == ["score-bias", "0"]


@pytest.mark.parametrize("name", BUILTIN_ARMS + EXAMPLES)
def test_fused_path_never_materialises_the_weights(name):
    """Only the flash kernel is allowed: a fallback to the math kernel (a T×T tensor) raises here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arm = make_arm(name, dtype=torch.float32)
    q, k, v, x = (t.detach().float().requires_grad_() for t in qkvx(T=64))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o, record = attention(arm, q, k, v, x, fused=True)
        o.sum().backward()
    assert record is None and torch.isfinite(q.grad).all()
