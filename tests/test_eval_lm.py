"""AblateLM scores as a direct computation with the model does: continuations, truncation, rolling windows."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ablate.data.tokenizer import EOT_TOKEN, VOCAB_SIZE, encode
from ablate.errors import AblateError
from ablate.evals.lm import AblateLM
from ablate.model import GPT, GPTConfig
from ablate.sizing import model_config
from ablate.tiers import get_tier

pytestmark = pytest.mark.unit

torch.set_num_threads(1)
WINDOW = 16


def tiny_model(arm: str, seed: int = 0) -> GPT:
    """The smoke tier's shape (GPT-2 vocabulary) with a short window, so truncation and rolling are exercised."""
    model = GPT(model_config(get_tier("smoke"), arm, max_seq_len=WINDOW))
    model.init_weights(seed)
    return model.eval()


def direct_logprob(model: GPT, context: list[int], continuation: list[int]) -> float:
    """Token by token through the KV cache (the model's incremental path, not the batched one)."""
    tokens = (context + continuation)[-(WINDOW + 1):]
    cache, total = model.new_cache(), 0.0
    with torch.no_grad():
        for position in range(len(tokens) - 1):
            logits = model(torch.tensor([[tokens[position]]]), cache=cache).logits[0, -1, :VOCAB_SIZE]
            if position + 1 >= len(tokens) - len(continuation):
                total += float(F.log_softmax(logits.double(), dim=-1)[tokens[position + 1]])
    return total


def requests(pairs, kind="loglikelihood"):
    return [Instance(request_type=kind, doc={}, arguments=args, idx=0) for args in pairs]


PAIRS = [
    ("The capital of France is", " Paris"),
    ("Once upon a time there was a princess who lived in a tall tower far away from", " the sea and the sky"),
    ("", "Hello world, this starts a document"),  # empty context: <|endoftext|> conditions it
    ("A short one", " two tokens"),
]


@pytest.mark.parametrize("arm", ["baseline", "sink-token"])
def test_loglikelihood_equals_the_models_own_token_logprobs(arm):
    model = tiny_model(arm)
    lm = AblateLM(model, batch_size=3)  # batches of mixed lengths: right padding must change nothing
    got = lm.loglikelihood(requests(PAIRS))
    cut = 0
    for (context, continuation), (score, _) in zip(PAIRS, got):
        if context:
            whole, ctx = encode(context + continuation), encode(context)
            ctx_ids, cont_ids = ctx, whole[len(ctx):]
        else:
            ctx_ids, cont_ids = [EOT_TOKEN], encode(continuation)
        cut += len(ctx_ids) + len(cont_ids) > WINDOW + 1
        assert score == pytest.approx(direct_logprob(model, ctx_ids, cont_ids), abs=1e-5)
    assert cut == 1  # one pair is longer than the window: cut from the left


def test_a_full_window_fits_the_sink_token_arm():
    """The sink token takes a position of its own: a window of max_seq_len text tokens must still run."""
    model = tiny_model("sink-token")
    text = " ".join(["word"] * 40)
    (score, _), = AblateLM(model).loglikelihood(requests([(text, " end")]))
    assert score == pytest.approx(direct_logprob(model, encode(text), encode(" end")), abs=1e-5)


def test_greedy_flag_is_the_argmax_of_every_continuation_token():
    model = tiny_model("baseline")
    context = encode("The quick brown")
    with torch.no_grad():
        greedy = int(model(torch.tensor([context])).logits[0, -1, :VOCAB_SIZE].argmax())
    lm = AblateLM(model)
    (_, is_greedy), = lm._loglikelihood_tokens([(None, context, [greedy])])
    (_, not_greedy), = lm._loglikelihood_tokens([(None, context, [(greedy + 1) % VOCAB_SIZE])])
    assert is_greedy and not not_greedy


@pytest.mark.parametrize("arm", ["baseline", "sink-token"])
def test_loglikelihood_rolling_equals_the_harness_windows_scored_directly(arm):
    model = tiny_model(arm, seed=1)
    document = "Rolling windows cover a document longer than the model's window, each token predicted once. " * 3
    tokens = encode(document)
    assert len(tokens) > 3 * WINDOW
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, EOT_TOKEN, WINDOW, 1)]
    assert sum(len(cont) for _, cont in windows) == len(tokens)
    direct = 0.0
    with torch.no_grad():
        for context, continuation in windows:
            inputs = (context + continuation)[:-1]
            logprobs = F.log_softmax(model(torch.tensor([inputs])).logits[0, :, :VOCAB_SIZE].double(), dim=-1)
            for offset, token in enumerate(continuation):
                direct += float(logprobs[len(inputs) - len(continuation) + offset, token])
    short = "A second, short document."
    rolling = requests([(document,), (short,)], "loglikelihood_rolling")
    got = AblateLM(model, batch_size=2).loglikelihood_rolling(rolling)
    assert got[0] == pytest.approx(direct, abs=1e-4)  # ~60 float32 log-probs summed (each to ~1e-6)
    assert got[1] == pytest.approx(direct_logprob(model, [EOT_TOKEN], encode(short)), abs=1e-5)


def test_generation_and_foreign_vocabularies_are_refused():
    with pytest.raises(AblateError, match="generate_until"):
        AblateLM(tiny_model("baseline")).generate_until([])
    with pytest.raises(AblateError, match="GPT-2"):
        AblateLM(GPT(GPTConfig(vocab_size=20, max_seq_len=8)))
