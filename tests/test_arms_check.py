"""One check for every arm (`ablate.armcheck`): the built-ins, the examples, and the arms registered here — slots
composed with each other and with the hooks. Float64: the training path = the reference path in values and every
gradient (attention level and whole model), flex_attention's forward = the reference for arms that take it on
CUDA, and KV-cache decoding = the full forward, or a one-line refusal naming the arm and why. The harness is
shown to catch what it is for: an arm that decodes wrong, and a fused path that drifts."""

import pytest
import torch

import ablate.armcheck as armcheck
from ablate.armcheck import check_arm, check_decoding, small_model
from ablate.arms import Arm, get_arm, list_arms
from ablate.arms.base import _REGISTRY
from ablate.arms.builtin import G1Headwise, NormGate, ProjGate, Renorm, SinkLogit
from ablate.arms.examples import Alibi, QKNorm, Temperature
from ablate.arms.papers import Differential, Forgetting, ScalableSoftmax, SigmoidAttention, SoftCap, ValueResidual
from ablate.errors import AblateError


class LearnedBias(Alibi):
    """A score bias with learned parameters (slopes and an absolute-position term): its gradient must flow."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.slope = torch.nn.Parameter(torch.zeros(ctx.n_head))
        self.position = torch.nn.Parameter(torch.zeros(ctx.n_head))

    def score_bias(self, query_pos, key_pos):
        distance = (query_pos.unsqueeze(1) - key_pos.unsqueeze(0)).to(self.slope.dtype)
        absolute = torch.cos(query_pos.unsqueeze(1) * 0.3 + key_pos.unsqueeze(0)).to(self.slope.dtype)
        return -self.slope.view(-1, 1, 1) * distance + self.position.view(-1, 1, 1) * absolute

    def init_parameter(self, name, param, generator):
        if name in ("slope", "position"):
            torch.nn.init.zeros_(param)
        else:
            super().init_parameter(name, param, generator)


class AlibiSink(Alibi, SinkLogit):
    """The score bias next to the phantom key (its extra column and the mask's extra row and column)."""


class BiasRenormSink(LearnedBias, Renorm, SinkLogit):
    """Every column trick at once, with a learned bias."""


class Everything(QKNorm, Temperature, BiasRenormSink):
    """Both new slots with the phantom key and the routing slot (the query-key slots chain via super())."""

    def query_key(self, q, k):
        q, k = QKNorm.query_key(self, q, k)
        return Temperature.query_key(self, q, k)


class ForgettingSink(Forgetting, SinkLogit):
    """The decay beside the phantom key: it decays real keys only."""


class CappedEverything(SoftCap, LearnedBias, Renorm, SinkLogit, G1Headwise):
    """A score modifier before the routing gate, a learned bias, the phantom key and an output gate."""

    cap = 2.0  # small enough that tanh bends the logits of the check's inputs


class SigmoidGated(SigmoidAttention, NormGate, G1Headwise):
    """The normaliser with a value gate and an output gate."""


class SsmaxRenorm(ScalableSoftmax, Renorm):
    """Positions from the context beside the routing gate: decoding must give the right n_i."""


class DiffSinkGate(Differential, SinkLogit, ProjGate):
    """An override whose two core calls each carry the phantom key and a value gate (and a cache each)."""


class ResidualForgetting(ValueResidual, Forgetting):
    """An override (cross-layer state) and a score modifier (decoding state) at once."""


class UncachedMemory(Arm):
    """A stand-in for an arm whose state a KV cache cannot hold: it says so, and decoding refuses it."""

    no_decoding = "its mixing reads the whole sequence's x, which the cache does not keep"

    def score_modifier(self, context):
        mean = context.x.mean(dim=(1, 2))  # depends on every position of the call

        def mod(score, b, h, q_idx, kv_idx):
            return score + mean[b]

        return mod


TEST_ARMS = {"test-alibi-sink": AlibiSink, "test-learned-bias": LearnedBias, "test-bias-renorm-sink": BiasRenormSink,
             "test-everything": Everything, "test-forgetting-sink": ForgettingSink,
             "test-capped-everything": CappedEverything, "test-sigmoid-gated": SigmoidGated,
             "test-ssmax-renorm": SsmaxRenorm, "test-diff-sink-gate": DiffSinkGate,
             "test-residual-forgetting": ResidualForgetting, "test-uncached-memory": UncachedMemory}


@pytest.fixture
def test_arms(monkeypatch):
    """Register the test arms for one test only, so that no other test's list of arms sees them."""
    for name, cls in TEST_ARMS.items():
        monkeypatch.setattr(cls, "name", name)
        monkeypatch.setitem(_REGISTRY, name, cls)


@pytest.mark.parametrize("name", list_arms() + list(TEST_ARMS))
def test_every_arm_passes_the_check(name, test_arms):
    results = check_arm(name)
    refused = TEST_ARMS.get(name) is UncachedMemory
    by_kind = {r.check.split(":")[0]: r for r in results}
    assert [r.status for r in results if not r.ok] == [], [(r.check, r.detail) for r in results]
    one_path = get_arm(name).path("cpu") == "reference"
    assert by_kind["attention"].status == "holds"
    assert ("one path: gradcheck" in by_kind["attention"].check) == one_path  # never the path against itself
    assert by_kind["model"].status == ("not run" if one_path else "holds")
    assert by_kind["mask"].status == ("holds" if get_arm(name).has_hook("mask") else "not run")
    assert by_kind["documents"].status == "holds", by_kind["documents"].detail
    assert by_kind["decoding"].status == ("refused" if refused else "holds"), by_kind["decoding"].detail
    takes_flex = get_arm(name).path("cuda") == "flex"
    assert by_kind["flex"].status == ("holds" if takes_flex else "not run")


@pytest.mark.parametrize("name", [n for n in list_arms() if n != "sink-token"] + ["test-diff-sink-gate"])
def test_generate_runs_with_the_cache(name, test_arms):
    model = small_model(name).eval()
    idx = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    generated = model.generate(idx, max_new_tokens=4)
    assert generated.shape == (2, 9) and torch.equal(generated[:, :5], idx)


def test_an_arm_that_cannot_be_cached_is_refused_in_one_line(test_arms):
    model = small_model("test-uncached-memory").eval()
    idx = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(0))
    for attempt in (model.new_cache, lambda: model.generate(idx, max_new_tokens=2)):
        with pytest.raises(AblateError) as refusal:
            attempt()
        message = str(refusal.value)
        assert "\n" not in message and "'test-uncached-memory'" in message and "whole sequence's x" in message
    model(idx)  # a whole sequence is fine


class OffsetBlindSsmax(ScalableSoftmax):
    """The bug the context fixes: n_i from the index of the query in this call, not its position."""

    def score_modifier(self, context):
        scale = self.scale

        def scalable(score, b, h, q_idx, kv_idx):
            return score * scale[h] * torch.log((q_idx + 1).to(score.dtype))

        return scalable


class OffsetBlindDistance(Arm):
    """A distance penalty from q_idx − kv_idx, the indices of this call: right on a whole sequence, wrong when
    decoding (q_idx restarts at 0); context.query_pos[q_idx] is the query's position."""

    def score_modifier(self, context):
        def distance(score, b, h, q_idx, kv_idx):
            return score - 0.5 * (q_idx - kv_idx).abs().to(score.dtype)

        return distance


@pytest.mark.parametrize("cls", [OffsetBlindSsmax, OffsetBlindDistance], ids=lambda c: c.__name__)
def test_the_decoding_check_catches_an_arm_that_decodes_wrong(cls, monkeypatch):
    monkeypatch.setattr(cls, "name", "test-wrong-decoding")
    monkeypatch.setitem(_REGISTRY, "test-wrong-decoding", cls)
    result = check_decoding("test-wrong-decoding")
    assert result.status == "fails" and "max |Δlogit|" in result.detail


def test_the_attention_check_catches_a_fused_path_that_drifts(monkeypatch):
    exact = armcheck.attention

    def drifting(*args, **kw):
        o, record = exact(*args, **kw)
        return (o * (1 + 1e-6) if kw["fused"] else o), record

    monkeypatch.setattr(armcheck, "attention", drifting)
    result = armcheck.check_attention("baseline")
    assert result.status == "fails" and "relative error" in result.detail


def test_the_hook_examples_of_docs_arms_md_pass_the_check(monkeypatch):
    """docs/arms.md's one example per hook kind and its composed arms, run as written: each registers and passes
    the check."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "arms.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 5  # one per hook kind, and two arms composed
    monkeypatch.setattr("ablate.arms.base._REGISTRY", dict(_REGISTRY))  # what the blocks register goes away after
    namespace: dict = {}
    for block in blocks:
        exec(block, namespace)  # noqa: S102 (the documentation's own code)
    registered = {cls.name: cls for cls in namespace.values() if isinstance(cls, type) and issubclass(cls, Arm)
                  and cls is not Arm and not cls.__module__.startswith("ablate.")}  # the docs' own, not imported
    assert len(registered) == 6
    assert {cls.hooks() for cls in registered.values()} == {("score-modifier",), ("normaliser",), ("override",),
                                                             ("mask",), ()}
    assert registered["window-sink"].slots() == ("denominator",) and registered["window-sink"].hooks() == ("mask",)
    for name in registered:
        assert all(r.status == "holds" for r in check_arm(name) if r.status != "not run"), name
