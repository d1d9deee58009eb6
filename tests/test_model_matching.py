"""The model's parameter-matched shape, its fingerprints, and the chunked loss."""

import pytest
import torch
import torch.nn.functional as F

from ablate.losses import chunked_cross_entropy
from ablate.model import GPT, common_fingerprint, fingerprint_parameters, shared_shapes
from ablate.sizing import model_config

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
# The smoke baseline's init fingerprint for seed 0, recorded by the code before parameter matching existed.
SMOKE_BASELINE_SEED0 = "1c50e1d059ebc036b201ead134f4fb7c821b1424e71494a7cab0ed0b786bd97d"


def model(arm="baseline", seed=0, match=False, **overrides):
    m = GPT(model_config("smoke", arm, match_params=match, **overrides))
    m.init_weights(seed)
    return m


def test_unmatched_fingerprint_is_what_it_was():
    for arm in ("baseline", "g2-value", "g1-headwise"):
        assert fingerprint_parameters(model(arm).shared_named_parameters()) == SMOKE_BASELINE_SEED0
    # matching leaves an arm within the tolerance exactly as it was
    assert fingerprint_parameters(model("g1-headwise", match=True).shared_named_parameters()) == SMOKE_BASELINE_SEED0


def test_matched_pair_shares_the_common_fingerprint_only():
    base, matched, other_seed = model(), model("g2-value", match=True), model("g2-value", seed=1, match=True)
    assert matched.config.mlp_hidden == 224
    full = fingerprint_parameters(matched.shared_named_parameters())
    assert full != SMOKE_BASELINE_SEED0  # the MLP matrices have another shape
    common = common_fingerprint(base)
    assert common_fingerprint(matched) == common != common_fingerprint(other_seed)
    # the same thing said through `like`: the parameters both have with the same name and shape
    like = shared_shapes(base.config)
    assert fingerprint_parameters(matched.shared_named_parameters(), like=like) == common
    assert fingerprint_parameters(base.shared_named_parameters(), like=shared_shapes(matched.config)) == common
    names = {n for n, s in like.items() if s == shared_shapes(matched.config).get(n)}
    assert not any(".mlp." in n for n in names) and "wte.weight" in names and "blocks.1.attn.c_attn.weight" in names


def test_matched_model_trains():
    torch.manual_seed(0)
    m = model("g1-elementwise", match=True)
    assert m.config.mlp_hidden == 224 and m.blocks[0].mlp.c_fc.weight.shape == (224, 64)
    batch = torch.randint(0, 50257, (4, 33), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = m(batch[:, :-1], batch[:, 1:]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


@pytest.mark.parametrize("arm", ["baseline", "sink-token"])
def test_chunked_loss_equals_the_full_loss_in_value_and_gradients(arm):
    m = model(arm)
    batch = torch.randint(0, 50257, (3, 17), generator=torch.Generator().manual_seed(1))
    full = m(batch[:, :-1], batch[:, 1:])
    full.loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    chunked = m(batch[:, :-1], batch[:, 1:], loss_chunk=7)  # 48 tokens: chunks of 7 and a remainder
    assert chunked.logits is None
    chunked.loss.backward()
    assert torch.allclose(chunked.loss, full.loss, rtol=1e-6, atol=0)
    for name, p in m.named_parameters():  # float32 rounding, relative to the gradient's scale
        assert (p.grad - grads[name]).abs().max() <= 1e-5 * grads[name].abs().max(), name
    with torch.no_grad():  # evaluation: the same number without a graph
        assert torch.allclose(m(batch[:, :-1], batch[:, 1:], loss_chunk=5).loss, full.loss, rtol=1e-6)


def test_chunked_cross_entropy_ignores_like_cross_entropy():
    g = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(10, 8, generator=g), torch.randn(30, 8, generator=g)
    targets = torch.randint(0, 30, (10,), generator=g)
    targets[[1, 4]] = -100
    expected = F.cross_entropy(hidden @ weight.T, targets)
    assert torch.allclose(chunked_cross_entropy(hidden, weight, targets, 3), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="loss chunk must be at least 1"):
        chunked_cross_entropy(hidden, weight, targets, 0)


def test_a_shape_only_model_has_every_parameter_and_buffer_of_the_built_one():
    """`shape_only` skips the draws on its meta tensors: every parameter keeps its name, shape and dtype, and the
    RoPE tables their values, for every registered arm."""
    from ablate.arms import list_arms
    from ablate.model import shape_only

    for arm in list_arms():
        config = model_config("smoke", arm)
        built, shapes = GPT(config), shape_only(config)
        assert all(p.is_meta for p in shapes.parameters()), arm
        assert [(n, p.shape, p.dtype) for n, p in shapes.named_parameters()] == [
            (n, p.shape, p.dtype) for n, p in built.named_parameters()], arm
        assert torch.equal(shapes.rope_cos, built.rope_cos) and torch.equal(shapes.rope_sin, built.rope_sin), arm
        assert shapes.param_counts() == built.param_counts(), arm
    shapes.to_empty(device="cpu")  # materialised: its tables are still the built model's, not left empty
    assert torch.equal(shapes.rope_cos, built.rope_cos) and torch.equal(shapes.rope_sin, built.rope_sin)
