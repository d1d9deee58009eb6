"""The tuned paired table (`ablate table EXPERIMENT --kind paired --tuned`): each arm at its own best LR, and its
test: did the picked LRs change the comparison? (Whether an arm's optimum moved is the LR table's other test,
`ablate.analysis.lr_optimum`.)

Each arm's best LR is chosen by its LR sweep on the selection loss (`ablate.analysis.lr`); the confirmatory
runs are the grid's seeds at that LR — seeds the sweep did not use — at `<tier>/<arm>/lr<f>/seed<k>`, or,
where the best LR is the shared one, the grid's own runs at `<tier>/<arm>/seed<k>`. Two of them pair when
they differ in the arm and in `lr` only, the one key the tuned table allows (and names). Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import polars as pl
from scipy.special import stdtr

from ablate.analysis.build import build_table
from ablate.analysis.figures import figure
from ablate.analysis.hypotheses import ALPHA, study_holm
from ablate.analysis.render import format_p
from ablate.analysis.stats import holm_by
from ablate.power import RESOLUTION
from ablate.analysis.kinds import TableKind, kind_where
from ablate.analysis.load import RUN_SCHEMA, RunFolders, load_runs, refuse_twice, store_row
from ablate.analysis.lr import LRAt, check_lr_factors
from ablate.analysis.matching import check_matched
from ablate.analysis.runs import Runs
from ablate.errors import AblateError
from ablate.runconfig import RunConfig
from ablate.store import CONFIG, run_of
from ablate.store_summary import RunSummary

ALLOWED = ("lr",)
WAY_OUT = "rerun that run (`ablate run ... --force` keeps the damaged folder aside) or move it out"


def tuned_runs(folder: str | Path | RunFolders, best: dict[str, dict[str, float]], allow_unverified: bool = False
               ) -> Runs:
    """The runs of each tier of `best` ({tier: {arm: best factor}}) at every arm's own best LR, as one source
    the paired tables read; the confirmatory runs a sweep has not reached yet are `missing` as usual.

    The grid's rules hold here too (`ablate.analysis.load`, `ablate.analysis.matching`): one run per (tier, arm,
    seed) — a copied `lr2.0` beside `lr2` is refused —, every identity the grid's rows carry (data_id, the
    fingerprints, what computed it), and each run's lr is its folder's factor × the tier's lr. `folder`: a path, or
    the `RunFolders` the command reads it through (each file read once)."""
    reads = RunFolders.of(folder)
    candidates = [run for run in [*reads.grid, *reads.swept] if run_of(run).tier in best]
    rows, seen, lrs, selection_starts = [], {}, [], {}
    for run in candidates:
        name = run_of(run)
        tier, arm, factor = name.tier, name.arm, name.lr_factor
        config = reads.config(run, WAY_OUT)
        settings = RunConfig.from_dict(config) if config is not None else RunConfig()
        if settings.selection_tokens:
            _note_selection_start(selection_starts, tier, run, settings, reads.summary(run, WAY_OUT))
            continue  # a sweep run: it chose the LR, so it never confirms it
        if isinstance(settings.lr, (int, float)):
            lrs.append(LRAt(str(run), tier, factor or 1.0, float(settings.lr)))
        if arm not in best[tier] or (factor or 1.0) != float(best[tier][arm]):
            continue
        summary = reads.summary(run, WAY_OUT)
        reads.refuse_damaged(run, summary)
        refuse_twice(seen, (tier, arm, name.seed), name.key, run)
        rows.append(store_row(run, tier, arm, name.seed, summary, config, ALLOWED))
    check_lr_factors(lrs)
    _refuse_reaching_selection(rows, selection_starts, reads)
    folder = reads.root
    if not rows:
        raise AblateError(f"no confirmatory runs at the arms' best LRs under {str(folder)!r}; "
                          "`ablate submit EXPERIMENT --tuned` queues them")
    frame = pl.DataFrame(rows, schema=RUN_SCHEMA)
    at = "; ".join(f"{tier}: " + ", ".join(f"{arm} ×{f:g}" for arm, f in arms.items()) for tier, arms in best.items())
    note = (f"each arm at its own best LR (× the tier's lr, chosen on the LR sweep's selection loss: {at}); "
            f"the confirmatory runs use the grid's seeds, which the sweep did not; pairs differ in the arm and in "
            f"{', '.join(ALLOWED)} only")
    runs = Runs(name=f"{folder.name} [tuned]", frame=frame, root=folder, notes=(note,))
    check_matched(runs, allow_unverified, varied=ALLOWED)
    return runs


def _validation_reach(run: Path, config: RunConfig, summary: RunSummary) -> int:
    """Where a run's final validation windows end in the val split (tokens from its start): from the tokens its
    summary says it evaluated (windows × seq_len), or, in a summary without `val_tokens_evaluated` (an older run),
    from its config's final_val_tokens (at most final_val_tokens // seq_len windows: a val split too small for them
    gives fewer, all of it, which reaches any selection split after them anyway); windows of seq_len + 1 tokens.
    A run that records neither is refused, named: its reach cannot be checked."""
    evaluated, seq_len, final = summary.val_tokens_evaluated, config.seq_len, config.final_val_tokens
    if _positive(seq_len) and isinstance(evaluated, int) and not isinstance(evaluated, bool) and evaluated >= 0:
        return evaluated // seq_len * (seq_len + 1)
    if _positive(seq_len) and _positive(final):
        return max(1, final // seq_len) * (seq_len + 1)
    raise AblateError(f"run {run} records neither val_tokens_evaluated (summary.json) nor final_val_tokens and "
                      f"seq_len ({CONFIG}): whether its validation windows reach the LR sweep's selection split "
                      f"cannot be checked; {WAY_OUT}")


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _note_selection_start(starts: dict, tier: str, run: Path, config: RunConfig, summary: RunSummary) -> None:
    """The first val-split token of the sweep's selection split (right after the sweep run's own validation
    windows: `ablate.data.order.selection_windows`), the earliest over the tier's sweep runs."""
    start = _validation_reach(run, config, summary)
    if tier not in starts or start < starts[tier][0]:
        starts[tier] = (start, str(run))


def _refuse_reaching_selection(rows: list[dict], starts: dict, reads: RunFolders) -> None:
    """A confirmatory run whose validation windows reach the sweep's selection split reports a loss on tokens
    the LR was chosen on (final_val_tokens raised between the sweep and `--tuned`): refused, named."""
    for row in rows:
        if row["tier"] not in starts or row["reason"] is not None:
            continue
        run = Path(row["path"])
        config = reads.config(run, WAY_OUT)
        reach = _validation_reach(run, RunConfig.from_dict(config) if config is not None else RunConfig(),
                                  reads.summary(run, WAY_OUT))
        start, sweep_run = starts[row["tier"]]
        if reach > start:
            raise AblateError(
                f"confirmatory run {run} reports its loss on val-split tokens 0–{reach - 1}, which reach the LR "
                f"sweep's selection split (from token {start}, after the validation windows of {sweep_run}): its "
                f"loss would be measured on tokens its LR was chosen on (final_val_tokens raised after the sweep?); "
                f"rerun it with the sweep's final_val_tokens (`ablate run ... --force` keeps the old folder aside)")


CHANGED, NO_CHANGE = "changed by the picked LRs", "no change detected"


def did_statistics(shared: np.ndarray, tuned: np.ndarray, scale: float | None = None) -> dict[str, np.ndarray]:
    """The paired difference-in-differences t over seeds, vectorised over leading axes: per seed
    d_s = Δ_tuned,s − Δ_shared,s (the same seed's comparison at each arm's best LR and at the shared LR); n, mean,
    se, df = n − 1, t and the two-sided p (NaN with fewer than two seeds or no spread). A spread at float
    resolution of the losses behind it (`scale`: their largest |value|; RESOLUTION, as the tables' rule) is no
    spread."""
    d = np.asarray(tuned, float) - np.asarray(shared, float)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n >= 2 else np.full(mean.shape, np.nan)
    sd = np.where(sd <= RESOLUTION * (scale if scale is not None else np.abs(d).max(axis=-1)), 0.0, sd)
    se = sd / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / se
        p = np.where(se > 0, 2.0 * stdtr(max(n - 1, 1), -np.abs(t)), np.nan)
    return {"n": np.full(mean.shape, n), "mean": mean, "se": se, "df": np.full(mean.shape, n - 1), "t": t, "p": p}


def tuning_decision(p_holm: float | None, alpha: float = ALPHA) -> str:
    """"changed by the picked LRs" when the difference-in-differences is significant in the family (p_holm < α), else
    "no change detected" (which is not evidence of no change: the interval says how large a change it allows)."""
    return CHANGED if p_holm is not None and p_holm < alpha else NO_CHANGE


def tuning_rows(shared, tuned, family=None) -> list[dict]:
    """Per row of the shared-LR table (tier and arm, quantity or comparison) found in the tuned one: the
    difference-in-differences test over the seeds both have (`did_statistics`), its p_holm (in the study's
    family `family`, an `ablate.family.Family`, when the tables are declared comparisons: Holm's m is the study's
    design m, whatever the sweep tuned; else Holm over the rows of each tier) and the decision from it. Beside it,
    as description only: both means, whether the sign is kept and whether each is significant (p_holm where the
    table adjusts, else p, < 0.05)."""
    key = shared.key
    column = "p_holm" if "p_holm" in shared.frame.columns else "p"
    tuned_rows = {(r["tier"], r[key]): r for r in tuned.frame.iter_rows(named=True)}
    found = []
    for row in shared.frame.iter_rows(named=True):
        other = tuned_rows.get((row["tier"], row[key]))
        if other is None or row["mean"] is None or other["mean"] is None:
            continue
        paired = _per_seed(shared, row).join(_per_seed(tuned, row), on="seed", suffix="_tuned")
        scale = max(paired["scale"].max() or 0.0, paired["scale_tuned"].max() or 0.0)
        test = did_statistics(paired["diff"].to_numpy(), paired["diff_tuned"].to_numpy(), scale)
        significant = [r.get(column) is not None and r[column] < 0.05 for r in (row, other)]
        found.append({"tier": row["tier"], key: row[key], "seeds": paired.height,
                      "did_mean": _float(test["mean"]), "did_se": _float(test["se"]), "did_t": _float(test["t"]),
                      "did_df": paired.height - 1, "did_p": _float(test["p"]),
                      "shared_mean": row["mean"], "tuned_mean": other["mean"],
                      "sign_kept": (row["mean"] > 0) == (other["mean"] > 0), "shared_significant": significant[0],
                      "tuned_significant": significant[1]})
    adjusted = _adjust(found, key, family)
    for row, p_holm in zip(found, adjusted):
        row.update(did_p_holm=p_holm, decision=tuning_decision(p_holm))
    return found


def _per_seed(table, row: dict) -> pl.DataFrame:
    diffs = table.differences
    part = diffs.filter((pl.col("tier") == row["tier"]) & (pl.col(table.key) == row[table.key]))
    scale = pl.col("scale") if "scale" in part.columns else pl.col("diff").abs()
    return part.select("seed", "diff", scale.alias("scale"))


def _float(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _adjust(rows: list[dict], key: str, family) -> list[float | None]:
    if not rows:
        return []
    frame = pl.DataFrame({"tier": [r["tier"] for r in rows], key: [r[key] for r in rows],
                          "p": [r["did_p"] for r in rows]}, schema={"tier": pl.String, key: pl.String,
                                                                    "p": pl.Float64})
    if family is not None and key == "comparison":
        return study_holm(frame, family)[0].to_list()
    return holm_by(frame).to_list()


def tuning_text(rows: list[dict], key: str) -> str:
    """One line per comparison: the difference-in-differences test and its decision, then the description."""
    if not rows:
        return "no comparison is in both the shared-LR and the tuned table yet\n"
    lines = []
    sig = {True: "significant", False: "not significant"}
    for r in rows:
        test = ("no test (fewer than two seeds or no spread)" if r["did_p"] is None else
                f"Δ_tuned − Δ_shared {figure(r['did_mean'])} ± {figure(r['did_se'], signed=False)} (se), "
                f"t {r['did_t']:.2f} on {r['did_df']} df, p {format_p(r['did_p'])}, p_holm {format_p(r['did_p_holm'])}")
        lines.append(f"- {r['tier']} {r[key]}: {test}: {r['decision']}; described: shared LR "
                     f"{figure(r['shared_mean'])} ({sig[r['shared_significant']]}), tuned {figure(r['tuned_mean'])} "
                     f"({sig[r['tuned_significant']]}), sign {'kept' if r['sign_kept'] else 'FLIPPED'}")
    return "\n".join(lines) + "\n"


TUNING_NOTE = ("Did the picked LRs change the comparison? The paired difference-in-differences t over the grid "
               "seeds (Δ_tuned,s − Δ_shared,s: each arm at the LR its sweep picked against the shared LR), its p "
               "Holm-adjusted in the study's family; whether the sign and the significance agree is description "
               "only. It does not ask whether an arm's optimum moved: with one sweep seed the picked LR is noise on "
               "a flat curve (the LR table's optimum test asks that, from the sweep seeds' vertices)")


def tuned_tables(folder: str | Path | RunFolders, best: dict, kind: TableKind | None = None,
                 reference: str | None = None, declared=None, allow_unverified: bool = False):
    """(the shared-LR table, the tuned table, the tuning test of each row of the declared comparisons — or, without
    declared ones, of the table's rows — `tuning_rows`, and the key of those rows) for the tiers the sweep tuned.
    The declared comparisons are judged in the study's family: the shared-LR ones in the table of every tier,
    the tuned ones and the difference-in-differences with the same design m. `kind`: a tunable kind (default the
    first, the paired table); `folder`: a path or the `RunFolders` the command reads it through."""
    kind = kind or kind_where("tunable")
    reads = RunFolders.of(folder)
    all_runs = load_runs(reads, allow_unverified=allow_unverified)
    shared_runs = Runs(name=all_runs.name, frame=all_runs.frame.filter(pl.col("tier").is_in(list(best))),
                       root=all_runs.root, notes=all_runs.notes)
    tuned = tuned_runs(reads, best, allow_unverified)
    has_declared = declared is not None and declared.comparisons
    family = declared.family_of(all_runs) if has_declared else None
    study = dataclasses.replace(declared, members=family) if has_declared else declared
    shared_table = _swept(build_table(shared_runs, kind, reference, study), best)
    tuned_table = _swept(build_table(tuned, kind, reference, study), best)
    if not has_declared:
        return shared_table, tuned_table, tuning_rows(shared_table, tuned_table), shared_table.key
    rows, key = judge_tuning(all_runs, tuned, best, study)
    return shared_table, tuned_table, rows, key


def judge_tuning(all_runs: Runs, tuned: Runs, best: dict, declared) -> tuple[list[dict], str]:
    """The tuning test of each declared comparison at the swept tiers (`best`'s): the shared-LR rows from the
    declared table of *every* tier, the tuned rows with the same family (`Declared.family_of` the whole study),
    so every p_holm, the shared, the tuned and the difference-in-differences one, has the study's design m."""
    family = declared.family_of(all_runs)
    study = dataclasses.replace(declared, members=family)
    judged = [_swept(build_table(r, kind_where("needs_declared"), None, study), best) for r in (all_runs, tuned)]
    return tuning_rows(*judged, family=family), judged[0].key


def _swept(table, best: dict):
    """A table's rows at the tiers the sweep tuned (a declared p_holm already in the study's family)."""
    return dataclasses.replace(table, frame=table.frame.filter(pl.col("tier").is_in(list(best))))
