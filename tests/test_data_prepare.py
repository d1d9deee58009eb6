"""Tokenizer, sources and `prepare`: ids, the FineWeb-Edu path on local parquet, manifests, resume, bad input."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from ablate.data import TokenShards, decode, encode, prepare  # noqa: E402
from ablate.data import tokenizer, writer  # noqa: E402
from ablate.data.sources import FINEWEB_EDU_COLUMNS, text_id  # noqa: E402
from ablate.errors import AblateError  # noqa: E402

pytestmark = pytest.mark.unit

WORDS = "the of and to in is was for on that with as by at from his her are be this an which or".split() + [
    "attention", "gate", "softmax", "sink", "token", "model", "river", "mountain", "history", "number",
]


def make_corpus(count: int = 240, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"id": f"<urn:doc:{seed}:{i}>", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 120))) + "."}
        for i in range(count)
    ]


def write_fineweb_parquet(path, docs) -> str:
    """Parquet in FineWeb-Edu's schema (docs/method.md §2)."""
    columns = {
        "text": [d["text"] for d in docs], "id": [d["id"] for d in docs], "dump": ["CC-MAIN-2024-10"] * len(docs),
        "url": [f"https://example.org/{i}" for i in range(len(docs))], "file_path": ["s3://x/0.parquet"] * len(docs),
        "language": ["en"] * len(docs), "language_score": [0.97] * len(docs),
        "token_count": [len(encode(d["text"])) for d in docs], "score": [3.1] * len(docs), "int_score": [3] * len(docs),
    }
    assert tuple(columns) == FINEWEB_EDU_COLUMNS
    pq.write_table(pa.table(columns), path)
    return str(path)


def write_jsonl(path, docs) -> str:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return str(path)


def folder_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def expected_stream(docs, val_fraction, split):
    want_val = split == "val"
    ids: list[int] = []
    for d in docs:
        if writer.is_validation(d["id"], val_fraction) == want_val:
            ids += [tokenizer.EOT_TOKEN] + encode(d["text"])
    return np.array(ids, dtype=np.uint16)


# --- tokenizer ---------------------------------------------------------------------------------


def test_gpt2_ids_and_document_separator():
    assert encode("Hello world!") == [15496, 995, 0]
    assert decode([15496, 995, 0]) == "Hello world!"
    assert tokenizer.gpt2_encoding().n_vocab == 50257
    assert list(tokenizer.encode_document("Hello world!")) == [50256, 15496, 995, 0]
    assert 50256 not in encode("<|endoftext|>")  # text that looks special is encoded as text


def test_damaged_bpe_file_is_refused(tmp_path):
    damaged = tmp_path / "gpt2.tiktoken"
    data = bytearray(tokenizer.BPE_FILE.read_bytes())
    data[100] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(AblateError, match=f"gpt2.tiktoken.*expected {tokenizer.BPE_SHA256}"):
        tokenizer._read_bpe_ranks(damaged)


# --- sources and output ------------------------------------------------------------------------


def test_fineweb_edu_path_on_local_parquet(tmp_path):
    docs = make_corpus(300)
    files = [write_fineweb_parquet(tmp_path / "a.parquet", docs[:150]),
             write_fineweb_parquet(tmp_path / "b.parquet", docs[150:])]
    out = prepare("fineweb-edu", tmp_path / "out", data_files=files, shard_tokens=3000, val_fraction=0.1,
                  workers=1, progress_bar=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == "fineweb-edu"
    assert manifest["source_args"] == {"config": "sample-10BT", "data_files": files}
    assert (manifest["tokenizer"], manifest["vocab_size"], manifest["tokenizer_sha256"]) == (
        "gpt2", 50257, tokenizer.BPE_SHA256)
    for split in ("train", "val"):
        shards = TokenShards(out, split)
        expected = expected_stream(docs, 0.1, split)
        assert np.array_equal(shards.read(0, len(shards)), expected)
        facts = manifest["splits"][split]
        assert facts["tokens"] == len(expected) == sum(s["tokens"] for s in facts["shards"])
    assert manifest["splits"]["val"]["documents"] == sum(writer.is_validation(d["id"], 0.1) for d in docs) > 0
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 300
    assert all(s["tokens"] == 3000 for s in manifest["splits"]["train"]["shards"][:-1])


def test_parquet_and_jsonl_sources_give_the_same_tokens(tmp_path):
    docs = make_corpus(80)
    from_parquet = prepare("parquet", tmp_path / "p", path=write_fineweb_parquet(tmp_path / "c.parquet", docs),
                           id_column="id", shard_tokens=2000, val_fraction=0.2, workers=1, progress_bar=False)
    from_jsonl = prepare("jsonl", tmp_path / "j", path=write_jsonl(tmp_path / "c.jsonl", docs),
                         id_column="id", shard_tokens=2000, val_fraction=0.2, workers=1, progress_bar=False)
    assert TokenShards(from_parquet).fingerprint == TokenShards(from_jsonl).fingerprint
    # without an id column the id is the text's hash, so the split follows the content
    no_ids = prepare("jsonl", tmp_path / "h", path=str(tmp_path / "c.jsonl"), shard_tokens=2000, val_fraction=0.2,
                     workers=1, progress_bar=False)
    hashed = [{"id": text_id(d["text"]), "text": d["text"]} for d in docs]
    assert np.array_equal(TokenShards(no_ids, "val").read(0, len(TokenShards(no_ids, "val"))),
                          expected_stream(hashed, 0.2, "val"))


def test_budget_is_exact_and_validation_does_not_move(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(300))
    common = dict(path=path, id_column="id", shard_tokens=1500, val_fraction=0.2, val_tokens=400, workers=1,
                  progress_bar=False)
    small = TokenShards(prepare("jsonl", tmp_path / "small", tokens=5000, **common))
    large = TokenShards(prepare("jsonl", tmp_path / "large", tokens=9000, **common))
    assert (len(small), len(large)) == (5000, 9000)
    assert np.array_equal(small.read(0, 5000), large.read(0, 5000))
    assert TokenShards(tmp_path / "small", "val").fingerprint == TokenShards(tmp_path / "large", "val").fingerprint
    assert len(TokenShards(tmp_path / "small", "val")) == 400


@pytest.mark.parametrize("stop_after", [1, 3])
def test_resumed_prepare_is_byte_identical(tmp_path, stop_after):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(300))
    common = dict(path=path, id_column="id", shard_tokens=1200, val_fraction=0.1, val_tokens=900, progress_bar=False)
    whole = prepare("jsonl", tmp_path / "whole", workers=1, **common)

    out = tmp_path / "resumed"
    with pytest.raises(writer.PrepareStopped):
        prepare("jsonl", out, workers=1, stop_after_shards=stop_after, **common)
    assert not (out / "manifest.json").exists() and (out / "progress.json").exists()
    # what a kill mid-write leaves: a temporary file and a shard the progress file does not count
    (out / ".train_000009.bin.x.tmp").write_bytes(b"half")
    recorded = json.loads((out / "progress.json").read_text())["splits"]["train"]["shards"]
    (out / writer.shard_name("train", len(recorded))).write_bytes(b"\x01\x02" * 7)
    with pytest.raises(AblateError, match="unfinished prepare with other arguments.*shard_tokens"):
        prepare("jsonl", out, workers=1, **{**common, "shard_tokens": 999})
    prepare("jsonl", out, workers=1, **common)
    assert folder_bytes(out) == folder_bytes(whole)
    assert len(json.loads((whole / "manifest.json").read_text())["splits"]["train"]["shards"]) > stop_after + 1


def test_worker_processes_do_not_change_the_output(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(400))
    common = dict(path=path, shard_tokens=2500, val_fraction=0.1, progress_bar=False)
    one = prepare("jsonl", tmp_path / "one", workers=1, **common)
    two = prepare("jsonl", tmp_path / "two", workers=2, **common)
    assert folder_bytes(one) == folder_bytes(two)


def test_finished_folder_is_reused_and_never_overwritten(tmp_path, caplog):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(60))
    common = dict(path=path, val_fraction=0.2, workers=1, progress_bar=False)
    out = prepare("jsonl", tmp_path / "out", **common)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with caplog.at_level("INFO"):
        prepare("jsonl", out, **common)
    assert "nothing to do" in caplog.text
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(AblateError, match=r"different prepared dataset \(val_fraction: 0.2 there, 0.3 now\)"):
        prepare("jsonl", out, **{**common, "val_fraction": 0.3})


def test_damaged_shard_is_named_when_opened(tmp_path):
    out = prepare("jsonl", tmp_path / "out", path=write_jsonl(tmp_path / "c.jsonl", make_corpus(100)),
                  shard_tokens=1000, val_fraction=0.2, workers=1, progress_bar=False)
    TokenShards(out)  # intact: opens
    shard = out / "train_000001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(AblateError, match="shard 'train_000001.bin'.*SHA-256"):
        TokenShards(out)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(AblateError, match="shard 'train_000001.bin'.*bytes"):
        TokenShards(out)
    shard.unlink()
    with pytest.raises(AblateError, match="shard 'train_000001.bin'.*missing"):
        TokenShards(out)


# --- bad input ---------------------------------------------------------------------------------


def test_unknown_source_lists_the_valid_ones(tmp_path):
    valid = "fineweb-edu, jsonl, parquet, sample"
    with pytest.raises(AblateError, match=f"unknown source 'fineweb'; valid sources: {valid}"):
        prepare("fineweb", tmp_path / "out")
    with pytest.raises(AblateError, match="source 'jsonl' takes no argument 'colum'; its arguments: path, text_column"):
        prepare("jsonl", tmp_path / "out", path="x.jsonl", colum="text")


def test_missing_text_column_lists_the_columns(tmp_path):
    docs = [{"id": "1", "body": "some text"}]
    pq.write_table(pa.Table.from_pylist(docs), tmp_path / "c.parquet")
    with pytest.raises(AblateError, match=r"no column 'text' \(set by --text-column\).*columns are: id, body"):
        prepare("parquet", tmp_path / "p", path=str(tmp_path / "c.parquet"), progress_bar=False, workers=1)
    with pytest.raises(AblateError, match=r"no column 'content'.*c.jsonl:1.*columns are: id, body"):
        prepare("jsonl", tmp_path / "j", path=write_jsonl(tmp_path / "c.jsonl", docs), text_column="content",
                progress_bar=False, workers=1)
    with pytest.raises(AblateError, match="no column 'text' in parquet files.*columns are: id, body.*FineWeb-Edu"):
        prepare("fineweb-edu", tmp_path / "f", data_files=[str(tmp_path / "c.parquet")], progress_bar=False, workers=1)


def test_empty_corpus_and_missing_files(tmp_path):
    write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"text": None}])
    with pytest.raises(AblateError, match="source 'jsonl'.*no documents with text: the corpus is empty"):
        prepare("jsonl", tmp_path / "out", path=str(tmp_path / "empty.jsonl"), progress_bar=False, workers=1)
    with pytest.raises(AblateError, match="path '.*nothing.jsonl' matches no file"):
        prepare("jsonl", tmp_path / "out2", path=str(tmp_path / "nothing.jsonl"), progress_bar=False, workers=1)


def test_budget_larger_than_the_source_names_both_numbers(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(30))
    expected = r"only [\d,]+ training tokens \(30 documents\) but --tokens asks for 1,000,000"
    with pytest.raises(AblateError, match=expected):
        prepare("jsonl", tmp_path / "out", path=path, tokens=1_000_000, val_fraction=0.2, progress_bar=False, workers=1)


def test_bad_numbers_and_foreign_folders(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", make_corpus(10))
    with pytest.raises(AblateError, match="--val-fraction 1.5 must be between 0 and 1"):
        prepare("jsonl", tmp_path / "a", path=path, val_fraction=1.5)
    with pytest.raises(AblateError, match="--tokens -5 must be a positive"):
        prepare("jsonl", tmp_path / "a", path=path, tokens=-5)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(AblateError, match="non-empty folder that is not a prepared dataset"):
        prepare("jsonl", tmp_path / "busy", path=path)
    with pytest.raises(AblateError, match="no document of the 10 read fell in the validation split"):
        prepare("jsonl", tmp_path / "b", path=path, val_fraction=1e-9, progress_bar=False, workers=1)
    with pytest.raises(AblateError, match="no manifest.json in .*not a prepared data folder"):
        TokenShards(tmp_path / "busy")


def test_cli_prepare_and_info_on_the_shipped_sample(tmp_path, capsys):
    from ablate.cli import main

    out = tmp_path / "sample"
    assert main(["data", "prepare", "--source", "sample", "--out", str(out), "--shard-tokens", "2e5",
                 "--workers", "1", "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["val"]["documents"] == 104
    assert manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"] == 605_356 + 104
    assert main(["data", "info", str(out), "--verify"]) == 0
    assert "every shard matches" in capsys.readouterr().out
    assert main(["data", "prepare", "--source", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "valid sources" in capsys.readouterr().err
    shutil.rmtree(out)


def test_fineweb_edu_without_the_hub_says_what_to_do(tmp_path):
    with pytest.raises(AblateError, match="cannot open HuggingFaceFW/fineweb-edu config 'sample-10BT'.*--source "
                                          "parquet --path"):
        prepare("fineweb-edu", tmp_path / "data" / "out", tokens=1000, progress_bar=False, workers=1)
    assert not (tmp_path / "data").exists()  # nothing left behind
