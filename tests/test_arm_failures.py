"""Every failure of a user's arm is one line naming the arm, the slot or hook and what was expected against what came:
a wrong shape where the method returns, a syntax or import error in its file (FILE:LINE: message), a non-finite
value (the first layer and slot or hook that made it, found by replaying from the last checkpoint with the checks
on, writing nothing). `ablate run` on a run that diverges exits 3; the traceback stays one flag away."""

import json
import re

import pytest
import torch

from ablate.arms import ArmContext, attention
from ablate.arms.base import Arm, AttentionContext
from ablate.arms.checks import ArmOutputError
from ablate.store import run_dir
from tests.datafix import ablate_cli

B, H, T, D = 2, 2, 5, 4
CTX = ArmContext(n_head=H, n_kv_head=H, head_dim=D, d_model=H * D, n_layer=2, layer=1)


class WideGate(Arm):
    name = "wide-gate"

    def value_gate(self, v, x):
        return torch.ones(v.shape[:3])  # (B, H_kv, T): the trailing 1 forgotten


class GateRouting(Arm):
    name = "bad-routing"

    def routing_log_gate(self, v, x):
        return torch.zeros(*v.shape[:3], 1)


class MatrixSink(Arm):
    name = "bad-sink"

    def sink_logit(self):
        return torch.zeros(H, 2)


class TokenOutputGate(Arm):
    name = "bad-output"

    def output_gate(self, o, x):
        return torch.ones(o.shape[0], o.shape[2], o.shape[1], 1)  # (B, T, H, 1): heads and positions swapped


class QueryOnly(Arm):
    name = "bad-query-key"

    def query_key(self, q, k):
        return q


class BiasPerPosition(Arm):
    name = "bad-bias"

    def score_bias(self, query_pos, key_pos):
        return torch.zeros(len(query_pos), len(key_pos), H)


class RowNormaliser(Arm):
    name = "bad-normaliser"

    def normalise(self, logits, context):
        return torch.softmax(logits, dim=-1)[..., 0]


class FlatOverride(Arm):
    name = "bad-override"

    def attend(self, q, k, v, context, core):
        return core(q, k, v).transpose(1, 2)  # (B, T, H, d): the model wants (B, H, T, d)


CASES = [
    (WideGate, "value slot value_gate(v, x)", "(2, 2, 5)", "(B, H_kv, T, 1) or (B, H_kv, T, d)"),
    (GateRouting, "routing slot routing_log_gate(v, x)", "(2, 2, 5, 1)", "log g (B, H_kv, T) = (2, 2, 5)"),
    (MatrixSink, "denominator slot sink_logit()", "(2, 2)", "b (H,) = (2,)"),
    (TokenOutputGate, "output slot output_gate(o, x)", "(2, 5, 2, 1)", "broadcastable to (2, 2, 5, 4)"),
    (QueryOnly, "query-key slot query_key(q, k)", "Tensor", "a pair (q, k)"),
    (BiasPerPosition, "score-bias slot score_bias(query_pos, key_pos)", "(5, 5, 2)", "(H, T_q, T_k)"),
    (RowNormaliser, "normaliser hook normalise(logits, context)", "(2, 2, 5)", "weights p (B, H, T_q, T_k)"),
    (FlatOverride, "override hook attend(q, k, v, context, core)", "(2, 5, 2, 4)", "(B, H, T_q, d_v)"),
]


@pytest.mark.unit
@pytest.mark.parametrize("cls, where, got, expected", CASES, ids=[c[0].name for c in CASES])
def test_a_wrong_shape_is_one_line_naming_the_arm_slot_and_both_shapes(cls, where, got, expected):
    torch.manual_seed(0)
    q, k, v, x = torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, H, T, D), torch.randn(B, T, H * D)
    arm = cls(CTX)
    with pytest.raises(ArmOutputError) as refusal:
        if cls is QueryOnly:
            from ablate.arms import checks

            checks.pair(arm, arm.query_key(q, k), q, k)
        else:
            attention(arm, q, k, v, x, context=AttentionContext.full(x) if arm.hooks() else None)
    message = str(refusal.value)
    assert "\n" not in message and f"arm {cls.name!r}, layer 1, {where} returned" in message
    assert got in message and expected in message and "docs/arms.md" in message


BAD_GATE = '''import torch
from ablate.arms import Arm, register_arm


@register_arm("my-flat-gate")
class FlatGate(Arm):
    def value_gate(self, v, x):
        return torch.sigmoid(v.mean(-1))  # (B, H_kv, T): no trailing 1
'''


@pytest.mark.run
def test_run_of_an_arm_of_the_wrong_shape_ends_in_one_line(tmp_path, sample_data):
    arm_file = tmp_path / "flat.py"
    arm_file.write_text(BAD_GATE)
    result = ablate_cli("run", "--tier", "smoke", "--arm", "my-flat-gate", "--arm-file", arm_file, "--max-steps", 2,
                        "--data", sample_data, "--results", tmp_path / "results", "--no-progress", "--threads", 1,
                        check=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len([e for e in errors if "ablate: error:" in e]) == 1
    # refused before training, by the check's fast part on the check's small model, in the same words
    assert "fails the check before training" in errors[-1] and not (tmp_path / "results").exists()
    assert re.search(r"arm 'my-flat-gate', layer 0, value slot value_gate\(v, x\) returned \(2, 2, \d+\); expected a "
                     r"gate \(B, H_kv, T, 1\) or \(B, H_kv, T, d\), broadcastable to \(2, 2, \d+, 8\)", errors[-1])


@pytest.mark.unit
@pytest.mark.parametrize("source, line, message", [
    ("import torch\n\nclass Broken(:\n    pass\n", 3, "SyntaxError: invalid syntax"),
    ("import torch\n\nx = undefined_name + 1\n", 3, "NameError: name 'undefined_name' is not defined"),
    ("import torch\nimport no_such_module_here\n", 2, "cannot import 'no_such_module_here'"),
], ids=["syntax", "name", "import"])
def test_an_arm_file_that_does_not_load_is_file_line_message(tmp_path, source, line, message):
    arm_file = tmp_path / "arms_of_mine.py"
    arm_file.write_text(source)
    result = ablate_cli("arms", "--arm-file", arm_file, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert error.startswith(f"ablate: error: {arm_file}:{line}: ") and message in error


NAN_ARM = '''import torch
from ablate.arms import Arm, register_arm


@register_arm("my-late-nan")
class LateNan(Arm):
    """A value gate of one half that turns to NaN in layer 1 from the {after}th training forward on: the count is
    a buffer, so the checkpoint holds it and the replay meets the NaN where the run did."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.register_buffer("forwards", torch.zeros((), dtype=torch.long))

    def value_gate(self, v, x):
        gate = torch.full_like(v[..., :1], 0.5)
        if self.training and torch.is_grad_enabled():
            self.forwards += 1
            if self.ctx.layer == 1 and int(self.forwards) > {after}:
                return gate * float("nan")
        return gate
'''


@pytest.mark.run
def test_a_diverging_arm_exits_3_naming_the_layer_and_slot_found_from_the_last_checkpoint(tmp_path, sample_data):
    arm_file = tmp_path / "late_nan.py"
    arm_file.write_text(NAN_ARM.replace("{after}", "3"))  # NaN at step 4, the checkpoint at step 2
    results = tmp_path / "results"
    argv = ["run", "--tier", "smoke", "--arm", "my-late-nan", "--arm-file", arm_file, "--max-steps", 6,
            "--checkpoint-interval", 2, "--data", sample_data, "--results", results, "--no-progress", "--threads", 1]
    result = ablate_cli(*argv, check=False)
    assert result.returncode == 3, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("ablate: run diverged:")]
    assert "non-finite training loss nan at step 4" in line
    assert ("first non-finite value at step 4: arm 'my-late-nan', layer 1, value slot value_gate(v, x) returned nan"
            in line and "replayed steps 3–4 from the last checkpoint" in line)
    folder = run_dir(results, "adhoc", "smoke", "my-late-nan", 0)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_step"] == 4 and "layer 1" in summary["error"]
    assert "exit status: 0 completed, 3 diverged" in " ".join(ablate_cli("run", "--help").stdout.split())


@pytest.mark.run
def test_the_replay_writes_nothing_and_says_when_it_does_not_reproduce(tmp_path, finished_runs):
    from ablate.replay import first_non_finite
    from ablate.runconfig import RunConfig

    results = finished_runs(tmp_path, ("baseline", 0))
    folder = run_dir(results, "study", "smoke", "baseline", 0)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    config = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    origin = first_non_finite(config, folder / "checkpoints" / "state.pt", 3)
    assert not origin.found and origin.text == ("not reproduced: replayed steps 1–3 from the initial weights with "
                                                "checks on, every value finite")
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


TYPO_ARM = '''from ablate.arms import Arm, register_arm


@register_arm("my-typo")
class Typo(Arm):
    def output_gate(self, o, x):
        return self.gate_weight * o if str(o.dtype) != "torch.float64" else o.new_ones(())  # in training only
'''


@pytest.mark.run
def test_an_arm_that_raises_is_one_line_where_it_arose_and_the_traceback_one_flag_away(tmp_path, sample_data):
    arm_file = tmp_path / "typo.py"
    arm_file.write_text(TYPO_ARM)
    results = tmp_path / "results"
    argv = ["run", "--tier", "smoke", "--arm", "my-typo", "--arm-file", arm_file, "--max-steps", 2, "--data",
            sample_data, "--results", results, "--no-progress", "--threads", 1]
    result = ablate_cli(*argv, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("ablate: error:")]
    log = run_dir(results, "adhoc", "smoke", "my-typo", 0) / "run.log"
    assert f"AttributeError: 'Typo' object has no attribute 'gate_weight' (at {arm_file}:7)" in line
    assert f"the full traceback: {log}" in line and "`ablate --traceback run …`" in line
    assert "Traceback (most recent call last)" in log.read_text() and f'"{arm_file}", line 7' in log.read_text()
    shown = ablate_cli("--traceback", *argv, "--force", check=False)
    assert shown.returncode == 1 and "Traceback (most recent call last)" in shown.stderr


@pytest.mark.unit
def test_a_slurm_task_whose_run_diverged_ends_its_job_well_and_a_failed_one_fails_it(monkeypatch):
    import ablate.train
    from ablate.experiment import RunSpec
    from ablate.runconfig import RunOptions
    from ablate.store_summary import RunSummary
    from ablate.workers import RunJob

    job, spec = RunJob(None, "results", RunOptions()), RunSpec("e", "smoke", "baseline", 0)
    monkeypatch.setattr(ablate.train, "run_as", lambda *a, **k: (RunSummary(status="diverged", error="nan"), False))
    assert job(spec).status == "diverged"  # the job ends well: `ablate status` shows the run diverged
    monkeypatch.setattr(ablate.train, "run_as", lambda *a, **k: (RunSummary(status="failed", error="boom"), False))
    with pytest.raises(RuntimeError, match="boom"):
        job(spec)


@pytest.mark.run
def test_a_task_run_warns_nothing(tmp_path):
    """`make demo`'s testbed part ended on torch's `UserWarning: Initializing zero-element tensors is a no-op` (the
    task model has no MLP: width 0); a task run now warns nothing."""
    import warnings

    from ablate.experiment import RunSpec
    from ablate.train import run

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = run(RunSpec("t", "abstain-stream", "baseline", 0, {"steps": 2}), tmp_path, progress=False)
    assert summary.status == "completed"


@pytest.mark.run
def test_a_task_run_that_diverges_names_the_layer_and_slot_of_its_first_non_finite_value(tmp_path):
    """The testbed's runs keep no checkpoint: the replay starts from the initial weights (milliseconds a step)."""
    from ablate.arms.base import _REGISTRY, register_arm
    from ablate.experiment import RunSpec
    from ablate.train import run

    @register_arm("test-task-nan")
    class TaskNan(Arm):
        def __init__(self, ctx):
            super().__init__(ctx)
            self.register_buffer("forwards", torch.zeros((), dtype=torch.long))

        def value_gate(self, v, x):
            if self.training and torch.is_grad_enabled():
                self.forwards += 1
                if int(self.forwards) > 2:
                    return torch.full_like(v[..., :1], float("nan"))
            return torch.ones_like(v[..., :1])

    try:
        summary = run(RunSpec("t", "abstain-stream", "test-task-nan", 0, {"steps": 6}), tmp_path, progress=False)
    finally:
        _REGISTRY.pop("test-task-nan")
    assert summary.status == "diverged" and summary.diverged_step == 3
    assert ("first non-finite value at step 3: arm 'test-task-nan', layer 0, value slot value_gate(v, x) returned "
            "nan (first non-finite value) (replayed steps 1–3 from the initial weights with checks on)"
            in summary.error)


@pytest.mark.system
def test_the_testbed_command_shows_a_failed_arm_in_one_line(tmp_path):
    arm_file = tmp_path / "flat.py"
    arm_file.write_text(BAD_GATE.replace("        return torch.sigmoid(v.mean(-1))",
                                         "        if v.dtype == torch.float64:  # the check before training passes\n"
                                         "            return torch.sigmoid(v[..., :1])\n"
                                         "        return torch.sigmoid(v.mean(-1))"))
    result = ablate_cli("testbed", "--arm", "my-flat-gate", "--arm-file", arm_file, "--tier", "abstain-stream",
                        "--steps", 2, "--seed-count", 1, "--parallel", 1, "--results", tmp_path / "r", check=False)
    assert result.returncode == 1, result.stderr
    assert ("  abstain-stream/my-flat-gate/seed0: arm 'my-flat-gate', layer 0, value slot value_gate(v, x) returned "
            in result.stdout), result.stdout


@pytest.mark.unit
def test_the_arm_check_names_a_wrong_shape_the_same_way(tmp_path):
    arm_file = tmp_path / "flat.py"
    arm_file.write_text(BAD_GATE)
    result = ablate_cli("arms", "--check", "my-flat-gate", "--arm-file", arm_file, check=False)
    assert result.returncode == 1
    attention = next(line for line in result.stdout.splitlines() if "fails    attention:" in line)
    assert "arm 'my-flat-gate', layer 0, value slot value_gate(v, x) returned (2, 2, 11); expected a gate" in attention
