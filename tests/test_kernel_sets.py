"""The recorded smoke run replayed under every CPU kernel set this machine offers, each in a process of its own:
the machine's own set in the test's process (what a run gets with no ATEN_CPU_CAPABILITY), every other set in a
fresh one (torch reads ATEN_CPU_CAPABILITY once, at import).

A bitwise claim holds within one kernel set on one machine kind: the machine's own set replays the record bit
for bit (`test_cpu_results_are_bitwise_those_of_the_recorded_run`). Across kernel sets the same run rounds
differently, and the drift grows with the steps. The next test bounds it: every
kernel set's losses lie within CROSS_KERNEL_BOUND of every other's and of every recorded entry (other machine
kinds included), so a change that breaks one kernel set shows on a machine that runs another. It may skip a
kernel set only where the CPU lacks it; default and avx2 always run on x86-64.
"""

from __future__ import annotations

import itertools
import json
import platform

import pytest
import torch

from datafix import REPO
from kernel_replay import (FINGERPRINTS, kernel_sets_offered, machine_kind, recorded_numbers, replay_here,
                           replay_in_subprocess)

# Max |Δ loss| over the 30 recorded steps and the final validation loss, between any two kernel sets or
# machine kinds: measured 2.5e-3 (docs/method.md, "Numerics"); the bound leaves 4× for other CPUs.
CROSS_KERNEL_BOUND = 1e-2


def _losses(numbers: dict) -> list[float]:
    return numbers["train_loss"] + [numbers["val_loss"]]


def max_difference(a: dict, b: dict) -> float:
    """Largest |Δ| between two replays' per-arm train losses and final validation losses."""
    return max(abs(x - y) for arm in a for x, y in zip(_losses(a[arm]), _losses(b[arm]), strict=True))


@pytest.fixture(scope="module")
def replays(sample_data, tmp_path_factory):
    """Per kernel set offered, the replay's numbers: this process's own set replayed here (starting Python and torch
    again would cost seconds and give the same numbers), each other set in a process of its own."""
    work = tmp_path_factory.mktemp("replays")
    here = torch.backends.cpu.get_cpu_capability().lower()
    return {kernel_set: replay_here(sample_data, work) if kernel_set == here else
            replay_in_subprocess(kernel_set, sample_data, work) for kernel_set in kernel_sets_offered()}


@pytest.mark.unit
def test_this_machine_offers_default_and_avx2():
    if platform.machine() in ("x86_64", "AMD64"):  # every x86-64 CPU torch supports has AVX2
        assert {"default", "avx2"} <= set(kernel_sets_offered())


@pytest.mark.system
def test_cpu_results_are_bitwise_those_of_the_recorded_run(replays):
    """The loop reads losses back in batches now (for GPUs); on the CPU every number must stay as recorded: each
    kernel set's replay that the record holds for this machine kind (the machine's own, what a run gets with no
    ATEN_CPU_CAPABILITY, among them) gives, per arm, every recorded number bit for bit (losses, gradient norms,
    curve, validation loss, fingerprints). Bitwise within one kernel set only; the test below bounds how far the
    sets drift apart."""
    native = torch.backends.cpu.get_cpu_capability()
    assert native.lower() in replays, (native, sorted(replays))
    recorded = {kernel_set: recorded_numbers(result["kernel_set"]) for kernel_set, result in replays.items()}
    if recorded[native.lower()] is None:  # another machine kind: the test below still bounds its numbers
        pytest.skip(f"no recorded numbers for kernel set {native} on {machine_kind()}; record them with "
                    "`.venv/bin/python tests/kernel_replay.py --record DATA_DIR`")
    for kernel_set, entry in recorded.items():
        for arm, expected in (entry or {"runs": {}})["runs"].items():
            assert {k: replays[kernel_set]["runs"][arm][k] for k in expected} == expected, (kernel_set, arm)


@pytest.mark.unit
@pytest.mark.slow
def test_every_kernel_set_replays_the_record_within_the_bound(replays):
    recorded = json.loads((REPO / "tests" / "recorded_smoke_run.json").read_text())
    for kernel_set, result in replays.items():
        assert result["kernel_set"] == kernel_set.upper() and result["threads"] == 1, result  # the set asked for ran
        for numbers in result["runs"].values():
            assert numbers["summary_kernel_set"] == kernel_set.upper()  # and the run's summary names it
    for (one, a), (other, b) in itertools.combinations(replays.items(), 2):
        # what a run is does not depend on the kernels that ran it; but the initial weights do, in their last bits,
        # between the scalar (default) and the vectorised (avx2, avx512) normal_ fill, and init_fingerprint says so
        same = [k for k in FINGERPRINTS if k != "init_fingerprint" or "default" not in (one, other)]
        for arm in a["runs"]:
            assert {k: a["runs"][arm][k] for k in same} == {k: b["runs"][arm][k] for k in same}, (one, other, arm)
        assert max_difference(a["runs"], b["runs"]) <= CROSS_KERNEL_BOUND, (one, other)
    entries = [entry for kinds in recorded["kernel_sets"].values() for entry in kinds.values()]
    for result, entry in itertools.product(replays.values(), entries):
        assert max_difference(result["runs"], entry["runs"]) <= CROSS_KERNEL_BOUND, (result["kernel_set"], entry["cpu"])
