"""One run = (tier, arm, seed): Lightning Fabric training with matched init and data, exact resume.

Why Fabric and a hand-written loop rather than `Trainer.fit`: bitwise resume needs the step, the data
position, the optimiser state and the data fingerprint saved together at one step boundary, and the
preemption signal turned into a checkpoint at that boundary. Fabric still gives us the Lightning
parts that matter at scale (DDP launch over GPUs or CPU/gloo, bf16 autocast, loggers).

The learning rate is a pure function of the step (no scheduler state to restore); the batch of step k
is a pure function of (data, seed, global batch, seq len, k) (`ablate.data.BatchStream`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import time
import traceback
import uuid
import warnings
from functools import partial
from pathlib import Path

import torch

from ablate import modelio  # the module, not its function: a test stops a run inside modelio.save_model
from ablate.config import lr_at, resolve_config
from ablate.data import BatchStream, TokenShards, selection_windows, validation_windows
from ablate.data.shards import tier_shards
from ablate.errors import AblateError, DiskFull
from ablate.experiment import RunSpec
from ablate.lock import CHILD_RUN_ENV, LockLost
from ablate.arms.base import get_arm
from ablate.arms.source import arm_identity
from ablate.loop import (Diverged, ReadBack, RunState, Step, StopRequests, copy_in, load_state,
                         log_to_file, make_optimizer, mean_token_loss, progress_bar, save_state, windows_fingerprint)
from ablate.model import GPT, GPTConfig, common_fingerprint, fingerprint_parameters, model_summary
from ablate.paths import default_results
from ablate.provenance import git_commit, now, versions
from ablate.ranks import LAUNCH_ENV, RunFolder, end_process_group
from ablate.runconfig import RunOptions
from ablate.sizing import loss_chunk_for
from ablate.store import (CHECKPOINTS, FINAL_WEIGHTS, METRICS, RUN_LOG, STATE, Status, file_sha256, read_metrics,
                          run_key)
from ablate.store_summary import RunSummary, arm_history, completed_summary, numerics_history, started_summary
from ablate.taskrun import train_task_run
from ablate.tiers import get_tier

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- the run
def run(spec: RunSpec, results: str | Path | None = None, *, data_dir: str | None = None, force: bool = False,
        **options) -> RunSummary:
    """Train one run to completion (or resume it); return its summary. A completed run is a no-op. `options`:
    run options by name (`RunOptions`), on top of the spec's overrides.

    The run folder is locked for the whole run (`ablate.ranks.RunFolder`): a second process on the same run is
    refused at once, naming the holder, before it touches anything.
    """
    return run_as(spec, results, RunOptions.of({**options, "data_dir": data_dir}), force)[0]


def run_as(spec: RunSpec, results, options: RunOptions, force: bool = False) -> tuple[RunSummary, bool]:
    """`run` with its options typed (as a command and a worker give them), and whether this process took part as a
    data-parallel child of the run's holder (a child reports nothing: its parent does)."""
    given = {key: value for key, value in options.given().items() if key != "data_dir"}
    config = resolve_config(spec, options.data_dir, **given).with_device_defaults(torch.cuda.is_available())
    folder = RunFolder(spec.folder(results or default_results()), config)
    if folder.child:
        finished = folder.join()
        return (finished if finished is not None else Trainer(folder).fit()), True
    with folder.held(force, what=f"run {spec.key} ({folder.path})") as (state, lock):
        if state == "done":
            summary = folder.summary()
            log.info("%s already %s (val_loss %s): nothing to do", folder.path, summary.status, summary.val_loss)
            return summary, False
        if get_tier(config.tier).task is not None:  # a task tier: seconds on one core, no Fabric (ablate.taskrun)
            return train_task_run(folder), False
        with lock.handed_down(**{CHILD_RUN_ENV: spec.key}):  # what the data-parallel children it starts show
            return Trainer(folder).fit(), False


class Trainer:
    def __init__(self, run_folder: RunFolder):
        """`run_folder.holding()` raises once the run's lock is another's (`FileLock.check_held`): at every step
        boundary and before every write (a data-parallel child holds no lock and writes nothing)."""
        self.run_folder, self.folder = run_folder, run_folder.path
        self.config = run_folder.config.with_device_defaults(torch.cuda.is_available())
        self.state_path, self.holding = self.folder / CHECKPOINTS / STATE, run_folder.holding

    def write_summary(self, **fields):
        if self.fabric.global_rank == 0:
            self.run_folder.update_summary(**fields)

    def fit(self) -> RunSummary:
        """Launch Fabric (DDP over `devices`, the run's precision, the loggers) and train; a divergence or
        a failure is written to the summary before it is reported."""
        # Fabric warns whenever `srun` exists on PATH; one run per task is how we use SLURM on purpose.
        warnings.filterwarnings("ignore", message=".*`srun` command is available")

        config = self.config
        if config.threads:
            torch.set_num_threads(int(config.threads))
        cuda = torch.cuda.is_available()
        devices = config.devices
        launch_env = {name: os.environ.get(name) for name in LAUNCH_ENV}
        from lightning_fabric import Fabric  # reason: a task run trains without it (~0.1 s once torch.optim is in)

        self.fabric = fabric = Fabric(
            accelerator="cuda" if cuda else "cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
            precision=config.precision, loggers=self._loggers())
        fabric.launch()
        to_file = fabric.global_rank == 0 and not os.environ.get("ABLATE_LOG_TO_STDERR_ONLY")
        handler = log_to_file(self.folder / RUN_LOG) if to_file else None
        try:
            return self._fit(fabric)
        except LockLost:  # the run is another process's now: nothing of this one is written
            raise
        except Diverged as err:
            log.warning("%s: %s", self.folder, err)
            self.write_summary(**self._located(err), finished=now())
            return self.run_folder.summary()
        except DiskFull:  # the summary could not be written either; nothing is lost, the same command resumes
            raise
        except AblateError as err:  # bad input: one line (the command shows it), no traceback
            self.write_summary(status=Status.FAILED, finished=now(), error=f"ablate: error: {err}")
            raise
        except Exception as err:
            # One line where the command shows it; the traceback in the run's log (and `ablate --traceback`).
            log.error("%s: the run failed: %s: %s", self.folder, type(err).__name__, err)
            if handler is not None:
                handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, "the traceback:", (),
                                              sys.exc_info()))
                err.add_note(f"the full traceback: {self.folder / RUN_LOG}")
            self.write_summary(status=Status.FAILED, finished=now(), error=traceback.format_exc()[-4000:])
            raise
        finally:
            if handler is not None:
                logging.getLogger("ablate").removeHandler(handler)
                handler.close()
            if devices > 1:  # this run's process group ends with it: a worker's next run starts its own children
                end_process_group(launch_env)

    def _located(self, err: Diverged) -> dict:
        """The diverged summary's fields, its error saying which layer and slot or hook made the first non-finite
        value: the steps since the last checkpoint replayed with checks on, writing nothing (`ablate.replay`).
        A data-parallel run is not replayed (its ranks would have to replay together)."""
        fields = err.summary_fields()
        if self.fabric.global_rank != 0:
            return fields
        if self.fabric.world_size > 1:
            origin = "not replayed (a data-parallel run)"
        else:
            from ablate.replay import first_non_finite  # reason: only a diverged run needs it

            err.__traceback__ = None  # its frames hold the run's model and optimiser: freed before the replay's own
            log.info("%s: replaying from the last checkpoint with checks on, to find the first non-finite value",
                     self.folder)
            origin = first_non_finite(self.config, self.state_path, err.step).text
        return {**fields, "error": f"{fields['error']}; {origin}"}

    @functools.cached_property
    def logger_run_id(self) -> str:
        """The logger's run id, kept in the run's summary from its first step on, so that a requeued or resumed
        job logs into the same run. A new run draws a new one: also one that `--force` starts in the folder
        of a run kept aside (which keeps its own id, in its summary), since one id for two different runs
        would merge them (`wandb sync --id`)."""
        kept = self.run_folder.summary().logger_run_id
        return kept if isinstance(kept, str) and kept else uuid.uuid4().hex[:16]

    def _loggers(self):
        kind = self.config.logger
        if kind == "none":
            return []
        run_id = self.logger_run_id
        if kind == "tensorboard":
            from lightning_fabric.loggers import TensorBoardLogger  # reason: optional extra (tensorboard)

            return [TensorBoardLogger(root_dir=str(self.folder / "tensorboard"), name="", version=run_id)]
        if kind == "wandb":
            # one id for every segment of the run; files in $WANDB_DIR, else the run folder (not the working one)
            return [WandbLog(name=self.folder.as_posix(), run_id=run_id,
                             save_dir=os.environ.get("WANDB_DIR") or str(self.folder))]
        raise AblateError(f"unknown logger {kind!r}; valid loggers: none, tensorboard, wandb")

    def _fit(self, fabric) -> RunSummary:
        """The run: data, model and optimiser, resume, the steps, then the final evaluation and weights."""
        config = self.config
        shards = tier_shards(config.data_dir, get_tier(config.tier), config.model.vocab_size)
        world, rank = fabric.world_size, fabric.global_rank
        stream = BatchStream(shards, seed=config.data_seed, global_batch=config.global_batch,
                             seq_len=config.seq_len, rank=rank, world_size=world)
        local_rows = config.global_batch // world
        micro = min(config.micro_batch, local_rows)
        if local_rows % micro:
            raise AblateError(f"micro_batch {micro} must divide the per-rank batch {local_rows}")
        # Which windows are evaluated depends on the data, seq_len and the token count only (not micro/world).
        curve_windows = validation_windows(config.data_dir, config.seq_len, config.val_tokens)
        final_windows = validation_windows(config.data_dir, config.seq_len, config.final_val_tokens)
        chosen_windows = selection_windows(config.data_dir, config.seq_len, config.final_val_tokens,
                                           config.selection_tokens) if config.selection_tokens else None

        torch.manual_seed(config.seed)
        model = GPT(GPTConfig(**config.model_fields()))
        model.document_mask = bool(config.document_mask)
        model.init_weights(config.seed)
        run = RunState(model, stream, init_fingerprint=fingerprint_parameters(model.shared_named_parameters()))
        # A parameter-matched arm narrows its MLP: it shares with its baseline the parameters whose name and
        # shape do not depend on the MLP width, and this fingerprint covers exactly those.
        init_common = common_fingerprint(model)
        cuda, on_cpu = fabric.device.type == "cuda", fabric.device.type == "cpu"
        if cuda:  # TF32 for the float32 matmuls that autocast leaves (bf16 does the bulk)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        optimizer = make_optimizer(model, config.weight_decay, config.lr, config.betas, config.eps, cuda)
        forward_model = torch.compile(model) if config.compile else model
        run.forward_model, run.optimizer = fabric.setup(forward_model, optimizer)
        resumed = self._resume(run)
        # the loggers got the rows up to `sent` before this resume: they get only later ones (no step twice)
        sent = max((r["step"] for r in read_metrics(self.folder / METRICS) if "step" in r), default=-1)
        metrics = self.run_folder.metrics(lambda row, step: step > sent and fabric.log_dict(row, step=step))
        self._log_metrics = metrics.write if rank == 0 else (lambda row: None)
        if rank == 0:  # lines after the checkpoint (or all of them, with none) will be written again
            metrics.truncate(run.step if resumed else -1)
        self._write_running(run, init_common, shards, resumed)

        # The float32 logits of a whole micro-batch (and their gradient) dominate GPU memory at small d_model: the
        # steps and evaluations compute the loss `loss_chunk` tokens at a time (`ablate.sizing.loss_chunk_for`).
        run.loss_chunk = loss_chunk_for(config.loss_chunk, fabric.device)
        evaluate = partial(mean_token_loss, run.forward_model, micro=micro, device=fabric.device, rank=rank,
                           world=world, all_reduce=lambda total: fabric.all_reduce(total, reduce_op="sum"),
                           loss_chunk=run.loss_chunk)
        run.t_resume = time.time()
        self._train(run, evaluate, curve_windows, micro, local_rows, on_cpu, config.host_sync == "step")
        self._checkpoint(run)  # the state at the last step: an interruption from here on resumes straight to the end
        val_loss = evaluate(final_windows)
        extra = {} if chosen_windows is None else {"selection_loss": evaluate(chosen_windows), "selection_fingerprint":
                                                   windows_fingerprint(chosen_windows, config.seq_len)}  # LR sweeps'
        return self._finish(run, val_loss, final_windows, extra)

    def _write_running(self, run: RunState, init_common: str, shards: TokenShards, resumed: bool = False) -> None:
        """summary.json while the run trains: what it is (`started_summary`, as a task run's), where it stands, and
        every fingerprint known so far; what computed it, this process and (resumed) every one before it
        (`numerics_history`)."""
        config, previous = self.config, self.run_folder.summary()
        run_versions, arm = versions(), arm_identity(get_arm(config.arm))
        started = started_summary(config, model_summary(run.model, run.init_fingerprint, init_common),
                                  made_by=(git_commit(), run_versions), started=previous.started or now(),
                                  data=(config.data_dir, shards.fingerprint), arm_source=arm,
                                  arm_sources=arm_history(previous, arm, resumed))
        self.write_summary(
            **started, status=Status.RUNNING, val_loss=None, steps=run.step, tokens=config.tokens(run.step),
            data_fingerprint=run.data_fp, loss_read_every=1 if config.host_sync == "step" else config.log_interval,
            val_fingerprint=None, val_tokens_evaluated=None, finished=None, wall_seconds=run.wall,
            numerics_history=numerics_history(previous, run_versions["numerics"], resumed),
            logger_run_id=self.logger_run_id if config.logger != "none" else None)

    def _resume(self, run: RunState) -> bool:
        """Load the checkpoint into the run, if there is one; whether there was."""
        config = self.config
        if not self.state_path.exists():
            log.info("%s: starting %s/%s/seed%d, %d steps", self.folder, config.tier, config.arm, config.seed,
                     config.steps)
            return False
        run.load_state_dict(load_state(self.state_path))
        log.info("%s: resuming at step %d of %d", self.folder, run.step, config.steps)
        return True

    def _train(self, run: RunState, evaluate, curve_windows, micro: int, local_rows: int, on_cpu: bool,
               every_step: bool):
        """The steps from `run.step` to the end: evaluate every val_interval, read back every log_interval
        (every step with host_sync "step"), checkpoint every checkpoint_interval and at a signal (then stop if
        asked)."""
        config, fabric, total_steps = self.config, self.fabric, self.config.steps
        device, rank, world = fabric.device, fabric.global_rank, fabric.world_size
        loss_chunk, model, optimizer = run.loss_chunk, run.forward_model, run.optimizer
        step = Step(optimizer, loss_of=lambda inputs, targets: model(inputs, targets, loss_chunk=loss_chunk).loss,
                    clip=lambda: fabric.clip_gradients(model, optimizer, max_norm=config.grad_clip,
                                                       error_if_nonfinite=False),
                    backward=fabric.backward, no_sync=lambda enabled: fabric.no_backward_sync(model, enabled=enabled),
                    all_reduce=(lambda loss: fabric.all_reduce(loss, reduce_op="mean")) if world > 1 else None,
                    halt_on_nonfinite=every_step)  # read every step anyway: a bad loss stops before its update
        bar = progress_bar(total_steps, run.step, run_key(config.tier, config.arm, config.seed)) if (
            rank == 0 and config.progress) else None
        requests = StopRequests().install()
        readback = ReadBack(config.tokens(1), self._log_metrics, bar)
        try:
            if run.step == 0:
                self._log_metrics({"step": 0, "tokens": 0, "val_loss": evaluate(curve_windows)})
            while run.step < total_steps:
                readback.begin_step()
                lr = lr_at(run.step, config)
                global_batch = run.stream.global_batch(run.step)
                run.data.add(global_batch)  # hashed into the data fingerprint in the background
                local = copy_in(global_batch[rank * local_rows:(rank + 1) * local_rows], device)
                loss, grad_norm = step(run.step + 1, lr, [(c[:, :-1], c[:, 1:]) for c in local.split(micro)], device)
                run.step += 1
                run.stream.step = run.step  # the position a checkpoint records
                readback.add(run.step, lr, loss, grad_norm)
                self.holding() if rank == 0 else None  # a holder stopped and taken over goes no further
                self._boundary(run, evaluate, curve_windows, readback, requests, every_step)
            readback.flush(run.step)
        finally:
            requests.restore()
            if bar is not None:
                bar.close()

    def _boundary(self, run: RunState, evaluate, curve_windows, readback: ReadBack, requests: StopRequests,
                  every_step: bool):
        """After a step: evaluate, read back, checkpoint, each when due; a signal's stop comes last."""
        config, step = self.config, run.step
        evaluate_now = step % config.val_interval == 0 or step == config.steps
        checkpoint_now = step % config.checkpoint_interval == 0 or requests.checkpoint
        if evaluate_now:
            readback.curve[step] = val_loss = evaluate(curve_windows)
            readback.flush(step)  # a non-finite training loss before this point is reported first, as the cause
            log.info("%s: step %d/%d val_loss %.4f", self.folder, step, config.steps, val_loss)
            if not math.isfinite(val_loss):
                raise Diverged(step, val_loss, detected_at=step)
        if every_step or checkpoint_now or step % config.log_interval == 0:
            readback.flush(step)
        if checkpoint_now:
            self._checkpoint(run)
            requests.checkpoint = False
            if requests.stop_signal is not None:
                log.warning("%s: checkpointed at step %d on signal %d", self.folder, step, requests.stop_signal)
                requests.hand_over()

    def _checkpoint(self, run: RunState):
        """Every rank reaches the same step boundary; rank 0 writes the resume state and the summary's progress."""
        fabric, config = self.fabric, self.config
        fabric.barrier()
        if fabric.global_rank == 0:
            self.holding()
            save_state(self.state_path, run.state_dict())
            self.write_summary(steps=run.step, tokens=config.tokens(run.step),
                               data_fingerprint=run.data_fp, wall_seconds=run.wall_seconds())
        fabric.barrier()

    def _finish(self, run: RunState, val_loss: float, final_windows, extra: dict) -> RunSummary:
        """The final loss is over every prepared validation token up to the cap (a run resumed at its last step
        comes straight here, so it ends with the same val_loss, bit for bit, as an uninterrupted run); then
        the final weights, the completed summary, and the resume state removed."""
        config, fabric = self.config, self.fabric
        if not math.isfinite(val_loss):
            raise Diverged(run.step, val_loss)
        val_fingerprint = windows_fingerprint(final_windows, config.seq_len)
        log.info("%s: final val_loss %.6f over %d tokens", self.folder, val_loss, final_windows[:, 1:].numel())
        weights_sha256 = None  # hashed once here, so that readers pair evaluations with these weights cheaply
        weights = self.folder / CHECKPOINTS / FINAL_WEIGHTS
        if fabric.global_rank == 0:
            self.holding()
            modelio.save_model(run.model, weights)
            weights_sha256 = file_sha256(weights)
        val = (val_fingerprint, int(final_windows[:, 1:].numel()))
        self.write_summary(**completed_summary(config, val_loss, val=val, data_fingerprint=run.data_fp,
                                               weights_sha256=weights_sha256, finished=now(),
                                               wall_seconds=run.wall_seconds()), **extra)
        fabric.barrier()
        if fabric.global_rank == 0:  # the final weights stay; the resume state is not needed once completed
            self.holding()
            self.state_path.unlink(missing_ok=True)
            log.info("%s: completed", self.folder)
        return self.run_folder.summary()


class WandbLog:
    """`--logger wandb`: the one call Fabric makes of a logger (`log_metrics`, from `fabric.log_dict`), sent to the
    W&B SDK. The run starts at the first row, on rank 0 only, under the run's id (`resume="allow"`: every segment of
    a run logs into one W&B run). The keys and step axis are Lightning's own WandbLogger's (`trainer/global_step`),
    which this replaces so that training needs Lightning Fabric alone: the full `lightning` package imports
    torchmetrics and scipy.signal in every process (~2 s each)."""

    def __init__(self, name: str, run_id: str, save_dir: str, project: str = "ablate"):
        self.init = dict(project=project, name=name, id=run_id, resume="allow", dir=save_dir)
        self.experiment = None

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        from lightning_fabric.utilities.rank_zero import rank_zero_only  # reason: set by Fabric's launch

        if rank_zero_only.rank != 0:
            return
        if self.experiment is None:
            import wandb  # reason: optional extra (wandb)

            self.experiment = wandb.init(**self.init)
            self.experiment.define_metric("trainer/global_step")
            self.experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
        self.experiment.log(dict(metrics) if step is None else {**metrics, "trainer/global_step": step})
