"""Dispatch an experiment's grid (submitit: SLURM job arrays, or this machine) and track its state.

* SLURM: one job array per tier, resources from a cluster profile `slurm/NAME.toml`; returns as soon as
  the arrays are queued. Each task runs `RunJob`, a submitit Checkpointable: on SLURM's warning signal
  the training loop checkpoints at the next step boundary and hands the signal to submitit, which
  requeues the task; the requeued task resumes from the checkpoint (same result as uninterrupted).
* local: the grid runs here (`ablate.workers`), at most `--parallel` runs at a time, each run's output
  kept in its folder's `run.log`, with one progress bar over the grid.

The ledger (`RESULTS/<experiment>/ledger.json`) records every job submitted, so a second `submit`
skips runs that are completed, queued or running, and `status` can ask the scheduler about them. A
submit holds the experiment's submit lock while it decides what to queue and writes the ledger (a
local grid: while it runs), so two submits at once never queue a run twice; a running run is known by
its run lock (`ablate.lock`), which a reused process id cannot fake.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import submitit

from ablate.arms import list_arms
from ablate.config import resolve_config
from ablate.data.shards import read_manifest
from ablate.design import record_design
from ablate.errors import AblateError, error_line
from ablate.evals.run import EvalJob
from ablate.experiment import Experiment, RunSpec
from ablate.lock import FileLock
from ablate.plan import plan_rows
from ablate.profiles import SINFO_FORMAT, Profile, load_profile, parse_sinfo, profile_misfits, sbatch_refusal
from ablate.sequential import recorded_design
from ablate.runconfig import RunOptions, chosen_options
from ablate.sizing import run_micro_batch
from ablate.status import status
from ablate.store import (CONFIG, SUBMIT_LOCK, LedgerEntry, Status, experiment_dir, keep_aside, read_json_file,
                          record_ledger, run_lock_path)
from ablate.store_summary import read_summary
from ablate.tiers import Tier, get_gpu, get_tier
from ablate.workers import RunJob, recorded_options, run_local


def executor_parameters(profile: Profile, name: str) -> dict:
    """submitit parameters for one run per array task: k data-parallel processes (`processes_per_run`, one
    per GPU) are k SLURM tasks on one node, which Lightning joins into one run (`devices = k`)."""
    processes = profile.processes_per_run
    params = {"name": name, "timeout_min": profile.time_min,
              "cpus_per_task": max(1, profile.cpus_per_run // processes),
              "mem_gb": profile.mem_gb, "slurm_array_parallelism": profile.array_parallelism,
              "slurm_signal_delay_s": profile.signal_delay_s, "tasks_per_node": processes, "nodes": 1}
    if profile.gpus_per_run:
        params["gpus_per_node"] = profile.gpus_per_run
    for key, value in (("partition", profile.partition), ("account", profile.account), ("qos", profile.qos),
                       ("constraint", profile.constraint)):
        if value:
            params[f"slurm_{key}"] = value
    extra = {}
    for line in profile.extra_sbatch:
        option = line.removeprefix("#SBATCH").strip().removeprefix("--")
        key, _, value = option.partition("=")
        extra[key] = value or True
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


# ---------------------------------------------------------------------------------------------- submit
def preflight(experiment: Experiment, specs: list[RunSpec], tiers: Mapping[str, Tier], executor: str,
              options: RunOptions) -> dict[str, dict]:
    """Everything that would make a queued run die on the cluster, checked before anything is queued; for
    SLURM, what sinfo says of each partition (`ablate.profiles.parse_sinfo`), else {}. `tiers`: the specs' tiers."""
    checked = set()
    for spec in specs:
        tier = tiers[spec.tier]
        config = resolve_config(spec, options.data_dir, tier=tier,
                                **{k: v for k, v in options.given().items() if k != "data_dir"})
        key = (spec.tier, config.data_dir)
        if key in checked or config.data_dir is None:  # None: a task tier, its batches drawn from the task
            continue
        checked.add(key)
        try:
            manifest = read_manifest(config.data_dir)
        except AblateError as err:
            raise AblateError(f"tier {spec.tier}: {err}; prepare it with `ablate data prepare` "
                              "(or give another folder with `data_dir` in the experiment's overrides)") from None
        if manifest.get("tokenizer") != tier.tokenizer or manifest.get("vocab_size") != config.model.vocab_size:
            raise AblateError(
                f"tier {spec.tier}: data folder {config.data_dir} holds {manifest.get('tokenizer')!r} tokens "
                f"(vocabulary {manifest.get('vocab_size')}); the tier expects {tier.tokenizer!r} "
                f"(vocabulary {config.model.vocab_size})")
    return check_slurm() if executor == "slurm" else {}


def refuse_other_document_mask(specs: list[RunSpec], results: Path, options: RunOptions) -> None:
    """A finished run trained with another document mask than the submit asks for (`--document-mask`, or the
    experiment's `document_mask` override) would be skipped as finished, its results read as the asked-for runs':
    refused in one line naming them, before anything is queued (`ablate run` refuses the same folder as a run of a
    different config)."""
    other = []
    for spec in specs:
        folder = spec.folder(results)
        if (folder / CONFIG).is_file() and read_summary(folder).done:
            trained = bool(read_json_file(folder / CONFIG, "use `ablate run --force`").get("document_mask"))
            if trained != bool(RunOptions.of(chosen_options(spec.overrides, options.given())).document_mask):
                other.append(f"{spec.key} ({'with' if trained else 'without'} it)")
    if other:
        raise AblateError(f"{len(other)} finished run(s) trained with another document mask than this submit asks "
                          f"for: {', '.join(other)}; submit to another --results folder (or match --document-mask); "
                          "nothing was queued")


def check_slurm() -> dict[str, dict]:
    """What sinfo says of each partition (GPUs, memory, CPUs, time limit), or a one-line error that
    suggests the local executor."""
    try:
        answer = subprocess.run(["sinfo", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise AblateError("SLURM is not installed here (no `sinfo` on PATH); run the grid on this machine with "
                          "`--executor local`") from None
    except subprocess.TimeoutExpired:
        raise AblateError("SLURM does not answer (sinfo timed out after 30 s); try again later, or run the grid "
                          "on this machine with `--executor local`") from None
    if answer.returncode != 0:
        raise AblateError(f"SLURM does not answer (sinfo: {error_line(answer.stderr) or answer.returncode}); "
                          "run the grid on this machine with `--executor local`")
    return parse_sinfo(answer.stdout)


@dataclass(frozen=True)
class Submission:
    """What `ablate submit` asks for: where the runs go, which of the grid's runs (tiers, arms, seed indices),
    the run options every run gets, and the evaluations that follow (`submit`)."""

    results: Path
    executor: str = "slurm"
    profile: str = "local"
    tiers: Sequence[str] | None = None
    arms: Sequence[str] | None = None
    seeds: Sequence[int] | None = None
    parallel: int | None = None
    dry_run: bool = False
    options: RunOptions = field(default_factory=RunOptions)
    eval_tasks: Sequence[str] | None = None
    eval_options: Mapping = field(default_factory=dict)
    seeds_by_tier: Mapping[str, int] | None = None
    sequential: Mapping | None = None
    grid: Sequence[RunSpec] | None = None  # these runs instead of the experiment's grid (an LR sweep's)
    # the fixed design (`ablate.design`): the experiment whose whole declaration the ledger keeps (None: the one
    # submitted; `ablate testbed --arm` submits a subset of the testbed and records the testbed's), and whether a
    # changed declaration is recorded as an amendment (`submit --amend`) rather than refused
    declaration: Experiment | None = None
    amend: bool = False
    rerun_stale: bool = False  # move aside and train again the completed runs of an arm whose code changed since


def submit(experiment: Experiment, experiment_file: str | None, request: Submission) -> dict:
    """Submit the grid's runs that are neither completed nor queued/running. Returns what was done.

    `seeds_by_tier` (a sequential study, `submit --sequential`): only seeds 0..n−1 of each tier, none of a
    tier it leaves out; `sequential`: the design's ledger record (`SequentialDesign.to_record`), written once, under
    the submit lock, before anything is queued; else the fixed design's whole declaration is recorded there at the
    first submit, and a changed one refused unless `amend` (`ablate.design.record_design`). `grid`: these runs
    instead of the experiment's grid (its LR
    sweep's, `Experiment.sweep_runs`, or the confirmatory runs at each arm's best LR), through the same
    dispatch, store, locks and ledger.

    With `eval_tasks`, evaluation jobs follow (`ablate.evals.run.EvalJob`): on SLURM one array per tier,
    after that tier's training array when one was queued now; locally once the grid has run.

    Checked first, before anything is queued: the executor, the profile, the data folders and their
    tokenizer, every override key, and (for SLURM) that the scheduler answers.
    """
    results, executor, by_tier = request.results, request.executor, request.seeds_by_tier
    _check_request(request)
    specs = experiment.runs(request.tiers, request.arms, request.seeds) if request.grid is None else list(request.grid)
    if by_tier is not None:
        specs = [s for s in specs if s.seed < by_tier.get(s.tier, 0)]
        if not specs:  # every tier decided: nothing to ask the scheduler about
            return {"experiment": experiment.name, "runs": 0, "to_submit": [], "skipped": {}, "gpu_hours": 0.0,
                    "resources": None, "jobs": {}}
    resources = load_profile(request.profile) if executor == "slurm" else None
    options = request.options.unset_to(progress=False)
    tiers = {name: get_tier(name) for name in dict.fromkeys(s.tier for s in specs)}  # once: each Tier travels
    partitions = preflight(experiment, specs, tiers, executor, options)
    refuse_other_document_mask(specs, results, options)
    misfits = profile_misfits(resources, partitions) if resources else []
    folder = experiment_dir(results, experiment)
    list_arms()  # every arm registered here (the built-ins too): a completed run of older arm code is stale
    if request.dry_run:
        return {**_plan_submission(experiment, specs, tiers, results, resources, request.rerun_stale)[0],
                "misfits": misfits}
    if misfits:
        raise AblateError(f"profile {resources.name!r} does not fit the cluster (sinfo): {'; '.join(misfits)}; "
                          f"nothing was queued (edit slurm/{resources.name}.toml)")
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder / SUBMIT_LOCK, what=f"experiment {experiment.name!r} (another `ablate submit`)")
    with lock:
        _record_the_design(folder, experiment, request)
        report, completed = _plan_submission(experiment, specs, tiers, results, resources, request.rerun_stale)
        todo = [s for s in specs if s.key in set(report["to_submit"])]
        _keep_stale_aside(todo, report["stale"], results)
        if not todo and not request.eval_tasks:
            return report
        if todo and executor == "slurm":
            report["jobs"] = _submit_slurm(experiment, experiment_file, todo, tiers, results, resources, options)
        elif todo:
            report["jobs"], report["diverged"], trained = _run_here(experiment, experiment_file, todo, request, options,
                                                                    lock.lock_id)
            completed |= trained
        if request.eval_tasks:
            report["evals"] = _submit_evals(experiment, experiment_file, specs, request, resources,
                                            report["jobs"], completed)
    return report


def _keep_stale_aside(todo, stale: dict, results) -> None:
    """The completed runs of an arm whose code changed (`--rerun-stale`), each moved aside under its run lock before
    it trains again; `stale` maps each to where it went."""
    for spec in todo:
        if spec.key in stale:
            with FileLock(run_lock_path(spec.folder(results)), what=f"run {spec.key}"):
                stale[spec.key] = str(keep_aside(spec.folder(results)))


def _check_request(request: Submission) -> None:
    """The executor and --parallel, refused in one line before anything else is read."""
    executor, parallel = request.executor, request.parallel
    if executor not in ("slurm", "local"):
        raise AblateError(f"unknown executor {executor!r}; valid executors: local, slurm")
    if parallel is not None and (isinstance(parallel, bool) or parallel <= 0):
        raise AblateError(f"--parallel must be a positive integer, not {parallel}")


def _run_here(experiment, experiment_file, todo, request: Submission, options, lock_id) -> tuple[dict, list, set]:
    """The local grid: (each run's exit code, the runs that diverged, the runs that completed)."""
    results = request.results
    codes = run_local(experiment, experiment_file, todo, results, request.parallel, options, lock_id)
    trained = {s.key: read_summary(s.folder(results)) for s in todo}
    return (codes, [key for key, summary in trained.items() if summary.status == Status.DIVERGED],
            {key for key, summary in trained.items() if summary.completed})


def _record_the_design(folder: Path, experiment: Experiment, request: Submission) -> None:
    """Under the submit lock, before anything is queued: a sequential design's record once; else the fixed design's
    whole declaration, frozen at its first submit (`ablate.design.record_design`: a changed one refused unless
    `amend`)."""
    if request.sequential is not None and recorded_design(folder) is None:
        record_ledger(folder, {}, {**request.sequential, "recorded": dt.datetime.now().isoformat(timespec="seconds")})
    elif request.sequential is None and recorded_design(folder) is None:
        record_design(folder, request.declaration or experiment, request.amend)


def _submit_evals(experiment, experiment_file, specs, request: Submission, profile, training_jobs,
                  completed: set[str]) -> dict:
    """Evaluation of every run of `specs` that is completed (`completed`: their keys, as status said before the
    submit and the local grid's runs since) or was just queued; {key: job id or outcome}."""
    results, executor, tasks = request.results, request.executor, list(request.eval_tasks)
    folder = experiment_dir(results, experiment)
    job = EvalJob(str(Path(experiment_file).resolve()) if experiment_file else None, str(Path(results).resolve()),
                  tasks, dict(request.eval_options))
    outcomes = {}
    if executor == "local":  # the grid has run: evaluate what completed
        for spec in [s for s in specs if s.key in completed]:
            try:
                job(spec)
                outcomes[spec.key] = "evaluated"
            except Exception as err:  # one run's failure must not stop the others
                outcomes[spec.key] = f"failed: {error_line(str(err)) or err.__class__.__name__}"
        record_ledger(folder, {f"eval:{k}": LedgerEntry("local", tasks=tuple(tasks), outcome=v)
                               for k, v in outcomes.items()})
        return outcomes

    chosen = [s for s in specs if s.key in completed or s.key in training_jobs]

    def after_training(tier_specs) -> dict:  # after the training array: runs that failed are refused by the evaluation
        after = sorted({training_jobs[s.key].split("_")[0] for s in tier_specs if s.key in training_jobs})
        return {"slurm_additional_parameters": {"dependency": "afterany:" + ":".join(after)}} if after else {}

    for tier, tier_specs, submitted, logs in _array_per_tier(experiment, folder, chosen, profile, "eval-",
                                                             lambda tier_specs: job, after_training):
        entries = {f"eval:{s.key}": LedgerEntry("slurm", j.job_id, str(logs / "%j"), tasks=tuple(tasks),
                                                submitted=dt.datetime.now().isoformat(timespec="seconds"))
                   for s, j in zip(tier_specs, submitted)}
        record_ledger(folder, entries, {"tier": tier, "executor": "slurm", "kind": "eval", "tasks": tasks,
                                        "array": submitted[0].job_id.split("_")[0],
                                        "runs": [s.key for s in tier_specs]})
        outcomes.update({k.removeprefix("eval:"): v.job_id for k, v in entries.items()})
    return outcomes



LEFT_ALONE = (Status.COMPLETED, Status.DIVERGED, "damaged")  # never queued again (damaged: `run --force` decides)


def _plan_submission(experiment, specs, tiers, results, resources, rerun_stale: bool = False) -> tuple[dict, set[str]]:
    """What a submit queues: the runs neither finished nor held, and (`rerun_stale`) the completed runs whose arm's
    code changed since they trained; without `rerun_stale` such runs are refused, named, before anything is queued.
    With it, the keys of the completed runs it leaves alone: `status` asked once for the whole submit."""
    rows = status(experiment, results, specs)
    stale = [spec.key for spec, row in zip(specs, rows) if row.stale and not row.queued]
    if stale and not rerun_stale:
        arms = sorted({row.arm for row in rows if row.stale})
        raise AblateError(f"{len(stale)} completed run(s) trained another version of their arm's code than the code "
                          f"now (arm {', '.join(arms)}): {', '.join(stale)}; `--rerun-stale` moves them aside and "
                          "trains the current code (or restore the code); nothing was queued")
    todo = [spec for spec, row in zip(specs, rows)
            if (row.state not in LEFT_ALONE or spec.key in stale) and not row.queued]
    skipped: dict[str, int] = {}
    for spec, row in zip(specs, rows):
        if (row.state in LEFT_ALONE and spec.key not in stale) or row.queued:
            skipped[row.state] = skipped.get(row.state, 0) + 1
    completed = {spec.key for spec, row in zip(specs, rows) if row.state == Status.COMPLETED and spec.key not in stale}
    return {"experiment": experiment.name, "runs": len(specs), "to_submit": [s.key for s in todo],
            "skipped": skipped, "gpu_hours": _gpu_hours(todo, tiers), "resources": resources, "jobs": {},
            "stale": dict.fromkeys(stale)}, completed


def _gpu_hours(specs: list[RunSpec], tiers: Mapping[str, Tier]) -> float:
    """The GPU-hours of `specs` as `ablate plan` prices them (`tiers`: their tiers)."""
    total = 0.0
    for tier in sorted({s.tier for s in specs}):
        per_arm = {r["arm"]: r["gpu_hours_per_run"]
                   for r in plan_rows(tiers[tier], sorted({s.arm for s in specs if s.tier == tier}), 1)["runs"]}
        total += sum(per_arm[s.arm] for s in specs if s.tier == tier)
    return total


def _submit_slurm(experiment, experiment_file, specs, tiers, results, profile, options) -> dict:
    folder = experiment_dir(results, experiment)
    processes = profile.processes_per_run
    job = RunJob(str(Path(experiment_file).resolve()) if experiment_file else None, str(Path(results).resolve()),
                 dataclasses.replace(options.unset_to(threads=max(1, profile.cpus_per_run // processes)),
                                     devices=processes))  # Lightning's processes are the job's tasks, as many
    gpu = profile.gpu

    def job_of(tier_specs):
        if not gpu:
            return job
        return RunJob(job.experiment_file, job.results,
                      gpu_run_options(job.options, tier_specs[0], tiers[tier_specs[0].tier], profile))

    jobs = {}
    for tier, tier_specs, submitted, logs in _array_per_tier(experiment, folder, specs, profile, "", job_of):
        entries = {s.key: LedgerEntry("slurm", j.job_id, str(logs / "%j"),
                                      submitted=dt.datetime.now().isoformat(timespec="seconds"))
                   for s, j in zip(tier_specs, submitted)}
        record_ledger(folder, entries, {"tier": tier, "executor": "slurm", "profile": profile.name,
                                        "array": submitted[0].job_id.split("_")[0], "runs": list(entries),
                                        **recorded_options(options)})
        jobs.update({k: v.job_id for k, v in entries.items()})
    return jobs


def _array_per_tier(experiment, folder: Path, specs: list[RunSpec], profile: Profile, prefix: str, job_of,
                    parameters_of=lambda tier_specs: {}):
    """One SLURM array per tier of `specs` (runs of a tier share their resources), logs under
    FOLDER/slurm/<prefix><tier>/; yields (tier, its specs, the submitted jobs, the log folder). `job_of(specs)`
    is the tier's job, `parameters_of(specs)` extra executor parameters (an evaluation's dependency)."""
    for tier in dict.fromkeys(s.tier for s in specs):
        tier_specs = [s for s in specs if s.tier == tier]
        logs = folder / "slurm" / f"{prefix}{tier}"
        executor = submitit.AutoExecutor(folder=logs / "%j", cluster="slurm")
        params = executor_parameters(profile, f"ablate-{prefix}{experiment.name}-{tier}")
        for key, value in parameters_of(tier_specs).items():
            params.setdefault(key, {}).update(value)
        executor.update_parameters(**params)
        yield tier, tier_specs, map_array(executor, job_of(tier_specs), tier_specs, profile), logs


def map_array(executor: submitit.AutoExecutor, job, specs: list[RunSpec], profile: Profile) -> list:
    """`executor.map_array`, with sbatch's refusal as one line naming the profile setting behind it (submitit
    would print sbatch's stderr and raise a traceback)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return executor.map_array(job, specs)
    except submitit.core.utils.FailedJobError as err:
        raise AblateError(sbatch_refusal(profile, f"{said.getvalue()}\n{err}")) from None


def gpu_run_options(options: RunOptions, spec: RunSpec, tier: Tier, profile: Profile) -> RunOptions:
    """The options a tier's runs get on the profile's GPU: the micro-batch `ablate.sizing.run_micro_batch`
    gives for the run's own options (the experiment's overrides, these options on top) and its arm, as `ablate plan`
    prints it (`tier`: the spec's)."""
    return dataclasses.replace(options, micro_batch=run_micro_batch(
        tier, get_gpu(profile.gpu).memory_gb, chosen_options(spec.overrides, options.given()),
        world_size=profile.processes_per_run, arm=spec.arm))
