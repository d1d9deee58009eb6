"""The GPU-only branches of a run, run on the CPU.

* `host_sync` "log" (the GPU's read-back every log_interval steps) gives the metrics of "step", catches a
  divergence at the next boundary, and never changes pairing;
* `precision` "bf16-mixed" (the GPU's autocast) on the CPU: every arm's loss and signals within a stated
  tolerance of float32, a smoke run completes, and precision is part of the config fingerprint;
* the input path: the pinned, non-blocking copy's branch, and the data fingerprint hashed off the step's
  critical path with the same value.

What is not tested here, for want of a GPU: that `pin_memory` and a non-blocking copy really happen on CUDA
(the branch is driven with a stand-in for `pin`), and bf16 kernels of CUDA (CPU autocast runs CPU kernels).
"""

import dataclasses
import hashlib
import json
import threading

import numpy as np
import pytest
import torch
from lightning_fabric import Fabric

import ablate.loop as loop
import ablate.train as train_module
from ablate.arms import get_arm
from ablate.arms.base import ArmContext
from ablate.arms.kernel import attention
from ablate.arms.names import BUILTIN_ARMS
from ablate.config import resolve_config, with_device_defaults
from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.identity import config_fingerprint, config_differences
from ablate.model import GPT, GPTConfig
from ablate.sizing import model_config
from ablate.store import read_json, read_metrics, run_dir
from ablate.train import run

torch.set_num_threads(1)

# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ≈ 0.2%); the stated tolerances of bf16 autocast
# against float32, at the smoke shape after a few steps of training:
LOSS_TOLERANCE = 0.02  # nats (the loss is ~10: 0.2%); measured ≤ 0.003
SIGNAL_TOLERANCE = {"phantom_mass": 0.01, "value_gate": 0.05, "routing_log_gate": 0.05, "output_gate": 0.05}
ATTENTION_TOLERANCE = 0.03  # max |o_bf16 − o_float32| of the fused kernel / max |o|; measured ≤ 0.015
UNTIMED = ("time", "tokens_per_s")  # what differs between two runs of the same numbers


def train(results, arm="baseline", steps=12, data=None, overrides=None, **options):
    spec = RunSpec("adhoc", "smoke", arm, 0, {"max_steps": steps, **(overrides or {})})
    return run(spec, results, data_dir=str(data), progress=False, **options)


def rows_of(results, arm="baseline"):
    return [{k: v for k, v in row.items() if k not in UNTIMED}
            for row in read_metrics(run_dir(results, "adhoc", "smoke", arm, 0) / "metrics.jsonl")]


# ---------------------------------------------------------------------------------------------- host_sync
@pytest.mark.run
def test_host_sync_log_gives_the_numbers_of_step_and_pairs_with_it(tmp_path, sample_data, monkeypatch):
    copies = []
    monkeypatch.setattr(train_module, "copy_in", lambda batch, device: copies.append(batch.shape) or batch)
    watched = {"log_interval": 5, "checkpoint_interval": 7}  # boundaries that fall apart from the steps
    short = {"val_tokens": 512, "final_val_tokens": 512}  # the same shorter evaluations in both runs
    every = train(tmp_path / "step", data=sample_data, overrides=short, host_sync="step", **watched)
    batched = train(tmp_path / "log", data=sample_data, overrides=short, host_sync="log", **watched)
    assert every.status == batched.status == "completed"
    assert (every.loss_read_every, batched.loss_read_every) == (1, 5)
    assert rows_of(tmp_path / "step") == rows_of(tmp_path / "log")  # every train_loss, grad_norm, lr, val_loss
    assert len([r for r in rows_of(tmp_path / "log") if "train_loss" in r]) == 12
    for key in ("val_loss", "data_fingerprint", "init_fingerprint", "val_fingerprint", "config_fingerprint"):
        assert getattr(every, key) == getattr(batched, key), key
    assert len(copies) == 24  # every step's batch went through copy_in, in both runs
    configs = [read_json(run_dir(tmp_path / r, "adhoc", "smoke", "baseline", 0) / "config.json")
               for r in ("step", "log")]
    assert [c["host_sync"] for c in configs] == ["step", "log"]  # written into config.json
    assert config_differences(*configs) == []  # they pair


@pytest.mark.run
@pytest.mark.parametrize("host_sync", ["step", "log"])
def test_a_diverging_run_ends_diverged_naming_its_step_and_when_it_was_seen(tmp_path, sample_data, host_sync):
    blow_up = {"lr": 1e9, "grad_clip": 1e30, "warmup_steps": 1}
    summary = train(tmp_path, data=sample_data, steps=20, overrides=blow_up, host_sync=host_sync, log_interval=5)
    assert summary.status == "diverged" and summary.val_loss is None and "non-finite" in summary.error
    step, seen = summary.diverged_step, summary.diverged_detected_at_step
    assert 1 <= step <= 20
    if host_sync == "step":
        assert seen == step
    else:  # read back at the next multiple of log_interval (20 is also the last step, evaluated)
        assert seen == -(-step // 5) * 5
    rows = [r for r in rows_of(tmp_path) if "train_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, step))  # the finite steps before it are all written


@pytest.mark.run
def test_diverged_step_is_the_same_under_both_read_backs(tmp_path, sample_data):
    blow_up = {"lr": 1e9, "grad_clip": 1e30, "warmup_steps": 1}
    steps = [train(tmp_path / s, data=sample_data, steps=20, overrides=blow_up, host_sync=s, log_interval=7)
             for s in ("step", "log")]
    assert steps[0].diverged_step == steps[1].diverged_step
    assert steps[0].diverged_detected_at_step <= steps[1].diverged_detected_at_step


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.unit
def test_bad_precision_or_host_sync_is_one_line_naming_the_valid_values():
    with pytest.raises(AblateError, match="'precision' must be one of 32-true, bf16-mixed, not 'fp8'"):
        resolve_config(RunSpec("adhoc", "smoke", "baseline", 0), precision="fp8")
    with pytest.raises(AblateError, match="'host_sync' must be one of step, log, not 'never'"):
        resolve_config(RunSpec("adhoc", "smoke", "baseline", 0), host_sync="never")


@pytest.mark.unit
def test_device_defaults_and_what_enters_the_config_fingerprint():
    config = resolve_config(RunSpec("adhoc", "smoke", "baseline", 0)).to_dict()
    assert (config["precision"], config["host_sync"]) == (None, None)  # "the device's", filled in by the run
    cpu, cuda = with_device_defaults(config, cuda=False), with_device_defaults(config, cuda=True)
    assert (cpu["precision"], cpu["host_sync"]) == ("32-true", "step")
    assert (cuda["precision"], cuda["host_sync"]) == ("bf16-mixed", "log")
    assert with_device_defaults({**config, "precision": "32-true"}, cuda=True)["precision"] == "32-true"  # chosen
    # precision changes the numbers: part of the fingerprint; host_sync does not: never part of it
    assert config_fingerprint(cpu) != config_fingerprint({**cpu, "precision": "bf16-mixed"})
    assert config_fingerprint(cpu) == config_fingerprint({**cpu, "host_sync": "log"})
    assert config_differences(cpu, {**cpu, "precision": "bf16-mixed"}) == [("precision", "32-true", "bf16-mixed")]
    # a config.json written before the options existed (float32, every step) keeps its fingerprint
    old = {k: v for k, v in cpu.items() if k not in ("precision", "host_sync")}
    assert config_fingerprint(old) == config_fingerprint(cpu) and config_differences(old, cpu) == []


@pytest.mark.run
def test_a_run_recorded_before_the_options_existed_reruns_as_a_no_op(tmp_path, sample_data):
    first = train(tmp_path, data=sample_data, steps=2)
    path = run_dir(tmp_path, "adhoc", "smoke", "baseline", 0) / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in config.items() if k not in ("precision", "host_sync")}))
    assert train(tmp_path, data=sample_data, steps=2) == first  # not "a different config"
    assert train(tmp_path, data=sample_data, steps=2, host_sync="log") == first  # how it is read: may differ
    with pytest.raises(AblateError, match="differs in: precision"):
        train(tmp_path, data=sample_data, steps=2, precision="bf16-mixed")


# ---------------------------------------------------------------------------------------------- bf16
def _trained(arm: str) -> tuple[GPT, torch.Tensor]:
    """A smoke-shape model a few float32 steps away from its init (arm parameters moved off theirs)."""
    config = dataclasses.asdict(model_config("smoke", arm))
    config["max_seq_len"] = 64
    model = GPT(GPTConfig(**config))
    model.init_weights(0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if model.is_arm_parameter(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.5)
    batch = torch.randint(0, 50257, (4, 65), generator=gen)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(6):
        model(batch[:, :-1], batch[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, batch


@pytest.fixture(scope="module")
def bf16():
    return Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")  # what a run at bf16-mixed uses


@pytest.mark.unit
@pytest.mark.parametrize("arm", BUILTIN_ARMS)
def test_bf16_autocast_stays_within_tolerance_of_float32_for_every_arm(arm, bf16):
    model, batch = _trained(arm)
    with torch.no_grad():
        loss32 = model(batch[:, :-1], batch[:, 1:]).loss
        records32 = model(batch[:, :-1], record=True, head=False).records  # the layers' signals: no output layer
        with bf16.autocast():
            out = model(batch[:, :-1], batch[:, 1:])
            records16 = model(batch[:, :-1], record=True, head=False).records
    assert out.logits.dtype == torch.bfloat16  # the mixed-precision path was taken, not float32 again
    assert loss32.item() < 10.5 and abs(out.loss.item() - loss32.item()) <= LOSS_TOLERANCE
    compared = 0
    for layer32, layer16 in zip(records32, records16):
        for key, tolerance in SIGNAL_TOLERANCE.items():
            a, b = getattr(layer32, key), getattr(layer16, key)
            assert (a is None) == (b is None), key
            if a is not None:
                compared += 1
                assert (a.float() - b.float()).abs().max().item() <= tolerance, (arm, key)
    assert compared > 0 or arm in ("baseline", "sink-token")  # the arms without a per-key or per-head signal


@pytest.mark.unit
@pytest.mark.parametrize("arm", BUILTIN_ARMS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fused_kernel_in_bf16_is_as_close_to_float32_as_bf16_itself(arm, seed, bf16):
    """The fused path (for the sink and renorm arms: the extra head dimensions, a phantom key and log-gate
    columns) under bf16 autocast against the float32 reference path: within ATTENTION_TOLERANCE of the
    output's range, and no further from it than the reference path computed in bf16 (the construction adds
    no error of its own). Gate and sink parameters ~N(0, 1): log-gates down to about −8."""
    torch.manual_seed(seed)
    ctx = ArmContext(n_head=4, n_kv_head=2, head_dim=16, d_model=64, n_layer=2, layer=0)
    module = get_arm(arm)(ctx)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape))
    q, k, v = torch.randn(2, 4, 48, 16), torch.randn(2, 2, 48, 16), torch.randn(2, 2, 48, 16)
    x = torch.randn(2, 48, 64)
    half = [t.bfloat16() for t in (q, k, v, x)]  # what the model's projections hand over under autocast
    with torch.no_grad():
        reference, _ = attention(module, q, k, v, x, fused=False)
        with bf16.autocast():
            fused, _ = attention(module, *half, fused=True)
            reference16, _ = attention(module, *half, fused=False)
    assert fused.dtype == torch.bfloat16
    error = (fused.float() - reference).abs().max().item()
    error16 = (reference16.float() - reference).abs().max().item()
    assert error <= ATTENTION_TOLERANCE * reference.abs().max().item()
    assert error <= 1.5 * error16 + 0.005


@pytest.mark.run
def test_a_smoke_run_at_bf16_completes_and_does_not_pair_with_float32(tmp_path, sample_data):
    short = {"val_tokens": 512, "final_val_tokens": 512}  # 512 tokens a validation: a bf16 evaluation on a CPU is slow
    half = train(tmp_path / "bf16", "combo", steps=6, data=sample_data, overrides=short, precision="bf16-mixed")
    full = train(tmp_path / "fp32", "combo", steps=6, data=sample_data, overrides=short)
    assert half.status == full.status == "completed"
    assert half.config_fingerprint != full.config_fingerprint
    losses = [[r["train_loss"] for r in rows_of(tmp_path / p, "combo") if "train_loss" in r] for p in ("bf16", "fp32")]
    assert losses[0] != losses[1]  # other numbers …
    assert max(abs(a - b) for a, b in zip(*losses)) <= 5 * LOSS_TOLERANCE  # … close to float32's (6 steps on)
    assert abs(half.val_loss - full.val_loss) <= 5 * LOSS_TOLERANCE
    assert (read_json(run_dir(tmp_path / "bf16", "adhoc", "smoke", "combo", 0) / "config.json")["precision"]
            == "bf16-mixed")


# ---------------------------------------------------------------------------------------------- input path
class _Pinned:
    """Stands for a pinned tensor: records the copy asked of it."""

    def __init__(self, batch):
        self.batch, self.copied = batch, None

    def to(self, device, non_blocking=False):
        self.copied = (torch.device(device).type, non_blocking)
        return self


@pytest.mark.unit
def test_to_a_cuda_device_the_batch_is_pinned_and_copied_without_blocking():
    batch, pinned = torch.arange(6).view(2, 3), []
    result = loop.copy_in(batch, torch.device("cuda"), pin=lambda t: pinned.append(_Pinned(t)) or pinned[-1])
    assert result is pinned[0] and result.batch is batch and result.copied == ("cuda", True)


@pytest.mark.unit
def test_to_the_cpu_the_batch_is_itself_and_never_pinned():
    batch = torch.arange(6).view(2, 3)

    def refuse(t):
        raise AssertionError("pinned on the CPU path")

    assert loop.copy_in(batch, torch.device("cpu"), pin=refuse) is batch
    assert loop.copy_in(batch, "cpu", pin=refuse) is batch


def _batches(n=5):
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.integers(0, 50257, (8, 33), dtype=np.uint16).astype(np.int64)) for _ in range(n)]


@pytest.mark.unit
def test_the_background_fingerprint_is_the_inline_one():
    start = hashlib.sha256(b"ablate-data").hexdigest()
    inline, background = start, loop.DataFingerprint(start)
    for batch in _batches():
        inline = hashlib.sha256(inline.encode() + batch.numpy().tobytes()).hexdigest()  # what the loop did before
        background.add(batch)
    assert background.value == inline
    state = loop.RunState(torch.nn.Linear(1, 1), stream=None, init_fingerprint="")
    for batch in _batches():
        state.data.add(batch)
    assert state.data_fp == inline  # what a checkpoint and the summary record
    state.data_fp = start  # a resume sets it
    assert state.data_fp == start


@pytest.mark.unit
def test_the_step_does_not_wait_for_the_hash(monkeypatch):
    release, calls = threading.Event(), []

    def slow_chain(previous, batch):
        calls.append(threading.current_thread().name)
        release.wait(30)
        return previous + "+"

    monkeypatch.setattr(loop, "chain_fingerprint", slow_chain)
    fingerprint = loop.DataFingerprint("fp")
    fingerprint.add(_batches(1)[0])  # returns while the hash is still running
    fingerprint.add(_batches(1)[0])
    assert not release.is_set()
    release.set()
    assert fingerprint.value == "fp++" and calls == ["data-fingerprint"] * 2


@pytest.mark.unit
def test_a_failed_hash_is_raised_where_the_fingerprint_is_read(monkeypatch):
    monkeypatch.setattr(loop, "chain_fingerprint", lambda previous, batch: 1 / 0)
    fingerprint = loop.DataFingerprint("fp")
    fingerprint.add(_batches(1)[0])
    with pytest.raises(ZeroDivisionError):
        fingerprint.value  # noqa: B018
