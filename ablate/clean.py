"""`ablate clean`: free the disk an experiment's results take, removing only what can be rebuilt.

Why a command and not `rm`: what is safe to delete depends on each run's state. The resume state
(`checkpoints/state.pt`, the largest file of a run) is only dead weight once the run is finished
(`RunSummary.done`: diverged, or completed with its final loss) and its final weights
(`checkpoints/model.pt`) exist; a run that is still running may be writing any of its files. So:

removed
    * `checkpoints/state.pt` of a finished run (a completed run drops it itself; older runs and
      diverged runs keep it);
    * stray temporaries `.*.tmp` that an interrupted atomic write left in a run folder or its
      `checkpoints/`;
    * `RESULTS/<experiment>/report/` (rebuilt by `ablate report`), only when the whole experiment is
      cleaned (no --tier/--arms/--seeds), since the report covers every run;
    * folders kept aside by `ablate run --force` (`seed<k>.old-…`, a sweep run's `lr<f>/seed<k>.old-…`),
      only with `aside=True`: they hold older results that nothing can rebuild.
never removed
    summary.json, metrics.jsonl, config.json, run.log, eval.json, the final weights, TensorBoard and
    SLURM logs, the ledger: none of them can be rebuilt. The result lists the final weights it kept
    (`kept_weights`: they are most of what remains) and what the folder holds after the clean (`left`).

A run whose lock is live is skipped and reported; the real clean holds each run's lock while it
deletes (the same lock a training process takes), so a run cannot start under it.

Clean stays inside the experiment's folder: it never follows a symbolic link. A link anywhere on the way
to what it would remove (a tier, arm or run folder, `checkpoints/`, `state.pt`, a temporary, `report/`, a
folder kept aside) is listed as skipped, with where it leads, and nothing behind it is touched: the
target may be another run's files, or not results at all.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ablate.errors import AblateError
from ablate.lock import FileLock, LockHeld, describe_holder, live_holder
from ablate.store import (CHECKPOINTS, FINAL_WEIGHTS, REPORT_DIR, STATE, Status, iter_lr_run_dirs,
                          iter_run_dirs, run_lock_path, run_of)
from ablate.store_summary import read_summary

log = logging.getLogger(__name__)
ASIDE_DIR = re.compile(r"(seed(?:0|[1-9][0-9]*))\.old-.+")  # what `ablate run --force` moves a run to


@dataclass
class Item:
    """One file or folder that clean removes (or would), its size in bytes and why it may go."""

    path: Path
    size: int
    why: str


@dataclass
class CleanResult:
    removed: list[Item] = field(default_factory=list)  # in a dry run: what would be removed
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # (run folder or link, why it was left alone)
    kept_aside: list[Item] = field(default_factory=list)  # folders kept aside, left because aside=False
    kept_weights: list[Item] = field(default_factory=list)  # the final weights of the runs it looked at: kept
    left: int = 0  # bytes the experiment's folder holds after the clean (in a dry run: would hold)
    dry_run: bool = False
    root: Path | None = None  # the experiment's folder

    @property
    def total(self) -> int:
        return sum(item.size for item in self.removed)


def size_of(path: Path) -> int:
    """Bytes a file or folder takes (links are not followed)."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(os.lstat(os.path.join(top, name)).st_size
               for top, dirs, files in os.walk(path) for name in files + [d for d in dirs if os.path.islink(
                   os.path.join(top, d))])


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def first_link(path: Path, root: Path) -> Path | None:
    """The first symbolic link on the way from `root` (not included) down to `path` (included), or None."""
    current = root
    for name in path.relative_to(root).parts:
        current = current / name
        if current.is_symlink():
            return current
    return None


def link_reason(link: Path) -> str:
    """Why clean leaves a link alone: it names where the link leads."""
    try:
        target = os.readlink(link)
    except OSError as err:
        target = f"? ({err.strerror})"
    return (f"a symbolic link (to {target}); clean never follows links out of the results folder, so nothing "
            "behind it is touched (remove what you want there by hand)")


def _plain_file(path: Path) -> bool:
    """A regular file, not a link to one: weights behind a link may not be there tomorrow."""
    return path.is_file() and not path.is_symlink()


def run_items(folder: Path) -> tuple[list[Item], list[tuple[Path, str]]]:
    """What may go from one run folder, judged from its summary (the caller makes sure it is not running).

    Returns the items and the links found in their place (`checkpoints/`, `state.pt`, a temporary), which stay.
    """
    links: list[tuple[Path, str]] = []
    checkpoints = folder / CHECKPOINTS
    where = [folder]
    if checkpoints.is_symlink():
        links.append((checkpoints, link_reason(checkpoints)))
    else:
        where.append(checkpoints)
    items = []
    for path in (p for place in where for p in sorted(place.glob(".*.tmp"))):
        if path.is_symlink():
            links.append((path, link_reason(path)))
        elif path.is_file():
            items.append(Item(path, size_of(path), "stray temporary of an interrupted write"))
    state = checkpoints / STATE
    if len(where) == 2 and state.is_symlink():
        links.append((state, link_reason(state)))
    elif len(where) == 2 and state.is_file():
        summary = read_summary(folder, f"fix or move aside {folder} (clean left it alone)")
        if summary.status == Status.DIVERGED:
            items.append(Item(state, size_of(state), "resume state of a diverged run"))
        elif summary.done and _plain_file(checkpoints / FINAL_WEIGHTS):
            items.append(Item(state, size_of(state), "resume state of a completed run"))
    return items, links


def _selected(tier: str, arm: str, seed: int, tiers, arms, seeds) -> bool:
    return (not tiers or tier in tiers) and (not arms or arm in arms) and (seeds is None or seed in seeds)


def clean(experiment_dir: str | Path, *, tiers: Sequence[str] | None = None, arms: Sequence[str] | None = None,
          seeds: Sequence[int] | None = None, aside: bool = False, dry_run: bool = False) -> CleanResult:
    """Remove (or with dry_run, list) what can be rebuilt under RESULTS/<experiment>; see the module doc.

    The filters are taken as given (the CLI checks them against the experiment's grid first).
    """
    root = Path(experiment_dir)
    if root.is_symlink():
        raise AblateError(f"{root} is a symbolic link (to {os.readlink(root)}); clean never follows links out of "
                          "the results folder: give --results the folder that holds the experiment itself")
    if not root.is_dir():
        raise AblateError(f"no results for this experiment: {root} does not exist (check --results)")
    cleaner = _Cleaner(CleanResult(dry_run=dry_run, root=root), (tiers, arms, seeds))
    cleaner.runs()
    cleaner.kept_aside(aside)
    if not tiers and not arms and seeds is None:
        cleaner.report()
    cleaner.result.left = size_of(root) - (cleaner.result.total if dry_run else 0)
    return cleaner.result


class _Cleaner:
    """One `clean`: what it removed, kept and skipped so far (`result`), and the links it has already named."""

    def __init__(self, result: CleanResult, selection: tuple):
        self.result, self.root, self.dry_run = result, result.root, result.dry_run
        self.selection = selection  # (tiers, arms, seeds), None each for all
        self.links_seen: set[Path] = set()

    def behind_link(self, path: Path) -> bool:
        """True (and the link listed once as skipped) when a link lies between root and path."""
        link = first_link(path, self.root)
        if link is not None and link not in self.links_seen:
            self.links_seen.add(link)
            self.result.skipped.append((link, link_reason(link)))
        return link is not None

    def act(self, folder: Path, lock_path: Path, judge) -> None:
        """Judge and remove under the run's lock; a live holder means the run is running: leave it."""
        result = self.result
        if self.dry_run:
            holder = live_holder(lock_path)
            if holder is not None:
                result.skipped.append((folder, f"running ({describe_holder(holder)})"))
                return
            items, links = judge()
            result.removed.extend(items)
            result.skipped.extend(links)
            return
        try:
            with FileLock(lock_path, what=f"run {folder}"):
                items, links = judge()
                result.skipped.extend(links)
                for item in items:
                    if self.behind_link(item.path):  # swapped for a link since it was judged: leave it
                        continue
                    _remove(item.path)
                    log.debug("removed %s (%d bytes)", item.path, item.size)
                    result.removed.append(item)
        except LockHeld as held:
            result.skipped.append((folder, f"running ({describe_holder(held.holder)})"))

    def runs(self) -> None:
        """The selected run folders (the grid's, then those at an lr factor): what each can lose (`run_items`),
        its final weights kept and listed."""
        for folder in [*iter_run_dirs(self.root), *iter_lr_run_dirs(self.root)]:
            run = run_of(folder)
            if not _selected(run.tier, run.arm, run.seed, *self.selection) or self.behind_link(folder):
                continue
            try:
                self.act(folder, run_lock_path(folder), lambda folder=folder: run_items(folder))
            except AblateError as err:  # a damaged summary: say so, clean the other runs
                self.result.skipped.append((folder, str(err)))
            weights = folder / CHECKPOINTS / FINAL_WEIGHTS
            if _plain_file(weights) and first_link(weights, self.root) is None:
                why = "final weights (probe, inject and eval read them; nothing rebuilds them)"
                self.result.kept_weights.append(Item(weights, size_of(weights), why))

    def kept_aside(self, remove: bool) -> None:
        """The run folders `--force` kept aside: listed, or removed with `--aside`."""
        grid, at_lr = self.root.glob("*/*/seed*.old-*"), self.root.glob("*/*/lr*/seed*.old-*")
        for folder in sorted(p for p in [*grid, *at_lr] if p.is_dir()):
            match = ASIDE_DIR.fullmatch(folder.name)
            run = run_of(folder.with_name(match.group(1))) if match else None  # the run it was kept aside from
            if (run is None or run.arm.startswith(".") or run.tier.startswith(".")
                    or not _selected(run.tier, run.arm, run.seed, *self.selection)):
                continue
            if self.behind_link(folder):
                continue
            item = Item(folder, size_of(folder), "run kept aside by --force (older results)")
            if not remove:
                self.result.kept_aside.append(item)
                continue
            # the lock of the run it was moved from: `--force` moves folders while holding it
            self.act(folder, run_lock_path(folder.with_name(match.group(1))), lambda item=item: ([item], []))

    def report(self) -> None:
        """The report folder (rebuilt by `ablate report`), when the whole experiment is cleaned."""
        report = self.root / REPORT_DIR
        if (report.exists() or report.is_symlink()) and not self.behind_link(report):
            item = Item(report, size_of(report), "report (rebuilt by `ablate report`)")
            if not self.dry_run:
                _remove(report)
            self.result.removed.append(item)


def human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
