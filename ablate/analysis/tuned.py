"""The tuned paired table (`ablate table EXPERIMENT --kind paired --tuned`): each arm at its own best LR.

Each arm's best LR is chosen by its LR sweep on the selection loss (`ablate.analysis.lr`); the confirmatory
runs are the grid's seeds at that LR — seeds the sweep did not use — at `<tier>/<arm>/lr<f>/seed<k>`, or,
where the best LR is the shared one, the grid's own runs at `<tier>/<arm>/seed<k>`. Two of them pair when
they differ in the arm and in `lr` only, the one key the tuned table allows (and names). Torch-free.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ablate.analysis.build import build_table
from ablate.analysis.load import RUN_SCHEMA, load_runs, refuse_twice, store_row
from ablate.analysis.lr import LRAt, check_lr_factors
from ablate.analysis.matching import check_matched
from ablate.analysis.runs import Runs
from ablate.errors import AblateError
from ablate.store import (CONFIG, SUMMARY, iter_lr_run_dirs, iter_run_dirs, lr_factor_of, read_json_file,
                          refuse_damaged_config, run_key)

ALLOWED = ("lr",)
WAY_OUT = "rerun that run (`ablate run ... --force` keeps the damaged folder aside) or move it out"


def tuned_runs(folder: str | Path, best: dict[str, dict[str, float]], allow_unverified: bool = False) -> Runs:
    """The runs of each tier of `best` ({tier: {arm: best factor}}) at every arm's own best LR, as one source
    the paired tables read; the confirmatory runs a sweep has not reached yet are `missing` as usual.

    The grid's rules hold here too (`ablate.analysis.load`, `ablate.analysis.matching`): one run per (tier, arm,
    seed) — a copied `lr2.0` beside `lr2` is refused —, every identity the grid's rows carry (data_id, the
    fingerprints, what computed it), and each run's lr is its folder's factor × the tier's lr."""
    folder = Path(folder)
    candidates = [run for run in iter_run_dirs(folder) if run.parent.parent.name in best] + [
        run for run in iter_lr_run_dirs(folder) if run.parent.parent.parent.name in best]
    rows, seen, lrs, selection_starts = [], {}, [], {}
    for run in candidates:
        factor = lr_factor_of(run)
        tier, arm = (run.parent.parent.parent if factor is not None else run.parent.parent).name, \
            (run.parent.parent if factor is not None else run.parent).name
        config = read_json_file(run / CONFIG, WAY_OUT) if (run / CONFIG).is_file() else None
        if config is not None and config.get("selection_tokens"):
            _note_selection_start(selection_starts, tier, run, config, read_json_file(run / SUMMARY, WAY_OUT))
            continue  # a sweep run: it chose the LR, so it never confirms it
        if config is not None and isinstance(config.get("lr"), (int, float)):
            lrs.append(LRAt(str(run), tier, factor or 1.0, float(config["lr"])))
        if arm not in best[tier] or (factor or 1.0) != float(best[tier][arm]):
            continue
        summary = read_json_file(run / SUMMARY, WAY_OUT)
        refuse_damaged_config(run, summary)
        seed = int(run.name.removeprefix("seed"))
        refuse_twice(seen, (tier, arm, seed), run_key(tier, arm, seed, factor), run)
        rows.append(store_row(run, tier, arm, seed, summary, config, ALLOWED))
    check_lr_factors(lrs)
    _refuse_reaching_selection(rows, selection_starts)
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


def _validation_reach(config: dict | None, summary: dict) -> int | None:
    """Where a run's final validation windows end in the val split (tokens from its start), from the tokens it
    evaluated (windows × seq_len) and its windows of seq_len + 1; None when not recorded."""
    evaluated, seq_len = summary.get("val_tokens_evaluated"), (config or {}).get("seq_len")
    if not isinstance(evaluated, int) or not isinstance(seq_len, int) or seq_len <= 0:
        return None
    return evaluated // seq_len * (seq_len + 1)


def _note_selection_start(starts: dict, tier: str, run: Path, config: dict, summary: dict) -> None:
    """The first val-split token of the sweep's selection split (right after the sweep run's own validation
    windows: `ablate.data.order.selection_windows`), the earliest over the tier's sweep runs."""
    start = _validation_reach(config, summary)
    if start is not None and (tier not in starts or start < starts[tier][0]):
        starts[tier] = (start, str(run))


def _refuse_reaching_selection(rows: list[dict], starts: dict) -> None:
    """A confirmatory run whose validation windows reach the sweep's selection split reports a loss on tokens
    the LR was chosen on (final_val_tokens raised between the sweep and `--tuned`): refused, named."""
    for row in rows:
        if row["tier"] not in starts or row["reason"] is not None:
            continue
        run = Path(row["path"])
        config = read_json_file(run / CONFIG, WAY_OUT) if (run / CONFIG).is_file() else None
        reach = _validation_reach(config, read_json_file(run / SUMMARY, WAY_OUT))
        start, sweep_run = starts[row["tier"]]
        if reach is not None and reach > start:
            raise AblateError(
                f"confirmatory run {run} reports its loss on val-split tokens 0–{reach - 1}, which reach the LR "
                f"sweep's selection split (from token {start}, after the validation windows of {sweep_run}): its "
                f"loss would be measured on tokens its LR was chosen on (final_val_tokens raised after the sweep?); "
                f"rerun it with the sweep's final_val_tokens (`ablate run ... --force` keeps the old folder aside)")


def survival(shared, tuned) -> list[dict]:
    """Per row of the shared-LR table (tier and arm, quantity or comparison) found in the tuned one: both means,
    whether the sign is kept, and whether each is significant (p_holm where the table adjusts, else p, < 0.05)."""
    key = shared.key
    column = "p_holm" if "p_holm" in shared.frame.columns else "p"
    tuned_rows = {(r["tier"], r[key]): r for r in tuned.frame.iter_rows(named=True)}
    found = []
    for row in shared.frame.iter_rows(named=True):
        other = tuned_rows.get((row["tier"], row[key]))
        if other is None or row["mean"] is None or other["mean"] is None:
            continue
        significant = [r.get(column) is not None and r[column] < 0.05 for r in (row, other)]
        sign_kept = (row["mean"] > 0) == (other["mean"] > 0)
        found.append({"tier": row["tier"], key: row[key], "shared_mean": row["mean"], "tuned_mean": other["mean"],
                      "sign_kept": sign_kept, "shared_significant": significant[0],
                      "tuned_significant": significant[1], "survives": sign_kept and significant[0] == significant[1]})
    return found


def survival_text(rows: list[dict], key: str) -> str:
    """One line per comparison: whether its sign and significance survive tuning."""
    if not rows:
        return "no comparison is in both the shared-LR and the tuned table yet\n"
    lines = []
    for r in rows:
        sig = lambda s: "significant" if s else "not significant"  # noqa: E731
        verdict = "survives tuning" if r["survives"] else "does NOT survive tuning"
        lines.append(f"- {r['tier']} {r[key]}: shared LR {r['shared_mean']:+.4f} ({sig(r['shared_significant'])}), "
                     f"tuned {r['tuned_mean']:+.4f} ({sig(r['tuned_significant'])}); sign "
                     f"{'kept' if r['sign_kept'] else 'FLIPPED'}: {verdict}")
    return "\n".join(lines) + "\n"


def tuned_tables(folder: str | Path, best: dict, kind: str = "paired", reference: str | None = None, declared=None,
                 allow_unverified: bool = False):
    """(the shared-LR table, the tuned table, the survival of each row of the declared comparisons — or, without
    declared ones, of the table's rows) for the tiers the sweep tuned."""
    shared_runs = load_runs(folder, allow_unverified=allow_unverified)
    shared_runs = Runs(name=shared_runs.name, frame=shared_runs.frame.filter(pl.col("tier").is_in(list(best))),
                       root=shared_runs.root, notes=shared_runs.notes)
    tuned = tuned_runs(folder, best, allow_unverified)
    shared_table = build_table(shared_runs, kind, reference, declared)
    tuned_table = build_table(tuned, kind, reference, declared)
    has_declared = declared is not None and declared.comparisons
    judged = [build_table(r, "declared", None, declared) for r in (shared_runs, tuned)] if has_declared else \
        [shared_table, tuned_table]
    return shared_table, tuned_table, survival(*judged), judged[0].key
