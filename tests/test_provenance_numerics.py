"""Runs record what made their numbers (kernel set, CPU, BLAS build, threads, GPU), and tables say when one row
mixes runs made on different kernel sets or devices. Provenance is execution, not identity: no fingerprint."""

from __future__ import annotations

import json
import types

import torch

from analysis_fixtures import write_store
from ablate import provenance
from ablate.analysis.build import build_table
from ablate.analysis.load import load_runs
from ablate.analysis.numerics import MIXED_NUMERICS, numerics_label
from ablate.analysis.render import render
from ablate.analysis.report import write_report
from ablate.analysis.tables import losses_table
from ablate.experiment import results_of
from ablate.provenance import build_libraries, versions
from datafix import ablate_cli
import pytest

pytestmark = pytest.mark.unit

SHOW = """PyTorch built with:
  - GCC 11.2
  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64 architecture applications
  - Intel(R) MKL-DNN v3.12.0 (Git Hash 1234)
  - OpenMP 201511 (a.k.a. OpenMP 4.5)
  - CPU capability usage: AVX512
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl, USE_MKL=ON, USE_MKLDNN=ON, USE_OPENMP=ON,
"""


def test_versions_name_the_kernel_set_cpu_blas_and_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        found = versions()["numerics"]
    finally:
        torch.set_num_threads(threads)
    assert found["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and found["threads"] == 1
    assert found["cpu_model"] and found["machine"] and found["build"]  # this wheel names its BLAS
    assert (found["gpu"] is None) == (not torch.cuda.is_available())
    assert json.loads(json.dumps(found)) == found  # it goes into summary.json as it is


def test_build_report_is_parsed_to_what_matters():
    assert build_libraries(SHOW) == {"mkl": "2024.2-Product", "onednn": "3.12.0", "openmp": "201511",
                                     "blas_info": "mkl", "lapack_info": "mkl", "use_mkl": "ON", "use_mkldnn": "ON",
                                     "use_openmp": "ON"}
    assert build_libraries("PyTorch built with:\n  - GCC 9\n") == {}  # another build: only what is there


def _fake_cuda(nccl):
    """A torch whose CUDA calls answer like an H100 node's; `nccl` is what torch.cuda.nccl.version does."""
    cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda i: "NVIDIA H100 80GB HBM3",
                                 get_device_capability=lambda i: (9, 0), device_count=lambda: 4,
                                 nccl=types.SimpleNamespace(version=nccl))
    return types.SimpleNamespace(cuda=cuda, backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(
        version=lambda: 90100)))


def test_cuda_branch_names_device_capability_cudnn_and_nccl():
    gpu = provenance.gpu(_fake_cuda(lambda: (2, 21, 5)))
    assert gpu == {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "count": 4, "cudnn": 90100, "nccl": "2.21.5"}

    def no_nccl():
        raise RuntimeError("torch was built without NCCL")

    assert provenance.gpu(_fake_cuda(no_nccl))["nccl"] is None  # what it cannot read is None, the run goes on
    assert numerics_label({"numerics": {"cpu_capability": "AVX2", "gpu": gpu}}) == "cuda NVIDIA H100 80GB HBM3 (sm 9.0)"
    assert numerics_label({"numerics": {"cpu_capability": "AVX2", "gpu": None}}) == "cpu AVX2"
    assert numerics_label({}) is None and numerics_label(None) is None  # an older run records none


def _numerics(kernel_set: str) -> dict:
    return {"versions": {"numerics": {"cpu_capability": kernel_set, "gpu": None}}}


def _mixed_store(tmp_path):
    """10M: baseline and sink-logit on AVX2 but sink-logit seed 2 on AVX512; off-by-one all on AVX2."""
    arms = ("baseline", "sink-logit", "off-by-one")
    store = write_store(tmp_path, losses={("10M", arm, s): 7.6 - 0.01 * k + 0.001 * s for k, arm in enumerate(arms)
                                          for s in range(3)}, curve_points=2)
    for arm, seed in (("baseline", 0), ("baseline", 1), ("baseline", 2), ("sink-logit", 0), ("sink-logit", 1),
                      ("off-by-one", 0), ("off-by-one", 1), ("off-by-one", 2)):
        path = store / "10M" / arm / f"seed{seed}" / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **_numerics("AVX2")}))
    path = store / "10M" / "sink-logit" / "seed2" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **_numerics("AVX512")}))
    return store


def test_a_row_that_mixes_kernel_sets_says_so_beside_it(tmp_path):
    runs = load_runs(_mixed_store(tmp_path))  # allowed: the pairing holds
    table = build_table(runs, "paired")
    marks = dict(zip(table.frame["arm"], table.frame["marks"]))
    assert marks == {"sink-logit": MIXED_NUMERICS, "off-by-one": None}
    assert "mixed-numerics 10M/sink-logit: cpu AVX2 ×5, cpu AVX512 ×1" in table.notes
    md = render(table, "md")
    assert md.count(MIXED_NUMERICS) >= 2 and "different CPU kernel sets or devices" in md
    losses = losses_table(runs)
    assert dict(zip(losses.frame["arm"], losses.frame["marks"])) == {"baseline": None, "sink-logit": MIXED_NUMERICS,
                                                                      "off-by-one": None}
    printed = ablate_cli("table", tmp_path / "study", "--kind", "paired").stdout
    assert "mixed-numerics" in printed and "cpu AVX2 ×5, cpu AVX512 ×1" in printed


def test_the_report_states_a_mixed_row(tmp_path):
    _mixed_store(tmp_path)
    report = write_report(results_of("study", results=tmp_path))
    assert "mixed-numerics" in (report / "paired.md").read_text()


def test_one_kernel_set_marks_nothing(tmp_path):
    store = _mixed_store(tmp_path)
    path = store / "10M" / "sink-logit" / "seed2" / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **_numerics("AVX2")}))
    runs = load_runs(store)
    for table in (build_table(runs, "paired"), losses_table(runs)):
        assert table.frame["marks"].drop_nulls().is_empty() and not any(MIXED_NUMERICS in n for n in table.notes)
