"""docs/method.md says what the code does: its numbers are recomputed here from the code."""

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from ablate.analysis import crossover, scale
from ablate.analysis.render import PADDED_VOCAB, REAL_VOCAB, VAL_LOSS_FOOTER
from ablate.model import GPT, shape_only
from ablate.plan import ASSUMED_MFU, GPU_CHECK_FILE
from ablate.sizing import model_config
from ablate.tiers import TIERS
from datafix import REPO

METHOD = (REPO / "docs" / "method.md").read_text()


def flat(text: str) -> str:
    return " ".join(text.split())


def baseline_params(tier) -> int:
    return shape_only(model_config(tier, "baseline")).param_counts()["non_embedding"]


def tier_rows() -> dict[str, list[str]]:
    head = "| tier | layers × width | heads (d = 64) | baseline non-embedding params | tokens | tokens per parameter |"
    table = METHOD.split(head, 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: row for row in rows}


@pytest.mark.unit
def test_the_tier_table_holds_every_tier_with_its_real_counts_and_tokens_per_parameter():
    rows = tier_rows()
    assert set(rows) == set(TIERS)  # 124M-gpt2 and 350M-gpt2 included
    for name, tier in TIERS.items():
        row, params = rows[name], baseline_params(tier)
        assert row[1] == f"{tier.n_layer} × {tier.d_model}"
        assert row[3] == f"{params:,}"
        per_parameter = tier.tokens / params
        assert row[5] == (f"{per_parameter:.1f}" if per_parameter > 1 else f"{per_parameter:.2f}"), name
        assert row[7] == f"{tier.steps:,}"
        assert row[10] == str(tier.seeds)


@pytest.mark.unit
def test_the_budget_sentence_names_the_tiers_that_reach_20_tokens_per_parameter():
    reach = [n for n in ("10M", "50M", "124M", "350M") if round(TIERS[n].tokens / baseline_params(TIERS[n])) >= 19]
    assert reach == ["10M", "50M"] and "which they hit at 10M and 50M only" in flat(METHOD)
    literal = [f"{TIERS[n].tokens / baseline_params(TIERS[n]):.1f}" for n in ("124M", "350M")]
    assert f"their budgets are then {literal[0]} and {literal[1]} tokens per parameter" in flat(METHOD)
    gpt2 = [f"{TIERS[n].tokens / baseline_params(TIERS[n]):.1f}" for n in ("124M-gpt2", "350M-gpt2")]
    assert f"({gpt2[0]} and {gpt2[1]} tokens per parameter)" in flat(METHOD)
    for name in ("124M-gpt2", "350M-gpt2"):
        gpt2_tier, literal_tier = TIERS[name], TIERS[name.removesuffix("-gpt2")]
        assert (gpt2_tier.tokens, gpt2_tier.lr, gpt2_tier.global_batch) == (literal_tier.tokens, literal_tier.lr,
                                                                            literal_tier.global_batch)
        assert f"{gpt2_tier.nominal_params / 1e6:.0f}M" in flat(METHOD.split("Two readings", 1)[1][:1200])


@pytest.mark.unit
def test_the_scale_model_and_its_crossover_rule_are_the_code_s():
    text = flat(METHOD)
    assert f"Fieller's* {scale.CONFIDENCE:.0%} interval" in text and "df = Σ_t (n_t − 1) (6 for 3/3/3/1)" in text
    assert "not between two adjacent tiers that both have two or more seeds" in text
    assert "bootstrap" not in crossover.__doc__.split("This replaced")[0]
    assert "equal increments never make a crossing" in text  # the tie rule: ≤ 0 is not above
    ladder = [f"{TIERS[t].tokens / TIERS[t].nominal_params:.1f}" for t in ("10M", "50M", "124M", "350M")]
    assert f"({', '.join(ladder[:3])}, {ladder[3]} at 10M" in text


@pytest.mark.unit
def test_the_plan_s_mfu_path_is_the_code_s():
    text = flat(METHOD)
    assert f"an assumed {ASSUMED_MFU:.0%}" in text
    assert f"`--gpu-check PATH`, else `./{GPU_CHECK_FILE}`, else `{GPU_CHECK_FILE}` at the repository root" in text
    assert "`plan_mfu`" in text and "benchmarks/gpu_check.py" in text


@pytest.mark.unit
def test_the_val_loss_convention_matches_the_model_and_the_footer():
    config = model_config("smoke", "baseline")
    assert (config.padded_vocab_size, config.vocab_size) == (PADDED_VOCAB, REAL_VOCAB)
    text = flat(METHOD)
    assert f"{REAL_VOCAB:,} tokens padded to {PADDED_VOCAB:,} rows" in text
    assert f"The {PADDED_VOCAB - REAL_VOCAB} padding rows" in text
    at_init = math.log(PADDED_VOCAB / REAL_VOCAB)
    assert f"ln({PADDED_VOCAB:,} / {REAL_VOCAB:,}) ≈ {at_init:.1e} nats".replace("e-04", "e-4") in text
    assert "about 2e-4 nats" in text and "about 2e-4 nats" in VAL_LOSS_FOOTER


def padding_gap(model, windows) -> tuple[float, float]:
    """(loss over the padded head, loss over the real vocabulary) of windows (b, T + 1), mean per token."""
    model.eval()
    padded = real = count = 0.0
    with torch.no_grad():
        for batch in windows:
            logits = model(batch[:, :-1]).logits.float()
            targets = batch[:, 1:].reshape(-1)
            padded += F.cross_entropy(logits.reshape(-1, PADDED_VOCAB), targets, reduction="sum").double().item()
            real += F.cross_entropy(logits[..., :REAL_VOCAB].reshape(-1, REAL_VOCAB), targets,
                                    reduction="sum").double().item()
            count += targets.numel()
    return padded / count, real / count


@pytest.mark.unit
def test_at_initialisation_the_padded_loss_exceeds_the_real_vocabulary_loss_by_about_ln_50304_over_50257():
    model = GPT(model_config("smoke", "baseline"))
    model.init_weights(0)
    windows = [torch.randint(0, REAL_VOCAB, (4, 65), generator=torch.Generator().manual_seed(k)) for k in range(4)]
    padded, real = padding_gap(model, windows)
    assert padded - real == pytest.approx(math.log(PADDED_VOCAB / REAL_VOCAB), rel=0.05)


@pytest.mark.run
@pytest.mark.slow
def test_after_a_smoke_run_val_loss_is_the_padded_loss_about_2e_4_above_the_real_vocabulary_loss(tmp_path, sample_data):
    from ablate.experiment import RunSpec
    from ablate.modelio import load_run, validation_batches_for_run
    from ablate.train import run

    # the smoke tier's 100 steps, validated at the end only (the curve's evaluations change no weight)
    summary = run(RunSpec("adhoc", "smoke", "baseline", 0, {"val_interval": 100}), results=tmp_path,
                  data_dir=str(sample_data))
    folder = tmp_path / "adhoc" / "smoke" / "baseline" / "seed0"
    model, config, _ = load_run(folder)
    windows = validation_batches_for_run(config, summary.val_tokens_evaluated // (4 * config.seq_len), 4)
    padded, real = padding_gap(model, windows)
    assert padded == pytest.approx(json.loads((folder / "summary.json").read_text())["val_loss"], abs=1e-9)
    assert sum(w.shape[0] * (w.shape[1] - 1) for w in windows) == summary.val_tokens_evaluated
    # what method.md and the footer say, to the one figure every kernel set agrees on (1.7e-4 with AVX2 on an AMD
    # EPYC, 1.78e-4 with AVX-512 on an Intel Xeon: the second figure is the kernels' rounding of 100 steps)
    assert re.fullmatch(r"2e-04", f"{padded - real:.0e}"), padded - real


@pytest.mark.unit
def test_the_numerics_section_names_the_testbed_s_own_seed_counts():
    """Section 5's sentence on the testbed's seeds is the experiment file's, tier by tier."""
    from ablate.experiment import load_experiment

    testbed = load_experiment(REPO / "experiments" / "testbed.py")
    said = re.search(r"decides over (\d+) seeds at abstain-stream and (\d+) at each value-junk tier", flat(METHOD))
    assert said, "docs/method.md no longer says how many seeds the testbed decides over"
    assert int(said.group(1)) == testbed.seed_count("abstain-stream")
    assert {testbed.seed_count(t) for t in ("value-junk-norm", "value-junk-direction")} == {int(said.group(2))}
