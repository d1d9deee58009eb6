"""The testbed's abstain-stream task (ablate.data.stream) and its strict-causal model (ablate.taskmodel): every
read is content, no position is a fixed place to park, and the answer is read without an MLP."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from ablate.data.filter import task_batch, task_from_fields
from ablate.data.stream import StreamTask, stream_batch
from ablate.data.synthetic import IGNORE
from ablate.experiment import load_experiment
from ablate.sizing import model_config
from ablate.taskmodel import StrictCausalAttention, task_model
from ablate.tiers import TASKS, TIERS

pytestmark = pytest.mark.unit


def test_a_window_is_pairs_only_and_each_answer_is_the_key_s_previous_value():
    task = StreamTask()
    inputs, targets = stream_batch(task, 256, seed=3)
    assert torch.equal(inputs, stream_batch(task, 256, seed=3)[0])  # a pure function of its seed
    assert not torch.equal(inputs, stream_batch(task, 256, seed=4)[0])
    assert bool((inputs >= task.first_pair).all())  # no BOS, no query-only token: every position is a pair
    keys, values = (inputs - task.first_pair) // task.n_values, (inputs - task.first_pair) % task.n_values
    assert bool((targets[:, 0] == IGNORE).all())  # position 0 sees nothing
    for b in range(inputs.shape[0]):
        for t in range(1, task.window):
            earlier = [j for j in range(t) if keys[b, j] == keys[b, t]]
            assert len(earlier) <= 1  # a key occurs at most twice
            want = task.first_value + int(values[b, earlier[0]]) if earlier else task.NONE
            assert int(targets[b, t]) == want
    share = float((targets == task.NONE).sum() / (targets != IGNORE).sum())
    assert 0.4 < share < 0.7  # about half of the answers are NONE


def test_the_tier_is_the_task_s_attention_only_one_layer_model():
    task = task_from_fields(TASKS["abstain-stream"])
    tier = TIERS["abstain-stream"]
    assert isinstance(task, StreamTask) and asdict(task) == TASKS["abstain-stream"]
    assert (tier.vocab_size, tier.seq_len, tier.task) == (task.vocab_size, task.seq_len, "abstain-stream")
    config = model_config(tier, "baseline")
    assert config.n_layer == 1 and config.mlp_width == 0  # the answer is read linearly, no MLP after the read
    model = task_model(config, task)
    assert all(isinstance(block.attn, StrictCausalAttention) for block in model.blocks)
    assert sum(p.numel() for n, p in model.named_parameters() if ".mlp." in n) == 0
    assert torch.equal(task_batch(task, 4, 1)[0], stream_batch(task, 4, 1)[0])


def _attention_outputs(model, inputs):
    block = model.blocks[0]
    x = model.wte(inputs)
    cos, sin = model.rope(0, inputs.shape[1], x.dtype)
    return block.attn(block.ln_1(x), cos, sin)[0]


@pytest.mark.parametrize("arm", ["baseline", "sink-logit", "renorm", "softcap", "sigmoid", "forgetting", "ssmax",
                                 "diff", "value-residual"])  # the slots and every hook kind
def test_a_position_reads_strictly_earlier_positions_and_the_fused_path_equals_the_reference(arm):
    """A change of the read at position 6 alone (what its key and value carry) leaves the outputs at positions ≤ 6
    unchanged and changes those after: no position reads itself, so its own token is no place to park.
    Position 0 reads nothing. Fused = reference in float64."""
    task = StreamTask()
    model = task_model(model_config(TIERS["abstain-stream"], arm), task).double()
    model.init_weights(5)
    inputs = stream_batch(task, 8, seed=0)[0]

    def shifted(v, layer):
        v = v.clone()
        v[:, :, 6] += 1.0
        return v

    with torch.no_grad():
        before = _attention_outputs(model, inputs)
        model.blocks[0].attn.read_hook = shifted
        after = _attention_outputs(model, inputs)
        model.blocks[0].attn.read_hook = None
        assert torch.allclose(before[:, :7], after[:, :7]) and not torch.allclose(before[:, 7:], after[:, 7:])
        assert bool((before[:, 0] == 0).all())
        fused = model(inputs).logits
        for block in model.blocks:
            block.attn.fused = False
        assert torch.allclose(fused, model(inputs).logits, atol=1e-10)


def test_the_sink_token_is_an_earlier_position_of_every_query():
    """The positive control's arm: the prepended token is read by position 0 and every later one."""
    task = StreamTask()
    model = task_model(model_config(TIERS["abstain-stream"], "sink-token"), task)
    inputs = stream_batch(task, 4, seed=0)[0]
    with torch.no_grad():
        record = model(inputs, record=True).records[0]
    assert record.weights.shape[-2:] == (task.window, task.window)  # a row per real token, the sink a key
    assert torch.allclose(record.weights[:, :, 0, 0], torch.ones(()))  # the first real token reads the sink only


def test_an_arm_with_an_output_gate_is_refused_in_one_line():
    with pytest.raises(ValueError, match="g1-headwise.*output gate"):
        task_model(model_config(TIERS["abstain-stream"], "g1-headwise"), StreamTask())


def test_the_testbed_declares_a_positive_control_in_the_arms_family():
    """Each tier has a control_ comparison at it, so in the same Holm family as the arms' predictions; the
    abstain-stream declarations stay as declared (docs/method.md)."""
    testbed = load_experiment("testbed")
    assert testbed.tiers == ("abstain-stream", "value-junk-norm", "value-junk-direction") and testbed.family == "tier"
    for tier in testbed.tiers:
        at = [h for h in testbed.hypotheses if h.at(tier)]
        assert [h.name for h in at if h.name.startswith("control_")], tier
    stream = [(h.name, h.minuend, h.subtrahend) for h in testbed.hypotheses if h.at("abstain-stream")]
    assert stream == [("control_park_position", "baseline", "sink-token"),
                      ("stream_sink_logit", "baseline", "sink-logit"), ("stream_off_by_one", "baseline", "off-by-one")]
    assert all(h.tiers == ("abstain-stream",) for h in testbed.hypotheses if h.at("abstain-stream"))
    junk = {h.name: (h.minuend, h.subtrahend, h.tiers) for h in testbed.hypotheses if not h.at("abstain-stream")}
    assert junk == {"control_junk_oracle": ("baseline", "oracle-gate", ("value-junk-norm", "value-junk-direction")),
                    "junk_direction_proj_gate": ("baseline", "proj-gate", ("value-junk-direction",)),
                    "junk_direction_proj_over_norm": ("norm-gate", "proj-gate", ("value-junk-direction",))}


def test_the_testbed_figure_shows_the_declared_quantity_per_seed_beside_the_signature(monkeypatch, tmp_path):
    """The report's testbed figure: a first panel with each seed's val_loss (the declared quantity) per arm, then
    the signature's panels, each seed a dot."""
    import ablate.analysis.testbed as testbed
    from ablate.store_summary import RunSummary

    saved = []
    monkeypatch.setattr(testbed, "_save", lambda fig, path: saved.append(fig))
    signature = {f"{name}_{case}": 0.1 for name in ("phantom", "first_key", "output_norm")
                 for case in ("absent", "present")}
    by_arm = {arm: [RunSummary(val_loss=0.09 + seed / 100, signature=signature) for seed in range(3)]
              for arm in ("baseline", "sink-logit")}
    testbed.plot_testbed("abstain-stream", by_arm, tmp_path / "f.png")
    axes = saved[0].axes
    assert len(axes) == 1 + len(testbed.SIGNATURE) and "declared quantity" in axes[0].get_title()
    dots = [[round(float(y), 6) for y in c.get_offsets()[:, 1]] for c in axes[0].collections]
    assert dots == [[0.09, 0.10, 0.11]] * 2  # one dot per seed, per arm


def test_saved_weights_of_a_stream_run_load_as_the_strict_causal_model(tmp_path):
    """Probes and evals load a run's final weights (`ablate.modelio.load_model`): a stream run's load with their
    strictly-earlier attention, so they compute what the run trained; a study model's file gains no key."""
    from ablate.model import GPT
    from ablate.modelio import load_model, save_model

    task = StreamTask()
    model = task_model(model_config(TIERS["abstain-stream"], "sink-logit"), task)
    model.init_weights(3)
    save_model(model, tmp_path / "w.pt")
    loaded = load_model(tmp_path / "w.pt")
    inputs = stream_batch(task, 4, seed=0)[0]
    assert isinstance(loaded.blocks[0].attn, StrictCausalAttention)
    assert torch.equal(loaded(inputs).logits, model.eval()(inputs).logits)
    save_model(GPT(model_config(TIERS["smoke"], "baseline")), tmp_path / "plain.pt")
    assert set(torch.load(tmp_path / "plain.pt", weights_only=True)) == {"config", "state_dict"}
