"""The commands a message suggests (resume a grid, follow it), built from one selection of runs.

Why one place: a hint that drops an option does something else than what was asked (without `--arms`
it queues every arm; without `--executor local` it sends local runs to SLURM). Every option that chose
the runs or where they run is here, and each hint is written from it.
"""

from __future__ import annotations

import dataclasses
import shlex


@dataclasses.dataclass
class Selection:
    """The runs a command chose and where they run: what a hint must repeat."""

    experiment: str
    tiers: list[str] | None = None
    arms: list[str] | None = None
    seeds: list[int] | None = None
    executor: str | None = None  # None: status cannot say (nothing of the selection was submitted)
    profile: str | None = None  # the SLURM profile (only with executor slurm)
    results: str | None = None  # as the user gave it (None: the default)
    data: str | None = None  # `--data` as the user gave it
    sequential: bool = False
    document_mask: bool = False  # `--document-mask`: a run option its runs resume with

    @classmethod
    def of(cls, args) -> "Selection":
        """The selection a parsed command line made (`submit`, `status`, …: options it lacks are None)."""
        executor = getattr(args, "executor", None)
        return cls(str(args.experiment), getattr(args, "tiers", None), getattr(args, "arms", None),
                   getattr(args, "seeds", None), executor,
                   getattr(args, "profile", None) if executor == "slurm" else None,
                   None if args.results is None else str(args.results), getattr(args, "data", None),
                   bool(getattr(args, "sequential", False)), bool(getattr(args, "document_mask", False)))

    def _options(self, where: bool) -> list[str]:
        words = []
        for flag, values in (("--tier", self.tiers), ("--arms", self.arms), ("--seeds", self.seeds)):
            if values:
                words += [flag, *map(str, values)]
        if self.sequential and where:
            words.append("--sequential")
        if where and self.executor:
            words += ["--executor", self.executor] + (["--profile", self.profile] if self.profile else [])
        if where and self.data:
            words += ["--data", self.data]
        if where and self.document_mask:
            words.append("--document-mask")
        if self.results:
            words += ["--results", self.results]
        return words

    def submit_command(self) -> str:
        """`ablate submit …` that queues (or resumes) exactly this selection, where it ran."""
        return shlex.join(["ablate", "submit", self.experiment, *self._options(where=True)])

    def status_command(self) -> str:
        """`ablate status …` that shows this selection."""
        return shlex.join(["ablate", "status", self.experiment, *self._options(where=False)])
