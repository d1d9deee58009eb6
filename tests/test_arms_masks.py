"""The mask hook (`Arm.mask_modifier`), composed with the causal mask in one place (`kernel.mask_of`), on every path:
fused SDPA with a boolean mask on a CPU (is_causal kept without one), the reference path and decoding at absolute
positions, flex_attention with a block mask (eager here, bounded cache). And the check's new parts, each shown to
fail on the fault it is for: gradcheck where an arm has one path, an arm's own mask evaluated alone, a decoding
long enough to see a window, a hook's shape error named."""

import math

import pytest
import torch

import ablate.arms.kernel as kernel
from ablate.armcheck import (check_arm, check_attention, check_decoding, check_inputs, check_mask, decode_length,
                             make_checked_arm)
from ablate.arms import Arm, get_arm
from ablate.arms.base import _REGISTRY, AttentionContext
from ablate.arms.kernel import attention
from ablate.arms.papers import SlidingWindow
from ablate.errors import AblateError

PATHS = ("fused", "reference", "flex")


def naive_window(q, k, v, window: int):
    """softmax over keys j with 0 ≤ i − j < window, written as loops over the formula (GQA: head h reads h // 2)."""
    B, H, T, d = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = range(max(0, i - window + 1), i + 1)
                logits = torch.stack([q[b, h, i] @ k[b, h // 2, j] / math.sqrt(d) for j in keys])
                weights = torch.softmax(logits, 0)
                out[b, h, i] = sum(w * v[b, h // 2, j] for w, j in zip(weights, keys))
    return out


def run_path(arm, path, T=13, window=None):
    q, k, v, x = (t.detach() for t in check_inputs(T=T))
    if window is not None:
        arm.window = window
    with torch.no_grad():
        o, _ = attention(arm, q, k, v, x, context=AttentionContext.full(x, train_len=32), fused=path)
    return o, (q, k, v)


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore::UserWarning")  # eager flex_attention warns that it is not compiled
@pytest.mark.parametrize("path", PATHS)
def test_the_sliding_window_is_its_formula_on_every_path(path):
    o, (q, k, v) = run_path(make_checked_arm("sliding-window"), path, window=5)
    torch.testing.assert_close(o, naive_window(q, k, v, 5), rtol=1e-12, atol=1e-12)


@pytest.mark.unit
def test_paths_and_listing():
    assert SlidingWindow.hooks() == ("mask",) and SlidingWindow.window == 64
    assert (SlidingWindow.path("cpu"), SlidingWindow.path("cuda")) == ("fused", "flex")
    assert get_arm("baseline").path("cuda") == "fused"


@pytest.mark.unit
def test_without_a_mask_fused_sdpa_keeps_is_causal(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append((kw.get("is_causal"), kw.get("attn_mask")))
        return sdpa(*args, **kw)

    monkeypatch.setattr(kernel.F, "scaled_dot_product_attention", spy)
    run_path(make_checked_arm("baseline"), "fused")
    run_path(make_checked_arm("sliding-window"), "fused", window=5)
    assert calls[0] == (True, None)
    assert calls[1][0] is False and calls[1][1].dtype == torch.bool  # a boolean mask with the window


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_causal_mask_has_one_owner(monkeypatch):
    """Changing `mask_of` changes the reference, flex and masked fused paths alike: none spells causality itself."""
    arm = make_checked_arm("sliding-window")
    before = {path: run_path(arm, path, window=5)[0] for path in PATHS}
    original = kernel.mask_of

    def one_more_key(arm_mask, offset, documents=None):
        composed = original(arm_mask, offset, documents)
        return lambda b, h, q_idx, kv_idx: composed(b, h, q_idx, kv_idx) | (kv_idx == q_idx + offset + 1)

    monkeypatch.setattr(kernel, "mask_of", one_more_key)
    arm.window = 100  # the arm's own mask admits no later key: only the composition could
    for path in PATHS:
        assert not torch.allclose(run_path(arm, path, window=5)[0], before[path]), path


class EverywhereNormaliser(Arm):
    """A normaliser that puts weight on every key, masked or not: the kernel must zero the masked ones."""

    def normalise(self, logits, context):
        return torch.ones_like(logits).nan_to_num()


@pytest.mark.unit
def test_the_kernel_zeroes_a_normalisers_weight_where_the_mask_is_false():
    q, k, v, x = check_inputs(T=7)
    arm = EverywhereNormaliser(make_checked_arm("baseline").ctx)
    _, record = attention(arm, q, k, v, x, fused=False)
    later = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert (record.weights[..., later] == 0).all() and (record.weights[..., ~later] == 1).all()


@pytest.mark.unit
def test_block_masks_are_bounded_and_built_once_per_forward():
    from torch.nn.attention.flex_attention import BlockMask

    kernel._CAUSAL_BLOCK_MASKS.clear()
    hooks = kernel.Hooks(AttentionContext.full(torch.zeros(1, 4, 8)))
    for T in range(1, kernel.CAUSAL_BLOCK_MASK_CACHE + 5):
        kernel.block_mask(hooks, 1, 1, T, T, torch.device("cpu"))
    assert len(kernel._CAUSAL_BLOCK_MASKS) == kernel.CAUSAL_BLOCK_MASK_CACHE
    hooks.mask = lambda b, h, q_idx, kv_idx: kv_idx <= q_idx
    first = kernel.block_mask(hooks, 1, 2, 9, 9, torch.device("cpu"))
    assert isinstance(first, BlockMask) and kernel.block_mask(hooks, 1, 2, 9, 9, torch.device("cpu")) is first
    assert hooks.context.shared[kernel.FORWARD_BLOCK_MASK] == {(1, 2, 9, 9): first}


# ---------------------------------------------------------------- the check, and the faults it catches


@pytest.fixture
def register(monkeypatch):
    def put(name, cls):
        monkeypatch.setattr(cls, "name", name)
        monkeypatch.setitem(_REGISTRY, name, cls)
        return name

    return put


class _WrongGradient(torch.autograd.Function):
    """tanh forward, a backward that forgets the chain rule's 1 − tanh²: gradients that break."""

    @staticmethod
    def forward(ctx, score):
        return torch.tanh(score)

    @staticmethod
    def backward(ctx, grad):
        return grad


class BrokenGradient(Arm):
    def score_modifier(self, context):
        return lambda score, b, h, q_idx, kv_idx: 3.0 * _WrongGradient.apply(score / 3.0)


class PeekingMask(Arm):
    """A mask that admits the next key: inert once composed with the causal mask, wrong as the arm's own."""

    def mask_modifier(self, context):
        return lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 1


class OffsetBlindWindow(SlidingWindow):
    """The window from the call's indices, not the positions: right on a whole sequence, wrong when decoding."""

    def mask_modifier(self, context):
        window = self.window

        def in_window(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx >= 0) & (q_idx - kv_idx < window)

        return in_window


class WrongShapeMask(Arm):
    def mask_modifier(self, context):
        return lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx)[..., :3]


@pytest.mark.unit
def test_a_one_path_arm_is_gradchecked_and_a_broken_gradient_fails(register):
    holds = check_attention("softcap")
    assert holds.status == "holds" and "one path: gradcheck" in holds.check
    broken = check_attention(register("test-broken-gradient", BrokenGradient))
    assert broken.status == "fails" and "one path: gradcheck" in broken.check, broken.detail


@pytest.mark.unit
def test_a_mask_that_admits_a_later_key_fails_the_check(register):
    assert check_mask("sliding-window").status == "holds"
    result = check_mask(register("test-peeking-mask", PeekingMask))
    assert result.status == "fails" and "later key" in result.detail
    assert not all(r.ok for r in check_arm("test-peeking-mask"))


@pytest.mark.unit
def test_the_decoding_check_decodes_past_the_window_and_catches_an_offset_blind_one(register):
    assert decode_length("baseline") == 128
    name = register("test-offset-blind-window", OffsetBlindWindow)
    assert decode_length(name) == 128
    holds = check_decoding("sliding-window")
    assert holds.status == "holds" and "128 tokens" in holds.check
    assert check_decoding(name).status == "fails"


@pytest.mark.unit
def test_a_hooks_wrong_shape_is_named(register):
    results = {r.check.split(":")[0]: r for r in check_arm(register("test-wrong-shape-mask", WrongShapeMask))}
    assert results["mask"].status == "fails"
    detail = results["mask"].detail
    assert "mask hook (mask_modifier)" in detail and "expected" in detail and "got" in detail, detail


@pytest.mark.unit
def test_a_score_modifiers_wrong_shape_is_named():
    class Summing(Arm):
        def score_modifier(self, context):
            return lambda score, b, h, q_idx, kv_idx: score.sum(-1)

    q, k, v, x = check_inputs(T=5)
    wrong = r"score-modifier hook score_modifier.* returned \(2, 4, 5\); expected a score"
    with pytest.raises(AblateError, match=wrong):
        attention(Summing(make_checked_arm("baseline").ctx), q, k, v, x, fused=False)


# ---------------------------------------------------------------- composition is explicit


@pytest.mark.unit
def test_two_arms_filling_one_slot_refuse_to_compose(monkeypatch):
    from ablate.arms import register_arm
    from ablate.arms.builtin import NormGate, ProjGate, SinkLogit
    from ablate.arms.papers import ScalableSoftmax, SoftCap

    monkeypatch.setattr("ablate.arms.base._REGISTRY", dict(_REGISTRY))
    for first, second, slot in ((NormGate, ProjGate, "value slot (value_gate)"),
                                (SoftCap, ScalableSoftmax, "score-modifier hook (score_modifier)")):
        with pytest.raises(TypeError) as refusal:
            register_arm("test-clash")(type("Clash", (first, second), {}))
        message = str(refusal.value)
        assert "\n" not in message and first.__qualname__ in message and second.__qualname__ in message
        assert slot in message, message

    class Both(NormGate, ProjGate):  # defines the slot itself: it says how the two compose
        def value_gate(self, v, x):
            return NormGate.value_gate(self, v, x) * ProjGate.value_gate(self, v, x)

    assert register_arm("test-both")(Both) is Both
    assert register_arm("test-sink-gate")(type("SinkGate", (SinkLogit, NormGate), {})).slots() == ("value",
                                                                                                   "denominator")


# ---------------------------------------------------------------- document masking


@pytest.mark.unit
def test_document_ids_start_at_each_end_of_text_token():
    from ablate.data.documents import document_ids
    from ablate.data.tokenizer import EOT_TOKEN

    idx = torch.tensor([[EOT_TOKEN, 5, 6, EOT_TOKEN, 7, EOT_TOKEN]])
    assert document_ids(idx).tolist() == [[1, 1, 1, 2, 2, 3]]
    assert document_ids(torch.tensor([[8, EOT_TOKEN]]), start=torch.tensor([3])).tolist() == [[3, 4]]


@pytest.mark.unit
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_document_mask_is_composed_on_every_path():
    """Keys of another document are masked on the fused, reference and flex paths alike, as loops over the formula
    say; document −1 (the sink token) stays visible to every document."""
    arm = make_checked_arm("baseline")
    q, k, v, x = (t.detach() for t in check_inputs(T=9))
    documents = torch.tensor([[-1, 0, 0, 0, 1, 1, 2, 2, 2], [-1, 0, 1, 1, 1, 1, 1, 2, 2]])
    allowed = ((documents.unsqueeze(2) == documents.unsqueeze(1)) | (documents.unsqueeze(1) < 0)).unsqueeze(1)
    allowed = allowed & torch.ones(9, 9, dtype=torch.bool).tril()
    logits = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    expected = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v.repeat_interleave(2, 1)
    for path in PATHS:
        context = AttentionContext.full(x, train_len=32)
        context.documents = documents
        with torch.no_grad():
            o, _ = attention(arm, q, k, v, x, context=context, fused=path)
        torch.testing.assert_close(o, expected, rtol=1e-12, atol=1e-12, msg=path)


class ReadsTheWholeSequence(Arm):
    """A hook that reads every position's x: under a document mask, document 1 leaks into the later ones."""

    def score_modifier(self, context):
        mean = context.x.mean(dim=(1, 2))

        def shift(score, b, h, q_idx, kv_idx):
            return score * (1 + mean[b])

        return shift


@pytest.mark.unit
def test_the_documents_check_catches_a_leak(register, monkeypatch):
    from ablate.armcheck import check_documents

    assert check_documents("sink-token").status == "holds"  # the sink token is visible to every document
    assert check_documents(register("test-reads-everything", ReadsTheWholeSequence)).status == "fails"
    original = kernel.mask_of
    monkeypatch.setattr(kernel, "mask_of", lambda arm_mask, offset, documents=None: original(arm_mask, offset))
    result = check_documents("baseline")  # a kernel that forgets the documents
    assert result.status == "fails" and "later document" in result.detail


@pytest.mark.unit
def test_a_cache_keeps_the_document_ids():
    from ablate.armcheck import small_model
    from ablate.data.documents import document_ids

    model = small_model("sink-token", max_seq_len=12).eval()
    idx = torch.tensor([[96, 3, 4, 96, 5, 6, 7]])
    cache = model.new_cache()
    with torch.no_grad():
        model(idx[:, :4], cache=cache, documents=document_ids(idx[:, :4], 96))
        model(idx[:, 4:], cache=cache, documents=document_ids(idx[:, 4:], 96, start=cache.documents[:, -1]))
    assert cache.documents.tolist() == [[-1, 1, 1, 1, 2, 2, 2, 2]]  # the sink token's −1 first


@pytest.mark.unit
def test_the_model_splits_documents_itself_under_the_run_option():
    from ablate.armcheck import small_model
    from ablate.data.documents import document_ids
    from ablate.data.tokenizer import EOT_TOKEN

    model = small_model("baseline", vocab_size=EOT_TOKEN + 1, max_seq_len=16).eval()
    idx = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    idx[:, [0, 5, 11]] = EOT_TOKEN
    with torch.no_grad():
        plain = model(idx).logits
        model.document_mask = True
        masked = model(idx).logits
        torch.testing.assert_close(masked, model(idx, documents=document_ids(idx)).logits, rtol=0, atol=0)
        cache = model.new_cache()
        decoded = torch.cat([model(idx[:, :7], cache=cache).logits, model(idx[:, 7:], cache=cache).logits], 1)
    torch.testing.assert_close(decoded, masked, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(masked[:, :5], plain[:, :5], rtol=0, atol=0)  # the first document sees no other
    assert not torch.allclose(masked[:, 5:], plain[:, 5:])


@pytest.mark.unit
def test_document_mask_is_a_run_option_in_the_runs_identity():
    from ablate.config import resolve_config
    from ablate.experiment import RunSpec
    from ablate.identity import config_fingerprint
    from ablate.tiers import TIERS

    spec = RunSpec("adhoc", "smoke", "baseline", 0)
    plain, masked = resolve_config(spec, "/tmp/data"), resolve_config(spec, "/tmp/data", document_mask=True)
    assert "document_mask" not in plain.to_dict() and masked.to_dict()["document_mask"] is True
    assert config_fingerprint(plain) != config_fingerprint(masked)
    assert config_fingerprint(resolve_config(spec, "/tmp/data", document_mask=False)) == config_fingerprint(plain)
    task_tier = next(name for name, tier in TIERS.items() if tier.task is not None)
    with pytest.raises(AblateError) as refusal:
        resolve_config(RunSpec("adhoc", task_tier, "baseline", 0), document_mask=True)
    message = str(refusal.value)
    assert "\n" not in message and "--document-mask" in message and task_tier in message


@pytest.mark.run
def test_a_sliding_window_arm_trains_document_masked_through_run(tmp_path, sample_data):
    import json

    from ablate.cli import main
    from ablate.store import run_dir

    results = tmp_path / "results"
    assert main(["run", "--tier", "smoke", "--arm", "sliding-window", "--document-mask", "--max-steps", "2",
                 "--data", str(sample_data), "--results", str(results), "--no-progress", "--threads", "1"]) == 0
    folder = run_dir(results, "adhoc", "smoke", "sliding-window", 0)
    assert json.loads((folder / "summary.json").read_text())["status"] == "completed"
    assert json.loads((folder / "config.json").read_text())["document_mask"] is True


@pytest.mark.unit
def test_ablate_eval_pads_a_flex_models_batches_to_fixed_buckets():
    from ablate.evals.lm import padded_width

    assert [padded_width(n, 1024, flex=True) for n in (1, 64, 65, 200, 700, 1024)] == [64, 64, 128, 256, 1024, 1024]
    assert padded_width(40, 48, flex=True) == 48  # capped at the model's window
    assert [padded_width(n, 1024, flex=False) for n in (1, 65, 700)] == [1, 65, 700]  # fused: no padding
