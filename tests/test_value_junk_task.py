"""The testbed's value-junk task (ablate.data.valuejunk) and its model (ablate.taskmodel.ValueJunkGPT): the junk is
a pure function of the batch, never in a token or a key, scaled to the head's median read norm, and the oracle
gate closes exactly the junk reads; the other task models are unchanged."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from ablate.arms import Arm
from ablate.data.filter import task_batch, task_from_fields
from ablate.data.stream import StreamTask, stream_batch
from ablate.data.synthetic import IGNORE
from ablate.data.valuejunk import ValueJunkTask, fixed_directions, junk_plan, marker_directions, value_junk_batch
from ablate.model import GPT
from ablate.sizing import model_config
from ablate.taskmodel import StrictCausalAttention, ValueJunkAttention, ValueJunkGPT, task_model
from ablate.taskrun import value_junk_signature
from ablate.tiers import TASKS, TIERS

TIERS_JUNK = ("value-junk-norm", "value-junk-direction")


@pytest.mark.unit
def test_a_sequence_is_a_pair_twice_then_its_query():
    task = ValueJunkTask()
    inputs, targets = value_junk_batch(task, 256, seed=3)
    assert torch.equal(inputs, value_junk_batch(task, 256, seed=3)[0])  # a pure function of its seed
    assert not torch.equal(inputs, value_junk_batch(task, 256, seed=4)[0])
    assert inputs.shape == (256, 3) and torch.equal(inputs[:, 0], inputs[:, 1])
    assert bool(task.is_pair(inputs[:, 0]).all())
    assert torch.equal(inputs[:, 2] - task.first_query, (inputs[:, 0] - task.first_pair) // task.n_values)
    assert bool((targets[:, :2] == IGNORE).all())
    assert torch.equal(targets[:, 2], (inputs[:, 0] - task.first_pair) % task.n_values)
    assert len(set(targets[:, 2].tolist())) == task.n_values and len(set(inputs[:, 2].tolist())) == task.n_keys


@pytest.mark.unit
def test_the_junk_is_one_copy_drawn_from_the_batch_not_from_any_token():
    """One of the two copies is junk, either about as often; its decoy has the key and another value; the plan is
    a pure function of the batch (the same token is junk at position 0 in one sequence and 1 in another)."""
    task = ValueJunkTask(junk="norm")
    inputs = value_junk_batch(task, 512, seed=0)[0]
    plan = junk_plan(task, inputs, 2, 32)
    again = junk_plan(task, inputs.clone(), 2, 32)
    assert torch.equal(plan.mask, again.mask) and torch.equal(plan.directions, again.directions)
    assert bool((plan.mask.sum(1) == 1).all()) and not bool(plan.mask[:, 2].any())
    assert 0.4 < float(plan.mask[:, 0].double().mean()) < 0.6
    key = lambda t: (t - task.first_pair) // task.n_values  # noqa: E731
    value = lambda t: (t - task.first_pair) % task.n_values  # noqa: E731
    junk = plan.mask
    assert torch.equal(key(plan.decoys[junk]), key(inputs[junk]))
    assert bool((value(plan.decoys[junk]) != value(inputs[junk])).all())
    shifts = (value(plan.decoys[junk]) - value(inputs[junk])) % task.n_values
    assert set(shifts.tolist()) == {1, 2, 3}  # every other value, so the decoy says nothing of the value
    assert torch.equal(plan.decoys[~junk], inputs[~junk])
    assert torch.allclose(plan.directions.norm(dim=-1), torch.ones(()))
    assert junk_plan(ValueJunkTask(junk="direction"), inputs, 2, 32).directions is None
    assert torch.equal(fixed_directions(3, 2, 32), fixed_directions(3, 2, 32))
    assert not torch.equal(fixed_directions(3, 2, 32), fixed_directions(4, 2, 32))


@pytest.mark.unit
def test_the_tiers_are_the_task_s_one_layer_attention_only_model():
    for name in TIERS_JUNK:
        task = task_from_fields(TASKS[name])
        tier = TIERS[name]
        assert isinstance(task, ValueJunkTask) and asdict(task) == TASKS[name] and task.junk in name
        assert (tier.vocab_size, tier.seq_len, tier.task) == (task.vocab_size, task.seq_len, name)
        config = model_config(tier, "baseline")
        assert config.n_layer == 1 and config.mlp_width == 0
        model = task_model(config, task)
        assert isinstance(model, ValueJunkGPT) and isinstance(model.blocks[0].attn, StrictCausalAttention)
        assert torch.equal(task_batch(task, 4, 1)[0], value_junk_batch(task, 4, 1)[0])


def _model(tier: str, arm: str, seed: int = 5):
    import ablate.arms.testbed  # noqa: F401 (registers oracle-gate, as experiments/testbed.py does; not at collection)

    task = task_from_fields(TASKS[tier])
    model = task_model(model_config(TIERS[tier], arm), task).double()
    model.init_weights(seed)
    return task, model


def _projected(model, inputs):
    """q, k, v of the attention layer in one forward of `inputs` (after the junk)."""
    attn, seen = model.blocks[0].attn, {}
    original = attn.projected

    def spy(x, cos, sin):
        seen["qkv"] = original(x, cos, sin)
        return seen["qkv"]

    attn.projected = spy
    try:
        model(inputs)
    finally:
        del attn.projected
    return seen["qkv"]


@pytest.mark.unit
@pytest.mark.parametrize("tier", (*TIERS_JUNK, "junk-content-e050"))
def test_junk_changes_the_junk_reads_only_and_never_a_query_or_key(tier):
    """Against the same model without junk (dose 0 and no decoy: the plain strict-causal model), queries and keys
    are equal everywhere and reads differ exactly at the junk positions."""
    task, model = _model(tier, "baseline")
    plain = task_model(model_config(TIERS[tier], "baseline"), StreamTask()).double()
    plain.load_state_dict(model.state_dict())
    inputs = value_junk_batch(task, 64, seed=1)[0]
    q, k, v = _projected(model, inputs)
    x = plain.blocks[0].ln_1(plain.wte(inputs))
    cos, sin = plain.rope(0, inputs.shape[1], x.dtype)
    q0, k0, v0 = plain.blocks[0].attn.projected(x, cos, sin)
    mask = junk_plan(task, inputs, 2, v.shape[-1]).mask
    assert torch.equal(q, q0) and torch.equal(k, k0)
    differs = (v != v0).any(-1).all(1)  # (B, T), every head
    assert torch.equal(differs, mask)


@pytest.mark.unit
@pytest.mark.parametrize("tier", (*TIERS_JUNK, "junk-content-e050"))
def test_the_marker_is_dose_times_the_head_s_median_read_norm_so_rescaling_w_v_cannot_escape_it(tier):
    """junk read − decoy's read = ε · median_h ‖v‖ · unit direction, the median over the batch's clean reads of
    the head; scaling W_v by 10 scales the marker by 10 too (the junk keeps its share of the read)."""
    task, model = _model(tier, "baseline")
    inputs = value_junk_batch(task, 16, seed=2)[0]
    plan = junk_plan(task, inputs, 2, 32)

    def marker_and_median(model):
        _, _, v = _projected(model, inputs)
        attn = model.blocks[0].attn
        with torch.no_grad():
            x = model.blocks[0].ln_1(model.wte(inputs))
            decoy_x = model.blocks[0].ln_1(model.wte(plan.decoys))
            cos, sin = model.rope(0, inputs.shape[1], x.dtype)
            clean = StrictCausalAttention.projected(attn, x, cos, sin)[2]
            decoy = StrictCausalAttention.projected(attn, decoy_x, cos, sin)[2]
        median = clean.norm(dim=-1).transpose(0, 1).reshape(2, -1).median(1).values
        marker = (v - decoy).transpose(1, 2)[plan.mask]  # (junk reads, H, d)
        return marker.detach(), median

    marker, median = marker_and_median(model)
    assert torch.allclose(marker.norm(dim=-1), task.dose * median.expand_as(marker[..., 0]))
    if task.junk == "direction":  # one fixed direction per head for every junk read
        unit = marker / marker.norm(dim=-1, keepdim=True)
        assert torch.allclose(unit, fixed_directions(5, 2, 32).double().expand_as(unit))
    if task.junk == "content":  # the graded testbed's: one fixed direction per head and decoy value
        unit = marker / marker.norm(dim=-1, keepdim=True)
        decoy_value = (plan.decoys[plan.mask] - task.first_pair) % task.n_values
        assert torch.allclose(unit, marker_directions(task, 5, 2, 32).double()[decoy_value])
        assert len(set(decoy_value.tolist())) > 1  # several values, so several directions, in this batch
        assert torch.equal(marker_directions(ValueJunkTask(junk="direction"), 5, 2, 32), fixed_directions(5, 2, 32))
    with torch.no_grad():
        model.blocks[0].attn.c_attn.weight[128:] *= 10  # W_v (after W_q and W_k: 2 heads × 32 each)
    scaled, scaled_median = marker_and_median(model)
    assert torch.allclose(scaled_median, 10 * median) and torch.allclose(scaled, 10 * marker)


@pytest.mark.unit
def test_the_plan_and_the_fixed_direction_are_the_same_for_every_arm_of_a_seed():
    """Two arms of one seed: the same junk mask, the same decoy reads at init (the shared weights), the same
    fixed direction; the oracle's gate is 0 exactly at junk reads."""
    task, baseline = _model("value-junk-direction", "baseline", seed=7)
    _, oracle = _model("value-junk-direction", "oracle-gate", seed=7)
    inputs = value_junk_batch(task, 16, seed=3)[0]
    assert torch.equal(_projected(baseline, inputs)[2], _projected(oracle, inputs)[2])
    assert torch.equal(baseline.blocks[0].attn.directions, oracle.blocks[0].attn.directions)
    record = oracle(inputs, record=True).records[0]
    mask = junk_plan(task, inputs, 2, 32).mask[:, :-1]  # keys 0..T-2
    assert torch.equal(record.value_gate[..., 0] == 0, mask[:, None].expand(-1, 2, -1))


@pytest.mark.unit
def test_fused_equals_reference_and_the_oracle_refuses_outside_the_task():
    task, model = _model("value-junk-norm", "oracle-gate")
    inputs = value_junk_batch(task, 8, seed=0)[0]
    fused = model(inputs).logits
    model.blocks[0].attn.fused = False
    assert torch.allclose(fused, model(inputs).logits, atol=1e-10)
    plain = GPT(model_config(TIERS["smoke"], "oracle-gate"))
    with pytest.raises(ValueError, match="oracle-gate.*value-junk-norm"):
        plain(torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.unit
def test_the_signature_sees_the_baseline_read_junk_and_the_oracle_drop_it():
    """At init both arms put about half the matched mass on the junk copy; the oracle's junk weight is 0."""
    task, baseline = _model("value-junk-norm", "baseline")
    _, oracle = _model("value-junk-norm", "oracle-gate")
    batches = [value_junk_batch(task, 64, seed=9)]
    base, gated = value_junk_signature(baseline, task, batches), value_junk_signature(oracle, task, batches)
    assert base["gate_junk"] is None and base["junk_weight"] == base["junk_mass"] > 0.1
    assert gated["junk_weight"] == 0 and gated["gate_junk"] == 0 and gated["gate_clean"] == 1
    assert abs(gated["junk_mass"] - base["junk_mass"]) < 1e-12  # the oracle filters in the value slot, not routing


@pytest.mark.unit
def test_the_stream_and_corpus_models_are_unchanged():
    """The abstain-stream model is the plain strict-causal one, the corpus GPT the plain GPT: no junk anywhere."""
    model = task_model(model_config(TIERS["abstain-stream"], "baseline"), StreamTask())
    assert type(model) is GPT and type(model.blocks[0].attn) is StrictCausalAttention
    assert not any(isinstance(b.attn, ValueJunkAttention) for b in model.blocks)
    inputs = stream_batch(StreamTask(), 4, seed=0)[0]
    model.init_weights(1)
    again = task_model(model_config(TIERS["abstain-stream"], "baseline"), StreamTask())
    again.init_weights(1)
    assert torch.equal(model(inputs).logits, again(inputs).logits)


@pytest.mark.unit
def test_bad_fields_are_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="junk='loud'.*norm, direction"):
        ValueJunkTask(junk="loud")
    with pytest.raises(ValueError, match="n_layer=2"):
        ValueJunkGPT(model_config(TIERS["smoke"], "baseline"), ValueJunkTask())


@pytest.mark.unit
def test_the_testbed_figure_shows_the_loss_per_seed_and_the_gate_on_junk_against_clean_reads(monkeypatch, tmp_path):
    """The report's figure for a value-junk tier: the declared quantity per seed, then Filter's panels, among them
    the value gate at junk reads beside clean reads, each seed a dot."""
    import ablate.analysis.testbed as testbed
    from ablate.store_summary import RunSummary

    saved = []
    monkeypatch.setattr(testbed, "_save", lambda fig, path: saved.append(fig))
    signature = {"junk_mass": 0.5, "clean_mass": 0.5, "junk_weight": 0.1, "output_norm": 1.0, "gate_junk": 0.2,
                 "gate_clean": 0.9}
    by_arm = {arm: [RunSummary.of({"val_loss": 0.7 - seed / 100, "val_loss_auc": 0.8, "val_accuracy": 0.5,
                                   "signature": signature}) for seed in range(3)]
              for arm in ("baseline", "proj-gate")}
    testbed.plot_testbed("value-junk-direction", by_arm, tmp_path / "f.png")
    axes = saved[0].axes
    assert "declared quantity" in axes[0].get_title() and len(axes) == 1 + len(testbed.FILTER_PANELS)
    gate = next(ax for ax in axes if ax.get_title() == "value gate on the read")
    assert [t.get_text() for t in gate.get_xticklabels()] == ["junk reads", "clean reads"]
    assert "gate_junk" in testbed.testbed_markdown("value-junk-norm", by_arm)


@pytest.mark.unit
def test_a_sink_token_is_never_junk_and_the_junk_moves_with_the_tokens():
    """A sequence arm's prepended token shifts the positions by one: the junk read is the same copy, one later."""
    task, model = _model("value-junk-norm", "sink-token")
    inputs = value_junk_batch(task, 32, seed=4)[0]
    record = model(inputs, record=True).records[0]
    mask = junk_plan(task, inputs, 2, 32).mask
    _, _, v = _projected(model, inputs)
    with torch.no_grad():
        x = model.blocks[0].ln_1(torch.cat([model.sink_token.expand(32, 1, -1), model.wte(inputs)], 1))
        cos, sin = model.rope(0, 4, x.dtype)
        clean = StrictCausalAttention.projected(model.blocks[0].attn, x, cos, sin)[2]
    differs = (v != clean).any(-1).all(1)  # (B, 1 + T)
    assert not bool(differs[:, 0].any()) and torch.equal(differs[:, 1:], mask)
    assert record.weights.shape[-2:] == (3, 3)


@pytest.mark.unit
def test_saved_weights_of_a_value_junk_run_load_as_the_strict_causal_model(tmp_path):
    """The junk is the task's, not the weights': a run's saved weights load as the plain strict-causal GPT with the
    same parameters (what probes of a run see is its model without the task's junk)."""
    from ablate.modelio import load_model, save_model

    task, model = _model("value-junk-direction", "proj-gate")
    save_model(model.float(), tmp_path / "w.pt")
    loaded = load_model(tmp_path / "w.pt")
    assert type(loaded) is GPT and isinstance(loaded.blocks[0].attn, StrictCausalAttention)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


class PeekingGate(Arm):
    """A user's value gate that reads a `junk_mask` attribute if anything hands it one: the answer of the task."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.junk_mask = None

    def value_gate(self, v, x):
        if self.junk_mask is None:
            return torch.ones_like(v[..., :1])
        return (~self.junk_mask[:, None, : v.shape[2], None]).to(v.dtype)


@pytest.mark.unit
def test_only_the_oracle_class_receives_the_junk_mask(monkeypatch):
    """An arm with a `junk_mask` attribute is not handed the task's answer, nor is a subclass of the oracle; the
    oracle control's own class is."""
    import ablate.arms.testbed as testbed
    from ablate.arms.base import _REGISTRY
    from ablate.taskmodel import hands_junk_mask

    class OracleImitation(testbed.OracleGate):
        pass

    for name, cls in (("test-peeking-gate", PeekingGate), ("test-oracle-imitation", OracleImitation)):
        monkeypatch.setattr(cls, "name", name)
        monkeypatch.setitem(_REGISTRY, name, cls)
    task, peeking = _model("value-junk-norm", "test-peeking-gate")
    inputs = value_junk_batch(task, 16, seed=0)[0]
    peeking(inputs)
    assert peeking.blocks[0].attn.arm.junk_mask is None and not peeking.hands_junk_mask
    _, imitation = _model("value-junk-norm", "test-oracle-imitation")
    assert not imitation.hands_junk_mask
    with pytest.raises(ValueError, match="reads the junk mask"):
        imitation(inputs)
    _, oracle = _model("value-junk-norm", "oracle-gate")
    oracle(inputs)
    assert oracle.hands_junk_mask and hands_junk_mask(oracle.blocks[0].attn.arm)
    assert torch.equal(oracle.blocks[0].attn.arm.junk_mask, junk_plan(task, inputs, 2, 32).mask)


@pytest.mark.run
def test_a_run_of_the_oracle_is_marked_as_having_received_the_mask(tmp_path):
    """`received_junk_mask` in the summary: True for the oracle's run, absent for any other arm's."""
    import ablate.arms.testbed  # noqa: F401
    from ablate.experiment import RunSpec
    from ablate.store_summary import read_summary
    from ablate.train import run

    marks = {}
    for arm in ("oracle-gate", "baseline"):
        spec = RunSpec("junk", "value-junk-norm", arm, 0)
        run(spec, tmp_path, max_steps=2)
        marks[arm] = read_summary(spec.folder(tmp_path)).received_junk_mask
    assert marks == {"oracle-gate": True, "baseline": None}


@pytest.mark.run
def test_the_oracle_off_its_task_is_refused_before_a_run_folder(tmp_path, sample_data, capsys):
    """`ablate run --tier smoke --arm oracle-gate`: one line naming the arm, the tier and the valid tiers; no folder."""
    import ablate.arms.testbed  # noqa: F401
    from ablate.cli import main

    results = tmp_path / "results"
    assert main(["run", "--tier", "smoke", "--arm", "oracle-gate", "--max-steps", "2", "--data", str(sample_data),
                 "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("ablate: error: arm 'oracle-gate' runs on the tiers of the task(s) value-junk-norm, "
                   "value-junk-direction only, not on tier 'smoke'; valid tiers: value-junk-norm, value-junk-direction")
    assert not results.exists()
