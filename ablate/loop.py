"""The pieces of a training run, each small enough to hold in the head: the optimiser, one optimisation step,
the evaluation over fixed windows, the read-back of device values, the checkpoint, the stop signals.

`ablate.train.Trainer` orchestrates them under Lightning Fabric (DDP, autocast, loggers); the synthetic task
(`ablate.taskrun`) calls the same optimiser and step without Fabric. Nothing here knows about Fabric:
a piece takes the callables it needs (`backward`, `clip`, `all_reduce`, `no_sync`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import queue
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import torch

from ablate.errors import AblateError, writing
from ablate.store import Status, atomic_write_bytes, read_metrics

STATE_KEYS = {"model", "optimizer", "stream", "data_fingerprint"}  # what every checkpoint holds


# ---------------------------------------------------------------------------------------------- signals
class StopRequests:
    """Signals set flags; the loop acts on them at the next step boundary (a consistent state).

    SIGUSR1: checkpoint now and go on. SIGUSR2 (SLURM's warning before a time limit or preemption),
    SIGTERM and SIGINT (Ctrl-C, unless the process was started ignoring it): checkpoint, then hand the
    signal to the handler that was there before (submitit's, which requeues the job; Python's, which
    raises KeyboardInterrupt) or stop.
    """

    def __init__(self):
        self.checkpoint = False
        self.stop_signal: int | None = None
        self.previous: dict[int, object] = {}

    def install(self):
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            if signum != signal.SIGINT or signal.getsignal(signum) is not signal.SIG_IGN:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        self.checkpoint = True
        if signum != signal.SIGUSR1:
            self.stop_signal = signum

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def hand_over(self):
        """After the checkpoint: let the earlier handler (submitit: requeue + exit) act, else stop."""
        previous = self.previous.get(self.stop_signal)
        self.restore()
        if callable(previous):
            previous(self.stop_signal, None)
        raise SystemExit(128 + self.stop_signal)


class Diverged(Exception):
    """A non-finite loss at `step`, noticed at `detected_at` (the next read-back boundary on a GPU)."""

    def __init__(self, step: int, loss: float, detected_at: int | None = None):
        super().__init__(f"non-finite training loss {loss} at step {step}")
        self.step, self.loss, self.detected_at = step, loss, detected_at if detected_at is not None else step

    def summary_fields(self) -> dict:
        """What a diverged run's summary says (a corpus run's and a task run's alike): status `diverged`, the step,
        no validation loss, the error; the tables show it as an outcome and `ablate status` never resubmits it."""
        return {"status": Status.DIVERGED, "diverged_step": self.step, "diverged_detected_at_step": self.detected_at,
                "val_loss": None, "error": str(self)}


def windows_fingerprint(windows, seq_len: int) -> str:
    """SHA-256 of the validation tokens actually evaluated (and the window length)."""
    digest = hashlib.sha256(f"ablate-val;seq_len={int(seq_len)};shape={tuple(windows.shape)};".encode())
    digest.update(windows.contiguous().numpy().astype("<i8").tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------- input path
def copy_in(batch: torch.Tensor, device, pin: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.pin_memory):
    """The batch on the device. To a GPU it is copied from pinned (page-locked) host memory with
    non_blocking=True, so the copy overlaps the work already queued (from pageable memory `non_blocking`
    does nothing); to the CPU it is the batch itself, as before. `pin` is a parameter for the tests."""
    if torch.device(device).type != "cuda":
        return batch.to(device)
    return pin(batch).to(device, non_blocking=True)


def chain_fingerprint(previous: str, batch: torch.Tensor) -> str:
    """sha256(previous hex digest + the batch's bytes): the data fingerprint after one more global batch."""
    digest = hashlib.sha256(previous.encode())
    digest.update(memoryview(batch.contiguous().numpy()).cast("B"))  # the bytes of .tobytes(), not copied
    return digest.hexdigest()


class DataFingerprint:
    """The data fingerprint, chained over every global batch trained on, computed in a background thread.

    Why a thread: hashing the 124M tier's global batch (512 × 1025 int64 tokens, 4.2 MB) takes about 1%
    of its planned H100 step (BENCHMARKS.md); hashlib releases the GIL, so the step goes on meanwhile.
    `value` waits for the batches added so far: the fingerprint is the same as hashing them in the loop.
    """

    def __init__(self, start: str):
        self._value, self._error = start, None
        self._queue: queue.Queue = queue.Queue(maxsize=16)  # a bound on the batches held in memory
        self._thread: threading.Thread | None = None

    def add(self, batch: torch.Tensor) -> None:
        """Hash `batch` (not changed afterwards) into the fingerprint, in the background."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="data-fingerprint", daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def _work(self):
        while True:
            batch = self._queue.get()
            try:
                if self._error is None:
                    self._value = chain_fingerprint(self._value, batch)
            except Exception as err:  # raised to the loop by `value`
                self._error = err
            finally:
                self._queue.task_done()

    @property
    def value(self) -> str:
        self._queue.join()
        if self._error is not None:
            raise self._error
        return self._value

    @value.setter
    def value(self, start: str) -> None:
        self._queue.join()
        self._value, self._error = start, None


# ---------------------------------------------------------------------------------------------- optimisation
def make_optimizer(model, weight_decay: float, lr: float, betas: Sequence[float], eps: float,
                   cuda: bool) -> torch.optim.AdamW:
    """AdamW over the model's own parameter groups (`GPT.param_groups`: decay on matrices and embeddings,
    none on norms and arm scalars), so that every run, the synthetic task's included, decays the same things.

    The groups' "names" are dropped (AdamW only needs the tensors); the fused kernel is used on CUDA only,
    where it is one launch per step instead of one per parameter.
    """
    groups = [{k: v for k, v in g.items() if k != "names"} for g in model.param_groups(weight_decay)]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **({"fused": True} if cuda else {}))


def _no_sync(enabled: bool) -> ContextManager:
    return nullcontext()


@dataclass
class Step:
    """One optimisation step over a global batch's micro-batches: set the lr, forward and backward each
    micro-batch (gradients accumulate, each loss weighted by its share of the rows), clip, step, zero.

    Why a piece of its own: the large runs and the synthetic task must step the same way (the same weighting,
    clip and update order), and a reader sees the whole update in one place. What differs between them is
    passed in: `loss_of(inputs, targets)` the micro-batch's mean loss; `backward(loss)` (Fabric's, for
    autocast and DDP); `clip()` returning the gradient norm; `no_sync(enabled)` to skip DDP's all-reduce on
    all but the last micro-batch; `all_reduce(loss)` the mean over ranks. With `halt_on_nonfinite` a
    non-finite loss raises `Diverged` before the optimiser step (reading the loss back costs nothing on a CPU).
    """

    optimizer: torch.optim.Optimizer
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    clip: Callable[[], torch.Tensor]
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward
    no_sync: Callable[[bool], ContextManager] = _no_sync
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    halt_on_nonfinite: bool = False

    def __call__(self, number: int, lr: float, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step `number` (1-based: the step count after it) at `lr`; returns (loss, grad norm), on the device."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rows = sum(inputs.shape[0] for inputs, _ in micro_batches)
        loss_sum = torch.zeros((), device=device)
        for i, (inputs, targets) in enumerate(micro_batches):
            with self.no_sync(i < len(micro_batches) - 1):
                loss = self.loss_of(inputs, targets) * (inputs.shape[0] / rows)
                self.backward(loss)
            loss_sum += loss.detach()
        grad_norm = self.clip()
        loss = self.all_reduce(loss_sum) if self.all_reduce is not None else loss_sum
        if self.halt_on_nonfinite and not math.isfinite(float(loss)):  # no optimiser step on a bad loss
            raise Diverged(number, float(loss), detected_at=number)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm


# ---------------------------------------------------------------------------------------------- evaluation
def mean_token_loss(model, windows: torch.Tensor, micro: int, device, rank: int = 0, world: int = 1,
                    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, loss_chunk: int = 0) -> float:
    """Mean token loss over fixed windows, summed in float64 in a fixed order (batches of `micro`).

    Why float64 and a fixed order: the final val_loss is compared across arms and resumes bit for bit, so it
    must not depend on how the sum was split. Rank r evaluates batches r, r + world, …; `all_reduce` sums
    the ranks' (loss, tokens). The model is left in training mode.

    loss_chunk > 0: each batch's loss is the training step's chunked loss (`GPT(..., loss_chunk=)`), so no
    more than `loss_chunk` tokens' logits exist at once; it equals the whole batch's to float32 rounding.
    0: the whole batch's logits at once (a CPU run's default: the sums tests/recorded_smoke_run.json holds).
    """
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for i, batch in enumerate(windows.split(micro)):
            if i % world != rank:
                continue
            batch = batch.to(device)
            if loss_chunk > 0:  # the mean over the batch's tokens (none ignored), back to their sum
                losses = model(batch[:, :-1], batch[:, 1:], loss_chunk=loss_chunk).loss.double() * batch[:, 1:].numel()
            else:
                logits = model(batch[:, :-1]).logits.float()
                losses = torch.nn.functional.cross_entropy(
                    logits.view(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
                del logits
            total += torch.stack([losses.double(), torch.tensor(batch[:, 1:].numel(), dtype=torch.float64,
                                                                 device=device)])
    model.train()
    total = all_reduce(total) if world > 1 and all_reduce is not None else total
    return float(total[0] / total[1])


# ---------------------------------------------------------------------------------------------- read-back
@dataclass
class ReadBack:
    """The steps' losses and gradient norms kept on the device, read back together at a boundary.

    Why: on a GPU every read of a device value stalls the kernel queue, so the loop reads every
    log_interval steps (and at evaluations and checkpoints), one copy for all pending steps. A non-finite
    loss is caught here (`Diverged`, naming its step and the step it was noticed at). Each row goes to
    `write_row`; a validation loss recorded in `curve` joins its step's row.
    """

    tokens_per_step: int
    write_row: Callable[[dict], None]
    bar: object = None  # a tqdm bar, advanced one step per row
    pending: list = field(default_factory=list)  # (step, lr, loss, grad_norm, end time)
    curve: dict = field(default_factory=dict)  # step -> validation loss not yet written
    started: float = field(default_factory=time.time)  # when the first pending step began

    def begin_step(self):
        if not self.pending:
            self.started = time.time()

    def add(self, step: int, lr: float, loss: torch.Tensor, grad_norm: torch.Tensor):
        self.pending.append((step, lr, loss.detach(), grad_norm.detach(), time.time()))

    def flush(self, now_step: int):
        """One device→host copy for the steps since the last boundary; divergence is caught here."""
        if not self.pending:
            return
        pending, tokens = self.pending, self.tokens_per_step
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for _, _, loss, norm, _ in pending]).tolist()
        elapsed = pending[-1][4] - self.started  # training time only: evaluations and checkpoints come after
        for (row_step, row_lr, _, _, _), (loss, norm) in zip(pending, values):
            if not math.isfinite(loss):
                pending.clear()
                raise Diverged(row_step, loss, detected_at=now_step)
            row = {"step": row_step, "tokens": row_step * tokens, "train_loss": loss, "lr": row_lr,
                   "grad_norm": norm, "tokens_per_s": tokens * len(values) / max(elapsed, 1e-9)}
            if row_step in self.curve:
                row["val_loss"] = self.curve.pop(row_step)
            self.write_row(row)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        pending.clear()


class MetricsLog:
    """RUN_DIR/metrics.jsonl, one row a line with the time it was written, and the loggers' copy of it.

    Why `truncate`: on resume the rows after the checkpoint are produced again (the same numbers), so the
    ones already written are dropped first and the file never holds a step twice. `holding()`, before each write,
    raises once the run's lock is another process's (`ablate.lock.FileLock.check_held`)."""

    def __init__(self, path: Path, log_dict: Callable[..., None] | None = None,
                 holding: Callable[[], None] = lambda: None):
        self.path, self.log_dict, self.holding = path, log_dict, holding

    def write(self, row: dict):
        self.holding()
        with writing(self.path), open(self.path, "a", encoding="utf-8") as handle:  # a torn line is skipped
            handle.write(json.dumps({**row, "time": round(time.time(), 3)}) + "\n")
        if self.log_dict is not None:
            self.log_dict({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def truncate(self, step: int):
        self.holding()
        if self.path.exists():
            rows = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def log_to_file(path: Path) -> logging.Handler:
    """The run's own log, RUN_DIR/run.log (appended across resumes), whatever runs it: local or SLURM.
    The caller removes the handler from the "ablate" logger and closes it when the run ends."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    package_log = logging.getLogger("ablate")
    if package_log.getEffectiveLevel() > logging.INFO:
        package_log.setLevel(logging.INFO)
    package_log.addHandler(handler)
    return handler


def progress_bar(total: int, initial: int, desc: str):
    """A tqdm bar over the run's steps (`ReadBack` advances it as it writes the rows)."""
    from tqdm.auto import tqdm  # reason: start-up time, only a run with a progress bar needs it

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------- checkpoint
@dataclass
class RunState:
    """What changes as a run trains, and what its checkpoint records: the model (and Fabric's wrappings of it
    and of the optimiser), the data stream and its position, the fingerprints, the wall time so far."""

    model: torch.nn.Module
    stream: object  # an `ablate.data.BatchStream`: its state is the data position
    init_fingerprint: str
    forward_model: object = None
    optimizer: object = None
    step: int = 0
    wall: float = 0.0  # training seconds before this process's start (`t_resume`)
    t_resume: float = 0.0
    loss_chunk: int = 0  # tokens per chunk of the loss in the steps and evaluations (0: the whole micro-batch)
    data: DataFingerprint = field(default_factory=lambda: DataFingerprint(hashlib.sha256(b"ablate-data").hexdigest()))

    @property
    def data_fp(self) -> str:
        """The data fingerprint of the batches trained on so far (waits for the background hashing)."""
        return self.data.value

    @data_fp.setter
    def data_fp(self, value: str) -> None:
        self.data.value = value

    def wall_seconds(self) -> float:
        return self.wall + time.time() - self.t_resume

    def state_dict(self) -> dict:
        """Everything needed to resume at this step boundary, bit for bit."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "stream": self.stream.state_dict(), "data_fingerprint": self.data_fp,
                "init_fingerprint": self.init_fingerprint, "wall_seconds": self.wall_seconds()}

    def load_state_dict(self, blob: dict) -> None:
        self.model.load_state_dict(blob["model"])
        self.optimizer.load_state_dict(blob["optimizer"])
        self.stream.load_state_dict(blob["stream"])  # refuses a checkpoint of another data stream
        self.step, self.data_fp, self.wall = self.stream.step, blob["data_fingerprint"], blob["wall_seconds"]
        self.init_fingerprint = blob["init_fingerprint"]


def save_state(path: Path, state: dict) -> None:
    """Write the resume state atomically: a crash mid-write leaves the previous checkpoint whole."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_state(path: Path) -> dict:
    """The checkpoint, loaded without running code (weights_only): a crafted pickle is refused."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for a crafted pickle; struct/zip/EOF errors for a damaged file
        first = str(err).strip().splitlines()[0] if str(err).strip() else err.__class__.__name__
        raise AblateError(
            f"{path} cannot be loaded safely ({first[:200]}); it is damaged or holds more than tensors "
            "and plain values. Rerun with --force to keep this run aside and start again") from None
    if not isinstance(blob, dict) or not STATE_KEYS <= set(blob):
        raise AblateError(f"{path} is not an ablate checkpoint; rerun with --force to start again")
    return blob
