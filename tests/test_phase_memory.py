"""No phase materialises a micro-batch's logits when a loss chunk is set, and the chunked result is the whole
one to float32 rounding (evaluation, the injection probe, `ablate eval`, every arm); the memory plan covers
every phase and holds against measured CPU peaks (benchmarks/phase_memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

from ablate.arms import list_arms
from ablate.data.tokenizer import VOCAB_SIZE
from ablate.errors import AblateError
from ablate.loop import mean_token_loss
from ablate.model import GPT, GPTConfig
from ablate.sizing import (LOSS_CHUNK, PHASES, loss_chunk_for, memory_estimate_gb, memory_phases_gb,
                           micro_batch_for)
from datafix import REPO

torch.set_num_threads(1)


def small_model(arm: str, vocab: int = 300, seq: int = 24, seed: int = 0) -> GPT:
    model = GPT(GPTConfig(vocab_size=vocab, n_layer=2, n_head=2, d_model=32, max_seq_len=seq, arm=arm))
    model.init_weights(seed)
    return model


class NoWholeLogits:
    """Fails the test if the output layer module runs (the whole-batch path calls `lm_head` on every position)."""

    def __init__(self, model):
        self.handle = model.lm_head.register_forward_hook(self.refuse)

    @staticmethod
    def refuse(module, inputs, output):
        raise AssertionError(f"the whole batch's logits were made: {tuple(output.shape)}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# ---------------------------------------------------------------------------------------------- evaluation
@pytest.mark.unit
@pytest.mark.parametrize("arm", list_arms())
def test_chunked_evaluation_equals_the_whole_one_for_every_arm(arm):
    model = small_model(arm)
    windows = torch.randint(0, 300, (6, 25), generator=torch.Generator().manual_seed(1))
    whole = mean_token_loss(model, windows, micro=4, device="cpu")
    with NoWholeLogits(model):
        chunked = mean_token_loss(model, windows, micro=4, device="cpu", loss_chunk=7)  # chunks cross rows
    assert chunked == pytest.approx(whole, rel=2e-6, abs=0)
    assert model.training  # left in training mode, as before


@pytest.mark.run
def test_a_run_evaluates_with_its_loss_chunk_and_the_cpu_default_stays_whole(monkeypatch, tmp_path, sample_data):
    import ablate.train as train
    from ablate.experiment import RunSpec

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["loss_chunk"])
        return mean_token_loss(*args, **kwargs)

    monkeypatch.setattr(train, "mean_token_loss", spy)
    options = dict(steps=2, val_interval=1, final_val_tokens=64 * 8, progress=False)
    chunked = train.run(RunSpec("t", "smoke", "baseline", 0, {**options, "loss_chunk": 100}), tmp_path / "a",
                        data_dir=str(sample_data))
    assert seen == [100] * 4 and chunked.status == "completed"  # step 0, 1, 2 and the final evaluation
    seen.clear()
    whole = train.run(RunSpec("t", "smoke", "baseline", 0, {**options, "loss_chunk": 0}), tmp_path / "b",
                      data_dir=str(sample_data))
    assert seen == [0] * 4
    assert chunked.val_loss == pytest.approx(whole.val_loss, rel=1e-5)  # training chunked too: rounding only
    assert loss_chunk_for(None, torch.device("cpu")) == 0 and loss_chunk_for(None, "cuda:1") == LOSS_CHUNK
    assert loss_chunk_for(0, "cuda") == 0 and loss_chunk_for(512, "cpu") == 512


# ---------------------------------------------------------------------------------------------- probes
@pytest.mark.unit
@pytest.mark.parametrize("arm", ["baseline", "sink-logit", "g1-elementwise"])
def test_the_injection_probe_chunked_equals_whole(arm):
    from ablate.probes.injection import inject_model

    model = small_model(arm).eval()
    batches = [torch.randint(0, 300, (2, 25), generator=torch.Generator().manual_seed(s)) for s in (2, 3)]
    options = dict(eps=[0.0, 1.0], junk=["random", "gaussian"])
    whole = inject_model(model, batches, loss_chunk=0, **options)
    with NoWholeLogits(model):
        chunked = inject_model(model, batches, loss_chunk=5, **options)
    assert chunked["clean_loss"] == pytest.approx(whole["clean_loss"], rel=2e-6)
    for a, b in zip(whole["rows"], chunked["rows"]):
        assert (a["junk"], a["eps"]) == (b["junk"], b["eps"]) and b["loss"] == pytest.approx(a["loss"], rel=2e-6)


@pytest.mark.unit
def test_the_diagnostics_probe_makes_no_logits():
    from ablate.probes.diagnostics import probe_model

    model = small_model("sink-logit")
    with NoWholeLogits(model):
        probe = probe_model(model, [torch.randint(0, 300, (3, 25))])
    assert probe["n_layer"] == 2


# ---------------------------------------------------------------------------------------------- ablate eval
@pytest.mark.unit
@pytest.mark.parametrize("arm", list_arms())
def test_ablate_eval_scores_chunked_equal_whole_for_every_arm(arm):
    from ablate.evals.lm import AblateLM

    model = small_model(arm, vocab=VOCAB_SIZE, seq=16)
    gen = torch.Generator().manual_seed(4)
    reqs = [(None, torch.randint(0, VOCAB_SIZE, (n,), generator=gen).tolist(),
             torch.randint(0, VOCAB_SIZE, (k,), generator=gen).tolist()) for n, k in ((3, 2), (20, 5), (1, 16), (9, 1))]
    # a greedy continuation too, so that `is greedy` is True somewhere and must agree
    whole_lm = AblateLM(model, batch_size=3, loss_chunk=0)
    with torch.no_grad():
        first = whole_lm.model(torch.tensor([[5, 6, 7]])).logits[0, -1, :VOCAB_SIZE].argmax().item()
    reqs.append((None, [5, 6, 7], [first]))
    whole = whole_lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    chunked_lm = AblateLM(model, batch_size=3, loss_chunk=4)
    with NoWholeLogits(model):
        chunked = chunked_lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert [g for _, g in chunked] == [g for _, g in whole] and whole[-1][1] is True
    for (a, _), (b, _) in zip(whole, chunked):
        assert b == pytest.approx(a, rel=2e-6, abs=1e-5)
    assert AblateLM(model).loss_chunk == 0  # a CPU's default: whole, as before


# ---------------------------------------------------------------------------------------------- the plan
@pytest.mark.unit
def test_every_phase_is_estimated_and_the_micro_batch_fits_them_all():
    phases = memory_phases_gb("10M", 128, loss_chunk=LOSS_CHUNK)
    assert set(phases) == set(PHASES) and memory_estimate_gb("10M", 128, loss_chunk=LOSS_CHUNK) == max(phases.values())
    # the case: the step fits a 40 GB A100 at 128 sequences, the whole-logits evaluation would not
    whole_eval = memory_phases_gb("10M", 128, loss_chunk=0)["evaluation"]
    assert whole_eval > 40 and phases["evaluation"] < phases["train_step"] < 0.9 * 40
    assert micro_batch_for("10M", 40, loss_chunk=LOSS_CHUNK) == 128
    for gb in (24, 40, 80):
        for chunk in (0, LOSS_CHUNK):
            micro = micro_batch_for("10M", gb, loss_chunk=chunk)
            assert all(v <= 0.9 * gb for v in memory_phases_gb("10M", micro, loss_chunk=chunk).values())
    # a huge `ablate eval` batch is the phase that does not fit, and the error says which and the way out
    with pytest.raises(AblateError, match="eval_scoring.*--batch-size"):
        micro_batch_for("10M", 40, loss_chunk=0, eval_batch=4096)


@pytest.mark.system
@pytest.mark.benchmark
def test_the_estimate_bounds_the_measured_cpu_peak_of_every_phase_within_2x():
    """benchmarks/phase_memory.py measures each phase's peak resident memory (VmHWM, reset through
    /proc/self/clear_refs before the phase, over the resident memory then) in its own process."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "phase_memory.py"), "--json", "--chunks", "0", "128"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert {(r["loss_chunk"], r["phase"]) for r in rows} == {(c, p) for c in (0, 128) for p in PHASES}
    for row in rows:
        assert row["measured_mb"] <= row["estimate_mb"] <= 2 * row["measured_mb"], row


@pytest.mark.unit
def test_plan_submit_and_run_agree_on_the_micro_batch_and_the_loss_chunk(tmp_path):
    """One rule (`ablate.sizing.run_micro_batch`): `ablate plan` prints the micro-batch `ablate submit` gives the
    runs on a profile's GPU, and the run sizes its loss with the chunk that micro-batch was sized for; an
    experiment that turns chunking off (loss_chunk: 0) gets a micro-batch sized for the whole loss."""
    from ablate.config import resolve_config
    from ablate.dispatch import gpu_run_options
    from ablate.runconfig import RunOptions
    from ablate.experiment import Experiment
    from ablate.plan import Throughput, plan_grid
    from ablate.profiles import Profile
    from ablate.tiers import get_gpu, get_tier

    profile, tier = Profile("h", gpu="h100", gpus_per_run=1), get_tier("10M")
    sized = {}
    for label, overrides in (("chunked", {}), ("unchunked", {"loss_chunk": 0})):
        experiment = Experiment(name=f"sizing_{label}", tiers=["10M"], arms=["baseline"], seeds=1, overrides=overrides)
        spec = experiment.runs()[0]
        planned = plan_grid(experiment, speed=Throughput("h100"))["tiers"][0]["micro_batch_for_gpu"]
        submitted = gpu_run_options(RunOptions(), spec, tier, profile).micro_batch
        config = resolve_config(spec, data_dir=str(tmp_path), micro_batch=submitted).to_dict()
        chunk = loss_chunk_for(config["loss_chunk"], "cuda")
        assert planned == submitted == config["micro_batch"], label
        assert chunk == (LOSS_CHUNK if label == "chunked" else 0)
        assert memory_estimate_gb("10M", submitted, loss_chunk=chunk) <= 0.9 * get_gpu("h100").memory_gb
        sized[label] = submitted
    assert sized["unchunked"] < sized["chunked"]  # the whole loss needs room: sized for it, not for chunks
    # an experiment's own micro-batch wins everywhere
    fixed = Experiment(name="sizing_fixed", tiers=["10M"], arms=["baseline"], seeds=1, overrides={"micro_batch": 8})
    assert plan_grid(fixed, speed=Throughput("h100"))["tiers"][0]["micro_batch_for_gpu"] == 8
    assert gpu_run_options(RunOptions(), fixed.runs()[0], tier, profile).micro_batch == 8
