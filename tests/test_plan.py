"""`ablate plan` and `ablate arms` with experiments, seeds, parameter matching and a profile's GPU."""

import json
import textwrap

import pytest

from ablate.cli import main
from ablate.errors import AblateError
from ablate.plan import ASSUMED_MFU, plan_grid, throughput
from ablate.tiers import get_gpu

pytestmark = pytest.mark.unit

CUSTOM = textwrap.dedent("""
    import torch
    from torch import nn
    from ablate.arms import Arm, register_arm
    from ablate.experiment import Experiment

    @register_arm("plan-test-arm")
    class PlanTestArm(Arm):
        description = "a value gate with one scalar per layer (test)"
        def __init__(self, ctx):
            super().__init__(ctx)
            self.scale = nn.Parameter(torch.empty(1))
        def init_parameter(self, name, param, generator):
            param.fill_(4.0)
        def value_gate(self, v, x):
            return torch.sigmoid(self.scale).expand(v.shape[:-1] + (1,))

    EXPERIMENT = Experiment(name="plan_test", tiers=("smoke", "10M"), arms=("baseline", "plan-test-arm"),
                            seeds={"smoke": 2, "10M": 3})
""")


def cli_json(capsys, *args):
    assert main([*map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_prices_an_experiments_grid(capsys):
    plan = cli_json(capsys, "plan", "sink_vs_filter")
    assert plan["experiment"] == "sink_vs_filter" and plan["total_runs"] == 90
    by_tier = {t["tier"]: t for t in plan["tiers"]}
    assert list(by_tier) == ["10M", "50M", "124M", "350M"]
    assert by_tier["124M"]["total_runs"] == 27 and by_tier["350M"]["total_runs"] == 9  # 9 arms × 3, × 1
    assert {r["arm"] for r in plan["runs"]} == {"baseline", "sink-logit", "off-by-one", "sink-token", "norm-gate",
                                               "proj-gate", "renorm", "combo", "combo2"}
    # --seeds means seed indices, as in `submit`; --seed-count is the count
    assert cli_json(capsys, "plan", "sink_vs_filter", "--seeds", "0")["total_runs"] == 36
    assert cli_json(capsys, "plan", "sink_vs_filter", "--tier", "124M", "--seed-count", "2")["total_runs"] == 18


def test_plan_without_an_experiment_and_bad_seeds(capsys):
    plan = cli_json(capsys, "plan", "--tier", "smoke", "124M", "--arms", "baseline", "combo2", "--seed-count", "2")
    assert plan["total_runs"] == 8 and [t["tier"] for t in plan["tiers"]] == ["smoke", "124M"]
    assert main(["plan", "--tier", "smoke", "--seeds", "0"]) == 2
    assert "--seeds takes seed indices of an experiment" in capsys.readouterr().err
    assert main(["plan", "demo", "--seeds", "5"]) == 2
    assert "seed 5 is not in tier 'smoke'" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "give an experiment or --tier" in capsys.readouterr().err


def test_custom_arm_experiment_in_arms_and_plan(tmp_path, capsys):
    path = tmp_path / "plan_test.py"
    path.write_text(CUSTOM)
    assert main(["arms", str(path), "--d-model", "64", "--n-head", "2"]) == 0
    out = capsys.readouterr().out
    assert "experiment plan_test: 2 arms" in out and "plan-test-arm" in out and "sink-logit" not in out
    rows = cli_json(capsys, "arms", path)  # one row per (tier, arm): counted at the experiment's tiers
    assert [(r["tier"], r["arm"]) for r in rows] == [("smoke", "baseline"), ("smoke", "plan-test-arm"),
                                                     ("10M", "baseline"), ("10M", "plan-test-arm")]
    assert rows[1]["extra_params_per_layer"] == 1 and rows[3]["extra_params_total"] == 8  # one per layer, 8 layers
    plan = cli_json(capsys, "plan", path)  # the same file loaded again in this process
    assert plan["total_runs"] == 2 * 2 + 2 * 3
    assert {(r["tier"], r["arm"], r["params_arm_extra"]) for r in plan["runs"]} >= {("10M", "plan-test-arm", 8)}


def test_plan_match_params_shows_matched_counts_and_widths(capsys):
    plan = cli_json(capsys, "plan", "gated_attention", "--tier", "124M", "--match-params")
    rows = {r["arm"]: r for r in plan["runs"]}
    assert plan["tiers"][0]["match_params"] is True
    assert rows["g2-value"]["mlp_hidden"] == rows["g1-elementwise"]["mlp_hidden"] == 2688
    assert rows["baseline"]["mlp_hidden"] == rows["g1-headwise"]["mlp_hidden"] == 3072
    for row in rows.values():
        assert abs(row["params_vs_baseline"]) <= 0.005
    assert cli_json(capsys, "plan", "gated_attention", "--tier", "124M")["tiers"][0]["match_params"] is True  # as run
    unmatched = {r["arm"]: r for r in cli_json(capsys, "plan", "gated_attention", "--tier", "124M",
                                                "--no-match-params")["runs"]}
    assert unmatched["g2-value"]["params_vs_baseline"] > 0.08 and unmatched["g2-value"]["mlp_hidden"] == 3072


def test_plan_uses_the_profiles_gpu(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no gpu_check.json here
    profile = tmp_path / "a100box.toml"
    profile.write_text('partition = "gpu"\ngpus_per_run = 1\ngpu = "a100"\n')
    h100 = cli_json(capsys, "plan", "--tier", "50M", "--arms", "baseline")
    a100 = cli_json(capsys, "plan", "--tier", "50M", "--arms", "baseline", "--profile", profile)
    assert h100["gpu"] == "h100" and a100["gpu"] == "a100" and "NVIDIA A100 40GB" in a100["assumption"]
    assert a100["total_gpu_hours"] == pytest.approx(h100["total_gpu_hours"] * 989 / 312)
    # the micro-batch the run gets on that GPU, its loss chunked as a GPU's run chunks it (ablate.sizing)
    assert a100["tiers"][0]["micro_batch_for_gpu"] == 32 and h100["tiers"][0]["micro_batch_for_gpu"] == 128
    h200 = cli_json(capsys, "plan", "--tier", "10M", "--arms", "baseline", "--profile", profile, "--gpu", "h200")
    assert h200["gpu"] == "h200"  # --gpu wins over the profile
    profile.write_text('gpu = "v100"\n')
    assert main(["plan", "--tier", "10M", "--profile", str(profile)]) == 2
    assert "unknown gpu 'v100'; valid gpus: a100, a100-80, h100, h200" in capsys.readouterr().err


def test_plan_uses_a_measured_mfu_for_its_gpu_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert throughput("h100").mfu == ASSUMED_MFU
    (tmp_path / "gpu_check.json").write_text(json.dumps({"gpu_key": "h100", "device": "NVIDIA H100 80GB HBM3",
                                                         "plan_mfu": 0.5}))
    measured = throughput("h100")
    assert measured.mfu == 0.5 and "measured by gpu_check" in measured.mfu_source
    assert throughput("a100").mfu == ASSUMED_MFU  # measured on another GPU: not used
    plan = plan_grid(tiers=["10M"], arms=["baseline"], speed=measured)
    assumed = plan_grid(tiers=["10M"], arms=["baseline"], speed=throughput("a100"))
    assert plan["total_gpu_hours"] == pytest.approx(
        assumed["total_gpu_hours"] * get_gpu("a100").peak_bf16_tflops * ASSUMED_MFU / (989 * 0.5))
    with pytest.raises(AblateError, match="--gpu-check absent.json: no such file"):
        throughput("h100", "absent.json")
