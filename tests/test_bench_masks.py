"""benchmarks/masks.py at a tiny shape, so it cannot rot (a benchmark: its figures are not checked here, only that every
variant is timed on the path it names, its documents are there, and its memory worker measures)."""

import json
import sys

import pytest

from ablate.data.documents import document_ids
from datafix import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import masks  # noqa: E402

pytestmark = pytest.mark.benchmark


@pytest.mark.run
def test_every_variant_is_timed_against_the_baseline_on_its_path(tmp_path, capsys):
    assert masks.main(["--quick", "--no-memory", "--json", str(tmp_path / "out.json")]) == 0
    shape = json.loads((tmp_path / "out.json").read_text())["shapes"][0]
    labels = [v.label for v in masks.VARIANTS]
    assert list(shape["timing"]) == labels and all(row["median_ms"] > 0 for row in shape["timing"].values())
    assert shape["timing"]["baseline"]["ratio"] == 1.0
    out = capsys.readouterr().out
    for row in ("| baseline | fused |", "| sliding-window | fused + boolean mask |", "| stick-breaking | reference |",
                "| selective | reference |", "| baseline --document-mask | fused + boolean mask |"):
        assert row in out


@pytest.mark.run
def test_the_documents_and_the_memory_worker():
    idx, _ = masks.documents_batch(2, 32, 50304)
    assert document_ids(idx)[:, -1].tolist() == [4, 4]  # four end-of-text tokens: four documents a row
    measured = masks.memory_worker(["smoke", "baseline", "1", "1", "32"])
    assert measured["label"] == "baseline --document-mask" and measured["peak_growth_mib"] >= 0
