"""Whether the runs of a table trained the arm's code as it is now (`ablate.arms.source`).

A fixed arm whose earlier runs are tabled under its name would show the old numbers as the new code's: a row whose
runs recorded another identity than the arm registered now is refused, naming the arm and the runs, with the way out
(`ablate submit ... --rerun-stale`). The analysis imports no arm: the command hands it each arm's identity now
(`now`: an arm not registered there is not checked, and the table says so). A run recorded under an older identity
scheme is not compared, and the table says that too; a CSV/parquet source records no identity at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ablate.analysis.runs import Runs
from ablate.arms.source import ARM_SOURCE, OLDER_SCHEME, current_scheme
from ablate.errors import AblateError
from ablate.store import run_key

NOT_CHECKED = "arm code not checked"


def check_arm_code(runs: Runs, now: Mapping[str, str | None]) -> Runs:
    """`runs` with notes on what was not compared; refused in one line when a counted run of an arm trained other
    code than the arm's now."""
    if runs.root is None:
        return _with_notes(runs, [f"{NOT_CHECKED}: {runs.name} is a table of losses, which records no arm's code"])
    older, unknown, stale = [], [], {}
    for row in runs.completed.sort("tier", "arm", "seed").iter_rows(named=True):
        recorded, key = row[ARM_SOURCE], run_key(row["tier"], row["arm"], row["seed"])
        if not current_scheme(recorded):
            older.append(key)
        elif now.get(row["arm"]) is None:
            unknown.append(row["arm"])
        elif recorded != now[row["arm"]]:
            stale.setdefault(row["arm"], []).append((key, recorded))
    if stale:
        arm, found = next(iter(stale.items()))
        others = f" (and arms {', '.join(list(stale)[1:])})" if len(stale) > 1 else ""
        raise AblateError(f"arm {arm!r}{others}: its code changed since {', '.join(k for k, _ in found)} trained "
                          f"(recorded {found[0][1][:15]}…, now {now[arm][:15]}…), so the row would show another "
                          "version's numbers under its name; `ablate submit EXPERIMENT --rerun-stale` retrains them, "
                          "or restore the code")
    notes = [f"{OLDER_SCHEME} ({', '.join(older)})"] if older else []
    if unknown:
        notes.append(f"{NOT_CHECKED} for {', '.join(dict.fromkeys(unknown))}: not registered by this command (give "
                     "the experiment file that registers it)")
    return _with_notes(runs, notes)


def _with_notes(runs: Runs, notes: list[str]) -> Runs:
    return dataclasses.replace(runs, notes=runs.notes + tuple(n for n in notes if n not in runs.notes))
