"""The model's RoPE tables are computed once and cached: same numbers, same state_dict, following `.to()`."""

import copy

import pytest
import torch

from ablate.arms.names import BUILTIN_ARMS
from ablate.model import GPT, GPTConfig, apply_rope, rope_tables

pytestmark = pytest.mark.unit


def small_model(arm="baseline", **kw):
    cfg = dict(vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=48, arm=arm)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def fresh(model, offset, length, dtype):
    """What the model computed on every forward before the cache: float64 tables, cast by `apply_rope`."""
    cos, sin = rope_tables(torch.arange(offset, offset + length), model.config.head_dim, model.config.rope_theta)
    return cos.to(dtype), sin.to(dtype)


def old_path(model):
    """The same model, its forward fed tables rebuilt for exactly its positions, as before the cache."""
    old = copy.deepcopy(model)
    old.rope = lambda offset, length, dtype: rope_tables(
        torch.arange(offset, offset + length), old.config.head_dim, old.config.rope_theta)
    return old


@pytest.mark.parametrize("arm", ["baseline", "sink-token"])
def test_cached_tables_equal_fresh_ones_bitwise_at_every_offset(arm):
    model = small_model(arm)
    positions = model.config.max_seq_len + (1 if arm == "sink-token" else 0)
    assert model.rope_cos.shape == (positions, model.config.head_dim // 2)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for offset, length in [(0, positions), (0, 1), (0, 17), (5, 1), (3, 29), (positions - 1, 1)]:
            cos, sin = model.rope(offset, length, dtype)
            want_cos, want_sin = fresh(model, offset, length, dtype)
            assert cos.dtype == dtype and torch.equal(cos, want_cos) and torch.equal(sin, want_sin), (dtype, offset)


def test_state_dict_keys_are_unchanged_and_load_strictly():
    model = small_model("sink-token")
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}  # lm_head.weight: tied, still a key
    assert set(model.state_dict()) == params
    assert not any("rope" in k for k in model.state_dict())
    other = small_model("sink-token")
    other.load_state_dict(model.state_dict(), strict=True)
    assert {n for n, _ in model.named_buffers()} >= {"rope_cos", "rope_sin"}


def test_tables_follow_to_but_stay_float64_and_the_casts_are_redone():
    model = small_model()
    model.rope(0, 8, torch.float32)  # fill the cast cache
    model.float()  # without the _apply override this would turn the float64 tables into float32
    assert model.rope_cos.dtype == torch.float64 and model.rope_sin.dtype == torch.float64
    model.to(torch.bfloat16)
    assert model.rope_cos.dtype == torch.float64 and model.wte.weight.dtype == torch.bfloat16
    assert model.rope_dtype(torch.device("cpu")) == torch.bfloat16
    cos, sin = model.rope(0, 48, torch.bfloat16)
    assert torch.equal(cos, fresh(model, 0, 48, torch.bfloat16)[0])
    model.to("meta")
    assert model.rope_cos.device.type == "meta" and model._rope_cast == {}
    assert model.rope(0, 4, torch.float32)[0].device.type == "meta"
    model.to_empty(device="cpu")  # from the meta device: the tables are computed, not left empty
    assert torch.equal(model.rope_cos, rope_tables(torch.arange(48), 8, 10000.0)[0])
    if torch.cuda.is_available():
        model = small_model().cuda()
        assert model.rope(0, 4, torch.float32)[0].device.type == "cuda" and model.rope_cos.dtype == torch.float64


def test_a_float64_model_after_float_gets_the_float64_table_back():
    model = small_model().float().double()
    cos, sin = model.rope(0, 48, torch.float64)
    assert torch.equal(cos, model.rope_cos) and torch.equal(cos, fresh(model, 0, 48, torch.float64)[0])
    assert model.rope(0, 48, torch.float64)[0] is not model.rope(0, 48, torch.float32)[0]


def test_autocast_layers_receive_tables_in_the_dtype_of_q():
    model = small_model()
    seen = []
    model.blocks[0].attn.register_forward_pre_hook(lambda mod, args: seen.append(args[1].dtype))
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    model(idx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = model.blocks[0].attn.c_attn(model.wte(idx))
        model(idx)
    assert seen == [torch.float32, q.dtype] and q.dtype == torch.bfloat16


@pytest.mark.parametrize("arm", BUILTIN_ARMS)
def test_forward_backward_and_decoding_are_bitwise_those_of_fresh_tables(arm):
    torch.manual_seed(0)
    model = small_model(arm)
    old = old_path(model)
    gen = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 97, (2, 24), generator=gen), torch.randint(0, 97, (2, 24), generator=gen)
    new_out, old_out = model(idx, targets), old(idx, targets)
    assert torch.equal(new_out.logits, old_out.logits) and torch.equal(new_out.loss, old_out.loss)
    new_out.loss.backward()
    old_out.loss.backward()
    grads = dict(old.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name
    with torch.no_grad():  # the KV cache path reads the tables at an offset
        assert torch.equal(model.generate(idx[:, :5], 6), old.generate(idx[:, :5], 6))
        new_cache, old_cache = model.new_cache(), old.new_cache()
        model(idx[:, :7], cache=new_cache), old(idx[:, :7], cache=old_cache)
        assert torch.equal(model(idx[:, 7:9], cache=new_cache).logits, old(idx[:, 7:9], cache=old_cache).logits)


def test_apply_rope_does_not_copy_a_table_already_in_the_dtype_of_q():
    cos, sin = fresh(small_model(), 0, 6, torch.float32)
    t = torch.randn(1, 2, 6, 8)
    out = apply_rope(t, cos, sin)
    x1, x2 = t.chunk(2, dim=-1)
    assert torch.equal(out, torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1))
    assert cos.to(t.dtype) is cos  # the per-layer cast is now a no-op
