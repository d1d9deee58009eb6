"""The blocked reference path: the materialised attention of a hooked arm in query blocks, each recomputed in the
backward pass, the arm's state carried block to block as decoding carries it; exact to the whole-row reference
path (float64, 1e-12, the output and every gradient) for every registered arm on the reference path that decodes,
with a document mask too; an arm that cannot decode (`no_decoding`) keeps the whole-row path."""

import pytest
import torch

from ablate.armcheck import check_inputs, make_checked_arm
from ablate.arms import AttentionContext, get_arm, list_arms
from ablate.arms.kernel import attention, blocked_rows, reference_block

pytestmark = pytest.mark.unit

T = 150  # three blocks of 64, the last one short


def _hooked():
    list_arms()
    return [name for name in list_arms() if get_arm(name).path("cpu") == "reference"]


def _run(name, path, documents=None):
    arm = make_checked_arm(name)
    q, k, v, x = check_inputs(T=T)
    context = AttentionContext.full(x)
    if documents is not None:
        context.documents = documents
    o, _ = attention(arm, q, k, v, x, context=context, fused=True if path is None else path)
    leaves = [q, k, v, x, *[p for p in arm.parameters() if p.requires_grad]]
    grads = torch.autograd.grad((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum(), leaves,
                                allow_unused=True)
    return o, grads


@pytest.mark.parametrize("name", _hooked())
def test_the_blocked_path_is_exact_to_the_whole_row_path(name):
    assert reference_block(T) == 64
    whole, whole_grads = _run(name, "reference")
    if get_arm(name).no_decoding:
        assert blocked_rows(make_checked_arm(name), T) is None
        return
    assert blocked_rows(make_checked_arm(name), T) == 64
    blocked, blocked_grads = _run(name, None)  # the training path: blocked at T = 150
    scale = whole.abs().max().item()
    assert (blocked - whole).abs().max().item() <= 1e-12 * max(scale, 1.0), name
    for a, b in zip(blocked_grads, whole_grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max().item() <= 1e-12 * max(b.abs().max().item(), 1.0), name


@pytest.mark.parametrize("name", ["softcap", "selective", "stick-breaking"])
def test_the_blocked_path_is_exact_under_a_document_mask(name):
    documents = (torch.arange(T) // 40).view(1, T).expand(2, T).clone()
    whole, whole_grads = _run(name, "reference", documents)
    blocked, blocked_grads = _run(name, None, documents)
    assert (blocked - whole).abs().max().item() <= 1e-12 * max(whole.abs().max().item(), 1.0)
    for a, b in zip(blocked_grads, whole_grads):
        if a is not None:
            assert (a - b).abs().max().item() <= 1e-12 * max(b.abs().max().item(), 1.0)


def test_block_sizes_and_the_paths_that_keep_whole_rows():
    assert [reference_block(t) for t in (64, 150, 1024, 2048, 4096, 65536)] == [64, 64, 128, 256, 512, 512]
    assert blocked_rows(make_checked_arm("softcap"), 64) is None  # one block: the smoke tier's T keeps whole rows


def test_the_blocked_path_saves_no_square_tensor_and_an_undecodable_arm_keeps_whole_rows():
    """Saved for the backward pass (saved-tensor hooks): no (…, T, T) tensor on the blocked path, whose saved bytes
    are a small part of the whole-row path's; an arm with `no_decoding` takes the whole rows and saves them."""
    from ablate.arms import Arm

    class Undecodable(Arm):
        no_decoding = "it reads every position's x at once"

        def normalise(self, logits, context):
            return torch.softmax(logits + context.x.mean(), dim=-1)

    n = 512

    def saved(arm, path):
        q, k, v, x = check_inputs(T=n, B=1, dtype=torch.float32)
        kept, square = {}, []

        def pack(t):
            kept.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            square.append(tuple(t.shape[-2:]) == (n, n))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            attention(arm, q, k, v, x, context=AttentionContext.full(x), fused=True if path is None else path)
        return sum(kept.values()), any(square)

    softcap = make_checked_arm("softcap").float()
    blocked, whole = saved(softcap, None), saved(softcap, "reference")
    assert not blocked[1] and whole[1] and blocked[0] < whole[0] / 4
    from ablate.armcheck import HEAD_DIM, HEADS, KV_HEADS
    from ablate.arms import ArmContext

    undecodable = Undecodable(ArmContext(HEADS, KV_HEADS, HEAD_DIM, HEADS * HEAD_DIM, n_layer=2, layer=0))
    assert blocked_rows(undecodable, n) is None and saved(undecodable, None)[1]
