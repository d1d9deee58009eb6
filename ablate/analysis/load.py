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
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ablate.arms.names import BUILTIN_ARMS
from ablate.errors import AblateError
from ablate.store import METRICS, SUMMARY, iter_run_dirs, read_json, read_metrics
from ablate.tiers import tier_rank

REQUIRED_COLUMNS = ("tier", "arm", "seed", "val_loss")
FINGERPRINTS = ("init_fingerprint", "data_fingerprint")
TABLE_SUFFIXES = (".csv", ".parquet")
RUN_SCHEMA = {
    "tier": pl.String,
    "arm": pl.String,
    "seed": pl.Int64,
    "status": pl.String,
    "val_loss": pl.Float64,
    "init_fingerprint": pl.String,
    "data_fingerprint": pl.String,
    "reason": pl.String,
    "path": pl.String,
}


@dataclass(frozen=True)
class Runs:
    """All runs of one source. `frame` has the columns of RUN_SCHEMA, one row per (tier, arm, seed).

    `reason` is null for a run that counts and says why otherwise (e.g. "diverged at step 812").
    `root` is the experiment folder (None for a CSV/parquet source); `path` the run folder.
    """

    name: str
    frame: pl.DataFrame
    root: Path | None = None

    @property
    def completed(self) -> pl.DataFrame:
        return self.frame.filter(pl.col("reason").is_null())

    @property
    def excluded(self) -> pl.DataFrame:
        return sort_runs(self.frame.filter(pl.col("reason").is_not_null()), self.arm_order)

    @property
    def tiers(self) -> list[str]:
        """Tiers by model size (nominal parameters), unknown names last by name."""
        return sorted(self.frame["tier"].unique().to_list(), key=lambda t: (tier_rank(t), t))

    @property
    def arm_order(self) -> list[str]:
        """Built-in arms in registry order, then custom arms in order of first appearance."""
        seen = self.frame["arm"].unique(maintain_order=True).to_list()
        return [a for a in BUILTIN_ARMS if a in seen] + [a for a in seen if a not in BUILTIN_ARMS]

    @property
    def missing(self) -> pl.DataFrame:
        """(tier, arm, seed) with no run at all, where the tier has that seed and that arm otherwise.

        A tier's seeds and arms are those of any run in it (whatever its status): the store does not
        know the grid that was planned, only what was started. Runs that exist but do not count are
        in `excluded`, not here.
        """
        grid = (
            self.frame.select("tier", "arm").unique()
            .join(self.frame.select("tier", "seed").unique(), on="tier")
        )
        present = self.frame.select("tier", "arm", "seed")
        return sort_runs(grid.join(present, on=["tier", "arm", "seed"], how="anti"), self.arm_order)


def sort_runs(frame: pl.DataFrame, arm_order: list[str], arm_column: str = "arm") -> pl.DataFrame:
    """Tiers by size, arms in `arm_order` (others after, by name), then seed if present."""
    arm_rank = {arm: i for i, arm in enumerate(arm_order)}
    tiers = frame["tier"].unique().to_list()
    tier_pos = {t: i for i, t in enumerate(sorted(tiers, key=lambda t: (tier_rank(t), t)))}
    keyed = frame.with_columns(
        pl.col("tier").replace_strict(tier_pos, return_dtype=pl.Int64).alias("_tier"),
        pl.col(arm_column).replace_strict(arm_rank, default=len(arm_rank), return_dtype=pl.Int64).alias("_arm"),
    )
    keys = ["_tier", "_arm", arm_column] + (["seed"] if "seed" in frame.columns else [])
    return keyed.sort(keys).drop("_tier", "_arm")


def load_runs(source: str | os.PathLike, results: str | os.PathLike | None = None) -> Runs:
    """SOURCE: a CSV/parquet file, an experiment folder, or an experiment (name or .py file)
    whose runs live in `results/<name>/` (results defaults to `ablate.experiment.default_results()`)."""
    path = Path(source)
    if path.suffix.lower() in TABLE_SUFFIXES:
        if not path.is_file():
            raise AblateError(f"no such file {str(path)!r}")
        return _runs_from_table(path)
    return _runs_from_store(resolve_experiment_dir(source, results))


def resolve_experiment_dir(source: str | os.PathLike, results: str | os.PathLike | None = None) -> Path:
    """An experiment folder itself, or `results/<experiment name>` for a name or an experiments/*.py file."""
    from ablate.experiment import default_results, load_experiment

    results_dir = Path(results) if results is not None else default_results()
    text = str(source)
    path = Path(text)
    if not text.endswith(".py"):
        if (results_dir / text).is_dir():
            return results_dir / text
        if path.is_dir():
            return path
    name = load_experiment(text).name  # refuses an unknown name, naming the valid experiments
    folder = results_dir / name
    if not folder.is_dir():
        with_runs = sorted(p.name for p in results_dir.glob("*") if p.is_dir()) if results_dir.is_dir() else []
        raise AblateError(
            f"experiment {name!r} has no runs under {str(results_dir)!r} (looked for {str(folder)!r}); "
            f"experiments with results there: {', '.join(with_runs) or '(none)'}"
        )
    return folder


def _runs_from_store(folder: Path) -> Runs:
    rows = []
    for run in iter_run_dirs(folder):
        try:
            summary = read_json(run / SUMMARY)
        except (OSError, ValueError) as err:
            raise AblateError(f"cannot read {str(run / SUMMARY)!r}: {err}") from err
        tier, arm, seed_dir = run.relative_to(folder).parts
        row = {
            "tier": str(summary.get("tier", tier)),
            "arm": str(summary.get("arm", arm)),
            "seed": int(summary.get("seed", seed_dir.removeprefix("seed"))),
            "status": summary.get("status"),
            "val_loss": summary.get("val_loss"),
            "path": str(run),
        }
        row.update({key: summary.get(key) for key in FINGERPRINTS})
        row["reason"] = _exclusion_reason(row["status"], row["val_loss"], summary)
        rows.append(row)
    if not rows:
        raise AblateError(f"no runs (no */*/seed*/{SUMMARY}) under {str(folder)!r}")
    frame = pl.DataFrame(rows, schema=RUN_SCHEMA)
    return Runs(name=folder.name, frame=frame, root=folder)


def _exclusion_reason(status, val_loss, summary: dict) -> str | None:
    if status != "completed":
        if status == "diverged" and summary.get("diverged_step") is not None:
            return f"diverged at step {summary['diverged_step']}"
        if status == "failed" and summary.get("error"):
            return f"failed: {str(summary['error']).splitlines()[0][:120]}"
        return str(status or "no status")
    if val_loss is None or not math.isfinite(float(val_loss)):
        return f"completed but val_loss is {val_loss!r}"
    return None


def _runs_from_table(path: Path) -> Runs:
    try:
        table = pl.read_parquet(path) if path.suffix.lower() == ".parquet" else pl.read_csv(path, infer_schema_length=None)
    except Exception as err:  # polars raises several types for unreadable files; name the file either way
        raise AblateError(f"cannot read {str(path)!r} as {path.suffix[1:]}: {err}") from err
    absent = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if absent:
        raise AblateError(
            f"{str(path)!r} lacks column(s) {', '.join(absent)}; needs {', '.join(REQUIRED_COLUMNS)}; "
            f"found: {', '.join(table.columns) or '(none)'}"
        )
    optional = [c for c in ("status", *FINGERPRINTS) if c in table.columns]
    try:
        frame = table.select(
            pl.col("tier").cast(pl.String),
            pl.col("arm").cast(pl.String),
            pl.col("seed").cast(pl.Int64),
            pl.col("val_loss").cast(pl.Float64),
            *[pl.col(c).cast(pl.String) for c in optional],
        )
    except pl.exceptions.PolarsError as err:
        raise AblateError(f"{str(path)!r}: seed must be an integer and val_loss a number ({err})") from err
    dupes = frame.filter(pl.struct("tier", "arm", "seed").is_duplicated())
    if dupes.height:
        first = dupes.row(0, named=True)
        raise AblateError(
            f"{str(path)!r} has more than one row for run {first['tier']}/{first['arm']}/seed{first['seed']}; "
            "each (tier, arm, seed) must appear once"
        )
    if "status" not in frame.columns:
        frame = frame.with_columns(status=pl.lit("completed"))
    for column in FINGERPRINTS:
        if column not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias(column))
    finite = pl.col("val_loss").is_not_null() & pl.col("val_loss").is_finite()
    frame = frame.with_columns(
        reason=pl.when(pl.col("status") != "completed").then(pl.col("status"))
        .when(~finite).then(pl.lit("completed but val_loss is missing or not finite")),
        path=pl.lit(None, dtype=pl.String),
    ).select(list(RUN_SCHEMA))
    return Runs(name=path.stem, frame=frame.cast(RUN_SCHEMA), root=None)


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
