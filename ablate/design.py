"""A fixed design, frozen at the first submit of its experiment: the ledger keeps the whole declaration.

A declared family holds its α only if it is fixed before its runs are seen: three comparisons declared and run,
then two deleted from the experiment file, and the one left is judged at m = 1. So the first `ablate submit` of an
experiment that declares comparisons records in the experiment folder's ledger the experiment file's whole
declaration (`Declaration`: its comparisons with their tiers, its tiers, its seeds per tier, its family kind and
the family's members and scale slopes; the testbed's predictions are its comparisons) — never the subset one
command submits (`--arms`, `--tiers`, `ablate testbed --arm`). Every table and report then decides under the
recorded declaration, and refuses, in one line naming what changed, an experiment file that now declares
otherwise. Changing the design is an explicit amendment (`submit --amend`): a new version with its date, which
the report names. A design recorded when finished runs already existed (runs by `ablate run`, or an older ablate,
or none recorded at all) is marked "design recorded after runs" in every table and the report.

A sequential design (`ablate.sequential`, `submit --sequential`) is recorded and checked there, not here.
Torch-free: the analysis reads it.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError
from ablate.family import Comparison, Family
from ablate.store import LEDGER, iter_run_dirs, read_ledger, record_ledger
from ablate.store_summary import read_summary

FIXED = "fixed-design"  # the kind of the ledger submission that records a fixed design (one per version)
AFTER_RUNS = "design recorded after runs"
PARTS = ("comparisons", "tiers", "seeds", "family", "members", "slopes")


@dataclass(frozen=True)
class Declaration:
    """What an experiment file declares of its design, as plain values (what the ledger keeps)."""

    comparisons: tuple[tuple[str, str, str, tuple[str, ...]], ...]  # (name, minuend, subtrahend, tiers: () = all)
    tiers: tuple[str, ...]
    seeds: tuple[tuple[str, int], ...]  # (tier, seed count)
    family: str
    members: tuple[tuple[str, str], ...]  # the family's (tier, comparison), as `Experiment.declared_family` gives
    slopes: tuple[str, ...]

    @classmethod
    def of(cls, experiment) -> Declaration:
        """The whole declaration of `experiment` (an `ablate.experiment.Experiment`)."""
        family = experiment.declared_family()
        return cls(tuple((c.name, c.minuend, c.subtrahend, tuple(c.tiers)) for c in experiment.hypotheses),
                   tuple(experiment.tiers), tuple((t, int(experiment.seed_count(t))) for t in experiment.tiers),
                   experiment.family, tuple(family.members), tuple(family.slopes))

    def to_record(self) -> dict:
        return {"comparisons": [[n, a, b, list(t)] for n, a, b, t in self.comparisons], "tiers": list(self.tiers),
                "seeds": dict(self.seeds), "family": self.family, "members": [list(m) for m in self.members],
                "slopes": list(self.slopes)}

    @classmethod
    def from_record(cls, record: object, where: str) -> Declaration:
        try:
            return cls(tuple((str(n), str(a), str(b), tuple(map(str, t))) for n, a, b, t in record["comparisons"]),
                       tuple(map(str, record["tiers"])),
                       tuple((str(t), _count(n)) for t, n in record["seeds"].items()), str(record["family"]),
                       tuple((str(t), str(c)) for t, c in record["members"]), tuple(map(str, record["slopes"])))
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise AblateError(f"{where} is damaged ({err.__class__.__name__}: {err}); move the ledger aside (the run "
                              "folders keep their results) and submit again to record the design") from None

    def comparisons_of(self) -> list[Comparison]:
        return [Comparison(n, a, b, t) for n, a, b, t in self.comparisons]

    def family_of(self) -> Family:
        return Family(self.family, self.members, self.slopes)

    def same_as(self, other: Declaration) -> bool:
        """The same design, whatever order the file lists its parts in (order decides nothing)."""
        return not self.changes_from(other)

    def changes_from(self, recorded: Declaration) -> list[str]:
        """What this declaration changes from `recorded`, part by part ("comparisons: recorded …, now …")."""
        out = []
        for part in PARTS:
            before, now = getattr(recorded, part), getattr(self, part)
            if sorted(before if isinstance(before, tuple) else (before,)) != sorted(
                    now if isinstance(now, tuple) else (now,)):
                out.append(f"{part}: recorded {_show(part, before)}, now {_show(part, now)}")
        return out


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"seed count {value!r} is not a positive whole number")
    return value


def _show(part: str, value) -> str:
    if part == "comparisons":
        return "[" + ", ".join(f"{n} ({a} − {b}{' at ' + '/'.join(t) if t else ''})" for n, a, b, t in value) + "]"
    if part == "seeds":
        return "[" + ", ".join(f"{t}: {n}" for t, n in value) + "]"
    if part == "members":
        return f"{len(value)} member(s)"
    return "[" + ", ".join(value) + "]" if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class Version:
    """One recorded version of a fixed design: its declaration, when it was recorded, and how many finished runs
    the folder already held then (the first version's: runs before the design)."""

    declaration: Declaration
    recorded: str
    runs_before: int
    number: int


def recorded_versions(folder: str | os.PathLike) -> list[Version]:
    """Every version of the fixed design the experiment folder's ledger records, oldest first ([] when none)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for index, entry in enumerate(read_ledger(folder).submissions):
        if isinstance(entry, dict) and entry.get("kind") == FIXED:
            where = f"{folder / LEDGER} (submissions[{index}], the fixed design)"
            runs_before = entry.get("runs_before", 0)
            found.append(Version(Declaration.from_record(entry.get("declaration"), where), str(entry.get("recorded")),
                                 runs_before if isinstance(runs_before, int) else 0, len(found) + 1))
    return found


def finished_runs(folder: Path, reads=None) -> int:
    """How many runs of the experiment folder are done (completed or diverged). `reads`: the folder as a command
    reads it once (`ablate.analysis.load.RunFolders`: its `grid` and each run's `summary`), else read here."""
    way_out = "move that run folder out of the experiment folder"
    if reads is not None:
        return sum(reads.summary(run, way_out).done for run in reads.grid)
    return sum(read_summary(run, way_out).done for run in iter_run_dirs(folder)) if folder.is_dir() else 0


def record_design(folder: str | os.PathLike, experiment, amend: bool = False) -> Version | None:
    """At a submit (under the experiment's submit lock): record the experiment's whole declaration when none is yet,
    or as a new version with `amend`; refuse, in one line naming what changed, a declaration that differs from the
    recorded one without `amend`. None (nothing recorded) for an experiment that declares no comparisons."""
    folder = Path(folder)
    versions = recorded_versions(folder)
    if not experiment.hypotheses and not versions:
        return None
    now = Declaration.of(experiment)
    if versions and versions[-1].declaration.same_as(now):
        return versions[-1]
    if versions and not amend:
        raise changed_error(experiment.name, now, versions[-1], folder)
    entry = {"kind": FIXED, "recorded": dt.datetime.now().isoformat(timespec="seconds"), "version": len(versions) + 1,
             "runs_before": finished_runs(folder), "declaration": now.to_record()}
    record_ledger(folder, {}, entry)
    return recorded_versions(folder)[-1]


def changed_error(name: str, now: Declaration, recorded: Version, folder: Path) -> AblateError:
    return AblateError(
        f"experiment {name!r} now declares another design than {folder / LEDGER} records (version "
        f"{recorded.number}, {recorded.recorded}): {'; '.join(now.changes_from(recorded.declaration))}; a fixed "
        f"design is frozen once submitted: put the experiment file back, or record the change as an amendment with "
        f"`ablate submit {name} --amend` (dated, and named in the report)")


@dataclass(frozen=True)
class DesignState:
    """What the tables read of a folder's fixed design: the declaration decided under (None: the experiment's own,
    none being recorded), and the notes every table and the report carry (after runs, amendments)."""

    declaration: Declaration | None
    notes: tuple[str, ...]


def design_state(experiment, folder: str | os.PathLike, reads=None) -> DesignState:
    """The recorded design of the experiment folder, checked against `experiment` (None: the folder read alone,
    its record decides). Refused in one line naming what changed when the file declares otherwise. `reads`: see
    `finished_runs`."""
    folder = Path(folder)
    versions = recorded_versions(folder)
    if not versions:
        done = finished_runs(folder, reads)
        note = (f"{AFTER_RUNS}: no design is recorded in {folder / LEDGER} for the {done} finished run(s) here (run "
                "by `ablate run`, or an older ablate); the declarations are read from the experiment file as it is "
                "now") if done else ""
        return DesignState(None, (note,) if note else ())
    latest = versions[-1]
    if experiment is not None and not Declaration.of(experiment).same_as(latest.declaration):
        raise changed_error(experiment.name, Declaration.of(experiment), latest, folder)
    notes = []
    if versions[0].runs_before:
        notes.append(f"{AFTER_RUNS}: the design was first recorded on {versions[0].recorded}, when "
                     f"{versions[0].runs_before} finished run(s) already existed here")
    for before, version in zip(versions, versions[1:]):
        notes.append(f"design amended: version {version.number} recorded on {version.recorded} "
                     f"(`submit --amend`): {'; '.join(version.declaration.changes_from(before.declaration))}")
    return DesignState(latest.declaration, tuple(notes))
