"""`AblateLM`: lm-evaluation-harness's model interface over ablate's GPT.

It scores exactly as the harness's own Hugging Face model (`lm_eval.models.huggingface.HFLM`) does,
so the numbers compare with published ones:

* tokens: GPT-2 BPE (ablate's shipped copy, `ablate.data.tokenizer`), `<|endoftext|>` as the prefix
  of an empty context and of every rolling window — the token that starts every training document;
* a context + continuation longer than the window is cut from the left, keeping the last
  `max_seq_len + 1` tokens (the last one is only a target);
* loglikelihood_rolling: the harness's own disjoint rolling windows (`get_rolling_token_windows` with
  context 1, then `make_disjoint_window`), each scored like a loglikelihood request, summed per document.

The window is the model's `max_seq_len` text positions for every arm: the sink-token arm's learned
extra position is prepended inside `GPT.forward`, which allows `max_seq_len + 1` positions for it.
Log-probabilities are over the 50,257 real tokens (the logits of the padding rows are dropped, as
`GPT.generate` does), computed in float32. With a loss chunk (the run's `loss_chunk`; by default
`ablate.sizing.LOSS_CHUNK` on a GPU, none on a CPU) only the continuations' positions are scored, that
many tokens at a time (`ablate.losses.chunked_log_probs`): no batch of logits exists. Whole or chunked,
the scores agree to float32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator
from tqdm import tqdm

from ablate.data.tokenizer import EOT_TOKEN, VOCAB_SIZE, decode, encode
from ablate.errors import AblateError
from ablate.losses import chunked_log_probs
from ablate.sizing import loss_chunk_for


class AblateLM(TemplateLM):
    """Wraps a trained `ablate.model.GPT` (any arm) for `lm_eval.simple_evaluate`."""

    def __init__(self, model, batch_size: int = 16, device: str = "cpu", loss_chunk: int | None = None):
        super().__init__()
        if model.config.vocab_size != VOCAB_SIZE:
            raise AblateError(
                f"the model's vocabulary has {model.config.vocab_size} tokens, not GPT-2's {VOCAB_SIZE}: "
                "only runs trained on GPT-2 tokens can be evaluated on text tasks"
            )
        if batch_size < 1:
            raise AblateError(f"--batch-size must be ≥ 1, got {batch_size}")
        self.model = model.to(device).eval()
        self.batch_size = int(batch_size)
        self.max_length = int(model.config.max_seq_len)
        self._device = torch.device(device)
        self.loss_chunk = loss_chunk_for(loss_chunk, self._device)

    # ------------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return EOT_TOKEN

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return encode(string)

    def tok_decode(self, tokens, **kwargs) -> str:
        return decode(tokens)

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(request strings, context tokens, continuation tokens) → (log-prob of the continuation, is greedy).

        Longest first (the harness's Collator), right-padded: the model is causal, so padding after a
        sequence changes none of its logits.
        """
        collator = Collator(requests, sort_fn=lambda req: (-len(req[1] + req[2]), tuple(req[1] + req[2])))
        results = []
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="ablate loglikelihood")
        for chunk in collator.get_batched(n=self.batch_size):
            inputs, spans = [], []
            for _, context, continuation in chunk:
                if not context or not continuation:
                    raise AblateError("a loglikelihood request needs a non-empty context and continuation")
                if len(continuation) > self.max_length:
                    raise AblateError(f"a continuation of {len(continuation)} tokens exceeds the model's window "
                                      f"of {self.max_length}")
                tokens = (context + continuation)[-(self.max_length + 1):][:-1]  # cut from the left, as HFLM
                inputs.append(tokens)
                spans.append((len(tokens) - len(continuation), len(tokens)))
            width = padded_width(max(len(tokens) for tokens in inputs), self.max_length,
                                 self.model.arm_class.path(self._device.type) == "flex")
            batch = torch.zeros(len(inputs), width, dtype=torch.long)
            for row, tokens in enumerate(inputs):
                batch[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            scored = self._score(batch.to(self._device), chunk, spans)
            for (request, _, _), (score, greedy) in zip(chunk, scored):
                results.append((score, greedy))
                if request is not None:
                    self.cache_hook.add_partial("loglikelihood", request, (score, greedy))
                progress.update(1)
        progress.close()
        return collator.get_original(results)

    def _score(self, batch: torch.Tensor, chunk, spans) -> list[tuple[float, bool]]:
        """(log-prob of the continuation, is greedy) of each row: from the batch's logits (no loss chunk),
        or from the continuations' hidden states, `loss_chunk` tokens at a time."""
        targets = [torch.tensor(continuation, dtype=torch.long, device=batch.device) for _, _, continuation in chunk]
        if self.loss_chunk <= 0:
            logits, scored = self.model(batch).logits, []
            for row, target, (start, end) in zip(logits, targets, spans):
                # only the continuation's positions need a softmax (the context's are thrown away)
                window = F.log_softmax(row[start:end, :VOCAB_SIZE].float(), dim=-1)
                scored.append((float(window.gather(1, target[:, None]).sum()),
                               bool((window.argmax(dim=-1) == target).all())))
            return scored
        hidden = self.model(batch, head=False).hidden
        rows = torch.cat([row[start:end] for row, (start, end) in zip(hidden, spans)])
        log_probs, greedy = chunked_log_probs(rows, self.model.lm_head.weight, torch.cat(targets), self.loss_chunk,
                                              vocab=VOCAB_SIZE)
        sizes = [end - start for start, end in spans]
        return [(float(lp.sum()), bool(g.all())) for lp, g in zip(log_probs.split(sizes), greedy.split(sizes))]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's total log-likelihood, every token predicted once (the harness's rolling windows)."""
        windows, owner = [], []
        for index, (string,) in enumerate(request.args for request in requests):
            for context, continuation in rolling_windows(self.tok_encode(string), self.max_length):
                windows.append((None, context, continuation))
                owner.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for index, (score, _) in zip(owner, scores):
            totals[index] += score
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise AblateError(
            "ablate eval scores likelihoods only (loglikelihood and loglikelihood_rolling tasks); "
            "a task that generates text (generate_until) is not supported"
        )


def rolling_windows(tokens: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) windows of a document: the harness's, with `<|endoftext|>` as prefix."""
    return [
        lm_utils.make_disjoint_window(pair)
        for pair in lm_utils.get_rolling_token_windows(
            token_list=tokens, prefix_token=EOT_TOKEN, max_seq_len=max_length, context_len=1
        )
    ]


SMALLEST_BUCKET = 64  # the narrowest width a flex model's batch is padded to


def padded_width(longest: int, limit: int, flex: bool) -> int:
    """A batch's width: its longest row, or for a model on the flex path (which compiles once per shape) the next
    of the fixed buckets 64, 128, 256, … capped at the model's window `limit`, so `ablate eval` compiles once per
    bucket rather than once per batch. Right padding changes no logit of a causal model's real positions."""
    if not flex:
        return longest
    width = SMALLEST_BUCKET
    while width < longest:
        width *= 2
    return max(longest, min(width, limit))
