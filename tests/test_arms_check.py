"""One check for every arm (`ablate.armcheck`): the built-ins, the examples, and the arms registered here — slots
composed with each other and with the hooks. Float64: the training path = the reference path in values and every
gradient (attention level and whole model), flex_attention's forward = the reference for arms that take it on
CUDA, KV-cache decoding = the full forward, or a one-line refusal naming the arm and why, and causality on every
path (later inputs and other sequences never move an output). The harness is shown to catch what it is for: an
arm that decodes wrong, a fused path that drifts, and the three leaks of issue 54 (an override reading v[t+1], a
score modifier reading the next position's x, a normaliser weighting later keys), each with `no_decoding` set."""

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

pytestmark = pytest.mark.unit


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

    no_decoding = "its mixing reads the mean of x over every earlier position, which the cache does not keep"

    def score_modifier(self, context):
        xs = context.x.sum(dim=2)  # (B, T)
        T = xs.shape[1]
        earlier = torch.ones(T, T, dtype=torch.bool, device=xs.device).tril()  # (T, T): position j ≤ i
        if context.documents is not None:  # under a document mask, the mean of this document's positions only
            earlier = earlier & (context.documents[:, :, None] == context.documents[:, None, :])
        earlier = earlier.expand(xs.shape[0], T, T).to(xs.dtype)
        mean = (earlier @ xs.unsqueeze(-1)).squeeze(-1) / earlier.sum(-1)  # (B, T): every position up to each one

        def mod(score, b, h, q_idx, kv_idx):
            return score + mean[b, kv_idx]  # per key: a per-query constant would not move the softmax

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
    assert by_kind["causal attention"].status == by_kind["causal model"].status == "holds"  # every arm, no_decoding too
    assert by_kind["decoding"].status == ("refused" if refused else "holds"), by_kind["decoding"].detail
    takes_flex = get_arm(name).path("cuda") == "flex"
    assert by_kind["flex"].status == ("holds" if takes_flex else "not run")


def test_generate_runs_with_the_cache():
    """The generation loop, once: that each arm decodes through the cache as the full forward computes is the
    check's "decoding" (test_every_arm_passes_the_check, every arm and the test arms)."""
    model = small_model("sink-logit").eval()
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
        assert "\n" not in message and "'test-uncached-memory'" in message and "every earlier position" in message
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


# ------------------------------------------------------------------------------------------ causality
class PeekNextValue(Arm):
    """An override that adds v[t+1] to the read at t: the query at t reads the next position's value."""

    no_decoding = "it reads the next position's value"

    def attend(self, q, k, v, context, core):
        later = torch.cat([v[:, :, 1:], torch.zeros_like(v[:, :, :1])], dim=2)
        return core(q, k, v + 0.5 * later)


class PeekNextX(Arm):
    """A score modifier closing over context.x of the next position (per key: key j gets x[j+1])."""

    no_decoding = "it reads the next position's x"

    def score_modifier(self, context):
        following = torch.roll(context.x, -1, dims=1).sum(dim=-1)  # (B, T): x of the position after each

        def mod(score, b, h, q_idx, kv_idx):
            return score + 0.3 * following[b, kv_idx]

        return mod


class LeakyNormaliser(Arm):
    """A normaliser 0.9·softmax + 0.1/T_k: a tenth of every weight spread over every key, the later ones too."""

    no_decoding = "its weights reach every key"

    def normalise(self, logits, context):
        return 0.9 * torch.softmax(logits, dim=-1) + 0.1 / logits.shape[-1]


LEAKS = {"test-peek-next-value": PeekNextValue, "test-peek-next-x": PeekNextX,
         "test-leaky-normaliser": LeakyNormaliser}


@pytest.fixture
def leaking_arms(monkeypatch):
    for name, cls in LEAKS.items():
        monkeypatch.setattr(cls, "name", name)
        monkeypatch.setitem(_REGISTRY, name, cls)


@pytest.mark.parametrize("name", list(LEAKS))
def test_the_causal_check_catches_each_leak_no_decoding_or_not(name, leaking_arms, capsys):
    """Each of the three leaks of issue 54, with `no_decoding` set: decoding is refused (not checked), and the causal
    checks fail at the attention call and in the whole model; `arms --check` says so and exits 1."""
    from ablate.cli.arms import check_command

    by_kind = {r.check.split(":")[0]: r for r in check_arm(name)}
    assert by_kind["decoding"].status == "refused"
    assert by_kind["causal attention"].status == "fails", by_kind["causal attention"].detail
    if name == "test-leaky-normaliser":  # the raw weights, not what the kernel leaves of them: the kernel zeroes
        # a normaliser's weight on a masked key (issue 55), so the model it trains is causal, and the check still
        # reports the normaliser that puts weight there
        assert "puts weight 0.00909 on masked (later) keys" in by_kind["causal attention"].detail
        assert by_kind["causal model"].status == "holds", by_kind["causal model"].detail
        failing = "1 fail (causal attention)"
    else:
        assert by_kind["causal model"].status == "fails", by_kind["causal model"].detail
        assert "changed at positions it may not see" in by_kind["causal model"].detail
        assert "training" in by_kind["causal attention"].detail and "changed at positions" in \
            by_kind["causal attention"].detail
        failing = "fail (causal attention, causal model)"
    assert check_command(name, as_json=False) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert "1 refused (decoding: not checked)" in last and failing in last, last


def test_the_leaky_normaliser_is_caught_by_its_weights_even_where_the_kernel_would_mask_them(leaking_arms,
                                                                                             monkeypatch):
    """A kernel that zeroes masked weights (issue 55) hides the leak from the black box; the raw weights do not."""
    from ablate.arms import kernel

    exact = kernel.Hooks.of

    def masking(arm, context):
        hooks = exact(arm, context)
        if hooks.normalise is not None:
            raw = hooks.normalise
            hooks.normalise = lambda logits: raw(logits).masked_fill(logits == float("-inf"), 0.0)
        return hooks

    monkeypatch.setattr(kernel.Hooks, "of", masking)
    assert armcheck.masked_weight("test-leaky-normaliser") == pytest.approx(0.1 / 11)
    result = armcheck.check_causal("test-leaky-normaliser")
    assert result.status == "fails" and "masked (later) keys" in result.detail
    monkeypatch.setattr(armcheck, "masked_weight", lambda name: 0.0)  # without the raw weights: the kernel hides it
    assert armcheck.check_causal("test-leaky-normaliser").status == "holds"


@pytest.mark.parametrize("path", ["training (reference)", "reference", "flex (eager)"])
def test_the_causal_check_runs_every_path_the_arm_takes(path, leaking_arms, monkeypatch):
    """A leak on one path alone (here: PeekNextX's modifier leaking only when called by the path patched) is caught,
    so flex's eager path and the reference path are each held, not only the training path."""
    honest = armcheck.attention_calls("softcap")
    calls = dict(honest)
    calls[path] = armcheck.attention_calls("test-peek-next-x")["training (reference)"]
    monkeypatch.setattr(armcheck, "attention_calls", lambda name: calls)
    result = armcheck.check_causal("softcap")
    assert result.status == "fails" and result.detail.startswith(path + ":"), result.detail
    monkeypatch.setattr(armcheck, "attention_calls", lambda name: honest)
    assert armcheck.check_causal("softcap").status == "holds"


def test_find_leak_is_a_black_box_over_any_call_and_any_visibility_rule():
    """The lower-level helper: a cumulative sum is causal, a reversed one is not, and a call mixing sequences
    leaks across the batch; with a document rule (key visible if earlier and in the query's document) a causal
    call that crosses documents is caught."""
    from ablate.armcheck import Probe, find_leak

    x = torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probe = [Probe("x", x, 1)]
    assert find_leak(lambda x: x.cumsum(1), probe, out_time_dim=1) is None
    assert "position 0" in find_leak(lambda x: x.flip(1).cumsum(1).flip(1), probe, out_time_dim=1)
    assert "sequence 0's output moved" in find_leak(lambda x: x.cumsum(1) + x.sum(0), probe, out_time_dim=1)
    document = torch.tensor([0, 0, 0, 1, 1, 1])

    def same_document(query, keys):
        return (keys <= query) & (document[keys] == document[query])

    per_document = lambda x: torch.cat([x[:, :3].cumsum(1), x[:, 3:].cumsum(1)], dim=1)  # noqa: E731
    assert find_leak(per_document, probe, out_time_dim=1, visible=same_document) is None
    leak = find_leak(lambda x: x.cumsum(1), probe, out_time_dim=1, visible=same_document)
    assert leak.startswith("the output at position 3 moved") and "(0, 1, 2, 4, 5)" in leak
    tokens = [Probe("the tokens", torch.tensor([[1, 2, 3]]), 1, vocab=5)]
    assert find_leak(lambda t: t.double().cumsum(1), tokens, out_time_dim=1) is None


def test_a_refused_decode_is_never_counted_as_holding(test_arms, capsys):
    """The tally says what holds, what was refused (not checked) and what fails, apart."""
    from ablate.cli.arms import check_command

    assert check_command("test-uncached-memory", as_json=False) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "5 of 8 checks hold; 1 refused (decoding: not checked); 2 do not apply; 0 fail", last


LEAKY_FILE = '''import torch

from ablate.arms import Arm, register_arm


@register_arm("my-peek")
class MyPeek(Arm):
    no_decoding = "it reads the next position's x"

    def score_modifier(self, context):
        following = torch.roll(context.x, -1, dims=1).sum(dim=-1)

        def mod(score, b, h, q_idx, kv_idx):
            return score + 0.3 * following[b, kv_idx]

        return mod
'''

EXPERIMENT_FILE = LEAKY_FILE + '''
from ablate.experiment import Experiment

EXPERIMENT = Experiment(name="peeking", tiers=["smoke"], arms=["baseline", "my-peek"], seeds=1)
'''


@pytest.mark.parametrize("command", ["run", "submit", "testbed"])
def test_a_leaking_arm_from_a_users_file_is_refused_before_training(command, tmp_path, capsys, monkeypatch):
    """`run --arm-file`, `submit` of an experiment file that registers the arm, `testbed --arm --arm-file`: one line
    naming the arm and the failed check, exit 2, and no run folder (nothing was trained)."""
    import ablate.arms.testbed  # noqa: F401 (oracle-gate, which `testbed` imports, stays registered after the test)
    from ablate.cli import main

    monkeypatch.setattr("ablate.arms.base._REGISTRY", dict(_REGISTRY))  # what the file registers goes away after

    arm_file, experiment_file = tmp_path / "my_arms.py", tmp_path / "peeking.py"
    arm_file.write_text(LEAKY_FILE)
    experiment_file.write_text(EXPERIMENT_FILE)
    results = tmp_path / "results"
    argv = {"run": ["run", "--tier", "smoke", "--arm", "my-peek", "--arm-file", str(arm_file), "--max-steps", "2"],
            "submit": ["submit", str(experiment_file), "--executor", "local"],
            "testbed": ["testbed", "--arm", "my-peek", "--arm-file", str(arm_file), "--tier", "abstain-stream",
                        "--steps", "2", "--seed-count", "1"]}
    assert main(argv[command] + ["--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "arm 'my-peek' fails the check before training" in err, err
    assert "causal attention" in err and "x changed at positions it may not see" in err
    assert not results.exists()


def test_the_arms_ablate_ships_do_not_pay_the_check_at_each_run(monkeypatch):
    """The built-ins and examples are held by this file's tests; `refuse_unsound` checks a user's arm only."""
    def no_check(name, checks):
        raise AssertionError(f"checked {name}")

    import ablate.arms.builtin as builtin
    import ablate.arms.examples as examples
    import ablate.arms.papers as papers
    import ablate.arms.testbed as testbed

    monkeypatch.setattr(armcheck, "run_checks", no_check)
    shipped = [cls.name for module in (builtin, examples, papers, testbed) for cls in vars(module).values()
               if isinstance(cls, type) and issubclass(cls, Arm) and cls.name and cls.__module__ == module.__name__]
    assert len(shipped) == 26 and set(list_arms()) >= set(shipped)
    assert [name for name in shipped if armcheck.is_users(name)] == []
    armcheck.refuse_unsound(shipped)
    monkeypatch.setattr(PeekNextX, "__module__", "my_arms")
    monkeypatch.setitem(_REGISTRY, "test-peek-next-x", PeekNextX)
    with pytest.raises(AssertionError, match="checked test-peek-next-x"):
        armcheck.refuse_unsound(["baseline", "test-peek-next-x"])
