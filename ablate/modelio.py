"""A trained run as probes and evals read it: its weights (saved with their config), its config and
identity, and its fixed validation batches.

Probes take token batches directly (so tests and notebooks can pass any tokens); this module only
supplies the default ones. A batch is either a LongTensor (b, T+1) — inputs [:, :-1], targets
[:, 1:], the form `ablate.data.validation_batches` returns — or an (inputs, targets) pair, the form
of tasks whose targets are not the shifted inputs (the synthetic task marks positions that predict
nothing with -100, cross-entropy's ignore index).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import torch

from ablate.data import validation_batches
from ablate.data.filter import task_from_fields, task_validation
from ablate.errors import AblateError
from ablate.lock import FileLock
from ablate.model import GPT, GPTConfig
from ablate.taskmodel import built_model, is_strict_causal
from ablate.runconfig import RunConfig
from ablate.store import CHECKPOINTS, CONFIG, FINAL_WEIGHTS, atomic_write_bytes, read_json_file, run_lock_path, run_of
from ablate.store_summary import verified_weights_sha256
from ablate.tiers import TIERS


def save_model(model: GPT, path: str | Path) -> None:
    buffer = io.BytesIO()
    strict = {"strict_causal": True} if is_strict_causal(model) else {}  # a stream-task model (ablate.taskmodel)
    torch.save({"config": dataclasses.asdict(model.config), "state_dict": model.state_dict(), **strict}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_model(path: str | Path) -> GPT:
    """The model saved at `path` (`save_model`), loaded without running code (weights_only). A damaged file,
    or one that is not weights ablate saved, is refused in one line naming it."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model = built_model(GPTConfig(**blob["config"]), strict_causal=bool(blob.get("strict_causal", False)))
        model.load_state_dict(blob["state_dict"])
    except AblateError:
        raise
    except Exception as err:  # UnpicklingError, zip/EOF errors, a foreign dict (KeyError/TypeError), shapes
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise AblateError(f"{path} is damaged or is not weights ablate saved ({err.__class__.__name__}: {first}); "
                          "rerun the run with `ablate run ... --force`") from None
    return model.eval()


@contextlib.contextmanager
def final_weights_held(run_dir: str | Path, device: str = "cpu"):
    """`with final_weights_held(RUN_DIR) as (model, config, identity, weights_sha256):` the run's final weights,
    checked to be those it completed with, and its lock for as long as the reader works (as `ablate eval`
    holds it): no `ablate run --force` replaces the run meanwhile, so the result written inside, with the
    weights' sha256 beside it, is of the weights it names."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise AblateError(f"run folder {str(run_dir)!r} does not exist")
    with FileLock(run_lock_path(folder), what=f"run {folder}"):
        weights = verified_weights_sha256(folder)
        model, config, identity = load_run(folder, device)
        yield model, config, identity, weights


def load_trained_model(run_dir: str | Path) -> GPT:
    """The final weights of a run (RUN_DIR/checkpoints/model.pt), in eval mode on the CPU."""
    path = Path(run_dir) / CHECKPOINTS / FINAL_WEIGHTS
    if not path.is_file():
        raise AblateError(f"{run_dir} has no trained weights ({path} is missing): has the run completed?")
    return load_model(path)


def read_run_config(run_dir: str | Path) -> RunConfig:
    """The run's config.json as its RunConfig; every option unset (None, or its default) for weights saved by hand
    in a folder without one."""
    path = Path(run_dir) / CONFIG
    if not Path(run_dir).is_dir():
        raise AblateError(f"run folder {str(run_dir)!r} does not exist")
    if not path.is_file():
        return RunConfig()
    return RunConfig.from_dict(read_json_file(path, f"put the run's {CONFIG} back, or rerun the run"))


def run_identity(run_dir: str | Path, config: RunConfig, arm: str) -> dict:
    """{"tier", "arm", "seed"} from config.json, else from the folder's name (`run_of`), else what is known."""
    try:
        named = run_of(Path(run_dir).resolve())
    except AblateError:  # weights saved by hand outside a results folder
        named = None
    seed = config.seed if config.seed is not None else (named.seed if named else None)
    tier = config.tier if config.tier is not None else (named.tier if named else None)
    return {"tier": tier, "arm": config.arm if config.arm is not None else arm, "seed": seed}


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch in either form (module docstring) → (inputs (b, T), targets (b, T))."""
    if isinstance(batch, (tuple, list)):
        inputs, targets = batch
        return inputs, targets
    if batch.dim() != 2 or batch.shape[1] < 2:
        raise AblateError(f"a token batch must be (b, T+1) with T ≥ 1, got shape {tuple(batch.shape)}")
    return batch[:, :-1], batch[:, 1:]


def validation_batches_for_run(config: RunConfig, n_batches: int, batch_size: int) -> list:
    """The run's fixed validation batches: the synthetic task's, or the corpus shards' (ablate.data)."""
    if n_batches < 1 or batch_size < 1:
        raise AblateError(f"--batches and --batch-size must be ≥ 1, got {n_batches} and {batch_size}")
    if config.synthetic_task is not None:
        return task_validation(task_from_fields(config.synthetic_task), batch_size, n_batches)
    missing = [key for key, value in (("data_dir", config.data_dir), ("seq_len", config.seq_len)) if value is None]
    if missing:
        raise AblateError(f"config.json of the run lacks {', '.join(missing)}: cannot find its validation tokens")
    batches = validation_batches(config.data_dir, int(config.seq_len), batch_size, n_batches)
    full = [batch for batch in batches if batch.shape[0] == batch_size]
    return full or batches  # a short last batch would weigh unevenly (and structural junk needs two sequences)


def load_run(run_dir: str | Path, device: str = "cpu"):
    """(model in eval mode on `device`, its RunConfig, identity dict) of a trained run. Weights of another model
    than the run's config.json names (a model.pt copied in from elsewhere) are refused."""
    config = read_run_config(run_dir)
    model = load_trained_model(run_dir).to(device)
    model.document_mask = bool(config.document_mask)  # the run's option: evaluated as it trained
    saved = json.loads(json.dumps(dataclasses.asdict(model.config)))
    file = Path(run_dir) / CONFIG  # its model as the file holds it (none: weights saved by hand, no config.json)
    recorded = read_json_file(file, "use `ablate run --force`").get("model") if file.is_file() else None
    if recorded is not None and recorded != saved:
        differ = sorted(k for k in set(saved) | set(recorded) if saved.get(k) != recorded.get(k))
        raise AblateError(f"{Path(run_dir) / CHECKPOINTS / FINAL_WEIGHTS} holds another model than the run's "
                          f"{CONFIG} (they differ in: {', '.join(differ)}): not this run's weights")
    return model, config, run_identity(run_dir, config, model.config.arm)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def generate_from_run(run_dir: str | Path, prompt: str, tokens: int, temperature: float = 0.0, seed: int = 0,
                      device: str = "cpu") -> tuple[list[int], list[int]]:
    """(the prompt's GPT-2 tokens, the `tokens` new ones) a trained corpus run decodes with its KV cache
    (`GPT.generate`): greedy at temperature 0, else sampled from a generator seeded with `seed`. A task tier's run
    (task tokens, not text), an arm a cache cannot decode (`Arm.no_decoding`) and a prompt longer than the run's
    context are refused in one line."""
    from ablate.data import encode  # reason: tiktoken loads only for text

    config = read_run_config(run_dir)
    tier = TIERS.get(config.tier) if config.tier else None
    if config.synthetic_task is not None or (tier is not None and tier.task is not None):
        raise AblateError(f"{run_dir} is a run of the task tier {config.tier!r}: its model reads the task's tokens, "
                          "not GPT-2 text; `ablate generate` decodes corpus runs only")
    if tokens < 1 or (temperature is not None and temperature < 0):
        raise AblateError(f"--tokens {tokens} and --temperature {temperature}: give a positive number of tokens and "
                          "a temperature ≥ 0 (0: greedy)")
    model, _, _ = load_run(run_dir, device)
    model.new_cache()  # an arm a KV cache cannot decode: one line naming it and why
    ids = encode(prompt)
    room = model.config.max_seq_len
    if not ids or len(ids) + tokens > room:
        raise AblateError(f"the prompt is {len(ids)} GPT-2 tokens and --tokens {tokens}: together they must be 1 to "
                          f"{room} (the run's context, max_seq_len)")
    generator = torch.Generator(device).manual_seed(int(seed)) if temperature else None
    out = model.generate(torch.tensor([ids], device=device), tokens, temperature=temperature, generator=generator)
    return ids, out[0, len(ids):].tolist()
