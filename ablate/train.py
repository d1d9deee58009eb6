"""One run = (tier, arm, seed): Lightning Fabric training with matched init and data, exact resume.

Why Fabric and a hand-written loop rather than `Trainer.fit`: bitwise resume needs the step, the data
position, the optimiser state and the data fingerprint saved together at one step boundary, and the
preemption signal turned into a checkpoint at that boundary. Fabric still gives us the Lightning
parts that matter at scale (DDP launch over GPUs or CPU/gloo, bf16 autocast, loggers).

The learning rate is a pure function of the step (no scheduler state to restore); the batch of step k
is a pure function of (data, seed, global batch, seq len, k) (`ablate.data.BatchStream`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import math
import os
import platform
import signal
import subprocess
import time
import traceback
from pathlib import Path

from ablate.errors import AblateError
from ablate.experiment import RunSpec
from ablate.paths import REPO_ROOT, default_results
from ablate.config import lr_at, resolve_config, semantic  # noqa: F401 (resolve_config: re-exported)
from ablate.identity import config_fingerprint
from ablate.lock import FileLock, held_by_parent
from ablate.store import (CHECKPOINTS, CONFIG, METRICS, RUN_LOG, SUMMARY, atomic_write_bytes, atomic_write_json, read_json,
                          finished, read_json_file, read_metrics, remove_stray_temporaries, run_dir, run_lock_path)
from ablate.tiers import get_tier

log = logging.getLogger(__name__)
STATE_FILE = "state.pt"  # RUN_DIR/checkpoints/state.pt: everything needed to resume
LOSS_CHUNK = 8192  # tokens per chunk of the loss on a GPU (float32 logits of 8192 × 50,304: 1.6 GB)
# ---------------------------------------------------------------------------------------------- provenance
def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict:
    import lightning
    import numpy
    import torch

    import ablate

    return {"ablate": ablate.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "lightning": lightning.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
            "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


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


def windows_fingerprint(windows, seq_len: int) -> str:
    """SHA-256 of the validation tokens actually evaluated (and the window length)."""
    digest = hashlib.sha256(f"ablate-val;seq_len={int(seq_len)};shape={tuple(windows.shape)};".encode())
    digest.update(windows.contiguous().numpy().astype("<i8").tobytes())
    return digest.hexdigest()


class Diverged(Exception):
    """A non-finite loss at `step`, noticed at `detected_at` (the next read-back boundary on a GPU)."""

    def __init__(self, step: int, loss: float, detected_at: int | None = None):
        super().__init__(f"non-finite training loss {loss} at step {step}")
        self.step, self.loss, self.detected_at = step, loss, detected_at if detected_at is not None else step


# ---------------------------------------------------------------------------------------------- the run
def prepare_run_dir(folder: Path, config: dict, force: bool) -> str:
    """'fresh' | 'resume' | 'done'. Never deletes: --force moves the old folder aside (the store ignores it).

    A folder holding results (a summary, metrics, checkpoints) but no config.json is damaged: refused,
    never retrained in place. A run of other settings is refused, unless it never took a step (nothing
    of it would be lost): then it starts again with the new settings.
    """
    summary_path, config_path = folder / SUMMARY, folder / CONFIG
    if force and folder.exists():
        aside = folder.with_name(f"{folder.name}.old-{dt.datetime.now():%Y%m%d-%H%M%S-%f}")
        folder.rename(aside)
        log.warning("kept the previous run aside in %s", aside)
    way_out = "use --force to keep the old run aside and start again"
    if not config_path.exists():
        held = [name for name in (SUMMARY, METRICS, CHECKPOINTS) if (folder / name).exists()]
        if held:
            raise AblateError(f"{folder} is damaged: it holds {', '.join(held)} but no {CONFIG}; {way_out}")
        return "fresh"
    previous, current = semantic(read_json_file(config_path, way_out)), semantic(config)
    summary = read_json_file(summary_path, way_out) if summary_path.exists() else {}
    if previous != current:
        diff = sorted(k for k in set(previous) | set(current) if previous.get(k) != current.get(k))
        if not took_a_step(folder, summary):
            log.warning("%s never took a step: starting it again with the new settings (they differ in: %s)",
                        folder, ", ".join(diff))
            summary_path.unlink(missing_ok=True)  # the record of an attempt that produced nothing
            return "fresh"
        raise AblateError(
            f"{folder} holds a run of a different config (differs in: {', '.join(diff)}); "
            "use another --results folder or --force to keep the old run aside and start again")
    return "done" if finished(summary) else "resume"


def took_a_step(folder: Path, summary: dict) -> bool:
    """Whether a run folder holds anything of a training step: a checkpoint, weights, a step's metrics."""
    checkpoints = folder / CHECKPOINTS
    if finished(summary) or summary.get("steps") or (checkpoints.is_dir() and any(checkpoints.iterdir())):
        return True
    return any(row.get("step") for row in read_metrics(folder / METRICS) if isinstance(row, dict))


RANK_VARIABLES = ("LOCAL_RANK", "RANK")


def claimed_rank() -> int:
    """The non-zero process rank the environment claims (LOCAL_RANK, else RANK), or 0."""
    for name in RANK_VARIABLES:
        try:
            rank = int(os.environ.get(name) or 0)
        except ValueError:
            continue
        if rank:
            return rank
    return 0


def launched_child(folder: Path) -> bool:
    """True only in a data-parallel child of the process that holds the run (it handed down the run lock's
    token, `FileLock.handed_down`). Anything else that claims a rank is an ordinary run, with every guard."""
    if not claimed_rank():
        return False
    if held_by_parent(run_lock_path(folder)):
        return True
    log.warning("the environment claims rank %d, but this process's parent does not hold %s: running it as an "
                "ordinary run", claimed_rank(), folder)
    return False


def run(spec: RunSpec, results: str | Path | None = None, *, data_dir: str | None = None, force: bool = False,
        **options) -> dict:
    """Train one run to completion (or resume it); return its summary. A completed run is a no-op.

    The run folder is locked for the whole run (`ablate.lock`): a second process on the same run is
    refused at once, naming the holder, before it touches anything.
    """
    return run_as(spec, results, data_dir, force, options)[0]


def run_as(spec: RunSpec, results, data_dir, force: bool, options: dict) -> tuple[dict, bool]:
    """`run`, and whether this process took part as a data-parallel child of the run's holder (a child
    reports nothing: its parent does)."""
    config = resolve_config(spec, data_dir, **options)
    folder = run_dir(results or default_results(), spec.experiment, spec.tier, spec.arm, spec.seed)
    if launched_child(folder):
        return Trainer(folder, config).fit(), True
    with FileLock(run_lock_path(folder), what=f"run {spec.key} ({folder})") as lock:
        state = prepare_run_dir(folder, config, force)
        if state == "done":
            summary = read_json(folder / SUMMARY)
            log.info("%s already %s (val_loss %s): nothing to do", folder, summary["status"], summary.get("val_loss"))
            return summary, False
        check_data_folder(config["data_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        for stray in remove_stray_temporaries(folder) + remove_stray_temporaries(folder / CHECKPOINTS):
            log.info("removed %s, left by an interrupted write", stray)
        if state == "fresh":
            atomic_write_json(folder / CONFIG, config)
        with lock.handed_down():  # the proof the data-parallel children this process starts show
            return Trainer(folder, config).fit(), False


def check_data_folder(data_dir: str) -> None:
    """A data folder that is not a prepared one is refused before the run folder is touched."""
    from ablate.data.shards import read_manifest

    try:
        read_manifest(data_dir)
    except AblateError as err:
        raise AblateError(f"{err}; pass --data a folder made by `ablate data prepare`") from None


class Trainer:
    def __init__(self, folder: Path, config: dict):
        self.folder, self.config = folder, config
        self.summary_path = folder / SUMMARY
        self.state_path = folder / CHECKPOINTS / STATE_FILE

    def write_summary(self, **fields):
        if self.fabric.global_rank != 0:
            return
        summary = read_json(self.summary_path) if self.summary_path.exists() else {}
        summary.update(fields)
        atomic_write_json(self.summary_path, summary)

    def fit(self) -> dict:
        import warnings

        import torch
        from lightning.fabric import Fabric

        # Fabric warns whenever `srun` exists on PATH; one run per task is how we use SLURM on purpose.
        warnings.filterwarnings("ignore", message=".*`srun` command is available")

        config = self.config
        if config["threads"]:
            torch.set_num_threads(int(config["threads"]))
        cuda = torch.cuda.is_available()
        devices = int(config["devices"])
        self.fabric = fabric = Fabric(
            accelerator="cuda" if cuda else "cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
            precision="bf16-mixed" if cuda else "32-true", loggers=self._loggers())
        fabric.launch()
        to_file = fabric.global_rank == 0 and not os.environ.get("ABLATE_LOG_TO_STDERR_ONLY")
        handler = self._log_to_file() if to_file else None
        try:
            return self._fit(fabric)
        except Diverged as err:
            log.warning("%s: %s", self.folder, err)
            self.write_summary(status="diverged", diverged_step=err.step, diverged_detected_at_step=err.detected_at,
                               val_loss=None, finished=now(), error=str(err))
            return read_json(self.summary_path)
        except AblateError as err:  # bad input: one line (the command shows it), no traceback
            self.write_summary(status="failed", finished=now(), error=f"ablate: error: {err}")
            raise
        except Exception as err:
            log.exception("%s: the run failed: %s", self.folder, err)
            self.write_summary(status="failed", finished=now(), error=traceback.format_exc()[-4000:])
            raise
        finally:
            if handler is not None:
                logging.getLogger("ablate").removeHandler(handler)
                handler.close()

    def _log_to_file(self) -> logging.Handler:
        """The run's own log, RUN_DIR/run.log (appended across resumes), whatever runs it: local or SLURM."""
        handler = logging.FileHandler(self.folder / RUN_LOG, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.INFO)
        package_log = logging.getLogger("ablate")
        if package_log.getEffectiveLevel() > logging.INFO:
            package_log.setLevel(logging.INFO)
        package_log.addHandler(handler)
        return handler

    @property
    def logger_run_id(self) -> str:
        """The logger's run id: a function of the run folder, so a requeued job logs into the same run."""
        return hashlib.sha256(str(self.folder.resolve()).encode()).hexdigest()[:16]

    def _loggers(self):
        kind = self.config["logger"]
        if kind == "none":
            return []
        run_id = self.logger_run_id
        if kind == "tensorboard":
            from lightning.fabric.loggers import TensorBoardLogger

            return [TensorBoardLogger(root_dir=str(self.folder / "tensorboard"), name="", version=run_id)]
        if kind == "wandb":
            from lightning.pytorch.loggers import WandbLogger

            return [WandbLogger(project="ablate", name=self.folder.as_posix(), id=run_id, resume="allow")]
        raise AblateError(f"unknown logger {kind!r}; valid loggers: none, tensorboard, wandb")

    def _load_state(self, torch) -> dict:
        """The checkpoint, loaded without running code (weights_only): a crafted pickle is refused."""
        try:
            blob = torch.load(self.state_path, map_location="cpu", weights_only=True)
        except Exception as err:  # UnpicklingError for a crafted pickle; struct/zip/EOF errors for a damaged file
            first = str(err).strip().splitlines()[0] if str(err).strip() else err.__class__.__name__
            raise AblateError(
                f"{self.state_path} cannot be loaded safely ({first[:200]}); it is damaged or holds more than tensors "
                "and plain values. Rerun with --force to keep this run aside and start again") from None
        if not isinstance(blob, dict) or not {"model", "optimizer", "stream", "data_fingerprint"} <= set(blob):
            raise AblateError(f"{self.state_path} is not an ablate checkpoint; rerun with --force to start again")
        return blob

    def _fit(self, fabric) -> dict:
        import torch

        from ablate.data import BatchStream, TokenShards, validation_windows
        from ablate.model import GPT, GPTConfig, common_fingerprint, fingerprint_parameters
        from ablate.modelio import FINAL_WEIGHTS, save_model
        from ablate.store import file_sha256

        config = self.config
        tier = get_tier(config["tier"])
        shards = TokenShards(config["data_dir"], split="train")
        if shards.tokenizer != tier.tokenizer or shards.vocab_size != config["model"]["vocab_size"]:
            raise AblateError(
                f"data folder {config['data_dir']} holds {shards.tokenizer!r} tokens (vocabulary {shards.vocab_size}); "
                f"tier {tier.name!r} expects {tier.tokenizer!r} (vocabulary {config['model']['vocab_size']})")
        world, rank = fabric.world_size, fabric.global_rank
        stream = BatchStream(shards, seed=config["data_seed"], global_batch=config["global_batch"],
                             seq_len=config["seq_len"], rank=rank, world_size=world)
        local_rows = config["global_batch"] // world
        micro = min(config["micro_batch"], local_rows)
        if local_rows % micro:
            raise AblateError(f"micro_batch {micro} must divide the per-rank batch {local_rows}")
        # Which windows are evaluated depends on the data, seq_len and the token count only (not micro/world).
        curve_windows = validation_windows(config["data_dir"], config["seq_len"], config["val_tokens"])
        final_windows = validation_windows(config["data_dir"], config["seq_len"], config["final_val_tokens"])

        torch.manual_seed(config["seed"])
        model = GPT(GPTConfig(**config["model"]))
        model.init_weights(config["seed"])
        init_fingerprint = fingerprint_parameters(model.shared_named_parameters())
        # A parameter-matched arm narrows its MLP: it shares with its baseline the parameters whose name and
        # shape do not depend on the MLP width, and this fingerprint covers exactly those.
        init_common = common_fingerprint(model)
        groups = [{k: v for k, v in g.items() if k != "names"} for g in model.param_groups(config["weight_decay"])]
        cuda, on_cpu = fabric.device.type == "cuda", fabric.device.type == "cpu"
        if cuda:  # TF32 for the float32 matmuls that autocast leaves (bf16 does the bulk)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        optimizer = torch.optim.AdamW(groups, lr=config["lr"], betas=tuple(config["betas"]), eps=config["eps"],
                                      **({"fused": True} if cuda else {}))
        counts = model.param_counts()
        forward_model = torch.compile(model) if config["compile"] else model
        forward_model, optimizer = fabric.setup(forward_model, optimizer)

        step, data_fp, wall = 0, hashlib.sha256(b"ablate-data").hexdigest(), 0.0
        resumed = self.state_path.exists()
        if resumed:
            blob = self._load_state(torch)
            model.load_state_dict(blob["model"])
            optimizer.load_state_dict(blob["optimizer"])
            stream.load_state_dict(blob["stream"])  # refuses a checkpoint of another data stream
            step, data_fp, wall = stream.step, blob["data_fingerprint"], blob["wall_seconds"]
            init_fingerprint = blob["init_fingerprint"]
            log.info("%s: resuming at step %d of %d", self.folder, step, config["steps"])
        else:
            log.info("%s: starting %s/%s/seed%d, %d steps", self.folder, config["tier"], config["arm"], config["seed"],
                     config["steps"])
        if rank == 0:  # lines after the checkpoint (or all of them, with none) will be written again
            self._truncate_metrics(step if resumed else -1)
        self.write_summary(
            tier=config["tier"], arm=config["arm"], seed=config["seed"], experiment=config["experiment"],
            status="running", val_loss=None, steps=step, total_steps=config["steps"],
            tokens=step * config["global_batch"] * config["seq_len"],
            init_fingerprint=init_fingerprint, init_fingerprint_common=init_common, data_fingerprint=data_fp,
            config_fingerprint=config_fingerprint(config),
            loss_read_every=1 if on_cpu else config["log_interval"],
            val_fingerprint=None, val_tokens_evaluated=None, params_total=counts["total"],
            params_non_embedding=counts["non_embedding"], params_arm_extra=counts["arm_extra"],
            mlp_hidden=model.config.mlp_width, match_params=bool(config["match_params"]),
            git_commit=git_commit(), versions=versions(), started=self._started(), finished=None,
            wall_seconds=wall, data_dir=config["data_dir"], data_id=shards.fingerprint, error=None,
            logger_run_id=self.logger_run_id if config["logger"] != "none" else None)

        def evaluate(windows) -> float:
            """Mean token loss over fixed windows, summed in float64 in a fixed order (batches of `micro`)."""
            forward_model.eval()
            total = torch.zeros(2, dtype=torch.float64, device=fabric.device)
            with torch.no_grad():
                for i, batch in enumerate(windows.split(micro)):
                    if i % world != rank:
                        continue
                    batch = batch.to(fabric.device)
                    logits = forward_model(batch[:, :-1]).logits.float()
                    losses = torch.nn.functional.cross_entropy(
                        logits.view(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
                    total += torch.stack([losses.double(), torch.tensor(batch[:, 1:].numel(), dtype=torch.float64,
                                                                         device=fabric.device)])
            forward_model.train()
            total = fabric.all_reduce(total, reduce_op="sum") if world > 1 else total
            return float(total[0] / total[1])

        def save_state():
            fabric.barrier()
            if rank == 0:
                buffer = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "stream": stream.state_dict(), "data_fingerprint": data_fp,
                            "init_fingerprint": init_fingerprint, "wall_seconds": wall + time.time() - t_resume},
                           buffer)
                atomic_write_bytes(self.state_path, buffer.getvalue())
                self.write_summary(steps=step, tokens=step * config["global_batch"] * config["seq_len"],
                                   data_fingerprint=data_fp, wall_seconds=wall + time.time() - t_resume)
            fabric.barrier()

        requests = StopRequests().install()
        t_resume = time.time()
        total_steps = config["steps"]
        bar = None
        if rank == 0 and config["progress"]:
            from tqdm.auto import tqdm

            bar = tqdm(total=total_steps, initial=step, desc=f"{config['tier']}/{config['arm']}/seed{config['seed']}",
                       unit="step", dynamic_ncols=True)
        tokens_per_step = config["global_batch"] * config["seq_len"]
        # On a GPU every read of a device value stalls the kernel queue: losses are read every log_interval
        # steps (and at evaluations and checkpoints). On the CPU a read costs nothing, so it happens every
        # step and a non-finite loss stops the run before its optimiser step, exactly as it always did.
        read_every_step = on_cpu
        # The float32 logits of a whole micro-batch (and their gradient) dominate GPU memory at small d_model:
        # on a GPU the loss is computed LOSS_CHUNK tokens at a time unless the run says otherwise (0: never).
        loss_chunk = config["loss_chunk"] if config["loss_chunk"] is not None else (0 if on_cpu else LOSS_CHUNK)
        try:
            if step == 0:
                val_loss = evaluate(curve_windows)
                self._log_metrics({"step": 0, "tokens": 0, "val_loss": val_loss})
            pending = []  # (step, lr, loss, grad_norm, end time) still on the device: read at the next boundary
            t_interval = time.time()  # when the first step of `pending` began

            def flush():
                """One device→host copy for the steps since the last boundary; divergence is caught here."""
                if not pending:
                    return
                values = torch.stack([torch.stack([loss.float(), norm.float()]) for _, _, loss, norm, _ in pending])
                values = values.tolist()
                elapsed = pending[-1][4] - t_interval  # training time only: evaluations and checkpoints come after
                for (row_step, row_lr, _, _, _), (loss, norm) in zip(pending, values):
                    if not math.isfinite(loss):
                        pending.clear()
                        raise Diverged(row_step, loss, detected_at=step)
                    row = {"step": row_step, "tokens": row_step * tokens_per_step, "train_loss": loss, "lr": row_lr,
                           "grad_norm": norm, "tokens_per_s": tokens_per_step * len(values) / max(elapsed, 1e-9)}
                    if row_step in curve:
                        row["val_loss"] = curve.pop(row_step)
                    self._log_metrics(row)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
                pending.clear()

            curve = {}
            while step < total_steps:
                if not pending:
                    t_interval = time.time()
                lr = lr_at(step, config)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                global_batch = stream.global_batch(step)
                data_fp = hashlib.sha256(data_fp.encode() + global_batch.numpy().tobytes()).hexdigest()
                local = global_batch[rank * local_rows:(rank + 1) * local_rows].to(fabric.device, non_blocking=True)
                loss_sum = torch.zeros((), device=fabric.device)
                chunks = local.split(micro)
                for i, chunk in enumerate(chunks):
                    with fabric.no_backward_sync(forward_model, enabled=i < len(chunks) - 1):
                        loss = forward_model(chunk[:, :-1], chunk[:, 1:], loss_chunk=loss_chunk).loss * (
                            chunk.shape[0] / local_rows)
                        fabric.backward(loss)
                    loss_sum += loss.detach()
                grad_norm = fabric.clip_gradients(forward_model, optimizer, max_norm=config["grad_clip"],
                                                  error_if_nonfinite=False)
                train_loss = fabric.all_reduce(loss_sum, reduce_op="mean") if world > 1 else loss_sum
                if read_every_step and not math.isfinite(float(train_loss)):  # no optimiser step on a bad loss
                    raise Diverged(step + 1, float(train_loss), detected_at=step + 1)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                stream.step = step  # the position a checkpoint records
                pending.append((step, lr, train_loss.detach(), grad_norm.detach(), time.time()))
                evaluate_now = step % config["val_interval"] == 0 or step == total_steps
                checkpoint_now = step % config["checkpoint_interval"] == 0 or requests.checkpoint
                if evaluate_now:
                    curve[step] = val_loss = evaluate(curve_windows)
                    flush()  # a non-finite training loss before this point is reported first, as the cause
                    log.info("%s: step %d/%d val_loss %.4f", self.folder, step, total_steps, val_loss)
                    if not math.isfinite(val_loss):
                        raise Diverged(step, val_loss, detected_at=step)
                if read_every_step or checkpoint_now or step % config["log_interval"] == 0:
                    flush()
                if checkpoint_now:
                    save_state()
                    requests.checkpoint = False
                    if requests.stop_signal is not None:
                        log.warning("%s: checkpointed at step %d on signal %d", self.folder, step,
                                    requests.stop_signal)
                        requests.hand_over()
            flush()
        finally:
            requests.restore()
            if bar is not None:
                bar.close()
        save_state()  # the state at the last step: an interruption from here on resumes straight to the end
        # The final loss: every prepared validation token up to the cap (a run resumed at its last step comes
        # straight here, so it ends with the same val_loss, bit for bit, as an uninterrupted run).
        val_loss = evaluate(final_windows)
        if not math.isfinite(val_loss):
            raise Diverged(step, val_loss)
        val_fingerprint = windows_fingerprint(final_windows, config["seq_len"])
        log.info("%s: final val_loss %.6f over %d tokens", self.folder, val_loss, final_windows[:, 1:].numel())
        weights_sha256 = None  # hashed once here, so that readers pair evaluations with these weights cheaply
        if rank == 0:
            save_model(model, self.folder / CHECKPOINTS / FINAL_WEIGHTS)
            weights_sha256 = file_sha256(self.folder / CHECKPOINTS / FINAL_WEIGHTS)
        self.write_summary(status="completed", val_loss=val_loss, steps=step, tokens=step * tokens_per_step,
                           val_fingerprint=val_fingerprint, val_tokens_evaluated=int(final_windows[:, 1:].numel()),
                           data_fingerprint=data_fp, finished=now(), wall_seconds=wall + time.time() - t_resume,
                           weights_sha256=weights_sha256)
        fabric.barrier()
        if rank == 0:  # the final weights stay; the resume state is not needed once the summary says completed
            self.state_path.unlink(missing_ok=True)
            log.info("%s: completed", self.folder)
        return read_json(self.summary_path)

    def _started(self):
        if self.summary_path.exists():
            return read_json(self.summary_path).get("started") or now()
        return now()

    def _log_metrics(self, row: dict):
        if self.fabric.global_rank != 0:
            return
        with open(self.folder / METRICS, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({**row, "time": round(time.time(), 3)}) + "\n")
        self.fabric.log_dict({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def _truncate_metrics(self, step: int):
        """On resume, drop metric lines written after the checkpoint (they will be produced again)."""
        path = self.folder / METRICS
        if path.exists():
            rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
            atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in rows).encode())
