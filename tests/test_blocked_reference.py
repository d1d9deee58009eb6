"""The blocked reference path: the materialised attention of a hooked arm in query blocks, each recomputed in the
backward pass, the arm's state carried block to block as decoding carries it; exact to the whole-row reference
path (float64, 1e-12, the output and every gradient) for every registered arm on the reference path that decodes,
with a document mask too; an arm that cannot decode (`no_decoding`) keeps the whole-row path."""

import pytest
import torch

from ablate.armcheck import check_inputs, make_checked_arm
from ablate.arms import AttentionContext, get_arm, list_arms
from ablate.arms import kernel
from ablate.arms.kernel import BLOCKS, attention, blocked_rows, reference_block

pytestmark = pytest.mark.unit

T = 150  # three blocks of 64, the last one short


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    """A one-byte budget: every block at these shapes is BLOCK_MIN = 64 rows (T = 150: three blocks)."""
    monkeypatch.setattr(kernel, "BLOCK_BUDGET", 1)


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
    assert reference_block(2, 4, T, 100.0) == 64
    whole, whole_grads = _run(name, "reference")
    if get_arm(name).no_decoding:
        assert blocked_rows(make_checked_arm(name), 2, 4, T) is None
        return
    assert blocked_rows(make_checked_arm(name), 2, 4, T) == 64
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
    """The block: the most rows of B·H·rows·T elements at the arm's bytes per element within the budget, a power of
    two within [64, 512]; a tighter budget gives a smaller block, a larger batch or length too."""
    mib = 2**20
    assert reference_block(1, 5, 1024, 32.0, 64 * mib) == 256  # 64 MiB / (5·1024·32 bytes) = 409.6 rows → 256
    assert reference_block(1, 5, 1024, 32.0, 16 * mib) == 64 < reference_block(1, 5, 1024, 32.0, 32 * mib) == 128
    assert reference_block(1, 5, 1024, 32.0, 2**40) == 512 and reference_block(64, 12, 4096, 90.0, mib) == 64
    assert reference_block(2, 5, 1024, 32.0, 64 * mib) == 128 and reference_block(1, 5, 2048, 32.0, 64 * mib) == 128
    softcap, stick = make_checked_arm("softcap"), make_checked_arm("stick-breaking")
    assert blocked_rows(softcap, 1, 5, 2048, budget=64 * mib) > blocked_rows(softcap, 1, 5, 2048, budget=16 * mib)
    # the arm's own measured bytes per element: stick-breaking's working set is larger than softcap's
    assert blocked_rows(stick, 1, 5, 1024, budget=64 * mib) < blocked_rows(softcap, 1, 5, 1024, budget=64 * mib)
    assert blocked_rows(softcap, 1, 2, 64) is None  # one block: the smoke tier's T keeps whole rows
    assert blocked_rows(softcap, 1, 2, 300, budget=2**40) is None  # T within one block of 512


def test_the_plans_stated_block_is_the_block_the_kernel_takes(monkeypatch, capsys):
    """`ablate plan` states the block (--json `reference_block`, the text's note) the run's reference path takes at
    its micro-batch; the kernel, called at that shape, takes the same one (its blocks' starts). A tighter budget: a
    smaller block in both."""
    from ablate.cli import main
    from ablate.plan import plan_rows

    from ablate.armcheck import HEADS

    overrides = {"seq_len": 512, "micro_batch": 2, "n_head": HEADS}  # the kernel call's shape: B 2, H 4, T 512
    stated = []
    for budget in (2**27, 2**26):  # B·H·T·92 bytes a row (stick-breaking): 355 → 256 rows, 177 → 128
        monkeypatch.setattr(kernel, "BLOCK_BUDGET", budget)
        row = plan_rows("smoke", ["stick-breaking"], 1, overrides=overrides)["runs"][0]
        arm = make_checked_arm("stick-breaking").float()
        q, k, v, x = check_inputs(T=512, B=2, dtype=torch.float32)
        context = AttentionContext.full(x)
        attention(arm, q, k, v, x, context=context, fused=True)
        starts = sorted(context.shared[BLOCKS])
        assert row["reference_block"] == starts[1] and starts == list(range(0, 512, starts[1])), (row, starts)
        assert f"blocks of {starts[1]} query rows at T = 512, micro-batch 2" in row["attention"]["note"]
        stated.append(row["reference_block"])
    assert stated[1] < stated[0]
    assert main(["plan", "--tier", "smoke", "--arms", "stick-breaking", "--seed-count", "1"]) == 0
    assert "stick-breaking: reference path, measured" in capsys.readouterr().out


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
    assert blocked_rows(undecodable, 1, HEADS, n) is None and saved(undecodable, None)[1]


# --- keys the composed mask hides from a whole block are skipped -------------------------------------------------
WINDOW = 20


def _windowed(*bases, per_head=False):
    """A sliding window of WINDOW keys composed with `bases` (an arm's hooks and slots): per_head, head h sees
    WINDOW·(h + 1) keys (a mask that differs by head)."""
    from ablate.arms.papers import SlidingWindow

    class Window(SlidingWindow):
        window = WINDOW * (4 if per_head else 1)

        def mask_modifier(self, context):
            query_pos, key_pos = context.query_pos, context.key_pos

            def in_window(b, h, q_idx, kv_idx):
                distance = query_pos[q_idx] - key_pos[kv_idx]
                return (distance >= 0) & (distance < WINDOW * ((h + 1) if per_head else 1))

            return in_window

    return type("Windowed", (Window, *bases), {})


def _arm_of(cls):
    from ablate.armcheck import HEAD_DIM, HEADS, KV_HEADS, randomise
    from ablate.arms import ArmContext

    arm = cls(ArmContext(HEADS, KV_HEADS, HEAD_DIM, HEADS * HEAD_DIM, n_layer=2, layer=0)).double()
    randomise(arm, 0)
    return arm


def _grads(arm, path, documents=None):
    q, k, v, x = check_inputs(T=T)
    context = AttentionContext.full(x)
    context.documents = documents
    o, _ = attention(arm, q, k, v, x, context=context, fused=path)
    leaves = [q, k, v, x, *[p for p in arm.parameters() if p.requires_grad]]
    weights = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
    return o, torch.autograd.grad((o * weights).sum(), leaves, allow_unused=True)


def _exact(a, b):
    return (a - b).abs().max().item() <= 1e-12 * max(b.abs().max().item(), 1.0)


@pytest.mark.parametrize("bases", [("stick-breaking",), ("softpick",), ("selective",), ("sigmoid",), ("softcap",),
                                   ("forgetting",), ("ssmax",), ("softcap", "alibi"), ("selective", "sink-logit"),
                                   ("stick-breaking", "renorm")], ids="+".join)
@pytest.mark.parametrize("per_head", [False, True])
def test_skipping_hidden_keys_is_exact_to_the_whole_row_path(bases, per_head):
    """A window composed with normalisers (a whole row's denominator, selective's per-key state), score modifiers,
    a score bias, the phantom key and a routing gate: the blocked path, which skips keys, equals the whole rows."""
    arm = _arm_of(_windowed(*(get_arm(name) for name in bases), per_head=per_head))
    assert blocked_rows(arm, 2, 4, T) == 64
    whole, whole_grads = _grads(arm, "reference")
    blocked, blocked_grads = _grads(arm, True)
    assert _exact(blocked, whole)
    for a, b in zip(blocked_grads, whole_grads, strict=True):
        assert (a is None) == (b is None)
        assert a is None or _exact(a, b)


def _scored_keys(cls, documents=None):
    """The key positions the score modifier is called on, per call (one call a block)."""
    calls = []
    base_modifier = cls.score_modifier

    class Counting(cls):
        def score_modifier(self, context):
            inner = base_modifier(self, context)

            def counted(score, b, h, q_idx, kv_idx):
                calls.append((tuple(score.shape), kv_idx.flatten().tolist()))
                return inner(score, b, h, q_idx, kv_idx)

            return counted

    from ablate.arms.kernel import block_bytes

    block_bytes(Counting)  # the block choice's probe (once per class) calls the modifier too: not counted
    calls.clear()
    _grads(_arm_of(Counting), True, documents)
    return calls


def test_keys_hidden_from_every_query_of_a_block_are_not_computed():
    """Blocks of 64 rows at T = 150 under a window of 20: block [s, e) scores keys s − 19 … e − 1 only (a window's
    cost is O(T·w)); the forward and the backward's recomputation each score every block once."""
    calls = _scored_keys(_windowed(get_arm("softcap")))
    blocks = [(0, 64), (64, 128), (128, 150)]
    expected = [list(range(max(s - WINDOW + 1, 0), e)) for s, e in blocks]
    # the forward, then the backward's recomputation (last block first)
    assert [keys for _, keys in calls] == expected + expected[::-1]
    assert [shape[-1] for shape, _ in calls[:3]] == [64, 83, 41]  # not 64, 128, 150
    no_mask = _scored_keys(get_arm("softcap"))
    assert [shape[-1] for shape, _ in no_mask[:3]] == [64, 128, 150]  # the causal mask alone skips nothing


def test_a_document_mask_skips_the_earlier_documents_keys_but_not_the_sink_tokens():
    documents = (torch.arange(T) // 40).view(1, T).expand(2, T).clone()  # documents of 40 positions
    calls = _scored_keys(get_arm("softcap"), documents)
    assert [keys[0] for _, keys in calls[:3]] == [0, 40, 120] and calls[1][0][-1] == 128 - 40
    documents[:, 0] = -1  # position 0 is a sink token every document sees: it is kept, the rest skipped
    calls = _scored_keys(get_arm("softcap"), documents)
    assert [keys[:2] for _, keys in calls[:3]] == [[0, 1], [0, 40], [0, 120]]
