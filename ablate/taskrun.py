"""One run of a task tier (`synthetic`): a tiny GPT trained on a synthetic task, written as a run folder.

Why not the corpus trainer: a task's batches are a pure function of (task, seed, step) and its targets are not
the shifted inputs (`ablate.data.synthetic`), so there are no shards, windows or data-parallel ranks to carry.
Everything else is the study's: the run folder and its files (config.json, summary.json with the same
fingerprints, metrics.jsonl, the final weights), the lock and the refusal of other settings (`ablate.train.run`
calls this after preparing the folder), the optimiser and the step (`ablate.loop`), the schedule (`lr_at`).
So the tables pair its runs by seed like any others. A run takes seconds: an interrupted one starts again
from step 0 (no checkpoint), with the same result.

Besides the loss at the budget it records the mechanism's signature at answer positions of the last
(retrieval) layer, in the summary (`signature`) and as the metrics of a task entry of eval.json, so that
`ablate table EXPERIMENT --metric abstain/phantom_absent` pairs them like a loss:
* phantom and first-key (BOS) mass at absent-key queries against present ones;
* the norm of the retrieval layer's attention output (mean over heads) at absent against present ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ablate.arms.base import get_arm
from ablate.arms.source import ARM_SOURCE, arm_identity
from ablate.config import lr_at
from ablate.data.filter import FilterTask, task_batch, task_from_fields, task_validation
from ablate.data.synthetic import IGNORE, SyntheticTask
from ablate.data.valuejunk import ValueJunkTask, junk_plan
from ablate.identity import config_fingerprint
from ablate.loop import Diverged, MetricsLog, Step, chain_fingerprint, make_optimizer, progress_bar
from ablate.model import GPTConfig, common_fingerprint, fingerprint_parameters, model_summary
from ablate.modelio import save_model
from ablate.provenance import git_commit, now, versions
from ablate.replay import replay
from ablate.runconfig import RunConfig
from ablate.store import CHECKPOINTS, EVAL_FILE, FINAL_WEIGHTS, Status, atomic_write_json, file_sha256, run_key
from ablate.ranks import RunFolder
from ablate.store_summary import RunSummary, completed_summary, started_summary, which_run
from ablate.taskmodel import task_model

log = logging.getLogger(__name__)

MAX_TASK_REPLAY_STEPS = 5000  # a diverged task run's steps replayed at most (to find its first non-finite value)
VAL_BATCH, VAL_BATCHES = 256, 4  # the fixed validation set: 1,024 sequences, the same for every arm and seed
SIGNATURE_VERSION = 1  # eval.json settings: a change in how the signature is measured is a different setting


def train_task_run(run_folder: RunFolder) -> RunSummary:
    """Train the run of its config (a task tier's) into `run_folder` (prepared and locked by the caller); its
    summary. `run_folder.holding()` raises once the caller's lock is not this process's any more
    (`FileLock.check_held`): it is called at every step and before every write (the folder's summary and metrics
    writes call it), so a holder that was stopped and taken over writes nothing more."""
    folder, config, holding = run_folder.path, run_folder.config, run_folder.holding
    started, clock = now(), time.time()
    task = task_from_fields(config.synthetic_task)
    arm_source = arm_identity(get_arm(config.arm))  # the arm's code, as imported: part of the run's identity
    threads = torch.get_num_threads()
    torch.set_num_threads(int(config.threads or 1))  # a model this small runs no faster on more threads
    try:
        torch.manual_seed(config.seed)
        model = task_model(GPTConfig(**config.model_fields()), task)
        model.init_weights(config.seed)
        init_fingerprint = fingerprint_parameters(model.shared_named_parameters())
        init_common = common_fingerprint(model)  # of the initial weights, as a corpus run's: what an LR sweep pairs
        oracle = {"received_junk_mask": True} if getattr(model, "hands_junk_mask", False) else {}  # a control's run
        metrics = run_folder.metrics()  # checks the lock at every step's row
        metrics.truncate(-1)  # a run that starts again from step 0 writes its rows again
        run_folder.write_summary({  # while it trains, as a corpus run's: status and `ablate status` say "running"
            **which_run(config), "status": Status.RUNNING, "val_loss": None, "steps": 0, "total_steps": config.steps,
            "init_fingerprint": init_fingerprint, "config_fingerprint": config_fingerprint(config), "started": started,
            ARM_SOURCE: arm_source, "arm_sources": [arm_source], **oracle})
        validation = task_validation(task, VAL_BATCH, VAL_BATCHES)
        try:
            curve, data_fingerprint = _train(model, task, config, validation, metrics)
            model.eval()
            val_loss, accuracy, absent_accuracy = _evaluate(model, task, validation)
            if not math.isfinite(val_loss):
                raise Diverged(config.steps, val_loss)
        except Diverged as err:  # an outcome, as a corpus run's: recorded, shown, never retried
            log.warning("%s: %s", folder, err)
            fields = err.summary_fields()
            fields["error"] = f"{fields['error']}; {_non_finite_origin(config, task, err.step)}"
            run_folder.update_summary(**fields, finished=now(), wall_seconds=time.time() - clock)
            return run_folder.summary()
        signature = _signature_of(task)(model, task, validation)
        run_versions = versions()  # with the run's thread count: its numerics say what computed the numbers
    finally:
        torch.set_num_threads(threads)
    weights = folder / CHECKPOINTS / FINAL_WEIGHTS
    holding()
    save_model(model, weights)
    weights_sha256 = file_sha256(weights)
    # as a corpus run's summary (`started_summary`, `completed_summary`)
    summary = {**started_summary(config, model_summary(model, init_fingerprint, init_common),
                                 made_by=(git_commit(), run_versions), started=started,
                                 data=(None, task_fingerprint(task)), arm_source=arm_source),
               **completed_summary(config, val_loss, val=(_validation_fingerprint(validation), _scored(validation)),
                                   data_fingerprint=data_fingerprint, weights_sha256=weights_sha256,
                                   finished=(finished := now()), wall_seconds=time.time() - clock),
               "val_loss_auc": curve_area(curve), "val_accuracy": accuracy, "absent_accuracy": absent_accuracy,
               "signature": signature, **oracle}
    holding()
    _write_signature_eval(folder, task, {**signature, "val_accuracy": accuracy, "absent_accuracy": absent_accuracy},
                          weights_sha256, finished)
    run_folder.write_summary(summary)
    log.info("%s: val_loss %.4f, accuracy %.3f (absent %s)", folder, val_loss, accuracy, absent_accuracy)
    return run_folder.summary()


def _train(model, task: SyntheticTask, config: RunConfig, validation, metrics: MetricsLog) -> tuple[list, str]:
    """The steps; the validation curve [(step, loss)] every val_interval (and at 0 and the end); the data
    fingerprint chained over every batch trained on, as the corpus runs' is."""
    optimizer = make_optimizer(model, config.weight_decay, config.lr, config.betas, config.eps, cuda=False)
    step = Step(optimizer, loss_of=lambda inputs, targets: model(inputs, targets).loss,
                clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip),
                halt_on_nonfinite=True)
    data_fingerprint = "sha256:" + task_fingerprint(task)
    bar = progress_bar(config.steps, 0, run_key(config.tier, config.arm, config.seed)) if (
        config.progress) else None
    curve = [(0, _evaluate(model, task, validation)[0])]
    metrics.write({"step": 0, "tokens": 0, "val_loss": curve[0][1]})
    model.train()
    for k in range(config.steps):
        inputs, targets = task_batch(task, config.global_batch, training_seed(config.seed, k))
        data_fingerprint = chain_fingerprint(data_fingerprint, torch.stack([inputs, targets], 1))
        loss, grad_norm = step(k + 1, lr_at(k, config), [(inputs, targets)])
        row = {"step": k + 1, "tokens": config.tokens(k + 1), "lr": lr_at(k, config),
               "train_loss": loss.item(), "grad_norm": grad_norm.item()}
        if (k + 1) % config.val_interval == 0 or k + 1 == config.steps:
            row["val_loss"] = _evaluate(model, task, validation)[0]
            curve.append((k + 1, row["val_loss"]))
            model.train()
        if not math.isfinite(row["val_loss"] if "val_loss" in row else 0.0):
            raise Diverged(k + 1, row["val_loss"])
        metrics.write(row)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return curve, data_fingerprint


def _non_finite_origin(config: RunConfig, task, diverged_step: int) -> str:
    """Which layer and slot or hook made the run's first non-finite value: its steps replayed from its initial
    weights (a task run keeps no checkpoint; its steps cost milliseconds) with the checks on, writing nothing."""
    if diverged_step > MAX_TASK_REPLAY_STEPS:
        return f"not replayed: {diverged_step} steps (at most {MAX_TASK_REPLAY_STEPS})"
    torch.manual_seed(config.seed)
    model = task_model(GPTConfig(**config.model_fields()), task)
    model.init_weights(config.seed)
    optimizer = make_optimizer(model, config.weight_decay, config.lr, config.betas, config.eps, cuda=False)

    def batches(number: int) -> list:
        return [task_batch(task, config.global_batch, training_seed(config.seed, number - 1))]

    return replay(model, optimizer, batches, lambda number: lr_at(number - 1, config), config.grad_clip,
                  (0, diverged_step)).text


def training_seed(seed: int, step: int) -> int:
    """The data seed of training batch `step` of run seed `seed` (disjoint from the validation seeds)."""
    return int(seed) * 100_003 + int(step) + 1


def task_fingerprint(task: SyntheticTask) -> str:
    return hashlib.sha256(json.dumps(asdict(task), sort_keys=True).encode()).hexdigest()


def curve_area(curve: list[tuple[int, float]]) -> float:
    """The area under the validation curve divided by the steps (trapezoids): a mean loss over training,
    lower for an arm that learns sooner even when both end at the same loss."""
    area = sum((b - a) * (la + lb) / 2 for (a, la), (b, lb) in zip(curve, curve[1:]))
    return area / max(1, curve[-1][0] - curve[0][0])


def _scored(validation) -> int:
    return int(sum(int((targets != IGNORE).sum()) for _, targets in validation))


def _validation_fingerprint(validation) -> str:
    digest = hashlib.sha256(b"ablate-task-val;")
    for inputs, targets in validation:
        digest.update(torch.stack([inputs, targets]).numpy().astype("<i8").tobytes())
    return digest.hexdigest()


@torch.no_grad()
def _evaluate(model, task: SyntheticTask, validation) -> tuple[float, float, float]:
    """(mean loss over answers, answer accuracy, accuracy on NONE answers), summed in float64 in a fixed order."""
    model.eval()
    totals = torch.zeros(5, dtype=torch.float64)  # loss, answers, correct, absent answers, correct absent
    for inputs, targets in validation:
        logits = model(inputs).logits[..., : task.vocab_size].float()
        scored = targets != IGNORE
        loss = torch.nn.functional.cross_entropy(logits[scored], targets[scored], reduction="sum")
        correct = (logits.argmax(-1) == targets) & scored
        absent = scored & (targets == task.NONE) if hasattr(task, "NONE") else torch.zeros_like(scored)
        totals += torch.stack([loss.double(), *(m.sum().double() for m in (scored, correct, absent, correct & absent))])
    loss, answers, correct, absent, correct_absent = totals.tolist()
    return loss / answers, correct / answers, (correct_absent / max(1.0, absent) if hasattr(task, "NONE") else None)


@torch.no_grad()
def answer_signature(model, task: SyntheticTask, batches) -> dict:
    """The last (retrieval) layer at answer positions, mean over heads and positions, absent against present
    keys: {"phantom_absent", "phantom_present" (0 without a phantom key), "first_key_absent",
    "first_key_present", "output_norm_absent", "output_norm_present"}. Output norm: ‖Σ_j p_ij v_j‖ per head
    (the gated values, before any output gate), the head's read; an arm that abstains reads less there."""
    sums: dict[str, float] = {}
    counts = {"absent": 0, "present": 0}
    for inputs, targets in batches:
        record = model(inputs, record=True).records[-1]
        # The queries' rows are the last ones: a sink token's row comes first, a strict-causal model has none for 0
        rows = min(record.weights.shape[2], targets.shape[1])
        weights, targets = record.weights.double()[:, :, -rows:], targets[:, -rows:]  # (B, H, rows, keys)
        values = record.values.double()
        values = values.repeat_interleave(weights.shape[1] // values.shape[1], dim=1)  # (B, H, keys, d)
        parts = {"first_key": weights[..., 0].mean(1), "output_norm": (weights @ values).norm(dim=-1).mean(1)}
        # An arm without a phantom key puts no mass on nothing: 0, so that its pair with a phantom arm is counted.
        parts["phantom"] = (record.phantom_mass.double()[:, :, -rows:].mean(1) if record.phantom_mass is not None
                            else torch.zeros_like(parts["first_key"]))
        for case, where in (("absent", targets == task.NONE),
                            ("present", (targets != task.NONE) & (targets != IGNORE))):
            counts[case] += int(where.sum())
            for name, value in parts.items():
                sums[f"{name}_{case}"] = sums.get(f"{name}_{case}", 0.0) + float(value[where].sum())
    names = [f"{name}_{case}" for name in ("phantom", "first_key", "output_norm") for case in ("absent", "present")]
    return {key: sums[key] / max(1, counts[key.rsplit("_", 1)[1]]) for key in names}


def _write_signature_eval(folder: Path, task: SyntheticTask, quantities: dict, weights_sha256: str,
                          evaluated_at: str) -> None:
    """The signature and the learning quantities as task `abstain` of eval.json (lower is better for none of
    them by nature: each is stated higher_is_better=True, so a table's positive Δ means the arm has more)."""
    quantities = {name: value for name, value in quantities.items() if value is not None}  # an arm without a gate
    entry = {"settings": {"task_version": SIGNATURE_VERSION, "lm_eval_version": None, "limit": None,
                          "num_fewshot": 0, "data": "synthetic:" + task_fingerprint(task)},
             "metrics": {name: {"value": value, "stderr": None, "higher_is_better": True}
                         for name, value in quantities.items()},
             "weights_sha256": weights_sha256, "evaluated_at": evaluated_at}
    atomic_write_json(folder / EVAL_FILE, {"tasks": {task_name(task): entry}})


def task_name(task) -> str:
    return "filter" if isinstance(task, (FilterTask, ValueJunkTask)) else "abstain"


def _signature_of(task):
    """The task's signature: Filter's (both tasks), else Abstain's."""
    if isinstance(task, ValueJunkTask):
        return value_junk_signature
    return filter_signature if isinstance(task, FilterTask) else answer_signature


class ReadTally:
    """Filter's signature summed over batches (both Filter tasks): at answer positions the attention mass on junk
    and on clean reads (`junk_mass`, `clean_mass`), the junk's weight in the read after any value gate
    (`junk_weight`: Σ over junk reads of p_ij·g_j, g = 1 without a gate), the read's norm (`output_norm`,
    ‖Σ_j p_ij g_j v_j‖), mean over heads; over the reads themselves the value gate on junk and on clean reads
    (`gate_junk`, `gate_clean`; None for an arm without a value gate)."""

    PER_ANSWER = ("junk_mass", "clean_mass", "junk_weight", "output_norm")

    def __init__(self):
        self.sums = dict.fromkeys((*self.PER_ANSWER, "gate_junk", "gate_clean"), 0.0)
        self.answers = self.junk_reads = self.clean_reads = 0
        self.gated = False

    def add(self, record, junk: torch.Tensor, clean: torch.Tensor, scored: torch.Tensor) -> None:
        """One batch's layer record; `junk`, `clean` (B, keys) mark the reads, `scored` (B, queries) the answers."""
        weights = record.weights.double()  # (B, H, queries, keys)
        groups = weights.shape[1] // record.values.shape[1]
        values = record.values.double().repeat_interleave(groups, dim=1)  # (B, H, keys, d)
        gate = (torch.ones_like(weights[..., 0, :]) if record.value_gate is None
                else record.value_gate.double()[..., 0].repeat_interleave(groups, dim=1))  # (B, H, keys)
        per_answer = {"junk_mass": (weights * junk[:, None, None]).sum(-1),
                      "clean_mass": (weights * clean[:, None, None]).sum(-1),
                      "junk_weight": (weights * (gate * junk[:, None])[:, :, None]).sum(-1),
                      "output_norm": (weights @ values).norm(dim=-1)}  # each (B, H, queries)
        for name, value in per_answer.items():
            self.sums[name] += float(value.mean(1)[scored].sum())
        self.answers += int(scored.sum())
        self.junk_reads, self.clean_reads = self.junk_reads + int(junk.sum()), self.clean_reads + int(clean.sum())
        if record.value_gate is not None:
            self.gated = True
            self.sums["gate_junk"] += float(gate.mean(1)[junk].sum())
            self.sums["gate_clean"] += float(gate.mean(1)[clean].sum())

    def result(self) -> dict:
        out = {name: self.sums[name] / max(1, self.answers) for name in self.PER_ANSWER}
        out["gate_junk"] = self.sums["gate_junk"] / max(1, self.junk_reads) if self.gated else None
        out["gate_clean"] = self.sums["gate_clean"] / max(1, self.clean_reads) if self.gated else None
        return out


@torch.no_grad()
def filter_signature(model, task: FilterTask, batches) -> dict:
    """The last (retrieval) layer of a Filter run: `ReadTally`'s quantities."""
    tally = ReadTally()
    for inputs, targets in batches:
        tally.add(model(inputs, record=True).records[-1], task.junk_reads(inputs), task.clean_reads(inputs),
                  targets != IGNORE)
    return tally.result()


@torch.no_grad()
def value_junk_signature(model, task: ValueJunkTask, batches) -> dict:
    """The attention layer of a value-junk run, as eval.json's task `filter` (the first Filter task's names, so
    the tables and the report's figure read both alike): `ReadTally`'s quantities. The model reads strictly
    earlier positions: row i of the weights is query i + 1, column j key j."""
    tally = ReadTally()
    for inputs, targets in batches:
        record = model(inputs, record=True).records[-1]
        junk = junk_plan(task, inputs, record.values.shape[1], record.values.shape[-1]).mask[:, :-1]
        tally.add(record, junk, task.is_pair(inputs)[:, :-1] & ~junk, targets[:, 1:] != IGNORE)
    return tally.result()
