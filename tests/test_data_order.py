"""The batch order on the real shipped sample: pure in (data, seed, B, T, step), rank- and worker-independent,
restored exactly; and the fixed validation batches."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from ablate.data import BatchStream, TokenShards, decode, prepare, validation_batches  # noqa: E402
from ablate.data.order import window_permutation  # noqa: E402
from ablate.errors import AblateError  # noqa: E402

pytestmark = pytest.mark.unit

B, T = 8, 64


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    return prepare("sample", tmp_path_factory.mktemp("data") / "sample", shard_tokens=150_000, workers=1,
                   progress_bar=False)


@pytest.fixture(scope="module")
def shards(sample_dir):
    return TokenShards(sample_dir)


def test_the_sample_is_real_english(shards):
    assert (shards.tokenizer, shards.vocab_size) == ("gpt2", 50257)
    assert len(shards) > 500_000 and len(shards.shards) > 1
    on_disk = np.concatenate([np.fromfile(shards.data_dir / s["file"], dtype="<u2") for s in shards.shards])
    assert np.array_equal(shards.read(150_000 - 7, 300_000 + 7), on_disk[150_000 - 7 : 300_000 + 7])
    text = decode(shards.read(0, 2000))
    assert text.startswith("<|endoftext|>") and " the " in text and "{{" not in text


def test_a_batch_is_a_pure_function_of_data_seed_shape_and_step(shards):
    stream = BatchStream(shards, seed=0, global_batch=B, seq_len=T)
    batch = stream.global_batch(7)
    assert batch.shape == (B, T + 1) and batch.dtype == torch.long
    reopened = BatchStream(TokenShards(shards.data_dir), seed=0, global_batch=B, seq_len=T)
    assert torch.equal(batch, reopened.global_batch(7))
    assert not torch.equal(batch, BatchStream(shards, seed=1, global_batch=B, seq_len=T).global_batch(7))
    for row, window in zip(batch, stream.window_indices(7)):  # each row is one aligned window of the train tokens
        assert np.array_equal(row.numpy(), shards.read(window * (T + 1), (window + 1) * (T + 1)))


def test_every_epoch_visits_distinct_windows_in_a_new_order(shards):
    stream = BatchStream(shards, seed=3, global_batch=B, seq_len=1023)
    epoch = stream.steps_per_epoch
    first = np.concatenate([stream.window_indices(s) for s in range(epoch)])
    second = np.concatenate([stream.window_indices(s) for s in range(epoch, 2 * epoch)])
    assert len(set(first)) == len(first) == epoch * B and len(set(second)) == len(second)
    assert not np.array_equal(first, second)


def test_the_permutation_is_fixed_arithmetic():
    # A regression anchor: the order must not change with numpy or torch versions.
    # [5, 8, ...] was checked against a pure-Python SplitMix64
    assert window_permutation(10, seed=0, epoch=0).tolist() == [5, 8, 1, 9, 7, 2, 4, 6, 3, 0]
    assert sorted(window_permutation(1000, 5, 2).tolist()) == list(range(1000))
    assert not np.array_equal(window_permutation(1000, 0, 1), window_permutation(1000, 1, 0))


def test_ranks_take_slices_of_the_same_global_batch(shards):
    single = BatchStream(shards, seed=0, global_batch=B, seq_len=T)
    ranks = [BatchStream(shards, seed=0, global_batch=B, seq_len=T, rank=r, world_size=2) for r in range(2)]
    for step in (0, 5, single.steps_per_epoch + 1):
        local = [r.local_batch(step) for r in ranks]
        assert local[0].shape == (B // 2, T + 1)
        assert torch.equal(torch.cat(local), single.global_batch(step))
    with pytest.raises(AblateError, match="global batch 8 is not divisible by world size 3"):
        BatchStream(shards, global_batch=8, seq_len=T, world_size=3)
    with pytest.raises(AblateError, match="rank 2 is outside 0..1"):
        BatchStream(shards, global_batch=8, seq_len=T, rank=2, world_size=2)


def test_loader_gives_the_same_batches_with_0_or_2_workers(shards):
    stream = BatchStream(shards, seed=0, global_batch=B, seq_len=T, rank=1, world_size=2)
    in_process = [b for _, b in zip(range(6), stream.loader(start_step=4, num_workers=0))]
    in_workers = [b for _, b in zip(range(6), stream.loader(start_step=4, num_workers=2))]
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers))
    assert all(torch.equal(a, stream.local_batch(4 + i)) for i, a in enumerate(in_process))


def test_loader_position_is_restored_exactly(shards):
    stream = BatchStream(shards, seed=2, global_batch=B, seq_len=T)
    iterator = iter(stream.loader())
    seen = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(stream.state_dict()))  # what a checkpoint keeps
    assert state["step"] == 3
    following = next(iterator)

    resumed = BatchStream(TokenShards(shards.data_dir), seed=2, global_batch=B, seq_len=T)
    resumed.load_state_dict(state)
    assert torch.equal(next(iter(resumed.loader())), following)
    assert torch.equal(seen[0], resumed.global_batch(0))
    # the global stream does not depend on the world size, so a resume may change it
    rank1 = BatchStream(shards, seed=2, global_batch=B, seq_len=T, rank=1, world_size=4)
    rank1.load_state_dict(state)
    assert torch.equal(next(iter(rank1.loader())), following[2:4])  # rows [1·8/4, 2·8/4)

    other = BatchStream(shards, seed=5, global_batch=B, seq_len=T)
    with pytest.raises(AblateError, match="another batch stream: seed 2 \\(this stream: 5\\)"):
        other.load_state_dict(state)
    with pytest.raises(AblateError, match="data '0+'"):
        stream.load_state_dict({**state, "data": "0" * 64})


def test_too_little_data_for_one_batch(shards):
    with pytest.raises(AblateError, match=r"a global batch needs 1000"):
        BatchStream(shards, global_batch=1000, seq_len=1023)


def test_validation_batches_are_contiguous_and_fixed(sample_dir):
    val = TokenShards(sample_dir, "val")
    batches = validation_batches(sample_dir, seq_len=T, batch_size=16)
    windows = len(val) // (T + 1)
    assert sum(len(b) for b in batches) == windows and all(b.shape[1] == T + 1 for b in batches)
    assert all(len(b) == 16 for b in batches[:-1])
    assert np.array_equal(torch.cat(batches).flatten().numpy(), val.read(0, windows * (T + 1)))
    first_two = validation_batches(sample_dir, seq_len=T, batch_size=16, max_batches=2)
    assert len(first_two) == 2 and all(torch.equal(a, b) for a, b in zip(first_two, batches))
    with pytest.raises(AblateError, match="fewer than one window"):
        validation_batches(sample_dir, seq_len=10**7, batch_size=1)
