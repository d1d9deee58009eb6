"""Where documents come from: a registry of named sources, each a function yielding `(id, text)`.

A source is registered with `@register_source(name, help=...)` from any module; `ablate data prepare
--source NAME` finds it there. The source's keyword arguments (with their defaults filled in) are
recorded in the manifest, so a prepared folder says exactly what it was made from. Modules listed in
`SOURCE_MODULES` are imported on first lookup, so a source defined elsewhere (a synthetic task)
registers itself without this file changing.

Document ids decide the validation split (see `prepare.py`), so they must be stable: FineWeb-Edu's
own `id`, a chosen `--id-column`, or else a hash of the text.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError, choice_error

log = logging.getLogger(__name__)

FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_COLUMNS = (
    "text", "id", "dump", "url", "file_path", "language", "language_score", "token_count", "score", "int_score",
)
SAMPLE_FILE = Path(__file__).with_name("assets") / "sample.parquet"
SOURCE_MODULES = ("ablate.data.synthetic",)

Documents = Iterator[tuple[str, str]]


@dataclass(frozen=True)
class Source:
    name: str
    documents: Callable[..., Documents]
    help: str
    val_fraction: float  # the default share of documents held out for validation
    provenance: Callable[..., dict] | None  # same arguments -> facts about the input (files, sizes, hashes)

    def resolve_args(self, args: dict) -> dict:
        """The call's arguments with defaults filled in (what the manifest records); unknown names are errors."""
        signature = inspect.signature(self.documents)
        unknown = sorted(set(args) - set(signature.parameters))
        if unknown:
            valid = ", ".join(signature.parameters) or "none"
            raise AblateError(f"source {self.name!r} takes no argument {unknown[0]!r}; its arguments: {valid}")
        try:
            bound = signature.bind(**args)
        except TypeError as err:
            raise AblateError(f"source {self.name!r}: {err}") from None
        bound.apply_defaults()
        return dict(bound.arguments)


SOURCES: dict[str, Source] = {}


def register_source(
    name: str, help: str, val_fraction: float = 1 / 200, provenance: Callable[..., dict] | None = None
):
    """Decorator: make a function `(**args) -> iterator of (id, text)` available as `--source name`.

    `provenance(**args)`, when given, describes the input itself (e.g. files and their sizes); it is
    recorded in the manifest and, like the arguments, must match for a prepared folder to be reused.
    """

    def register(function: Callable[..., Documents]) -> Callable[..., Documents]:
        SOURCES[name] = Source(name, function, help, val_fraction, provenance)
        return function

    return register


def _import_source_modules() -> None:
    for module in SOURCE_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise


def source_names() -> list[str]:
    _import_source_modules()
    return sorted(SOURCES)


def get_source(name: str) -> Source:
    _import_source_modules()
    if name not in SOURCES:
        raise choice_error("source", name, sorted(SOURCES))
    return SOURCES[name]


def text_id(text: str) -> str:
    """A stable id for a document without one: its content hash (so reordering files keeps the split)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _missing_column(column: str, option: str, where: str, columns) -> AblateError:
    return AblateError(
        f"no column {column!r} (set by {option}) in {where}; its columns are: {', '.join(map(str, columns))}"
    )


def expand_paths(path: str | list[str], suffixes: tuple[str, ...]) -> list[str]:
    """Files, folders (every file with one of `suffixes` inside, recursively) and glob patterns, sorted."""
    patterns = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    files: list[str] = []
    for pattern in map(str, patterns):
        if os.path.isdir(pattern):
            found = [p for s in suffixes for p in glob.glob(os.path.join(pattern, "**", f"*{s}"), recursive=True)]
        else:
            found = glob.glob(pattern)
        if not found:
            kinds = "/".join(suffixes)
            raise AblateError(f"path {pattern!r} matches no file (expected a file, folder or glob of {kinds})")
        files.extend(sorted(os.path.abspath(p) for p in found))
    return files


def _file_sizes(suffixes: tuple[str, ...]) -> Callable[..., dict]:
    def provenance(path, **_) -> dict:
        return {"files": {file: os.path.getsize(file) for file in expand_paths(path, suffixes)}}

    return provenance


def _fineweb_provenance(config: str, data_files: list[str] | None) -> dict:
    if data_files:
        return _file_sizes((".parquet",))(data_files)
    return {"dataset": FINEWEB_EDU, "config": config}


@register_source(
    "fineweb-edu",
    help="HuggingFaceFW/fineweb-edu streamed by `datasets` (--config, e.g. sample-10BT; --data-files: local copies)",
    provenance=_fineweb_provenance,
)
def fineweb_edu(config: str = "sample-10BT", data_files: list[str] | None = None) -> Documents:
    """FineWeb-Edu's `train` split, streamed, in the dataset's own order.

    `data_files` reads local parquet files in FineWeb-Edu's schema through the same `datasets`
    streaming path (the parquet builder) instead of the hub: an offline mirror, and what the tests use.
    """
    import datasets  # `datasets` (~1 s) loads only to stream FineWeb-Edu

    if data_files:
        files = expand_paths(data_files, (".parquet",))
        dataset = datasets.load_dataset("parquet", data_files={"train": files}, split="train", streaming=True)
        where = f"parquet files {files}"
    else:
        try:
            dataset = datasets.load_dataset(FINEWEB_EDU, name=config, split="train", streaming=True)
        except (ConnectionError, ValueError, FileNotFoundError) as err:  # offline, no such config, no access
            raise AblateError(
                f"cannot open {FINEWEB_EDU} config {config!r}: {err} (without the hub, prepare local parquet "
                "copies: `ablate data prepare --source parquet --path 'DIR/*.parquet' --out ...`)"
            ) from err
        where = f"{FINEWEB_EDU} config {config!r}"
    columns = dataset.column_names
    for row in dataset:
        if columns is None:  # features unknown until the first row
            columns = list(row)
        for needed in ("text", "id"):
            if needed not in columns:
                raise AblateError(
                    f"no column {needed!r} in {where}; its columns are: {', '.join(columns)} "
                    f"(FineWeb-Edu's are: {', '.join(FINEWEB_EDU_COLUMNS)})"
                )
        if row["text"]:
            yield str(row["id"]), row["text"]


def parquet_documents(path: str | list[str], text_column: str = "text", id_column: str | None = None) -> Documents:
    import pyarrow.parquet as pq  # pyarrow only for a parquet source

    for file in expand_paths(path, (".parquet",)):
        parquet = pq.ParquetFile(file)
        columns = parquet.schema_arrow.names
        for column, option in ((text_column, "--text-column"), (id_column, "--id-column")):
            if column is not None and column not in columns:
                raise _missing_column(column, option, f"parquet file {file!r}", columns)
        wanted = [text_column] + ([id_column] if id_column else [])
        for batch in parquet.iter_batches(columns=wanted, batch_size=1024):
            texts = batch.column(text_column).to_pylist()
            ids = batch.column(id_column).to_pylist() if id_column else [None] * len(texts)
            for doc_id, text in zip(ids, texts):
                if text:
                    yield (str(doc_id) if id_column else text_id(text)), text


register_source(
    "parquet",
    help="local parquet files/folders/globs with a text column (--path, --text-column)",
    provenance=_file_sizes((".parquet",)),
)(parquet_documents)


@register_source(
    "jsonl",
    help="local JSON-lines files/folders/globs, one object per line (--path, --text-column)",
    provenance=_file_sizes((".jsonl",)),
)
def jsonl_documents(path: str | list[str], text_column: str = "text", id_column: str | None = None) -> Documents:
    for file in expand_paths(path, (".jsonl",)):
        with open(file, encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise AblateError(f"{file}:{line_number} is not valid JSON ({err.msg})") from None
                for column, option in ((text_column, "--text-column"), (id_column, "--id-column")):
                    if column is not None and column not in row:
                        raise _missing_column(column, option, f"{file}:{line_number}", list(row))
                text = row[text_column]
                if text:
                    yield (str(row[id_column]) if id_column else text_id(text)), text


@register_source(
    "sample",
    help="the shipped sample: English Wikipedia articles in FineWeb-Edu's schema (offline, a few MB)",
    val_fraction=1 / 20,
    provenance=lambda: {"file": SAMPLE_FILE.name, "sha256": _sample_sha256()},
)
def sample_documents() -> Documents:
    """The shipped sample (see ablate/data/assets/README.md), read as FineWeb-Edu-schema parquet."""
    _sample_sha256()
    yield from parquet_documents(str(SAMPLE_FILE), text_column="text", id_column="id")


def _sample_sha256() -> str:
    if not SAMPLE_FILE.is_file():
        raise AblateError(
            f"the shipped sample {str(SAMPLE_FILE)!r} is missing; build it with `ablate data build-sample`"
        )
    return hashlib.sha256(SAMPLE_FILE.read_bytes()).hexdigest()
