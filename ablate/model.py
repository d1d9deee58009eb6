"""A GPT whose every attention layer is one arm: pre-norm RMSNorm, RoPE, tied embeddings, no biases,
optional grouped-query attention, vocabulary padded to a multiple of 64 (nanoGPT-sized on purpose).

Initialisation is keyed by name: every parameter is drawn from its own generator seeded by
(seed, parameter name), so two arms with the same seed start from identical shared weights, and an
arm's extra parameters never shift anyone else's draw (`init_weights`).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ablate.arms import Arm, ArmContext, AttentionRecord, attention, get_arm
from ablate.arms import checks
from ablate.arms.base import AttentionContext
from ablate.arms.kernel import LayerCache, refuse_decoding
from ablate.data.documents import VISIBLE_TO_ALL, document_ids
from ablate.losses import chunked_cross_entropy

INIT_STD = 0.02  # GPT-2


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    n_layer: int = 2
    n_head: int = 2
    n_kv_head: int | None = None  # None: as many as query heads (no GQA)
    d_model: int = 64
    max_seq_len: int = 1024
    arm: str = "baseline"
    mlp_ratio: int = 4
    mlp_hidden: int | None = None  # MLP hidden width; None: mlp_ratio · d_model (parameter matching narrows it)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    fused: bool = True  # False: the reference path that materialises the weights

    def __post_init__(self):
        self.n_kv_head = self.n_kv_head or self.n_head
        if self.d_model % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(
                f"d_model={self.d_model} must divide by n_head={self.n_head}, and n_head by n_kv_head={self.n_kv_head}"
            )
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ValueError(f"mlp_hidden={self.mlp_hidden} must be a positive width")
        get_arm(self.arm)  # a clear error for an unknown arm, before any weight is made

    @property
    def mlp_width(self) -> int:
        return self.mlp_ratio * self.d_model if self.mlp_hidden is None else self.mlp_hidden

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / 64) * 64


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, d/2) in float64 for the given positions; `GPT` computes them once (`GPT.rope`)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    angles = positions.to(torch.float64).unsqueeze(-1) * freqs  # (T, d/2)
    return angles.cos(), angles.sin()


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x1, x2) = halves of the head dim; t is (B, H, T, d)."""
    x1, x2 = t.chunk(2, dim=-1)
    cos, sin = cos.to(t.dtype), sin.to(t.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@dataclass
class KVCache:
    layers: list[LayerCache]
    length: int = 0  # positions already cached (the sink token included)
    documents: torch.Tensor | None = None  # (B, length) the cached positions' document ids, under a document mask


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.c_attn = nn.Linear(config.d_model, (config.n_head + 2 * config.n_kv_head) * self.head_dim, bias=False)
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        ctx = ArmContext(config.n_head, config.n_kv_head, self.head_dim, config.d_model, config.n_layer, layer)
        self.arm: Arm = get_arm(config.arm)(ctx)
        self.fused = config.fused
        self.train_len = config.max_seq_len
        self.read_hook = None  # probes: callable(v, layer_module) -> v, applied before any gate sees the read

    def forward(self, x, cos, sin, cache: LayerCache | None = None, offset: int = 0, record: bool = False,
                shared: dict | None = None, documents: torch.Tensor | None = None):
        B, T, C = x.shape
        q, k, v = self.projected(x, cos, sin)
        positions = torch.arange(offset, offset + T, device=x.device)
        context = self.hook_context(x, positions, shared, decoding=cache is not None, documents=documents)
        y, rec = attention(self.arm, q, k, v, x, fused=self.fused and not record and cache is None,
                           context=context, cache=cache)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y), rec

    def projected(self, x, cos, sin):
        """q, k, v of x: (B, H, T, d), (B, Hkv, T, d), (B, Hkv, T, d), after the query-key slot, RoPE and the probes'
        read hook."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(
            [self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim], dim=-1
        )
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, Hkv, T, d)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.arm.has_slot("query-key"):  # before RoPE, where OLMo 2 puts its QK-norm; per position, so cacheable
            q, k = checks.pair(self.arm, self.arm.query_key(q, k), q, k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.read_hook is not None:
            v = self.read_hook(v, self)
        return q, k, v

    def hook_context(self, x, positions, shared, decoding=False, documents=None) -> AttentionContext | None:
        """The per-forward context, for an arm with hooks or under a document mask only (the slots never see it);
        documents (B, Tk): every key position's document, the cached ones included."""
        if not self.arm.hooks() and documents is None:
            return None
        return AttentionContext(x, positions, positions, self.train_len, {} if shared is None else shared,
                                decoding=decoding, documents=documents)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        with warnings.catch_warnings():  # a task model has no MLP (width 0): torch warns that its init does nothing
            warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op", UserWarning)
            self.c_fc = nn.Linear(config.d_model, config.mlp_width, bias=False)
            self.c_proj = nn.Linear(config.mlp_width, config.d_model, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache=None, offset=0, record=False, shared=None, documents=None):
        a, rec = self.attn(self.ln_1(x), cos, sin, cache, offset, record, shared, documents)
        x = x + a
        return x + self.mlp(self.ln_2(x)), rec


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # (B, T, padded vocab): text positions only; None with a chunked loss
    loss: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # (B, T, d) final-norm output, with head=False (then no logits)
    records: list[AttentionRecord] = field(default_factory=list)  # per layer, when asked for
    residuals: list[torch.Tensor] = field(default_factory=list)  # per layer output, when asked for


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.arm_class = get_arm(config.arm)
        self.wte = nn.Embedding(config.padded_vocab_size, config.d_model)
        # sink-token: one learned embedding row prepended to every sequence; it predicts nothing.
        self.sink_token = nn.Parameter(torch.empty(config.d_model)) if self.arm_class.sequence_token else None
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        # RoPE tables for every position a forward may reach, computed once in float64 as `rope_tables` always
        # has; non-persistent, so state_dicts and checkpoints are unchanged. `rope` casts them once per dtype.
        cos, sin = self._rope_master(torch.device("cpu"))  # on the CPU also for a shape-only model (`shape_only`)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._rope_cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        # A run's `document_mask` option (set by whoever builds the model for that run: training, `load_run`): every
        # forward then splits idx into documents at <|endoftext|> itself (`document_ids`), unless given them.
        self.document_mask = False
        self.init_weights(seed=0)

    def _rope_master(self, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        positions = self.config.max_seq_len + (1 if self.sink_token is not None else 0)
        return rope_tables(torch.arange(positions, device=device), self.config.head_dim, self.config.rope_theta)

    def _apply(self, fn, recurse=True):
        """`.to()`, `.cuda()`, `.float()`, …: the RoPE tables follow the device but stay float64, so that every
        dtype the model is cast to later (float64 too) gets the table `rope_tables` gives; the casts are redone."""
        tables = self.rope_cos, self.rope_sin
        super()._apply(fn, recurse)
        device = self.rope_cos.device
        if tables[0].is_meta and not self.rope_cos.is_meta:  # to_empty() from the meta device: compute them
            tables = self._rope_master()
        self.rope_cos, self.rope_sin = (t.to(device=device) for t in tables)
        self._rope_cast = {}
        return self

    def rope_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype q and k have in the attention layers: autocast's if it is on, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.wte.weight.dtype

    def rope(self, offset: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (length, d/2) for positions offset … offset+length-1, cast float64 → dtype once per dtype:
        the values `rope_tables` gives for those positions, cast as `apply_rope` would cast them."""
        if dtype not in self._rope_cast:
            self._rope_cast[dtype] = (self.rope_cos.to(dtype), self.rope_sin.to(dtype))
        cos, sin = self._rope_cast[dtype]
        return cos[offset : offset + length], sin[offset : offset + length]

    # ------------------------------------------------------------------ parameters
    def init_weights(self, seed: int) -> None:
        """Draw every parameter from a generator keyed by (seed, its name)."""
        out_std = INIT_STD / math.sqrt(2 * self.config.n_layer)  # GPT-2's scaled residual projections
        with torch.no_grad():
            for name, param in self.named_parameters():
                if param.is_meta:  # shape-only model (parameter counting): nothing to draw
                    continue
                gen = torch.Generator().manual_seed(name_seed(seed, name))
                arm_prefix = self._arm_prefix(name)
                if arm_prefix is not None:
                    self.get_submodule(arm_prefix).init_parameter(name[len(arm_prefix) + 1 :], param, gen)
                elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                    param.fill_(1.0)
                else:
                    std = out_std if name.endswith("c_proj.weight") else INIT_STD
                    cpu = torch.empty(param.shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
                    param.copy_(cpu)

    @staticmethod
    def _arm_prefix(name: str) -> str | None:
        """'blocks.3.attn.arm.tau' → 'blocks.3.attn.arm'."""
        parts = name.split(".")
        return ".".join(parts[:4]) if len(parts) > 4 and parts[0] == "blocks" and parts[3] == "arm" else None

    def is_arm_parameter(self, name: str) -> bool:
        return name == "sink_token" or self._arm_prefix(name) is not None

    def shared_named_parameters(self):
        """The parameters every arm has (what `init_fingerprint` hashes)."""
        return [(n, p) for n, p in self.named_parameters() if not self.is_arm_parameter(n)]

    def param_counts(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.parameters())
        embedding = self.wte.weight.numel() + (self.sink_token.numel() if self.sink_token is not None else 0)
        arm_extra = sum(p.numel() for n, p in self.named_parameters() if self.is_arm_parameter(n))
        return {"total": total, "non_embedding": total - embedding, "arm_extra": arm_extra}

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: matrices and embeddings (the sink token too) decay; norms and arm scalars don't."""
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            prefix = self._arm_prefix(name)
            if prefix is not None:
                exempt = name[len(prefix) + 1 :] in self.arm_class.no_decay_names()
            elif name == "sink_token":
                exempt = False  # like the token embeddings
            else:
                exempt = param.dim() < 2
            (no_decay if exempt else decay).append(name)
        params = dict(self.named_parameters())
        return [
            {"params": [params[n] for n in decay], "names": decay, "weight_decay": weight_decay},
            {"params": [params[n] for n in no_decay], "names": no_decay, "weight_decay": 0.0},
        ]

    # ------------------------------------------------------------------ forward
    def forward(self, idx, targets=None, *, record: bool = False, cache: KVCache | None = None,
                loss_chunk: int = 0, head: bool = True, documents: torch.Tensor | None = None) -> ModelOutput:
        """idx (B, T) token ids → logits for the T text positions (the sink token's position is dropped).

        loss_chunk > 0 (with targets): the loss is computed `loss_chunk` tokens at a time and no logits
        are returned, so the float32 logits of the whole micro-batch never exist (`chunked_cross_entropy`).
        head=False: no output layer at all; `hidden` is the final norm's output, for a caller that scores
        a few positions, or every position in chunks (`chunked_log_probs`).
        documents (B, T): each token's document (`ablate.data.documents.document_ids`): a document mask, each token
        attending within its document only; the sink token is visible to every document, RoPE positions run on
        across documents (relative positions within one are unchanged), and a KV cache keeps the ids.
        """
        B, T = idx.shape
        x = self.wte(idx)  # (B, T, C)
        offset = cache.length if cache is not None else 0
        prepend = self.sink_token is not None and offset == 0
        if prepend:
            x = torch.cat([self.sink_token.to(x.dtype).expand(B, 1, -1), x], dim=1)
        length = x.shape[1]
        if offset + length > self.config.max_seq_len + (1 if self.sink_token is not None else 0):
            raise ValueError(f"sequence of {offset + length} positions exceeds max_seq_len={self.config.max_seq_len}")
        cos, sin = self.rope(offset, length, self.rope_dtype(idx.device))
        if documents is None and self.document_mask:
            documents = document_ids(idx, start=None if cache is None or cache.documents is None
                                     else cache.documents[:, -1])
        documents = self._key_documents(documents, cache, prepend)
        out = ModelOutput(logits=None)
        shared: dict = {}  # the hooks' cross-layer state: lives for this forward only
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x, rec = block(x, cos, sin, layer_cache, offset, record, shared, documents)
            if record:
                out.records.append(rec)
                out.residuals.append(x)
        if cache is not None:
            cache.length += length
        if prepend:
            x = x[:, 1:]  # the sink token's position predicts nothing
        if not head:
            out.hidden = self.ln_f(x)
            return out
        if targets is not None and loss_chunk > 0:
            out.loss = chunked_cross_entropy(self.ln_f(x), self.lm_head.weight, targets, loss_chunk)
            return out
        out.logits = self.lm_head(self.ln_f(x))
        if targets is not None:
            out.loss = F.cross_entropy(out.logits.float().view(-1, out.logits.shape[-1]), targets.reshape(-1))
        return out

    @staticmethod
    def _key_documents(documents, cache, prepend):
        """Every key position's document under a document mask (cached ones first, the sink token's −1: visible to
        every document); the cache keeps them. None without a document mask."""
        if documents is None:
            if cache is not None and cache.documents is not None:
                raise ValueError("this KV cache was filled under a document mask: give each call's documents")
            return None
        if prepend:
            documents = torch.cat([documents.new_full((documents.shape[0], 1), VISIBLE_TO_ALL), documents], dim=1)
        if cache is not None:
            if cache.length and cache.documents is None:
                raise ValueError("this KV cache was filled without a document mask: decode without documents")
            documents = documents if cache.documents is None else torch.cat([cache.documents, documents], dim=1)
            cache.documents = documents
        return documents

    def new_cache(self) -> KVCache:
        """An empty KV cache; an arm whose state a cache cannot hold is refused here, in one line."""
        refuse_decoding(self.blocks[0].attn.arm)
        return KVCache([LayerCache() for _ in self.blocks])

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Incremental decoding with the KV cache (greedy when temperature is 0)."""
        cache = self.new_cache()
        logits = self(idx, cache=cache).logits[:, -1]
        out = idx
        for _ in range(max_new_tokens):
            logits = logits[:, : self.config.vocab_size]
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            else:
                nxt = logits.argmax(dim=-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            logits = self(nxt, cache=cache).logits[:, -1]
        return out


def name_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for one parameter of one run seed."""
    return int.from_bytes(hashlib.sha256(f"{int(seed)}/{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def fingerprint_parameters(named_params, like: Mapping[str, Sequence[int]] | None = None) -> str:
    """SHA-256 over names, shapes and bytes (float32) of the given parameters, in name order.

    like (name → shape): hash only the parameters that have that name *and* that shape, i.e. the part
    two models of different shapes have in common (a parameter-matched arm and its baseline). Without
    it every given parameter is hashed, exactly as before parameter matching existed.
    """
    digest = hashlib.sha256()
    if like is not None:
        named_params = [(n, p) for n, p in named_params if n in like and tuple(p.shape) == tuple(like[n])]
    for name, param in sorted(named_params, key=lambda item: item[0]):
        data = param.detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}:{tuple(data.shape)};".encode())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


class _NoDraws(torch.overrides.TorchFunctionMode):
    """Skips the random draws and `torch.nn.init`'s initialisers on meta tensors, which hold no values: their meta
    kernels are Python references, and the first of them a process runs imports torch._dynamo (~2 s)."""

    DRAWS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.exponential_, torch.Tensor.log_normal_,
                       torch.Tensor.cauchy_, torch.Tensor.geometric_, torch.Tensor.random_, torch.Tensor.bernoulli_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        drawn = func in self.DRAWS or getattr(func, "__module__", None) == "torch.nn.init"
        if drawn and isinstance(target, torch.Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def shape_only(config: GPTConfig) -> GPT:
    """The model on the meta device: its parameters' names, shapes and counts, with no memory allocated and no
    weight drawn (its RoPE tables, a few KB, are computed on the CPU)."""
    with torch.device("meta"), _NoDraws():
        return GPT(config)


def shared_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """name → shape of the parameters every arm has (`GPT.shared_named_parameters`), of a shape-only model."""
    return {n: tuple(p.shape) for n, p in shape_only(config).shared_named_parameters()}


def common_fingerprint(model: GPT) -> str:
    """The init fingerprint over the shared parameters whose shape does not depend on the MLP width.

    Parameter matching changes only the MLP hidden width (`ablate.sizing.model_config(match_params=True)`),
    so these are exactly the parameters a matched arm and its baseline both have with the same name and
    shape: equal for a matched pair of one seed, whatever the arm's width. The embeddings, attention
    projections and norms are in it; the MLP matrices of every layer are not (nor the arm's own weights).
    """
    wider = replace(model.config, mlp_hidden=model.config.mlp_width + 1)
    mine, other = shared_shapes(model.config), shared_shapes(wider)
    common = {n: s for n, s in mine.items() if other.get(n) == s}
    return fingerprint_parameters(model.shared_named_parameters(), like=common)


def model_summary(model: GPT, init_fingerprint: str, init_common: str) -> dict:
    """What a run's summary says of its model (`ablate.store_summary.started_summary`): the fingerprints of its
    initial weights (all shared ones, and those a matched arm shares: `common_fingerprint`) and its counts."""
    counts = model.param_counts()
    return {"init_fingerprint": init_fingerprint, "init_fingerprint_common": init_common,
            "params_total": counts["total"], "params_non_embedding": counts["non_embedding"],
            "params_arm_extra": counts["arm_extra"], "mlp_hidden": model.config.mlp_width}
