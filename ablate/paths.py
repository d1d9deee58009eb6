"""Where things are: the checkout, the default results and data folders, and the one "./X, then the
checkout's X" lookup that experiments, cluster profiles and GPU measurements share.

Defaults are the checkout's, whatever the current folder (as experiment names are): `results/` unless
$ABLATE_RESULTS or `--results` says otherwise, and a tier's `data_dir` (`data/...`). A path the user
types (`--results DIR`, `--data DIR`, `data_dir` in an experiment's overrides) is read from the current
folder, as a shell reads it. So `ablate status demo` reads the same folder from any directory."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def default_results() -> Path:
    """Where run folders go unless `--results` says otherwise: $ABLATE_RESULTS, else the checkout's results/."""
    return Path(os.environ.get("ABLATE_RESULTS") or REPO_ROOT / "results")


def default_data_dir(data_dir: str | os.PathLike) -> Path:
    """A tier's default data folder (relative: in the checkout, like the results and the experiments)."""
    return Path(data_dir) if Path(data_dir).is_absolute() else REPO_ROOT / data_dir


def results_folder(results: str | os.PathLike | None) -> Path:
    """`--results` as given, else the default."""
    return Path(results) if results else default_results()


def search_folders(folder: str) -> list[Path]:
    """`./<folder>` first, then the checkout's `<folder>` (one entry when they are the same place)."""
    here, checkout = Path(folder), REPO_ROOT / folder
    return [here] if here.resolve() == checkout.resolve() else [here, checkout]


def find_file(folder: str, name: str) -> Path | None:
    """The first of `./<folder>/<name>` and the checkout's `<folder>/<name>` that is a file."""
    return next((p / name for p in search_folders(folder) if (p / name).is_file()), None)


def names_in(folder: str, suffix: str) -> list[str]:
    """The stems of the `*<suffix>` files in `./<folder>` and the checkout's `<folder>` (not `_private`)."""
    return sorted({p.stem for f in search_folders(folder) for p in f.glob(f"*{suffix}") if not p.stem.startswith("_")})
