"""benchmarks/gpu_check.py in its CPU mode: the GPU script's code runs on every test run, so it cannot rot; the
parts that only a GPU runs are held where a CPU can hold them (the run configuration it sizes, the scoring
without lm-eval, the arms the flex section finds, the budget, and writing a GPU run's figures where they go)."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from ablate.arms import Arm, get_arm, list_arms, study_arms
from ablate.arms.names import BUILTIN_ARMS
from ablate.plan import throughput
from ablate.sizing import LOSS_CHUNK, USABLE_FRACTION, memory_phases_gb, run_micro_batch
from datafix import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_apply  # noqa: E402
import gpu_arms  # noqa: E402
import gpu_flex  # noqa: E402
import gpu_long  # noqa: E402
import gpu_report  # noqa: E402
import phase_memory  # noqa: E402

SCRIPT = str(REPO / "benchmarks" / "gpu_check.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
pytestmark = pytest.mark.benchmark  # every test here holds a benchmarks/ script


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU run of every section (aot_eager: dynamo and AOT autograd trace the model as on a GPU; inductor's
    C++ build takes minutes on CPU)."""
    folder = tmp_path_factory.mktemp("gpu_check")
    out = folder / "gpu_check.json"
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--warmup", "1", "--timed", "1", "--long-s", "0.3",
           "--compile-backend", "aot_eager", "--ddp", "--flex-arms", "sink-logit", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600, cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout


@pytest.mark.system
def test_gpu_check_runs_on_cpu_and_writes_its_report(cpu_run):
    report, stdout = cpu_run
    arms = report["arms"]["arms"]
    assert set(BUILTIN_ARMS) <= set(arms) and set(arms) <= set(list_arms())
    for arm, row in arms.items():
        # bf16 fused path vs float32 reference: bf16 rounding of logits of order 1; float32 fused: the kernel only
        assert row["accuracy"]["max_abs_logit_error"] < 0.05, arm
        assert row["accuracy"]["max_abs_logit_error_fp32_fused"] < 1e-5, arm
        assert abs(row["accuracy"]["loss_bf16_fused"] - row["accuracy"]["loss_fp32_reference"]) < 0.01, arm
        assert row["backend"]["fused_kernel_used"], (arm, row["backend"])
        assert row["speed"]["tokens_per_s"] > 0 and row["speed"]["mfu"] is None  # no GPU: no peak, no MFU
        assert row["speed_fp32"]["step_s"] > 0 and row["speed_fp32"]["bf16_speedup"] > 0
    assert arms["baseline"]["speed"]["step_ratio_to_baseline"] == 1
    assert report["ddp"]["gradients_match"] and report["ddp"]["world_size"] == 2
    # nothing measured on a GPU: no MFU for `ablate plan`, no goal judged; nothing failed
    assert report["gpu_key"] is None and report["plan_mfu"] is None and report["errors"] == [] and report["ok"]
    goals = report["goals"]
    assert goals["compiled_faster"] is None and set(goals["baseline_mfu_at_least_45pct"].values()) == {None}
    assert "|Δlogit| bf16" in stdout and "ddp: 2 processes (gloo)" in stdout
    # every phase inside its memory plan: on CPU at a reduced smoke shape, measured host peaks within their estimates
    phases = report["phases"]
    assert phases["all_fit"] and list(phases["tiers"]) == ["smoke-reduced"]
    row = phases["tiers"]["smoke-reduced"]
    assert row["micro_batch"] == 4 and row["loss_chunk"] == 128
    assert set(row["phases"]) == {"train_step", "evaluation", "final_evaluation", "eval_scoring"}
    for name, phase in row["phases"].items():
        assert 0 < phase["measured_gb"] <= phase["estimate_gb"] and phase["fits"], (name, phase)
    assert "memory smoke-reduced: micro-batch 4, train_step" in stdout
    for name in gpu_check_sections():
        assert report[name]["seconds"] >= 0, name


def gpu_check_sections():
    return ("hardware", "phases", "arms", "flex", "long", "ddp")


@pytest.mark.system
def test_the_long_section_trains_both_arms_eager_and_compiled_to_the_same_loss(cpu_run):
    report, stdout = cpu_run
    long = report["long"]
    assert long["micro_batch"] == 2 and long["global_batch"] == 4 and long["loss_chunk"] == gpu_long.TINY_CHUNK
    for arm in ("baseline", "sink-logit"):
        for mode in ("eager", "compiled"):
            run = long["runs"][arm][mode]
            assert run["timed_steps"] >= gpu_long.MIN_STEPS and run["steps"] == len(run["losses"]), (arm, mode)
            assert run["tokens_per_s"] > 0 and run["mfu"] is None
        assert long["runs"][arm]["compiled"]["graphs_compiled"] == 1  # one compilation, no recompile at step 2
        # same weights, same batches: the compiled (chunked, checkpointed) loss curve is the eager one
        compiled = long["compile"][arm]
        assert compiled["same_loss_to_bf16"] and compiled["steps_compared"] >= gpu_long.MIN_STEPS, compiled
    assert set(long["step_ratio_to_baseline"]["sink-logit"]) == {"eager", "compiled"}
    assert report["goals"]["compiled_same_loss"] is True
    assert "compile baseline: max loss difference" in stdout


@pytest.mark.system
def test_the_flex_section_holds_a_named_arm_to_the_reference(cpu_run):
    report, stdout = cpu_run
    row = report["flex"]["arms"]["sink-logit"]
    assert row["why"] == "named by --flex-arms" and row["paths"]["agree"]
    assert row["paths"]["max_relative_logit_error"] < 1e-5 and row["paths"]["max_relative_gradient_error"] < 1e-4
    assert row["paths"]["gradients_missing_on_one_path"] == [] and row["speed"]["step_ratio_to_baseline"] > 0
    assert report["goals"]["flex_paths_agree"]["sink-logit"] is True and "flex sink-logit" in stdout
    # and the registered hook arms, found by what they say, each through its own path against the reference
    assert {arm for arm, agree in report["goals"]["flex_paths_agree"].items() if agree} >= {
        "softcap", "sigmoid", "forgetting", "ssmax"}


@pytest.mark.unit
def test_the_flex_section_selects_arms_by_their_path():
    """An arm is checked through flex when its own path on CUDA is flex (`Arm.path`): a score modifier, a normaliser
    with a log-weight, a mask; not a normaliser without one (reference there), nor the study's arms (fused)."""

    class ScoreModifier(Arm):
        def score_modifier(self, context):
            return lambda score, b, h, q_idx, kv_idx: score

    class RowNormaliser(Arm):
        def normalise(self, logits, context):
            return torch.softmax(logits, -1)

    class Window(Arm):
        def mask_modifier(self, context):
            return lambda b, h, q_idx, kv_idx: q_idx - kv_idx < 4

    class Plain(Arm):
        def output_gate(self, o, x):
            return torch.ones_like(o)

    found = gpu_flex.flex_candidates({"s": ScoreModifier, "n": RowNormaliser, "w": Window, "p": Plain}, ["extra"])
    assert found == {"s": "path flex on CUDA", "w": "path flex on CUDA", "extra": "named by --flex-arms"}
    assert gpu_flex.flex_candidates({name: gpu_flex.get_arm(name) for name in study_arms()
                                     if gpu_flex.get_arm(name).__module__.startswith("ablate.")}) == {}
    hook_examples = {name: gpu_flex.get_arm(name) for name in ("softcap", "sigmoid", "forgetting", "ssmax", "diff",
                                                               "sliding-window", "stick-breaking")}
    assert set(gpu_flex.flex_candidates(hook_examples)) == {"softcap", "sigmoid", "forgetting", "ssmax",
                                                            "sliding-window"}


@pytest.mark.unit
def test_the_long_section_sizes_the_124M_run_as_plan_and_submit_do():
    """On an H200 (141 GB in the table) the long runs take the micro-batch `ablate plan` prints, the GPU's loss
    chunk, and the training step's estimate as the plan to hold their peak against (no GPU needed to size)."""
    shp = gpu_arms.shape(False)
    conf = gpu_long.configuration(shp, torch.device("cuda"), 141.0, tiny=False)
    assert conf["micro_batch"] == run_micro_batch("124M", 141.0, {}) and conf["loss_chunk"] == LOSS_CHUNK
    assert conf["tier"].global_batch % conf["micro_batch"] == 0
    assert conf["estimate_gb"] == memory_phases_gb("124M", conf["micro_batch"], loss_chunk=LOSS_CHUNK)["train_step"]
    assert conf["estimate_gb"] <= USABLE_FRACTION * 141.0


@pytest.mark.unit
def test_the_long_runs_share_the_time_left_and_drop_compilations_that_cannot_fit():
    order = [("baseline", "eager"), ("sink-logit", "eager"), ("baseline", "compiled"), ("sink-logit", "compiled")]
    assert gpu_long.run_window(order, 600.0, 40.0, 75.0) == (40.0, 600.0)  # time enough: the full window each
    assert gpu_long.run_window(order, 200.0, 40.0, 75.0) == ((200.0 - 150.0) / 4, 200.0)  # shortened alike
    assert gpu_long.run_window(order, 100.0, 40.0, 75.0) == (40.0, 100.0)  # no compilation fits: eager ones only
    assert gpu_long.run_window(order[2:], 60.0, 40.0, 75.0) == (None, 60.0)  # a compilation that cannot finish
    assert gpu_long.run_window(order, -1.0, 40.0, 75.0) == (None, -1.0)


@pytest.mark.unit
def test_a_long_run_out_of_memory_runs_again_at_half_the_micro_batch(monkeypatch):
    def fake_run(arm, mode, conf, shp, device, *args):
        if conf["micro_batch"] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"step_s": 1.0}

    monkeypatch.setattr(gpu_long, "timed_run", fake_run)
    conf = gpu_long.configuration(gpu_arms.shape(False), torch.device("cuda"), 141.0, tiny=False)
    conf["micro_batch"] = 4
    row = gpu_long.run_or_halve("baseline", "eager", conf, {}, torch.device("cpu"))
    assert row == {"step_s": 1.0, "out_of_memory_at_micro_batch": 4} and conf["micro_batch"] == 2
    assert conf["estimate_gb"] == memory_phases_gb("124M", 2, loss_chunk=LOSS_CHUNK)["train_step"]
    row = gpu_long.run_or_halve("baseline", "eager", {**conf, "micro_batch": 8}, {}, torch.device("cpu"))
    assert row["error"].startswith("OutOfMemoryError at micro-batch 4") and row["out_of_memory_at_micro_batch"] == 8


@pytest.mark.unit
def test_scoring_without_lm_eval_is_ablate_lm_scoring(monkeypatch):
    """The GPU machine lacks lm-eval: the phases section then scores with `score_windows`, which gives the
    scores `AblateLM` gives for the same requests."""
    from ablate.evals.lm import AblateLM
    from ablate.model import GPT
    from ablate.sizing import model_config

    torch.manual_seed(0)
    model = GPT(model_config("smoke", "sink-logit"))
    model.init_weights(0)
    windows = torch.randint(0, 50257, (3, 65), generator=torch.Generator().manual_seed(0))
    lm = AblateLM(model, batch_size=3, loss_chunk=32)
    expected = [s for s, _ in lm._loglikelihood_tokens([(None, w[:1].tolist(), w[1:].tolist()) for w in windows],
                                                       disable_tqdm=True)]
    assert gpu_close(phase_memory.score_windows(model, windows, 32), expected)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails as where it is not installed
    monkeypatch.delitem(sys.modules, "ablate.evals.lm")
    scoring, scored_by = phase_memory.eval_scoring(model, windows, 3, "cpu", 32)
    assert scored_by.startswith("score_windows") and gpu_close(scoring(), expected)


def gpu_close(a, b) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b))


@pytest.mark.system
def test_the_budget_shortens_or_skips_sections_and_says_so(tmp_path):
    out = tmp_path / "gpu_check.json"
    t0 = time.perf_counter()
    cmd = [SCRIPT, "--device", "cpu", "--tiny", "--budget-s", "1", "--sections", "hardware", "arms", "long",
           "--out", str(out)]
    result = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {row["skipped"] for row in report["arms"]["arms"].values()} == {"the arms' share of the budget ran out"}
    assert all("left for" in run["skipped"] for modes in report["long"]["runs"].values() for run in modes.values())
    # 12 arms, 4 long runs, and so 2 eager-against-compiled comparisons skipped; the sections not asked for not run
    package_study_arms = [a for a in study_arms() if get_arm(a).__module__.startswith("ablate.")]  # a test's own
    assert len(report["skipped"]) == len(package_study_arms) + 4 + 2 and "phases" not in report  # arm: not there
    assert report["plan_mfu"] is None and "skipped long.runs.baseline.eager" in result.stdout
    assert time.perf_counter() - t0 < 120


@pytest.mark.unit
def test_a_section_s_parts_are_saved_as_they_come(tmp_path):
    """Within the long sections the report is written after each part, marked partial, so that a run stopped by
    its timeout still brings back what it measured; the section's end replaces it whole."""
    import gpu_check

    out, report = tmp_path / "gpu_check.json", {"gpu_key": None}
    save_partial = gpu_check.saver(report, "long", out)
    save_partial({"runs": {"baseline": {"eager": {"step_s": 1.0}}}})
    written = json.loads(out.read_text())
    assert written["long"]["partial"] is True and written["long"]["runs"]["baseline"]["eager"]["step_s"] == 1.0
    gpu_check.run_section(report, "long", lambda: {"runs": {}}, out)
    assert "partial" not in json.loads(out.read_text())["long"]


def gpu_like(report: dict, peak_scale: float = 1.0) -> dict:
    """The CPU run's report as a GPU run of the table would write it (the figures are the CPU's, MFU over the
    H200's peak times `peak_scale`): what gpu_apply reads."""
    report = json.loads(json.dumps(report))
    report.update(gpu_key="h200", device="NVIDIA H200", peak_bf16_tflops=989.0 * peak_scale)
    gpu_long.add_judgements(report["long"], ["baseline", "sink-logit"], ["eager", "compiled"], 989.0 * peak_scale)
    gpu_report.finish(report)
    return report


@pytest.mark.system
def test_gpu_apply_puts_the_figures_where_plan_and_the_docs_read_them(cpu_run, tmp_path):
    report = gpu_like(cpu_run[0])
    benchmarks, plan_file = tmp_path / "BENCHMARKS.md", tmp_path / "gpu_check.json"
    original = (REPO / "BENCHMARKS.md").read_text()
    benchmarks.write_text(original)
    gpu_apply.apply(report, benchmarks, plan_file)
    measured = throughput("h200", plan_file)
    assert measured.mfu == report["plan_mfu"] and 0 < report["plan_mfu"] <= 1
    assert measured.mfu_source == f"measured by gpu_check on NVIDIA H200, {plan_file}"
    assert throughput("h100", plan_file).mfu != report["plan_mfu"]  # measured on another GPU: not used there
    text = benchmarks.read_text()
    assert "not run on a GPU yet" not in text and "**On a GPU: pending.**" not in text
    assert f"{gpu_apply.HEADING} — measured on NVIDIA H200" in text
    eager = report["long"]["runs"]["baseline"]["eager"]
    assert f"| baseline | eager | {eager['timed_steps']} | {eager['step_s']:.3f} |" in text
    assert "| smoke-reduced | 4 | train_step |" in text and "\nGoal figures: baseline at the 124M shape" in text
    assert text.count(gpu_apply.MARKS["figures"][0]) == 1 and text.count(gpu_apply.MARKS["phases"][0]) == 1
    # the rest of BENCHMARKS.md is untouched
    assert text.split(gpu_apply.HEADING)[0] == original.split(gpu_apply.HEADING)[0]
    gpu_apply.apply(report, benchmarks, plan_file)  # the same run again: the same files
    assert benchmarks.read_text() == text
    other = gpu_like(cpu_run[0], 0.5)
    with pytest.raises(gpu_apply.ApplyError, match="exists with other content; pass --force"):
        gpu_apply.apply(other, benchmarks, plan_file)
    assert benchmarks.read_text() == text  # refused: nothing written
    gpu_apply.apply(other, benchmarks, plan_file, force=True)
    assert throughput("h200", plan_file).mfu == other["plan_mfu"] and benchmarks.read_text().count("<!-- gpu") == 4
    with pytest.raises(gpu_apply.ApplyError, match="is not a GPU of ablate.tiers.GPUS"):
        gpu_apply.apply(cpu_run[0], benchmarks, plan_file, force=True)


@pytest.mark.unit
def test_gpu_check_fails_a_phase_that_does_not_fit():
    """The judge marks (and the script exits 1 on) a phase that ran out of memory, exceeded its estimate, or
    whose estimate is above 90% of the GPU; a tier that fits no micro-batch fails too."""

    def tiers(measured, estimate, error=None):
        row = {"phases": {"train_step": {"measured_gb": measured, "estimate_gb": estimate}}}
        return {"10M": {**row, **({"error": error} if error else {})}}

    assert phase_memory.judge(tiers(30.0, 35.0), 40.0)
    for bad, gpu in ((tiers(36.0, 35.0), 40.0), (tiers(None, 35.0), 40.0), (tiers(30.0, 37.0), 40.0),
                     (tiers(36.0, 35.0), None)):
        assert not phase_memory.judge(bad, gpu) and not bad["10M"]["phases"]["train_step"]["fits"]
    assert not phase_memory.judge({"350M": {"error": "does not fit", "phases": {}}}, 4.0)
