"""Experiments: a named grid of tiers × arms × seeds, defined in `experiments/*.py`, expanded to run specs.

An experiment file defines a module-level `EXPERIMENT = Experiment(...)`. Commands accept either the
file (`experiments/demo.py`) or its name (`demo`), looked up in `./experiments/` and then in the
`experiments/` folder of the ablate checkout.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ablate.errors import AblateError
from ablate.family import FAMILIES, Comparison, Family  # Comparison: experiment files import it from here
from ablate.paths import find_file, names_in, results_folder
from ablate.store import check_name, check_name_length, run_dir, run_key
from ablate.sweep import LRSweep  # declared in experiment files: `from ablate.experiment import LRSweep`
from ablate.tiers import get_tier


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: everything `ablate.train.run` needs besides the results folder."""

    experiment: str
    tier: str
    arm: str
    seed: int
    overrides: Mapping = field(default_factory=dict)
    lr_factor: float | None = None  # a run at a multiple of the tier's lr (an LR sweep's, or a confirmatory one)
    seq_len: int | None = None  # a run at a sequence length other than the tier's (`ablate run --seq-len`): its key

    @property
    def key(self) -> str:
        return run_key(self.tier, self.arm, self.seed, self.lr_factor, self.seq_len)

    def folder(self, results: str | os.PathLike) -> Path:
        """The run's folder in the store (`ablate.store.run_dir`)."""
        return run_dir(results, self.experiment, self.tier, self.arm, self.seed, self.lr_factor, self.seq_len)


@dataclass(frozen=True)
class Experiment:
    """`arms="all"` means every registered arm at the time the grid is expanded, but the registered examples
    outside the study (`Arm.example`: qk-norm, temperature, alibi; `ablate.arms.study_arms`).

    arms: a list for every tier, or a {tier: arms} mapping (each tier its own arms).
    seeds: one count for every tier, or a {tier: count} mapping; seeds are 0..count-1.
    overrides: run-config overrides for every run, or {tier: {...}} when keyed by tier names.
    hypotheses: the comparisons the experiment exists for (`Comparison`s, declared at every tier); the
    tables adjust p (Holm) over the family of them only (`family`: "tier", each tier's own, or
    "experiment", all tiers' together) and mark every other row exploratory. None declared: every row
    of a tier is adjusted together, as before.
    """

    name: str
    tiers: Sequence[str]
    arms: Sequence[str] | str | Mapping[str, Sequence[str]]
    seeds: int | Mapping[str, int]
    overrides: Mapping = field(default_factory=dict)
    description: str = ""

    match_params: bool = False  # narrow the MLP of arms that add parameters to the baseline's count
    hypotheses: Sequence[Comparison] = ()
    family: str = "tier"
    lr_sweep: LRSweep | None = None  # every arm at its own learning rate (`submit --sweep`, `table --kind lr`)

    def __post_init__(self):
        check_name("experiment", self.name)
        if isinstance(self.tiers, str) or (isinstance(self.arms, str) and self.arms != "all"):
            raise AblateError(f"experiment {self.name!r}: tiers and arms are lists of names (arms may be 'all')")
        if isinstance(self.arms, Mapping):
            self._check_tier_arms()
        counts = self.seeds.values() if isinstance(self.seeds, Mapping) else [self.seeds]
        for count in counts:
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                raise AblateError(f"experiment {self.name!r}: seed counts must be positive integers, not {count!r}")
        self._check_hypotheses()
        self._check_sweep()

    def _check_sweep(self) -> None:
        """The sweep's tiers are the experiment's, and its seeds are none of the grid's."""
        sweep = self.lr_sweep
        if sweep is None:
            return
        if not isinstance(sweep, LRSweep):
            raise AblateError(f"experiment {self.name!r}: lr_sweep is an LRSweep(factors=..., tiers=...), "
                              f"not {sweep!r}")
        for tier in sweep.tiers:
            if tier not in self.tiers:
                raise AblateError(f"experiment {self.name!r}: the LR sweep names tier {tier!r}, which the experiment "
                                  f"does not run; its tiers: {', '.join(self.tiers)}")
            if sweep.first_seed < self.seed_count(tier):
                raise AblateError(f"experiment {self.name!r}: the LR sweep's first seed {sweep.first_seed} is one of "
                                  f"the grid's seeds at tier {tier!r} (0..{self.seed_count(tier) - 1}); the sweep's "
                                  "seeds must be others, so that the confirmatory runs use seeds the sweep did not")

    def _check_tier_arms(self) -> None:
        """A {tier: arms} mapping gives each of the experiment's tiers, and no other, a list of arms."""
        for tier in set(self.arms) ^ set(self.tiers):
            raise AblateError(f"experiment {self.name!r}: arms per tier names tier {tier!r}; it must name each "
                              f"of its tiers once: {', '.join(self.tiers)}")
        for tier, arms in self.arms.items():
            if isinstance(arms, str) or not arms or not all(isinstance(a, str) for a in arms):
                raise AblateError(f"experiment {self.name!r}: tier {tier!r}'s arms are a list of names, not {arms!r}")

    def _check_hypotheses(self) -> None:
        """Comparisons of two of the experiment's arms, each name once; the family a known one."""
        if self.family not in FAMILIES:
            raise AblateError(f"experiment {self.name!r}: unknown family {self.family!r}; valid families: "
                              f"{', '.join(FAMILIES)}")
        if isinstance(self.hypotheses, (str, Comparison)) or not all(isinstance(c, Comparison) for c in
                                                                     self.hypotheses):
            raise AblateError(f"experiment {self.name!r}: hypotheses is a list of Comparison(name, minuend, "
                              f"subtrahend), not {self.hypotheses!r}")
        object.__setattr__(self, "hypotheses", tuple(self.hypotheses))
        names = [c.name for c in self.hypotheses]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise AblateError(f"experiment {self.name!r} declares comparison {twice[0]!r} twice; give each "
                              "a distinct name")
        for comparison, tier in [(c, t) for c in self.hypotheses for t in c.tiers if t not in self.tiers]:
            raise AblateError(f"experiment {self.name!r}: comparison {comparison.name!r} names tier {tier!r}, "
                              f"which the experiment does not run; its tiers: {', '.join(self.tiers)}")
        if self.arms == "all":  # the registry loads torch; `comparisons()` checks these arms once it is asked
            return
        self._check_arms()

    def _check_arms(self) -> None:
        for c, tier, arm in [(c, t, a) for c in self.hypotheses for t in self.tiers if c.at(t)
                             for a in (c.minuend, c.subtrahend) if a not in self.arm_names(t)]:
            raise AblateError(f"experiment {self.name!r}: comparison {c.name!r} names arm {arm!r}, which the "
                              f"experiment does not run at tier {tier!r}; its arms: "
                              f"{', '.join(self.arm_names(tier))}")

    def comparisons(self) -> dict[str, list[Comparison]]:
        """The declared comparisons of every tier ({} when none are declared)."""
        if not self.hypotheses:
            return {}
        if self.arms == "all":
            self._check_arms()
        return {tier: [c for c in self.hypotheses if c.at(tier)] for tier in self.tiers}

    def declared_family(self, sequential: bool = False) -> Family:
        """The declared family (`ablate.family.Family`): every (tier, comparison) the experiment declares and, with
        family="experiment" in a fixed design, the scale slopes its analysis adjusts with them. The one rule for
        m that the planner, the sequential design, the tables and the report read."""
        arms = None if self.arms == "all" else self.arm_names()  # "all": every study arm, every increment formable
        return Family.of(self.hypotheses, self.tiers, self.family, arms=arms, sequential=sequential)

    def family_size(self) -> int:
        """m a sequential design's boundaries are set for (0: none): the declared comparisons of the largest group
        (a tier's, or every evidence tier's together), slopes not counted (α is spent on the comparisons only)."""
        return self.declared_family(sequential=True).largest

    def planned_family_size(self) -> int:
        """m a fixed design's power plan splits α over: the largest group of `declared_family`, with
        family="experiment" its scale slopes too; the tables' Holm uses the same m (comparisons that did not
        run, or have one seed, count in it)."""
        return self.declared_family().largest

    def seed_count(self, tier: str) -> int:
        if isinstance(self.seeds, int):
            return self.seeds
        if tier not in self.seeds:
            raise AblateError(f"experiment {self.name!r} gives no seed count for tier {tier!r}")
        return int(self.seeds[tier])

    def arm_names(self, tier: str | None = None) -> list[str]:
        """The experiment's arms (at `tier`; None: at any tier), each once (a name listed twice is one arm)."""
        if isinstance(self.arms, Mapping):
            lists = [self.arms[tier]] if tier is not None else list(self.arms.values())
            return list(dict.fromkeys(arm for arms in lists for arm in arms))
        from ablate.arms import study_arms  # the arm registry loads torch; status and tables do without it

        return study_arms() if self.arms == "all" else list(dict.fromkeys(self.arms))

    def tier_overrides(self, tier: str) -> dict:
        if self.overrides and all(key in self.tiers for key in self.overrides):
            overrides = dict(self.overrides.get(tier, {}))
        else:
            overrides = dict(self.overrides)
        if self.match_params:
            overrides.setdefault("match_params", True)
        return overrides

    def runs(
        self,
        tiers: Sequence[str] | None = None,
        arms: Sequence[str] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[RunSpec]:
        """The grid, filtered; unknown tiers, arms or seeds are refused with the valid ones named."""
        from ablate.arms import get_arm  # the arm registry loads torch; status and tables read experiments without it
        all_arms = self.arm_names()
        for arm in all_arms:
            get_arm(arm)  # an experiment naming an unregistered arm fails before anything runs
        for tier in self.tiers:
            get_tier(tier)  # an unknown tier fails before anything runs
        chosen_tiers = list(dict.fromkeys(tiers or self.tiers))  # a name given twice is one tier
        for tier in [t for t in chosen_tiers if t not in self.tiers]:
            raise AblateError(f"tier {tier!r} is not in experiment {self.name!r}; its tiers: {', '.join(self.tiers)}")
        chosen_arms = list(dict.fromkeys(arms)) if arms else all_arms
        for arm in [a for a in chosen_arms if a not in all_arms]:
            raise AblateError(f"arm {arm!r} is not in experiment {self.name!r}; its arms: {', '.join(all_arms)}")
        specs = []
        for tier in chosen_tiers:
            valid_seeds = list(range(self.seed_count(tier)))
            for seed in [s for s in seeds or [] if type(s) is not int or s not in valid_seeds]:  # bool: no seed
                raise AblateError(f"seed {seed} is not in tier {tier!r} of {self.name!r}; seeds: {valid_seeds}")
            tier_seeds = [s for s in valid_seeds if seeds is None or s in seeds]
            for arm in [a for a in chosen_arms if a in self.arm_names(tier)]:
                for seed in tier_seeds:
                    specs.append(RunSpec(self.name, tier, arm, seed, self.tier_overrides(tier)))
        return specs

    def base_lr(self, tier: str) -> float:
        """The lr the grid trains `tier` at (its overrides' `lr`, else the tier's): what sweep factors multiply."""
        return float(self.tier_overrides(tier).get("lr", get_tier(tier).lr))

    def sweep_runs(self, tiers: Sequence[str] | None = None, arms: Sequence[str] | None = None) -> list[RunSpec]:
        """The LR sweep's runs: tiers × arms × factors × sweep seeds, each with its lr and selection split."""
        sweep = self.declared_sweep()
        chosen = list(dict.fromkeys(tiers or sweep.tiers))
        for tier in chosen:
            if tier not in sweep.tiers:
                raise AblateError(f"tier {tier!r} is not in the LR sweep of {self.name!r}; its tiers: "
                                  f"{', '.join(sweep.tiers)}")
        self.runs(chosen, arms, seeds=[])  # checks the tiers and arms like `submit`
        arm_names = list(dict.fromkeys(arms)) if arms else self.arm_names()
        specs = []
        for tier in chosen:
            selection = sweep.selection_tokens or self.tier_overrides(tier).get("val_tokens", get_tier(tier).val_tokens)
            for arm in arm_names:
                for factor in sweep.factors:
                    overrides = {**self.tier_overrides(tier), "lr": self.base_lr(tier) * factor,
                                 "selection_tokens": selection}
                    specs += [RunSpec(self.name, tier, arm, seed, overrides, factor) for seed in sweep.seed_list]
        return specs

    def confirmatory_runs(self, best_factors: Mapping[str, Mapping[str, float]]) -> list[RunSpec]:
        """The grid's seeds at each arm's best LR factor ({tier: {arm: factor}}); at factor 1 the grid's own
        run is the confirmatory one (the same config), so it is not run twice."""
        specs = []
        for tier, arms in best_factors.items():
            for spec in self.runs([tier], list(arms)):
                factor = float(arms[spec.arm])
                if factor == 1.0:
                    specs.append(spec)
                else:
                    overrides = {**spec.overrides, "lr": self.base_lr(tier) * factor}
                    specs.append(RunSpec(self.name, tier, spec.arm, spec.seed, overrides, factor))
        return specs

    def declared_sweep(self) -> LRSweep:
        """The LR sweep the experiment declares, or a one-line error saying how to declare one."""
        if self.lr_sweep is None:
            raise AblateError(f"experiment {self.name!r} declares no LR sweep; add lr_sweep=LRSweep(factors=(0.25, "
                              "0.5, 1, 2, 4, 8), seeds=1, tiers=(...)) to its file (see experiments/sink_vs_filter.py)")
        return self.lr_sweep


def defines_experiment(path: Path) -> bool:
    """Whether a file assigns a module-level `EXPERIMENT`, read from its syntax tree without running it, so a
    module of arms that lies beside the experiments is not taken for one (and nothing is executed to tell)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return False
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "EXPERIMENT" for t in targets):
            return True
    return False


def available_experiments() -> list[str]:
    """The names of the experiments/*.py files that define an `EXPERIMENT` (`defines_experiment`)."""
    return [name for name in names_in("experiments", ".py")
            if defines_experiment(find_file("experiments", f"{name}.py"))]


def experiment_file(spec: str | os.PathLike) -> Path:
    """`demo` or `experiments/demo.py` → the absolute path of the experiment file. A name finds only a file that
    defines `EXPERIMENT` (`defines_experiment`); a file given by its path is loaded as asked (`load_experiment`)."""
    text = str(spec)
    for part in Path(text).parts if text.endswith(".py") else (text,):
        check_name_length("experiment", part)  # before a lookup ends in "File name too long"
    path = (Path(text) if Path(text).is_file()
            else None) if text.endswith(".py") else find_file("experiments", f"{text}.py")
    named = path is not None and not text.endswith(".py")
    if path is None or (named and not defines_experiment(path)):
        why = f" ({path} defines no `EXPERIMENT = Experiment(...)`)" if path is not None else ""
        raise AblateError(f"unknown experiment {text!r}{why}; valid experiments: "
                          f"{', '.join(available_experiments()) or '(none found)'} (or an experiments/*.py file)")
    return path.resolve()


def load_module(path: Path):
    """Execute a Python file as a module (an experiment file, or a file that registers arms) and return it. The
    file's folder is on the import path while it loads, so it may import modules that lie beside it
    (`from scalar_gate import ScalarGate` with `scalar_gate.py` in the same folder). An import that fails is one
    line naming the file and the missing module.
    """
    module_spec = importlib.util.spec_from_file_location(f"ablate_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    # In sys.modules, as importlib's recipe does it: torch.compile (flex_attention's score_mod of an arm the file
    # defines) and pickling look a function's module up by name.
    sys.modules[module_spec.name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except AblateError:  # the library's own one line (an Experiment's bad field, a clashing arm name)
        raise
    except ImportError as err:
        missing = err.name or str(err)
        raise AblateError(
            f"{file_line(path, err)}: cannot import {missing!r} ({err}); a module of your own goes beside the "
            f"experiment file (in {folder}), an installed one into this Python ({sys.executable})") from err
    except SyntaxError as err:
        raise AblateError(f"{err.filename or path}:{err.lineno}: {type(err).__name__}: {err.msg}") from err
    except Exception as err:  # the file's own code failed as it ran: where, and what (the traceback: --traceback)
        raise AblateError(f"{file_line(path, err)}: {type(err).__name__}: {err}") from err
    finally:
        try:
            sys.path.remove(folder)  # the first occurrence: the one put there above
        except ValueError:  # the file took it off itself
            pass
    return module


def file_line(path: Path, err: BaseException) -> str:
    """`FILE:LINE` of the innermost frame of `err` in the user's folder (the file itself, or a module beside it)."""
    import traceback  # reason: only a failing file needs it

    folder = path.parent.resolve()
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).resolve().parent == folder]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(path)


def load_experiment(spec: str | os.PathLike) -> Experiment:
    """`demo` or `experiments/demo.py` → the Experiment that file defines (arms it registers included), loaded by
    `load_module`. Every command, the SLURM task and the local worker load it through here."""
    path = experiment_file(spec)
    experiment = getattr(load_module(path), "EXPERIMENT", None)
    if not isinstance(experiment, Experiment):
        raise AblateError(f"{path} defines no `EXPERIMENT = Experiment(...)`")
    return experiment


def start_task(experiment_file: str | None) -> None:
    """The start of every SLURM array task, a run's or an evaluation's: ablate's log lines go to the job's log,
    and the experiment file (or the arm file `ablate testbed --arm-file` gave) is imported again, so the arms it
    registers exist before a model is built."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if experiment_file:
        load_module(Path(experiment_file))


def named_experiment(source: str | os.PathLike) -> Experiment | None:
    """The Experiment a table source names (an experiments/*.py file or its name), None for a folder or table."""
    text = str(source)
    if text.endswith(".py"):
        return load_experiment(text)
    if (Path(text).suffix.lower() in (".csv", ".parquet") or os.sep in text
            or find_file("experiments", f"{text}.py") is None):
        return None
    return load_experiment(text)


def results_of(source: str | os.PathLike, results: str | os.PathLike | None = None,
               experiment: Experiment | None = None) -> Path:
    """What a table or report reads: a .csv/.parquet file or an experiment folder itself, else
    `results/<experiment name>` for an experiment's name or experiments/*.py file (`experiment`: the one
    SOURCE names, already loaded by `named_experiment`, so that its file is executed once per command)."""
    results_dir = results_folder(results)
    text = str(source)
    path = Path(text)
    if path.suffix.lower() in (".csv", ".parquet"):
        return path
    if not text.endswith(".py"):
        if (results_dir / text).is_dir():
            return results_dir / text
        if path.is_dir():
            return path
        if len(path.parts) > 1:  # a path, not an experiment's name: say what is missing
            raise AblateError(f"{text}: no such folder; give an experiment folder, a .csv/.parquet table, "
                              "or an experiment's name")
    name = (experiment or load_experiment(text)).name  # refuses an unknown name, naming the valid experiments
    folder = results_dir / name
    if not folder.is_dir():
        raise no_runs_error(name, results_dir)
    return folder


def no_runs_error(name: str, results_dir: Path) -> AblateError:
    """The one line of `table` and `status` for a results folder that holds nothing of experiment `name`."""
    results_dir = results_dir.resolve()
    with_runs = sorted(p.name for p in results_dir.glob("*") if p.is_dir()) if results_dir.is_dir() else []
    return AblateError(f"experiment {name!r} has no runs under {str(results_dir)!r} (looked for "
                       f"{str(results_dir / name)!r}); experiments with results there: "
                       f"{', '.join(with_runs) or '(none)'}; another folder? give --results DIR or set $ABLATE_RESULTS")
