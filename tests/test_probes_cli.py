"""probe.json / inject.json in run folders, the CLI on hand-built runs, and the report summaries."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest
import torch

from ablate.cli import main
from ablate.model import GPT, GPTConfig
from ablate.modelio import save_model
from ablate.analysis.probes import summarise_injections, summarise_probes
from ablate.probes.diagnostics import HEATMAP_FILE, PROBE_FILE, probe_run
from ablate.probes.injection import INJECT_FILE, Sweep, inject_run
from ablate.data.synthetic import SYNTHETIC_KEY, SyntheticTask
from ablate.store import atomic_write_json

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
TASK = SyntheticTask()


def make_run(root, arm: str, seed: int, tier: str = "tiny", synthetic: bool = True):
    """A run folder as training leaves it: config.json and checkpoints/model.pt (an untrained model)."""
    run_dir = root / tier / arm / f"seed{seed}"
    config = GPTConfig(vocab_size=TASK.vocab_size, n_layer=2, n_head=2, d_model=32, max_seq_len=TASK.seq_len, arm=arm)
    model = GPT(config)
    model.init_weights(seed)
    if arm == "proj-gate":
        with torch.no_grad():
            for block in model.blocks:
                block.attn.arm.gate_w.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    save_model(model, run_dir / "checkpoints" / "model.pt")
    extra = {SYNTHETIC_KEY: asdict(TASK)} if synthetic else {"data_dir": str(root / "data"), "seq_len": TASK.seq_len}
    atomic_write_json(run_dir / "config.json", {"tier": tier, "arm": arm, "seed": seed, "model": asdict(config),
                                                **extra})
    return run_dir


def test_cli_probe_writes_probe_json_and_heatmap(tmp_path, capsys):
    run_dir = make_run(tmp_path, "sink-logit", 3)
    assert main(["probe", str(run_dir), "--batches", "2", "--batch-size", "4", "--device", "cpu"]) == 0
    probe = json.loads((run_dir / PROBE_FILE).read_text())
    assert probe["run"] == {"tier": "tiny", "arm": "sink-logit", "seed": 3}
    assert probe["n_batches"] == 2 and probe["batch_size"] == 4
    assert len(probe["layers"]) == 2 and probe["summary"]["phantom_mass"] > 0
    assert (run_dir / HEATMAP_FILE).stat().st_size > 1000
    assert "first-key mass per head" in capsys.readouterr().out


def test_cli_inject_prints_a_table_and_merges_cutoffs(tmp_path, capsys):
    run_dir = make_run(tmp_path, "proj-gate", 0)
    args = ["inject", str(run_dir), "--eps", "0,0.8", "--junk", "structural,gate-direction", "--batches", "2",
            "--batch-size", "4", "--device", "cpu"]
    assert main(args + ["--cutoff", "p25"]) == 0
    out = capsys.readouterr().out
    assert "| structural |" in out and "ε=0.8" in out and "| gate-direction |" in out
    assert main(args + ["--cutoff", "median"]) == 0
    data = json.loads((run_dir / INJECT_FILE).read_text())
    assert set(data["by_cutoff"]) == {"p25", "median"}
    rows = data["by_cutoff"]["median"]["rows"]
    assert [row["increase"] for row in rows if row["eps"] == 0.0] == [0.0, 0.0]


def test_probe_and_inject_say_a_pipeline_check_carries_no_evidence_in_output_and_json(tmp_path, capsys):
    common = ["--batches", "1", "--batch-size", "2", "--device", "cpu"]
    for tier, said in (("smoke", True), ("10M", False)):
        run_dir = make_run(tmp_path, "proj-gate", 0, tier=tier)
        assert main(["probe", str(run_dir), *common]) == 0
        probe_out = capsys.readouterr().out
        assert main(["inject", str(run_dir), "--eps", "0.8", "--junk", "structural", *common]) == 0
        inject_out = capsys.readouterr().out
        probe = json.loads((run_dir / PROBE_FILE).read_text())
        injected = json.loads((run_dir / INJECT_FILE).read_text())
        notes = [probe["evidence"], injected["evidence"], injected["by_cutoff"]["p25"]["evidence"]]
        if said:
            assert all(n.startswith("pipeline check: no evidence (smoke is smaller") for n in notes), notes
            assert probe_out.startswith("pipeline check: no evidence") and inject_out.startswith(
                "pipeline check: no evidence")
        else:
            assert notes == [None, None, None] and "pipeline check" not in probe_out + inject_out


def test_cli_errors_name_the_bad_value(tmp_path, capsys):
    run_dir = make_run(tmp_path, "baseline", 0)
    assert main(["inject", str(run_dir), "--cutoff", "p10", "--device", "cpu", "--batches", "1"]) == 2
    assert "valid cutoffs: median, p25" in capsys.readouterr().err
    assert main(["inject", str(run_dir), "--eps", "a,b", "--device", "cpu"]) == 2
    assert "--eps 'a,b'" in capsys.readouterr().err
    assert main(["probe", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_corpus_runs_take_their_validation_batches_from_ablate_data(tmp_path, monkeypatch):
    import ablate.modelio

    calls = []

    def fake_validation_batches(data_dir, seq_len, batch_size, max_batches):
        calls.append((data_dir, seq_len, batch_size, max_batches))
        gen = torch.Generator().manual_seed(0)
        full = [torch.randint(TASK.vocab_size, (batch_size, seq_len + 1), generator=gen) for _ in range(max_batches)]
        return full + [full[0][:1]]  # a short last batch is dropped

    monkeypatch.setattr(ablate.modelio, "validation_batches", fake_validation_batches)
    run_dir = make_run(tmp_path, "baseline", 1, synthetic=False)
    probe = probe_run(run_dir, n_batches=2, batch_size=3)
    assert calls == [(str(tmp_path / "data"), TASK.seq_len, 3, 2)]
    assert probe["n_batches"] == 2 and probe["batch_size"] == 3


def test_summaries_by_tier_and_arm_across_seeds(tmp_path):
    assert summarise_probes(tmp_path) == "" and summarise_injections(tmp_path) == ""
    for arm in ("baseline", "sink-logit"):
        for seed in (0, 1):
            run_dir = make_run(tmp_path, arm, seed)
            probe_run(run_dir, n_batches=1, batch_size=4)
            inject_run(run_dir, Sweep("p25", (0.4,), ("structural", "gate-direction")), n_batches=1, batch_size=4)
    probes = summarise_probes(tmp_path)
    lines = probes.splitlines()
    assert lines[0].startswith("| tier | arm | seeds | first-key mass")
    assert "phantom mass" in lines[0] and "value gate mean" not in lines[0]  # no gated arm here
    assert lines[2].startswith("| tiny | baseline | 2 |") and lines[3].startswith("| tiny | sink-logit | 2 |")
    assert " ± " in lines[2]
    injections = summarise_injections(tmp_path)
    assert "cutoff p25" in injections and "| ε=0.4 |" in injections
    assert "| tiny | baseline | gate-direction | 2 | n/a |" in injections
    assert "| tiny | sink-logit | structural | 2 |" in injections


@pytest.mark.parametrize("name", ["summarise_probes", "summarise_injections"])
def test_summaries_skip_unreadable_files(tmp_path, name):
    bad = tmp_path / "tiny" / "baseline" / "seed0"
    bad.mkdir(parents=True)
    (bad / (PROBE_FILE if name == "summarise_probes" else INJECT_FILE)).write_text("{not json")
    assert globals()[name](tmp_path) == ""


def test_report_summarises_probes_by_tier_and_arm(tmp_path):
    from analysis_fixtures import reference_losses, write_store

    from ablate.analysis.report import write_report

    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M"}
    store = write_store(tmp_path / "results", losses=losses, curve_points=2)
    source = make_run(tmp_path / "probed", "sink-logit", 0)
    probe_run(source, n_batches=1, batch_size=4)
    probe = json.loads((source / PROBE_FILE).read_text())
    for seed in (0, 1):
        probe["run"].update(tier="10M", seed=seed)
        folder = store / "10M" / "sink-logit" / f"seed{seed}"
        (folder / PROBE_FILE).write_text(json.dumps(probe))
        (folder / "checkpoints").mkdir(exist_ok=True)  # the weights it probed are the run's final weights
        shutil.copy(source / "checkpoints" / "model.pt", folder / "checkpoints" / "model.pt")
    report = write_report(store)
    summary = (report / "summary.md").read_text()
    assert "## Probes" in summary and "| 10M | sink-logit | 2 |" in summary
    assert "| 10M | sink-logit | 2 |" in (report / "probes.md").read_text()
