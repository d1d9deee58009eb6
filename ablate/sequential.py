"""The sequential design of a study, as `submit --sequential` records it in the experiment's ledger.

A group-sequential design holds its α only if it is fixed before its first look's data are seen and
never bent afterwards. So the design is one typed, frozen value (`SequentialDesign`), written once to
the ledger and read back through `recorded_design`, which refuses a record that is damaged or whose
boundaries are not the ones (α, m, looks, max seeds) give: the boundaries are deterministic
(`ablate.power.sequential_design`, a fixed calibration seed), so they are recomputed, never trusted as
written. `check_declares` refuses an experiment file whose declared comparisons, family or family size
m no longer match the recorded design (a comparison added after the first look would otherwise be judged
at the m = 1 boundary). Torch-free: the analysis and status read it.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError
from ablate.family import FAMILIES
from ablate.power import sequential_design
from ablate.store import LEDGER, iter_run_dirs, read_ledger, run_of
from ablate.store_summary import read_summary

SEQUENTIAL = "sequential-design"  # the kind of the ledger submission that records `submit --sequential`'s design
FIELDS = ("design", "comparisons", "family", "looks", "max_seeds", "alpha")
BOUNDARY_TOLERANCE = 1e-9  # relative: the same calibration on another platform may differ in the last digits


@functools.lru_cache(maxsize=32)
def _boundaries(alpha: float, family_size: int, looks: int, max_seeds: int) -> dict:
    return sequential_design(alpha, family_size, looks, max_seeds)


@dataclass(frozen=True)
class SequentialDesign:
    """What `submit --sequential` fixed at its first submit: the declared comparisons as (name, minuend,
    subtrahend), their family, α, the number of looks and the seeds at the last one; `boundaries` is the
    `ablate.power.sequential_design` object they give (looks' seed counts and |t| boundaries)."""

    comparisons: tuple[tuple[str, str, str], ...]
    family: str
    alpha: float
    looks: int
    max_seeds: int
    boundaries: dict

    @classmethod
    def new(cls, comparisons, family: str, family_size: int, alpha: float, looks: int, max_seeds: int):
        """A design for comparisons (`Comparison`s or triples) adjusted in a family of `family_size`."""
        triples = tuple(tuple(c) if isinstance(c, (tuple, list)) else (c.name, c.minuend, c.subtrahend)
                        for c in comparisons)
        return cls(triples, family, alpha, looks, max_seeds, _boundaries(alpha, family_size, looks, max_seeds))

    @property
    def family_size(self) -> int:
        return int(self.boundaries["family_size"])

    @property
    def first_look(self) -> int:
        return int(self.boundaries["looks"][0]["seeds"])

    def to_record(self) -> dict:
        """The ledger submission that records it (the format `from_record` reads)."""
        return {"kind": SEQUENTIAL, "design": self.boundaries, "looks": self.looks, "max_seeds": self.max_seeds,
                "alpha": self.alpha, "family": self.family, "comparisons": [list(c) for c in self.comparisons]}

    @classmethod
    def from_record(cls, record: object, where: str) -> SequentialDesign:
        """The design of a ledger record, refused in one line naming `where` when it is damaged or its
        boundaries are not those its (α, m, looks, max seeds) give."""
        if not isinstance(record, dict):
            raise _damaged(where, f"it is a {type(record).__name__}, not an object")
        absent = [k for k in FIELDS if k not in record]
        if absent:
            raise _damaged(where, f"it has no {', '.join(absent)}")
        design, comparisons = record["design"], record["comparisons"]
        if not isinstance(design, dict) or not _is_count(design.get("family_size")) or \
                not isinstance(design.get("looks"), list):
            raise _damaged(where, "its design is not an object with family_size and looks")
        if not isinstance(comparisons, list) or not comparisons or not all(
                isinstance(c, list) and len(c) == 3 and all(isinstance(p, str) for p in c) for c in comparisons):
            raise _damaged(where, f"its comparisons are {comparisons!r}, not [[name, minuend, subtrahend], …]")
        if record["family"] not in FAMILIES:
            raise _damaged(where, f"its family is {record['family']!r}, not one of {', '.join(FAMILIES)}")
        alpha, looks, max_seeds = record["alpha"], record["looks"], record["max_seeds"]
        if not (_is_count(looks) and _is_count(max_seeds) and isinstance(alpha, (int, float))
                and not isinstance(alpha, bool) and 0 < alpha < 1):
            raise _damaged(where, f"looks {looks!r}, max_seeds {max_seeds!r} and alpha {alpha!r} are not a design's")
        try:
            expected = _boundaries(float(alpha), int(design["family_size"]), looks, max_seeds)
        except AblateError as err:
            raise _damaged(where, str(err)) from None
        _check_boundaries(design, expected, where)
        return cls(tuple(tuple(c) for c in comparisons), str(record["family"]), float(alpha), looks, max_seeds,
                   expected)

    def check_declares(self, comparisons, family: str, family_size: int, experiment: str, where: str) -> None:
        """Refuse an experiment that now declares another design than the one recorded (naming both)."""
        declared = tuple(tuple(c) if isinstance(c, (tuple, list)) else (c.name, c.minuend, c.subtrahend)
                         for c in comparisons)
        now = _describe(declared, family, family_size)
        recorded = _describe(self.comparisons, self.family, self.family_size)
        if now != recorded:
            raise AblateError(
                f"experiment {experiment!r} now declares {now}, but {where} records the sequential design {recorded}: "
                "a design cannot change once its seeds are queued (its boundaries hold α only for the design "
                "chosen before the first look); put the experiment file back, or start a new design under "
                "another --results")


def _describe(comparisons, family: str, family_size: int) -> str:
    names = ", ".join(f"{name} ({a} − {b})" for name, a, b in comparisons) or "no comparisons"
    return f"[{names}; family {family}, m = {family_size}]"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _damaged(where: str, why: str) -> AblateError:
    return AblateError(f"{where} is damaged: {why}; move the ledger aside (the run folders keep their results) and "
                       "start the design again with `ablate submit EXPERIMENT --sequential --looks K --max-seeds N`")


def _check_boundaries(design: dict, expected: dict, where: str) -> None:
    """The recorded looks must be the recomputed ones: seed counts equal, boundaries equal to rounding."""
    recorded = design["looks"]
    if len(recorded) != len(expected["looks"]):
        raise _damaged(where, f"it records {len(recorded)} looks, and its design has {len(expected['looks'])}")
    for k, (look, truth) in enumerate(zip(recorded, expected["looks"]), start=1):
        seeds = look.get("seeds") if isinstance(look, dict) else None
        boundary = look.get("t_boundary") if isinstance(look, dict) else None
        if seeds != truth["seeds"] or not isinstance(boundary, (int, float)) or isinstance(boundary, bool) or \
                not math.isclose(boundary, truth["t_boundary"], rel_tol=BOUNDARY_TOLERANCE):
            raise _damaged(where, f"look {k} records {seeds!r} seeds at |t| boundary {boundary!r}, but the design "
                                  f"(alpha {expected['alpha']}, m = {expected['family_size']}) gives "
                                  f"{truth['seeds']} seeds at {truth['t_boundary']:.6g} (edited by hand?)")


def recorded_design(folder: str | os.PathLike) -> SequentialDesign | None:
    """The sequential design `submit --sequential` recorded in the experiment folder's ledger, else None;
    a damaged or altered record is one line naming the ledger and the entry."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    submissions = read_ledger(folder).submissions
    found = [(i, s) for i, s in enumerate(submissions) if isinstance(s, dict) and s.get("kind") == SEQUENTIAL]
    if not found:
        return None
    index, record = found[-1]
    return SequentialDesign.from_record(record, f"{folder / LEDGER} (submissions[{index}], the sequential design)")


def design_to_follow(experiment, folder: str | os.PathLike, looks: int | None, max_seeds: int | None,
                     alpha: float | None, tiers) -> tuple[SequentialDesign, bool]:
    """(the design `submit --sequential` follows, whether it is new): the recorded one, which the experiment
    must still declare and which options cannot change, or a new one from the options.

    `experiment` is an `ablate.experiment.Experiment` (read for its name, hypotheses, family and m). A new
    design refuses an experiment folder whose declared arms already hold finished runs in `tiers` (a pilot):
    a design chosen after its first look's data were seen does not hold its α.
    """
    folder = Path(folder)
    design = recorded_design(folder)
    if design is not None:
        given = {"looks": looks, "max_seeds": max_seeds, "alpha": alpha}
        changed = [f"--{k.replace('_', '-')} {v} (recorded: {getattr(design, k)})" for k, v in given.items()
                   if v is not None and v != getattr(design, k)]
        if changed:
            raise AblateError(f"{folder / LEDGER} records a sequential design; a design cannot change once seeds are "
                              f"queued: {', '.join(changed)}; submit again without them, or use another --results")
        design.check_declares(experiment.hypotheses, experiment.family, experiment.family_size(), experiment.name,
                              str(folder / LEDGER))
        return design, False
    if not experiment.hypotheses:
        raise AblateError(f"experiment {experiment.name!r} declares no comparisons, so nothing decides when to stop; "
                          "add hypotheses=[Comparison(name, minuend, subtrahend), …] to its file")
    if looks is None or max_seeds is None:
        raise AblateError("the first `submit --sequential` needs --looks K and --max-seeds N (e.g. --looks 3 "
                          "--max-seeds 12; `ablate plan EXPERIMENT --sequential` shows the design)")
    design = SequentialDesign.new(experiment.hypotheses, experiment.family, experiment.family_size(),
                                  0.05 if alpha is None else alpha, looks, max_seeds)
    _refuse_pilot(folder, design, tiers)
    return design, True


def _refuse_pilot(folder: Path, design: SequentialDesign, tiers) -> None:
    """Finished runs of the design's arms that exist before the design would be adopted as its first look."""
    arms = {arm for _, a, b in design.comparisons for arm in (a, b)}
    seen = []
    for run in iter_run_dirs(folder) if folder.is_dir() else ():
        name = run_of(run)
        if name.tier in tiers and name.arm in arms:
            if read_summary(run, "move that run folder out of the experiment folder").done:
                seen.append(run.relative_to(folder).as_posix())
    if seen:
        raise AblateError(
            f"{folder} already holds {len(seen)} finished run(s) of the declared arms ({', '.join(seen[:3])}"
            f"{', …' if len(seen) > 3 else ''}) from before any sequential design: a design chosen after its data "
            "were seen does not hold its α, so they cannot be its first look; use them as a pilot (`ablate plan "
            "EXPERIMENT --power --pilot FOLDER`) and run the design under another --results")
