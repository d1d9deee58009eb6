"""The one check every arm is held to (`tests/test_arms_check.py` runs it over every registered arm; `ablate arms
--check NAME` on a user's arm), in float64 on a small model with the arm's parameters drawn away from their init:

* attention: the training path (fused SDPA, with a boolean mask for a mask arm) = the reference path, in o and in
  the gradients of q, k, v, x and of every arm parameter; where the training path on a CPU *is* the reference
  path (a score modifier or a normaliser), "one path: gradcheck" — `torch.autograd.gradcheck` of the same
  gradients against finite differences, never a comparison of the path with itself;
* model: the same for the whole model's loss and every parameter's gradient (cross-layer state included); not
  run for a one-path arm (the gradcheck holds its gradients);
* mask: an arm's own mask function, evaluated alone (the kernel's composition with the causal mask would hide
  it): a bool of the right shape that admits no later key;
* flex: for an arm that trains through flex_attention on CUDA, its flex path = the reference path, forward, run
  eagerly on a CPU (PyTorch 2.13 has no flex backward there) and compiled with gradients on CUDA when there is one;
* documents: under a document mask, changing document 1's tokens leaves every later document's logits unchanged
  (a hook that reads `context.x` or carries state across positions must not leak across documents either), and
  KV-cache decoding with document ids = the full forward;
* decoding: KV-cache decoding (a prefix, then one token at a time) = the full forward, or a one-line refusal
  naming the arm and why (`Arm.no_decoding`), over `decode_length` tokens: at least 128, and at least twice the
  largest position constant the arm states (`Arm.window`), so a window or position bug shows — a refusal is not
  a check that holds: `ablate arms --check` counts it apart;
* causal attention: q, k, v and x changed at positions after t, or in another sequence of the batch, move no
  output o at ≤ t (or of the first sequence) by more than 1e-12 relative, on every path the arm takes (training,
  reference, flex run eagerly where it takes flex); and a normaliser's raw weights on masked logits put nothing
  on a later key (the kernel's masking must not be what hides it);
* causal model: tokens changed after t, or another sequence, move no logit at ≤ t, on the training and the
  reference path. Every arm is held to both, `no_decoding` or not.

The causal checks hold an arm to a black box of their own module, reusable over any call (a document mask's, say):
`ablate.causality.find_leak(call, [Probe("x", x, time_dim=1), ...], out_time_dim=1, visible=causal)` changes every
probe at the positions `visible(i, positions)` hides from query i and requires call's output at i unchanged, then
changes the second sequence of dim 0 and requires the first's unchanged; a token probe gives its
`vocab`. `check_causal(name)`, `check_causal_model(name)` apply it to an arm (`attention_calls(name)`: the
arm's attention per path as (q, k, v, x) -> o; `masked_weight(name)`: its normaliser's weight on masked keys).

The fast part (`FAST_CHECKS`: finiteness and causality, about a second on a CPU for a slot arm, a few for a hooked
one) is what `ablate run --arm-file`, `ablate submit` and `ablate testbed --arm` hold a user's arm to before
anything trains (`refuse_unsound`: one line, no run folder); the arms ablate ships are held by the test suite.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.autograd.gradcheck import GradcheckError

from ablate.arms.base import ArmContext, AttentionContext, get_arm
from ablate.arms.kernel import attention, dense_mask
from ablate.causality import Probe, find_leak, relative
from ablate.data.documents import document_ids
from ablate.errors import AblateError
from ablate.model import GPT, GPTConfig

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8  # the check's shape: grouped-query attention, head dim 8
WIDTH = HEADS * HEAD_DIM
VALUE_RTOL, GRAD_RTOL = 1e-10, 1e-9  # float64: the fused kernels sum in another order than the reference
DECODE_ATOL = 1e-9
DECODE_MIN = 128  # tokens the decoding check decodes at least
CHECK_T = 11  # the attention and flex checks' sequence length, longer for an arm with a window (`check_length`)
GRADCHECK_T = 6  # the one-path gradcheck's sequence length (finite differences: small)
PARAMETER_SCALE = 0.7  # arm parameters drawn N(0, 0.7²): away from the init, over the whole parameter space


@dataclass
class CheckResult:
    check: str
    status: str  # "holds", "fails", "refused" (decoding, with the arm's reason) or "not run" (with why)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("holds", "refused", "not run")


def randomise(module: torch.nn.Module, seed: int = 0, scale: float = PARAMETER_SCALE, only=None) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if only is None or only(name):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * scale)


CUDA_HEAD_DIM = 64  # flex_attention's GPU kernels want a head dim of 16 or more


def check_inputs(T: int = 11, B: int = 2, seed: int = 0, dtype=torch.float64, head_dim: int = HEAD_DIM):
    gen = torch.Generator().manual_seed(seed)
    width = HEADS * head_dim

    def make(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()

    return (make(B, HEADS, T, head_dim), make(B, KV_HEADS, T, head_dim), make(B, KV_HEADS, T, head_dim),
            make(B, T, width))


def make_checked_arm(name: str, layer: int = 0, seed: int = 0, head_dim: int = HEAD_DIM):
    arm = get_arm(name)(ArmContext(HEADS, KV_HEADS, head_dim, HEADS * head_dim, n_layer=2, layer=layer)).double()
    randomise(arm, seed)
    return arm


def _compare(check: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor]], rtol: float) -> CheckResult:
    worst_name, worst = "", 0.0
    unreached = [label for label, a, b in pairs if a is None and b is None]  # e.g. the query-key slot's, which
    pairs = [(label, a, b) for label, a, b in pairs if label not in unreached]  # the model applies, not the kernel
    for label, a, b in pairs:
        if a is None or b is None:
            return CheckResult(check, "fails", f"{label}: no gradient on one path")
        error = relative(a, b)
        if not error <= rtol:  # NaN fails too
            return CheckResult(check, "fails", f"{label}: relative error {error:.2e} > {rtol:g}")
        if error >= worst:
            worst_name, worst = label, error
    left_out = f"; not reached here: {', '.join(unreached)}" if unreached else ""
    return CheckResult(check, "holds", f"max relative error {worst:.1e} ({worst_name}), {len(pairs)} tensors{left_out}")


def check_length(name: str) -> int:
    """The attention and flex checks' T: CHECK_T, or the arm's window + 8, so the window takes keys away."""
    window = get_arm(name).window
    return max(CHECK_T, window + 8) if window else CHECK_T


def decode_length(name: str) -> int:
    """Tokens the decoding check decodes: DECODE_MIN, or twice the arm's window if that is more."""
    return max(DECODE_MIN, 2 * (get_arm(name).window or 0))


def one_path(name: str) -> bool:
    """True where the arm's training path on a CPU is the reference path itself (a score modifier, a normaliser)."""
    return get_arm(name).path("cpu") == "reference"


def check_attention(name: str) -> CheckResult:
    if one_path(name):
        return check_gradients(name)
    arm = make_checked_arm(name)
    runs = []
    for fused in (True, False):
        q, k, v, x = check_inputs(T=check_length(name))
        arm.zero_grad()
        o, _ = attention(arm, q, k, v, x, fused=fused, context=AttentionContext.full(x, train_len=32))
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()  # a generic gradient
        x_grad = x.grad if x.grad is not None else torch.zeros_like(x)  # only some arms read x
        grads = [("q", q.grad), ("k", k.grad), ("v", v.grad), ("x", x_grad)]
        grads += [(n, p.grad) for n, p in arm.named_parameters()]
        runs.append([("o", o.detach())] + grads)
    path = get_arm(name).path("cpu")
    pairs = [(label, a, b) for (label, a), (_, b) in zip(*runs)]
    return _compare(f"attention: {path} path = reference (o and every gradient)", pairs, GRAD_RTOL)


def small_model(name: str, fused: bool = True, seed: int = 5, **fields):
    config = dict(vocab_size=97, n_layer=2, n_head=HEADS, n_kv_head=KV_HEADS, d_model=WIDTH, max_seq_len=32,
                  arm=name, fused=fused)
    model = GPT(GPTConfig(**{**config, **fields})).double()
    model.init_weights(seed=seed)
    randomise(model, seed=1, only=model.is_arm_parameter)
    return model


def check_model(name: str) -> CheckResult:
    if one_path(name):
        return CheckResult("model: training path = reference", "not run",
                           "one path: the reference path is the training path on a CPU; the gradcheck holds it")
    idx = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))
    runs = []
    for fused in (True, False):
        model = small_model(name, fused=fused)
        out = model(idx[:, :-1], idx[:, 1:])
        out.loss.backward()
        runs.append([("loss", out.loss.detach())] + [(n, p.grad) for n, p in model.named_parameters()])
    pairs = [(label, a, b) for (label, a), (_, b) in zip(*runs)]
    return _compare("model: loss and every parameter's gradient, training path = reference", pairs, GRAD_RTOL)


def check_decoding(name: str) -> CheckResult:
    length = decode_length(name)
    check = f"decoding: KV cache (6 tokens, then 1 at a time, {length} tokens) = full forward"
    model = small_model(name, max_seq_len=length).eval()
    idx = torch.randint(0, 97, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx).logits
        try:
            cache = model.new_cache()
        except AblateError as refusal:
            return CheckResult(check, "refused", str(refusal))
        pieces = [model(idx[:, :6], cache=cache).logits]
        pieces += [model(idx[:, t:t + 1], cache=cache).logits for t in range(6, length)]
    error = (torch.cat(pieces, 1) - full).abs().max().item()
    if not error <= DECODE_ATOL:
        return CheckResult(check, "fails", f"max |Δlogit| {error:.2e} > {DECODE_ATOL:g}")
    return CheckResult(check, "holds", f"max |Δlogit| {error:.1e}")


def check_flex(name: str, device: str = "cpu") -> CheckResult:
    """The flex path against the reference: eager forward on a CPU (float64, no gradient); on CUDA compiled, in
    float32, with the gradients of q, k, v, x and the arm's parameters."""
    cls = get_arm(name)
    if cls.path("cuda") != "flex":
        return CheckResult("flex: flex_attention = reference", "not run", f"{name} does not take the flex path")
    cuda = device == "cuda"
    dtype, head_dim = (torch.float32, CUDA_HEAD_DIM) if cuda else (torch.float64, HEAD_DIM)
    arm = make_checked_arm(name, head_dim=head_dim).to(device=device, dtype=dtype)
    runs = []
    for flex in (True, False):
        inputs = check_inputs(T=256 if cuda else check_length(name), dtype=dtype, head_dim=head_dim)
        q, k, v, x = (t.detach().to(device).requires_grad_(cuda) for t in inputs)
        arm.zero_grad()
        with torch.set_grad_enabled(cuda), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # eager flex_attention warns that it is not compiled
            # The kernel's own composition (slots, hooks, mask), on the path asked for.
            o, _ = attention(arm, q, k, v, x, context=AttentionContext.full(x, train_len=32),
                             fused="flex" if flex else "reference")
            row = [("o", o.detach())]
            if cuda:
                o.sum().backward()
                x_grad = x.grad if x.grad is not None else torch.zeros_like(x)  # only some arms read x
                row += [("q", q.grad), ("k", k.grad), ("v", v.grad), ("x", x_grad)]
                row += [(n, p.grad) for n, p in arm.named_parameters()]
        runs.append(row)
    pairs = [(label, a, b) for (label, a), (_, b) in zip(*runs)]
    what = "compiled, float32, forward and gradients" if cuda else "eager forward, float64, CPU"
    return _compare(f"flex: flex_attention ({what}) = reference", pairs, 2e-3 if cuda else VALUE_RTOL)


DOCUMENT_EOT = 96  # the documents check's end-of-text token (the small model's vocabulary has 97)
DOCUMENT_STARTS = (0, 10, 22, 31)  # where its four documents start, in a sequence of DOCUMENT_LENGTH
DOCUMENT_LENGTH = 40


def check_documents(name: str) -> CheckResult:
    """Document 1 (positions 10 … 21) perturbed: the logits of documents 2 and 3 must not move (and document 1's
    must, or the check says nothing); then the same sequence decoded with its document ids = the full forward."""
    check = "documents: document 1 perturbed, later documents' logits unchanged; decoding with documents = full"
    model = small_model(name, max_seq_len=DOCUMENT_LENGTH).eval()
    gen = torch.Generator().manual_seed(4)
    idx = torch.randint(0, DOCUMENT_EOT, (2, DOCUMENT_LENGTH), generator=gen)
    idx[:, list(DOCUMENT_STARTS)] = DOCUMENT_EOT
    documents = document_ids(idx, DOCUMENT_EOT)
    first, later = DOCUMENT_STARTS[1], DOCUMENT_STARTS[2]
    changed = idx.clone()
    changed[:, first + 1:later] = torch.randint(0, DOCUMENT_EOT, (2, later - first - 1), generator=gen)
    with torch.no_grad():
        full = model(idx, documents=documents).logits
        other = model(changed, documents=documents).logits
    leak = (full[:, later:] - other[:, later:]).abs().max().item()
    if not leak <= DECODE_ATOL or not (full[:, first + 1:later] - other[:, first + 1:later]).abs().max() > 0:
        return CheckResult(check, "fails", f"a later document's logits moved by {leak:.2e} (> {DECODE_ATOL:g}) when "
                                           "document 1 changed")
    try:
        cache = model.new_cache()
    except AblateError:
        return CheckResult(check, "holds", f"later documents moved {leak:.1e}; decoding refused (see decoding)")
    with torch.no_grad():
        pieces = [model(idx[:, :6], cache=cache, documents=documents[:, :6]).logits]
        pieces += [model(idx[:, t:t + 1], cache=cache, documents=documents[:, t:t + 1]).logits
                   for t in range(6, DOCUMENT_LENGTH)]
    error = (torch.cat(pieces, 1) - full).abs().max().item()
    if not error <= DECODE_ATOL:
        return CheckResult(check, "fails", f"decoding with documents: max |Δlogit| {error:.2e} > {DECODE_ATOL:g}")
    return CheckResult(check, "holds", f"later documents moved {leak:.1e}; decoding max |Δlogit| {error:.1e}")


class _Attention(torch.nn.Module):
    """The arm's attention on the reference path as a module, so gradcheck can vary the arm's parameters."""

    def __init__(self, arm):
        super().__init__()
        self.arm = arm

    def forward(self, q, k, v, x):
        return attention(self.arm, q, k, v, x, fused="reference", context=AttentionContext.full(x, train_len=32))[0]


def check_gradients(name: str) -> CheckResult:
    """One path: o's gradients of q, k, v, x and every arm parameter against finite differences (float64)."""
    check = f"attention: one path: gradcheck (reference path, float64, T = {GRADCHECK_T}, q, k, v, x and every arm " \
            "parameter)"
    module = _Attention(make_checked_arm(name))
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    inputs = check_inputs(T=GRADCHECK_T, B=1)

    def forward(q, k, v, x, *values):
        return torch.func.functional_call(module, dict(zip(names, values)), (q, k, v, x))

    try:
        torch.autograd.gradcheck(forward, (*inputs, *params), fast_mode=True)
    except GradcheckError as err:
        return CheckResult(check, "fails", str(err).strip().splitlines()[0].rstrip(","))
    return CheckResult(check, "holds", f"{4 + len(params)} tensors against finite differences")


def check_mask(name: str) -> CheckResult:
    """The arm's own mask function, alone: a bool broadcasting to (B, H, T, T) that admits no later key (composed
    with the causal mask, such a key would be hidden, and the arm would not be what it says)."""
    check = "mask: the arm's own mask admits no later key"
    if not get_arm(name).has_hook("mask"):
        return CheckResult(check, "not run", f"{name} has no mask hook")
    arm = make_checked_arm(name)
    T = check_length(name)
    q, _, _, x = (t.detach() for t in check_inputs(T=T))
    allowed = dense_mask(arm.mask_modifier(AttentionContext.full(x, train_len=32)), q, T)  # shape named if wrong
    later = torch.arange(T).view(1, T) > torch.arange(T).view(T, 1)
    admitted = (allowed & later).nonzero()
    if len(admitted):
        b, h, i, j = admitted[0].tolist()
        return CheckResult(check, "fails", f"query {i} may attend to the later key {j} (batch {b}, head {h}); "
                                           f"{len(admitted)} such pairs")
    return CheckResult(check, "holds", f"T = {T}, {int(allowed.expand(-1, -1, T, T).sum())} pairs admitted")


def check_arm(name: str) -> list[CheckResult]:
    """Every check, in order; an exception inside one is that check failing, in one line."""
    get_arm(name)  # an unknown name: one line naming the registered arms
    results = run_checks(name, (check_attention, check_model, check_mask, check_flex, check_documents,
                                check_decoding, check_causal, check_causal_model))
    if torch.cuda.is_available():
        results.append(check_flex(name, "cuda"))
    return results


# --------------------------------------------------------------------------------------- causality
# The black box (`ablate.causality.find_leak`) held to an arm: `check_causal` at the attention call (every path it
# takes), `check_causal_model` in the whole model.


def attention_calls(name: str) -> dict[str, object]:
    """The arm's attention as calls (q, k, v, x) -> o on every path it takes, a fresh context each call: 'training'
    (what it trains through on a CPU), 'reference', and 'flex (eager)' for an arm that takes flex on CUDA."""
    arm = make_checked_arm(name)

    def kernel(fused: bool):
        def call(q, k, v, x):
            return attention(arm, q, k, v, x, fused=fused, context=AttentionContext.full(x, train_len=32))[0]
        return call

    calls = {f"training ({arm.path('cpu')})": kernel(True), "reference": kernel(False)}
    if arm.path("cuda") == "flex":
        def flex(q, k, v, x):
            with warnings.catch_warnings():  # eager flex_attention warns that it is not compiled: on purpose here
                warnings.simplefilter("ignore", UserWarning)
                return attention(arm, q, k, v, x, fused="flex", context=AttentionContext.full(x, train_len=32))[0]
        calls["flex (eager)"] = flex
    return calls


def masked_weight(name: str) -> float:
    """The most weight the arm's normaliser gives a masked (later) key, from its raw weights on masked logits; 0.0
    for an arm without a normaliser. The check fails on anything but 0: the kernel must not be what hides it."""
    cls = get_arm(name)
    if not cls.has_hook("normaliser"):
        return 0.0
    arm = make_checked_arm(name)
    q, _, _, x = (t.detach() for t in check_inputs())
    T = q.shape[2]
    logits = torch.randn(q.shape[0], HEADS, T, T, generator=torch.Generator().manual_seed(7), dtype=q.dtype)
    later = torch.ones(T, T, dtype=torch.bool).triu(1)
    with torch.no_grad():
        weights = arm.normalise(logits.masked_fill(later, float("-inf")), AttentionContext.full(x, train_len=32))
    return weights.masked_select(later.expand_as(weights)).abs().max().item()


def check_causal(name: str) -> CheckResult:
    """Causality at the attention call: q, k, v, x changed at later positions (or in another sequence) never move
    o at earlier ones, on every path the arm takes; a normaliser puts no weight on a masked key."""
    calls = attention_calls(name)
    check = f"causal attention: o at ≤ t blind to q, k, v, x after t and to other sequences ({', '.join(calls)})"
    weight = masked_weight(name)
    if weight != 0.0:
        return CheckResult(check, "fails", f"the normaliser puts weight {weight:.3g} on masked (later) keys")
    q, k, v, x = (t.detach() for t in check_inputs())
    probes = [Probe("q", q, 2), Probe("k", k, 2), Probe("v", v, 2), Probe("x", x, 1)]
    with torch.no_grad():
        for path, call in calls.items():
            leak = find_leak(call, probes, out_time_dim=2)
            if leak is not None:
                return CheckResult(check, "fails", f"{path}: {leak}")
    return CheckResult(check, "holds", f"{len(calls)} path(s), 4 inputs, every position and sequence")


def check_causal_model(name: str) -> CheckResult:
    """Causality of the whole model: tokens changed after t (or in another sequence) never move logits at ≤ t,
    on the training path and the reference path."""
    check = "causal model: logits at ≤ t blind to tokens after t and to other sequences (training, reference)"
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for fused in (True, False):
            model = small_model(name, fused=fused)
            leak = find_leak(lambda tokens: model(tokens).logits, [Probe("the tokens", idx, 1, vocab=97)],
                             out_time_dim=1)
            if leak is not None:
                return CheckResult(check, "fails", f"{'training' if fused else 'reference'}: {leak}")
    return CheckResult(check, "holds", "2 paths, every position and sequence")


def check_finite(name: str) -> CheckResult:
    """The small model's loss and every parameter's gradient on the training path are finite numbers."""
    check = "finite: the model's loss and every parameter's gradient (training path)"
    model = small_model(name)
    idx = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))
    out = model(idx[:, :-1], idx[:, 1:])
    out.loss.backward()
    if not torch.isfinite(out.loss):
        return CheckResult(check, "fails", f"loss {out.loss.item()}")
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad:
        return CheckResult(check, "fails", f"non-finite gradient of {', '.join(bad)}")
    return CheckResult(check, "holds", f"loss {out.loss.item():.4f}")


FAST_CHECKS = (check_finite, check_causal, check_causal_model)  # what a run of a user's arm is held to first


def run_checks(name: str, checks) -> list[CheckResult]:
    """Each check on arm `name`, in order; an exception inside one is that check failing, in one line."""
    results = []
    for check in checks:
        try:
            results.append(check(name))
        except Exception as err:  # a user's arm may raise anything: report it as that check's failure
            results.append(CheckResult(check.__name__.removeprefix("check_"), "fails",
                                       f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"))
    return results


def is_users(name: str) -> bool:
    """Whether arm `name` is a user's (its class defined outside the ablate package): the arms ablate ships are
    held to every check by its test suite, a user's before each run that trains it."""
    module = get_arm(name).__module__
    return not (module == "ablate" or module.startswith("ablate."))


def refuse_unsound(names, file: str | None = None) -> None:
    """Before training: the fast part of the check (finiteness and causality) on every user's arm of `names`; the
    first that fails is refused in one line naming the arm, the check and what failed."""
    for name in dict.fromkeys(names):
        if not is_users(name):
            continue
        for result in run_checks(name, FAST_CHECKS):
            if not result.ok:
                where = f" --arm-file {file}" if file else ""
                raise AblateError(f"arm {name!r} fails the check before training, so nothing was trained: "
                                  f"{result.check.split(':')[0]}: {result.detail} (every check: `ablate arms --check "
                                  f"{name}{where}`)")
