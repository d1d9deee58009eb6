"""A CSV/parquet table of final losses as a `Runs` value, checked cell by cell.

A table file is data from outside the harness: every name in it is checked as the CLI checks a name
(`ablate.store.check_name`), so that no arm or tier can carry markup into a rendered table (`a|b`, a
newline, `\\input{…}`), and every damaged cell (an empty name, a seed that is negative or beyond int64,
a loss that is not a number) is one line naming the file, the row and the column.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from ablate.errors import AblateError
from ablate.store import check_name

REQUIRED_COLUMNS = ("tier", "arm", "seed", "val_loss")
INT64_MAX = 2**63 - 1
FIX = "correct that cell or delete the row"


def read_table(path: Path) -> pl.DataFrame:
    """tier, arm (String), seed (Int64), val_loss (Float64) and the optional string columns `optional`."""
    try:
        table = (pl.read_parquet(path) if path.suffix.lower() == ".parquet"
                 else pl.read_csv(path, infer_schema_length=None))
    except Exception as err:  # polars raises several types for unreadable files; name the file either way
        raise AblateError(f"cannot read {str(path)!r} as {path.suffix[1:]}: {err}") from err
    absent = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if absent:
        raise AblateError(
            f"{str(path)!r} lacks column(s) {', '.join(absent)}; needs {', '.join(REQUIRED_COLUMNS)}; "
            f"found: {', '.join(table.columns) or '(none)'}"
        )
    for column in ("tier", "arm"):
        _check_names(path, table, column)
    _check_seeds(path, table["seed"])
    _check_losses(path, table["val_loss"])
    return table


def _where(path: Path, index: int, column: str) -> str:
    return f"{str(path)!r} row {index + 1} (not counting the header), column {column}"


def _check_names(path: Path, table: pl.DataFrame, column: str) -> None:
    """Every cell a name the CLI would accept: not empty, letters, digits and . _ + - only."""
    if table[column].dtype.is_float():
        raise AblateError(f"{str(path)!r}: column {column} holds numbers with a fraction (e.g. "
                          f"{table[column].drop_nulls().head(1).to_list()}); {column} names are text")
    values = table[column].cast(pl.String).to_list()
    for index, value in enumerate(values):
        if value is None or not value.strip():
            raise AblateError(f"{_where(path, index, column)}: empty cell; every row needs a tier, an arm and a "
                              f"seed: {FIX}")
    for value in dict.fromkeys(values):
        try:
            check_name(column, value)
        except AblateError as err:
            raise AblateError(f"{_where(path, values.index(value), column)}: {err}; {FIX}") from None


def _check_seeds(path: Path, seed: pl.Series) -> None:
    """seed must hold integers from 0 to 2**63 − 1: 1.7, -1 and 2**64 are no seeds."""
    if not (seed.dtype.is_integer() or seed.dtype.is_float()):
        raise AblateError(f"{str(path)!r}: column seed holds {seed.dtype} values (e.g. "
                          f"{seed.drop_nulls().head(1).to_list()}); seeds are integers >= 0")
    for index, value in enumerate(seed.to_list()):
        if value is None:
            problem = "empty cell; every row needs a tier, an arm and a seed"
        elif isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
            problem = f"seed {value!r} is not an integer; seeds are integers >= 0"
        elif value < 0 or value > INT64_MAX:
            problem = f"seed {value!r} is out of range; seeds are integers from 0 to {INT64_MAX}"
        else:
            continue
        raise AblateError(f"{_where(path, index, 'seed')}: {problem}: {FIX}")


def _check_losses(path: Path, loss: pl.Series) -> None:
    """val_loss must hold numbers (or be empty: a run without a loss is listed as excluded): true or "low" is no
    loss."""
    if not (loss.dtype.is_float() or loss.dtype.is_integer()) and not loss.is_null().all():
        raise AblateError(f"{str(path)!r}: column val_loss holds {loss.dtype} values (e.g. "
                          f"{loss.drop_nulls().head(1).to_list()}); val_loss must be a number")
