"""Reading runs for the analysis: an experiment's run store, or a CSV/parquet table of final losses.

Everything downstream works on one `Runs` value, whatever the source, so that the store and a
hand-made CSV give the same tables. Only completed runs with a finite validation loss count; every
other run is kept in the frame with the reason it is left out, because a table that silently drops
a diverged run overstates how well an arm trains.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import polars as pl

from ablate.errors import AblateError
from ablate.analysis.numerics import NUMERICS, numerics_label
from ablate.analysis.matching import ARM_SOURCE, DATA_ID, FINGERPRINTS, SETTINGS, check_matched
from ablate.analysis.runs import NOT_EVALUATED, Runs
from ablate.arms.source import current_scheme
from ablate.analysis.tablefile import read_table
from ablate.evals.results import check_metric, read_metric
from ablate.identity import fingerprints_without, shared_fingerprint
from ablate.store import (CONFIG, METRICS, SUMMARY, Status, check_name, iter_lr_run_dirs, iter_run_dirs,
                          refuse_damaged_config, read_json_file, read_metrics, run_key, run_of)
from ablate.store_summary import RunSummary, read_summary

TABLE_SUFFIXES = (".csv", ".parquet")
STORE_WAY_OUT = ("rerun that run (`ablate run ... --force` keeps the damaged folder aside) or move the folder out of "
                 "the experiment")
RUN_SCHEMA = {
    "tier": pl.String,
    "arm": pl.String,
    "seed": pl.Int64,
    "status": pl.String,
    "val_loss": pl.Float64,
    "init_fingerprint": pl.String,
    "data_fingerprint": pl.String,
    "config_fingerprint": pl.String,
    "val_fingerprint": pl.String,
    DATA_ID: pl.String,  # the training data's identity (split and shard checksums), whatever folder held it
    SETTINGS: pl.String,  # of everything but arm and seed (ablate.identity.shared_config), from config.json
    "eval_fingerprint": pl.String,
    "init_fingerprint_common": pl.String,
    ARM_SOURCE: pl.String,  # the arm's code (`ablate.arms.source`): equal for every seed of one row
    "mlp_hidden": pl.Int64,
    "params_non_embedding": pl.Int64,  # the run's trained size: the baseline's is its tier's x in the scale model
    "verified": pl.Boolean,
    NUMERICS: pl.String,  # what computed the run (`ablate.analysis.numerics.numerics_label`): execution, not identity
    "reason": pl.String,
    "path": pl.String,
}


@dataclass
class RunFolders:
    """An experiment folder read once: its run folders listed once (`grid`, the grid's; `swept`, those at an lr
    factor), and each run's summary.json and config.json read at most once, whichever reader asks first (the
    grid's tables, the LR sweep's, the tuned table's: `ablate table --tuned` reads the folder through one)."""

    root: Path
    _summaries: dict = field(default_factory=dict, repr=False)
    _configs: dict = field(default_factory=dict, repr=False)
    _checked: set = field(default_factory=set, repr=False)

    @classmethod
    def of(cls, folder: "str | os.PathLike | RunFolders") -> "RunFolders":
        return folder if isinstance(folder, RunFolders) else cls(Path(folder))

    @cached_property
    def grid(self) -> list[Path]:
        return list(iter_run_dirs(self.root))

    @cached_property
    def swept(self) -> list[Path]:
        return list(iter_lr_run_dirs(self.root))

    def summary(self, run: Path, way_out: str) -> RunSummary:
        """The run's summary.json (`read_summary`; `way_out`: what a damaged one's error says to do)."""
        if run not in self._summaries:
            self._summaries[run] = read_summary(run, way_out)
        return self._summaries[run]

    def refuse_damaged(self, run: Path, summary: RunSummary) -> None:
        """`ablate.store.refuse_damaged_config` of the run, once: its config.json against the fingerprint it trained
        with (that check reads config.json itself, so a run's config is read twice: once checked, once here)."""
        if run not in self._checked:
            refuse_damaged_config(run, summary)
            self._checked.add(run)

    def config(self, run: Path, way_out: str) -> dict | None:
        """The run's config.json; None when it has none (an older run)."""
        if run not in self._configs:
            try:
                self._configs[run] = read_json_file(run / CONFIG, way_out)
            except FileNotFoundError:
                self._configs[run] = None
        return self._configs[run]


def load_runs(source: "str | os.PathLike | RunFolders", *, allow_unverified: bool = False,
              metric: str | None = None) -> Runs:
    """SOURCE: a CSV/parquet file or an experiment's folder of runs (an experiment's name or file is
    resolved to its folder by `ablate.experiment.results_of`, which the commands call first).

    Every counted run of a (tier, seed) must carry the same init, data, config and validation
    fingerprints (any two of them may be paired by some table), and every counted run of a tier the
    same settings but arm and seed (its rows average over seeds): `ablate.analysis.matching`. A run
    without fingerprints or config.json (an older run) is refused unless `allow_unverified`, and then
    marked `verified = False`.

    `metric` (TASK/METRIC of `ablate eval`, store sources only) replaces the loss by that downstream
    metric, oriented like a loss (negated when higher is better), so that every table keeps "positive
    = the arm is better"; runs evaluated under other settings than their pair are refused like any
    unmatched pair. A `RunFolders` source is that folder, read through it.
    """
    path = source.root if isinstance(source, RunFolders) else Path(source)
    if path.suffix.lower() in TABLE_SUFFIXES:
        if not path.is_file():
            raise AblateError(f"no such file {str(path)!r}")
        runs = _runs_from_table(path)
    elif path.is_dir():
        runs = _runs_from_store(RunFolders.of(source))
    else:
        raise AblateError(f"{str(path)!r} is neither an experiment's folder of runs nor a .csv/.parquet file")
    if metric is not None:
        if runs.root is None:
            raise AblateError("--metric reads eval.json in run folders: give an experiment, not a table file")
        runs = _with_metric(runs, metric)
    check_matched(runs, allow_unverified, with_eval=metric is not None)
    return runs


def _with_metric(runs: Runs, name: str) -> Runs:
    check_metric(name, [Path(p) for p in runs.frame["path"].to_list()])
    values, fingerprints, reasons, directions = [], [], [], set()
    for row in runs.frame.iter_rows(named=True):
        found = read_metric(row["path"], name) if row["reason"] is None else None
        if found is None or found.get("value") is None or not math.isfinite(found["value"]):
            values.append(None)
            fingerprints.append(None)
            reasons.append(row["reason"] or (found or {}).get("reason") or f"{NOT_EVALUATED} {name} (`ablate eval`)")
            continue
        directions.add(bool(found["higher_is_better"]))
        values.append(-found["value"] if found["higher_is_better"] else found["value"])
        fingerprints.append(found["fingerprint"])
        reasons.append(None)
    frame = runs.frame.with_columns(pl.Series("val_loss", values, dtype=pl.Float64),
                                    pl.Series("eval_fingerprint", fingerprints, dtype=pl.String),
                                    pl.Series("reason", reasons, dtype=pl.String))
    higher = directions == {True}
    # The sign convention is the table caption's to state (`ablate.analysis.render.caption`), once.
    return Runs(name=f"{runs.name} [{name}]", frame=frame, root=runs.root, notes=runs.notes, metric=name,
                higher_is_better=higher)


def _runs_from_store(reads: RunFolders) -> Runs:
    rows, seen, folder = [], {}, reads.root
    for run in reads.grid:
        summary = reads.summary(run, STORE_WAY_OUT)
        name = run_of(run)
        _check_folder_names(run, name.tier, name.arm)
        for key in ("experiment", "tier", "arm", "seed"):
            recorded, expected = getattr(summary, key), getattr(name, key)
            if recorded is not None and recorded != expected:
                raise AblateError(
                    f"{run} holds a run of {key} {recorded!r}, but its folder says {expected!r} (a copied or "
                    "moved run folder?); move it out of the experiment folder")
        reads.refuse_damaged(run, summary)
        refuse_twice(seen, (name.tier, name.arm, name.seed), name.key, run)
        rows.append(store_row(run, name.tier, name.arm, name.seed, summary, reads.config(run, STORE_WAY_OUT)))
    if not rows:
        raise AblateError(f"no runs (no */*/seed<k>/{SUMMARY}) under {str(folder)!r}")
    frame = pl.DataFrame(rows, schema=RUN_SCHEMA)
    return Runs(name=folder.name, frame=frame, root=folder)


def _check_folder_names(run: Path, tier: str, arm: str) -> None:
    """Names read from the store are data: a folder the CLI could not have made (`a|b`) is refused, named."""
    for kind, name in (("tier", tier), ("arm", arm)):
        try:
            check_name(kind, name)
        except AblateError as err:
            raise AblateError(f"{run}: {err}; move that folder out of the experiment folder") from None


def refuse_twice(seen: dict, key: tuple, name: str, run: Path) -> None:
    """One run per key (the grid's (tier, arm, seed); a sweep's (tier, arm, factor, seed)): a second folder of
    it (a copy, or `lr1` beside `lr1.0`) is refused, both named, so that no run counts twice."""
    if key in seen:
        raise AblateError(f"run {name} appears twice: {seen[key]} and {run}; move one of them out of the "
                          "experiment folder")
    seen[key] = run


def store_row(run: Path, tier: str, arm: str, seed: int, summary: RunSummary, config: dict | None,
              varied: tuple[str, ...] = ()) -> dict:
    """One run's row of RUN_SCHEMA, carrying every identity the grid's tables check (the fingerprints, data_id,
    the settings, the arm's code, what computed it). `varied`: the config keys the runs of this source may
    differ in (an LR sweep's or a tuned table's `lr`), left out of its config and settings fingerprints."""
    refuse_hybrid(run, summary)
    row = {"tier": tier, "arm": arm, "seed": seed, "status": summary.status, "val_loss": summary.val_loss,
           "mlp_hidden": summary.mlp_hidden, "params_non_embedding": summary.params_non_embedding,
           "eval_fingerprint": None, DATA_ID: summary.data_id,
           "init_fingerprint_common": summary.init_fingerprint_common, "path": str(run),
           ARM_SOURCE: summary.arm_source, NUMERICS: numerics_label(summary.versions, summary.numerics_history)}
    row.update({key: getattr(summary, key) for key in FINGERPRINTS})
    if varied:
        row["config_fingerprint"], row[SETTINGS] = fingerprints_without(config, varied) if config else (None, None)
    else:
        row[SETTINGS] = shared_fingerprint(config) if config is not None else None
    row["verified"] = all(row[key] is not None for key in (*FINGERPRINTS, SETTINGS))
    row["reason"] = _exclusion_reason(row["status"], row["val_loss"], summary)
    return row


def refuse_hybrid(run: Path, summary: RunSummary) -> None:
    """A run that trained under more than one version of its arm's code (a resume after an edit, forced or from an
    older ablate) is no run of either: refused, named."""
    versions = [a for a in summary.arm_sources or [] if current_scheme(a)]
    if len(versions) > 1:
        raise AblateError(f"run {run} trained under {len(versions)} versions of arm {summary.arm!r}'s code "
                          f"({', '.join(v[:15] + '…' for v in versions)}): it is no run of either; rerun it "
                          "(`ablate run ... --force` keeps it aside) or move it out of the experiment folder")


def _exclusion_reason(status, val_loss, summary: RunSummary) -> str | None:
    """None for a run that counts (`RunSummary.completed`), else why it does not."""
    if summary.completed:
        return None
    if status != Status.COMPLETED:
        if status == Status.DIVERGED and summary.diverged_step is not None:
            return f"diverged at step {summary.diverged_step}"
        if status == Status.FAILED and summary.error:
            return f"failed: {str(summary.error).splitlines()[0][:120]}"
        return str(status or "no status")
    return f"completed but val_loss is {val_loss!r}"


def _runs_from_table(path: Path) -> Runs:
    table = read_table(path)
    optional = [c for c in ("status", *FINGERPRINTS) if c in table.columns]
    sized = "params_non_embedding" in table.columns  # the trained sizes, when the table carries them
    frame = table.select(
        pl.col("tier").cast(pl.String),
        pl.col("arm").cast(pl.String),
        pl.col("seed").cast(pl.Int64),
        pl.col("val_loss").cast(pl.Float64),
        *[pl.col(c).cast(pl.String) for c in optional],
        *([pl.col("params_non_embedding").cast(pl.Int64)] if sized else []),
    )
    dupes = frame.filter(pl.struct("tier", "arm", "seed").is_duplicated())
    if dupes.height:
        first = dupes.row(0, named=True)
        raise AblateError(
            f"{str(path)!r} has more than one row for run {run_key(first['tier'], first['arm'], first['seed'])}; "
            "each (tier, arm, seed) must appear once"
        )
    if "status" not in frame.columns:
        frame = frame.with_columns(status=pl.lit(Status.COMPLETED.value))
    for column in FINGERPRINTS:
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias(column))
    finite = pl.col("val_loss").is_not_null() & pl.col("val_loss").is_finite()
    frame = frame.with_columns(
        reason=pl.when(pl.col("status") != Status.COMPLETED.value).then(pl.col("status"))
        .when(~finite).then(pl.lit("completed but val_loss is missing or not finite")),
        path=pl.lit(None, dtype=pl.String), **{DATA_ID: pl.lit(None, dtype=pl.String)},
                               mlp_hidden=pl.lit(None, dtype=pl.Int64), verified=pl.lit(False),
        **({} if sized else {"params_non_embedding": pl.lit(None, dtype=pl.Int64)}),
        eval_fingerprint=pl.lit(None, dtype=pl.String), init_fingerprint_common=pl.lit(None, dtype=pl.String),
        **{ARM_SOURCE: pl.lit(None, dtype=pl.String)},
        **{SETTINGS: pl.lit(None, dtype=pl.String), NUMERICS: pl.lit(None, dtype=pl.String)},
    ).select(list(RUN_SCHEMA))
    note = (f"pairing NOT verified: {path.name} is a table of losses, not run folders, so nothing shows that its "
            "runs of one seed differ only in the arm")
    return Runs(name=path.stem, frame=frame.cast(RUN_SCHEMA), root=None, notes=(note,))


CURVE_SCHEMA = {"tier": pl.String, "arm": pl.String, "seed": pl.Int64, "step": pl.Int64, "tokens": pl.Int64,
                "val_loss": pl.Float64}


def load_curves(runs: Runs) -> pl.DataFrame:
    """Validation-loss curves of the counted runs: tier, arm, seed, step, tokens, val_loss.

    Lines without a validation loss (training lines) are dropped, and so are non-finite points.
    """
    frames = [
        _validation_points(Path(row["path"]) / METRICS).with_columns(
            tier=pl.lit(row["tier"]), arm=pl.lit(row["arm"]), seed=pl.lit(row["seed"], dtype=pl.Int64)
        )
        for row in runs.completed.filter(pl.col("path").is_not_null()).iter_rows(named=True)
    ]
    if not frames:
        return pl.DataFrame(schema=CURVE_SCHEMA)
    return pl.concat(frames).select(list(CURVE_SCHEMA)).filter(pl.col("val_loss").is_finite())


def _validation_points(path: Path) -> pl.DataFrame:
    """step, tokens, val_loss of one metrics.jsonl, parsed by polars: a study-sized report reads
    ~200,000 lines, which json.loads line by line makes the slowest part of the report.

    Same reading rules as `ablate.store.read_metrics`: a torn last line is skipped; a file polars
    cannot parse (a damaged line in the middle) is read line by line through `read_metrics` instead.
    """
    schema = {"step": pl.Int64, "tokens": pl.Int64, "val_loss": pl.Float64}
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return pl.DataFrame(schema=schema)
    if not data.rstrip().endswith(b"}"):
        data = data[: data.rfind(b"\n") + 1]  # a torn last line from a killed writer
    data = data.replace(b"-Infinity", b"null").replace(b"Infinity", b"null").replace(b"NaN", b"null")
    if not data.strip():
        return pl.DataFrame(schema=schema)
    try:
        frame = pl.read_ndjson(io.BytesIO(data), schema=schema)
    except pl.exceptions.PolarsError:
        rows = [{k: m.get(k) for k in schema} for m in read_metrics(path)]
        frame = pl.DataFrame(rows, schema=schema)
    return frame.filter(pl.col("val_loss").is_not_null())
