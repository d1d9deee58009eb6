"""The hook examples against their papers' formulas, each written here independently of the arm (float64,
relative error ≤ 1e-12 in the output and in every gradient); their hooks and paths, init, parameter counts beside
the baseline's, the refusal of a normaliser beside a denominator slot, and the fused path of the overrides.
(fused = reference and decoding = the full forward for each: tests/test_arms_check.py.)"""

import math

import pytest
import torch
import torch.nn.functional as F

from ablate.arms import Arm, ArmContext, AttentionContext, attention, get_arm, list_arms, register_arm
from ablate.arms.builtin import SinkLogit
from ablate.arms.papers import FIRST_VALUES, SoftCap, diff_lambda_init, split_rope_pairs
from ablate.model import apply_rope, rope_tables
from test_arms import C, D, H, HKV, qkvx, small_model

pytestmark = pytest.mark.unit

SIX = ("softcap", "sigmoid", "diff", "forgetting", "ssmax", "value-residual")
TRAIN_LEN = 32
REL = 1e-12


def make(cls_or_name, layer=0, seed=0, scale=0.7):
    cls = get_arm(cls_or_name) if isinstance(cls_or_name, str) else cls_or_name
    arm = cls(ArmContext(H, HKV, D, C, n_layer=4, layer=layer)).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in arm.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale)
    return arm


def rel_error(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def assert_formula(run_arm, formula, inputs, params):
    """Both functions of the same leaves: outputs and the gradients of every leaf within REL (relative)."""
    results = []
    for fn in (run_arm, formula):
        for t in inputs + params:
            t.grad = None
        o = fn()
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
        results.append([o.detach()] + [t.grad.clone() for t in inputs + params])
    assert rel_error(results[0][0], results[1][0]) <= REL
    for a, b in zip(results[0][1:], results[1][1:]):
        assert rel_error(a, b) <= REL


def causal_logits(q, k, scale_dim=None):
    """s·q_i·k_j for every (i, j), grouped-query heads expanded, s = 1/√(head dim of q)."""
    k_full = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k_full.transpose(-2, -1) / math.sqrt(scale_dim or q.shape[-1])


def masked_softmax(logits, extra_column=None):
    T = logits.shape[-1]
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if extra_column is None:
        return torch.softmax(logits, -1)
    full = torch.softmax(torch.cat([logits, extra_column.expand(*logits.shape[:3], 1)], -1), -1)
    return full[..., :-1]


def expand(v):
    return v.repeat_interleave(H // HKV, dim=1)


def context_of(x):
    return AttentionContext.full(x, train_len=TRAIN_LEN)


def test_hooks_and_paths():
    assert [get_arm(n).hooks() for n in SIX] == [("score-modifier",), ("normaliser",), ("override",),
                                                  ("score-modifier",), ("score-modifier",), ("override",)]
    assert [get_arm(n).path("cpu") for n in SIX] == ["reference", "reference", "fused", "reference", "reference",
                                                     "fused"]
    assert [get_arm(n).path("cuda") for n in SIX] == ["flex", "flex", "fused", "flex", "flex", "fused"]
    assert all(get_arm(n).example and not get_arm(n).slots() for n in SIX)


def test_softcap_is_gemma_2s_cap():
    assert SoftCap.cap == 50.0

    class Cap2(SoftCap):
        cap = 2.0  # the check's logits reach a few units: tanh bends them

    arm, (q, k, v, x) = make(Cap2), qkvx()

    def formula():
        logits = causal_logits(q, k)
        return masked_softmax(2.0 * torch.tanh(logits / 2.0)) @ expand(v)

    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0], formula, [q, k, v], [])
    assert rel_error(attention(arm, q, k, v, x, context=context_of(x))[0].detach(),
                     attention(make("baseline"), q, k, v, x)[0].detach()) > 1e-3


def test_sigmoid_attention_is_unnormalised_with_bias_minus_log_n():
    arm, (q, k, v, x) = make("sigmoid"), qkvx()

    def formula():
        T = q.shape[2]
        p = torch.sigmoid(causal_logits(q, k) - math.log(TRAIN_LEN))
        return (p * torch.ones(T, T, dtype=torch.float64).tril()) @ expand(v)  # no normalisation

    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0], formula, [q, k, v], [])


def test_the_model_gives_the_training_length_to_the_hooks(monkeypatch):
    seen = []
    arm_class = get_arm("sigmoid")
    monkeypatch.setattr(arm_class, "normalise", lambda self, logits, context: seen.append(context) or
                        torch.sigmoid(logits))
    small_model("sigmoid", max_seq_len=24)(torch.zeros(1, 5, dtype=torch.long))
    assert [c.train_len for c in seen] == [24, 24] and seen[0].shared is seen[1].shared  # one dict per forward
    assert torch.equal(seen[0].query_pos, torch.arange(5))


def test_diff_is_differential_attention():
    layer = 2  # l = 3 in the paper's count
    arm, (q, k, v, x) = make("diff", layer=layer), qkvx()
    first = [p for p in range(D // 2) if p % 2 == 0]  # RoPE pairs (p, p + d/2); the even ones make the first half
    second = [p for p in range(D // 2) if p % 2 == 1]
    idx1 = torch.tensor(first + [p + D // 2 for p in first])
    idx2 = torch.tensor(second + [p + D // 2 for p in second])
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (3 - 1))
    assert arm.lambda_init == pytest.approx(lambda_init, abs=0) and diff_lambda_init(0) == pytest.approx(0.2)

    def formula():
        a1 = masked_softmax(causal_logits(q[..., idx1], k[..., idx1], D // 2))
        a2 = masked_softmax(causal_logits(q[..., idx2], k[..., idx2], D // 2))
        lam = (torch.exp((arm.lambda_q1 * arm.lambda_k1).sum()) - torch.exp((arm.lambda_q2 * arm.lambda_k2).sum())
               + lambda_init)
        heads = (a1 - lam * a2) @ expand(v)  # (B, H, T, d)
        normed = heads / torch.sqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-5) * arm.norm_weight
        return normed * (1 - lambda_init)

    params = [arm.lambda_q1, arm.lambda_k1, arm.lambda_q2, arm.lambda_k2, arm.norm_weight]
    for fused in (True, False):
        assert_formula(lambda: attention(arm, q, k, v, x, fused=fused)[0], formula, [q, k, v], params)


def test_diff_halves_keep_rope_whole():
    """The first half-head under the model's RoPE for d is the half-head under RoPE for d/2: relative positions."""
    t = torch.randn(1, 1, 6, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6)
    rotated_first, _ = split_rope_pairs(apply_rope(t, *rope_tables(positions, D, 10000.0)))
    first, _ = split_rope_pairs(t)
    torch.testing.assert_close(rotated_first, apply_rope(first, *rope_tables(positions, D // 2, 10000.0)),
                               rtol=0, atol=1e-14)


def forgetting_formula(arm, q, k, v, x, sink=None):
    log_f = F.logsigmoid(x @ arm.gate_w.T + arm.gate_b)  # (B, T, H): log f_t per head
    T = q.shape[2]
    decay = torch.zeros(x.shape[0], H, T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            decay[:, :, i, j] = log_f[:, j + 1:i + 1, :].sum(1)  # Σ_{t=j+1..i} log f_t (0 when j = i)
    column = None if sink is None else sink.view(1, H, 1, 1)
    return masked_softmax(causal_logits(q, k) + decay, column) @ expand(v)


def test_forgetting_is_the_forgetting_transformers_decay():
    arm, (q, k, v, x) = make("forgetting"), qkvx(T=7)
    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0],
                   lambda: forgetting_formula(arm, q, k, v, x), [q, k, v, x], [arm.gate_w, arm.gate_b])


def test_forgetting_is_exact_beside_a_phantom_key():
    class ForgettingSink(get_arm("forgetting"), SinkLogit):
        pass

    arm, (q, k, v, x) = make(ForgettingSink), qkvx(T=7)
    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0],
                   lambda: forgetting_formula(arm, q, k, v, x, sink=arm.sink_bias), [q, k, v, x],
                   [arm.gate_w, arm.gate_b, arm.sink_bias])


def test_ssmax_is_scalable_softmax():
    arm, (q, k, v, x) = make("ssmax"), qkvx()

    def formula():
        n = torch.arange(1, q.shape[2] + 1, dtype=torch.float64).view(1, 1, -1, 1)  # keys query i sees
        return masked_softmax(arm.scale.view(1, H, 1, 1) * torch.log(n) * causal_logits(q, k)) @ expand(v)

    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0], formula, [q, k, v], [arm.scale])


def test_value_residual_mixes_the_first_layers_values():
    first, later = make("value-residual", layer=0), make("value-residual", layer=3)
    assert not list(first.parameters())  # the first layer attends with its own values: nothing to learn there
    q0, k0, v0, x = qkvx(seed=1)
    q, k, v, _ = qkvx(seed=2)

    def run_arm():
        context = context_of(x)
        o0 = attention(first, q0, k0, v0, x, context=context)[0]
        assert context.shared[FIRST_VALUES] is v0
        return torch.cat([o0, attention(later, q, k, v, x, context=context)[0]])

    def formula():
        lam1, lam2 = later.mix
        return torch.cat([masked_softmax(causal_logits(q0, k0)) @ expand(v0),
                          masked_softmax(causal_logits(q, k)) @ expand(lam1 * v + lam2 * v0)])

    assert_formula(run_arm, formula, [q0, k0, v0, q, k, v], [later.mix])


def test_value_residual_in_the_model_reads_layer_0s_values():
    model = small_model("value-residual").double()
    with torch.no_grad():
        model.blocks[1].attn.arm.mix.copy_(torch.tensor([0.3, -1.1], dtype=torch.float64))
    out = model(torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0)), record=True)
    attn = model.blocks[1].attn
    hidden = model.blocks[1].ln_1(out.residuals[0])
    v1 = attn.c_attn(hidden)[..., (H + HKV) * D:].view(2, 9, HKV, D).transpose(1, 2)
    torch.testing.assert_close(out.records[1].reads, 0.3 * v1 - 1.1 * out.records[0].reads, rtol=0, atol=1e-14)


def test_a_normaliser_beside_a_denominator_slot_is_refused_in_one_line():
    with pytest.raises(TypeError) as refusal:
        @register_arm("test-sigmoid-sink")
        class SigmoidSink(get_arm("sigmoid"), SinkLogit):
            pass
    message = str(refusal.value)
    assert "\n" not in message and "normalise" in message and "sink_logit" in message and "test-sigmoid-sink" in message
    assert "test-sigmoid-sink" not in list_arms()


@pytest.mark.parametrize("name", ["diff", "value-residual"])
def test_override_arms_keep_the_fused_path(name):
    """Only the flash kernel is allowed: a fallback to the math kernel (a T×T tensor) raises here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arm = make(name).float()  # parameters drawn, not left as torch.empty
    q, k, v, x = (t.detach().float().requires_grad_() for t in qkvx(T=64))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o, record = attention(arm, q, k, v, x, fused=True)
        o.sum().backward()
    assert record is None and torch.isfinite(q.grad).all()


def test_every_hook_example_trains_a_step_through_the_model():
    for name in SIX:
        model = small_model(name)
        idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
        out = model(idx[:, :-1], idx[:, 1:])
        out.loss.backward()
        arm_grads = [p.grad for n, p in model.named_parameters() if model.is_arm_parameter(n)]
        assert torch.isfinite(out.loss) and all(g is not None and torch.isfinite(g).all() for g in arm_grads), name


def test_hook_methods_are_found_like_slots():
    class Plain(Arm):
        pass

    assert Plain.hooks() == () and Plain.path("cuda") == "fused"


# ---------------------------------------------------------------- normalisers beyond softmax, each as loops over
# its paper's formula (float64, values and the gradients of q, k, v within REL)


def stick_breaking_loops(q, k, v):
    """Tan et al. 2024, eq. (3)–(4): β_ij = σ(z_ij), A_ij = β_ij Π_{j<k<i} (1 − β_ik) for j < i; o_i = Σ_{j<i} A_ij v_j
    (the authors' default, attend_current=False: no weight on the query's own key)."""
    z = causal_logits(q, k)
    B, _, T, _ = q.shape
    rows = []
    for i in range(T):
        weights = [torch.sigmoid(z[:, :, i, j]) * math.prod([1 - torch.sigmoid(z[:, :, i, m]) for m in range(j + 1, i)])
                   for j in range(i)] + [torch.zeros_like(z[:, :, i, 0])] * (T - i)
        rows.append(torch.stack(weights, -1))
    return torch.stack(rows, 2) @ expand(v)


def softpick_loops(q, k, v, eps=1e-6):
    """Zuhri et al. 2025, eq. (2): softpick(x)_j = ReLU(e^x_j − 1) / (Σ_m |e^x_m − 1| + ε), over the keys m ≤ i."""
    z = causal_logits(q, k)
    T = q.shape[2]
    rows = []
    for i in range(T):
        seen = z[:, :, i, : i + 1]
        p = F.relu(torch.exp(seen) - 1) / ((torch.exp(seen) - 1).abs().sum(-1, keepdim=True) + eps)
        rows.append(F.pad(p, (0, T - i - 1)))
    return torch.stack(rows, 2) @ expand(v)


def selective_loops(q, k, v):
    """Leviathan et al. 2024, the paper's listing: S = ReLU(head 0's causal logits), S[:, 0] = 0 (the first token is
    never masked), S_ii = 0 (no token masks itself); F_ij = Σ_{m<i} S_mj; attention softmax(l − F) in every head."""
    z = causal_logits(q, k)
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    select = torch.zeros(q.shape[0], T, T, dtype=torch.float64)
    for m in range(T):
        for j in range(1, m):  # key 0 and the query itself (j = m) are never masked
            select[:, m, j] = F.relu(z[:, 0, m, j])
    forget = torch.stack([select[:, :i].sum(1) for i in range(T)], 1)  # (B, Tq, Tk)
    return torch.softmax((z - forget.unsqueeze(1)).masked_fill(~causal, float("-inf")), -1) @ expand(v)


@pytest.mark.parametrize("name, loops", [("stick-breaking", stick_breaking_loops), ("softpick", softpick_loops),
                                         ("selective", selective_loops)])
def test_a_normaliser_is_its_papers_formula(name, loops):
    arm, (q, k, v, x) = make(name), qkvx(T=9, scale=1.5)
    assert get_arm(name).hooks() == ("normaliser",) and get_arm(name).path("cuda") == "reference"
    assert_formula(lambda: attention(arm, q, k, v, x, context=context_of(x))[0], lambda: loops(q, k, v), [q, k, v],
                   [])


def test_softpick_leaves_masked_keys_out_of_its_denominator():
    """A masked key (−∞) has |e^−∞ − 1| = 1: were it in the denominator, query 0 (one key) would get ≠ softpick."""
    arm, (q, k, v, x) = make("softpick"), qkvx(T=4)
    _, record = attention(arm, q, k, v, x, fused=False, context=context_of(x))
    z = causal_logits(q, k)[:, :, 0, 0]
    expected = F.relu(torch.exp(z) - 1) / ((torch.exp(z) - 1).abs() + 1e-6)
    torch.testing.assert_close(record.weights[:, :, 0, 0], expected, rtol=1e-12, atol=0)


def test_selective_attention_needs_its_decoding_state(monkeypatch):
    """Its per-key sums over earlier queries are what the cache must carry: without them decoding goes wrong."""
    from ablate.armcheck import check_decoding

    assert check_decoding("selective").status == "holds"
    forgetful = dict(get_arm("selective").__dict__)["normalise"]

    def without_state(self, logits, context):
        context.state.clear()
        return forgetful(self, logits, context)

    monkeypatch.setattr(get_arm("selective"), "normalise", without_state)
    assert check_decoding("selective").status == "fails"
