"""The JSON files of a prepared data folder (manifest.json, progress.json): their names, and reading them back.

Every command that reads them (`ablate data info`, `ablate data prepare` resuming or reusing a folder,
`ablate submit`'s preflight, `ablate run`) goes through `read_manifest_file` / `read_progress_file`, so a
truncated, empty, `[]` or otherwise damaged file is one `AblateError` naming the file, what is wrong
with it and the way out, never a traceback from deep inside a reader. The check is structural (the keys
and types the readers use), not a second source of truth: the shards' checksums are verified elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

from ablate.errors import AblateError
from ablate.store import read_json_file

FORMAT = "ablate-token-shards/1"
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a shard or carry file: one name inside the folder


class FileName:
    """Schema marker: a file name inside the data folder (no separators, not hidden)."""


_SHARD = {"file": FileName, "tokens": int, "sha256": str}
_MANIFEST_SCHEMA = {
    "format": str, "tokenizer": str, "tokenizer_sha256": str, "source": str, "source_args": dict,
    "vocab_size": int, "documents_read": int, "request": dict,
    "splits": {name: {"documents": int, "tokens": int, "shards": [_SHARD]} for name in ("train", "val")},
}
_PROGRESS_SCHEMA = {
    "request": dict, "documents_read": int,
    "carry": {"file": FileName, "sha256": str, "tokens": {"train": int, "val": int}},
    "splits": {name: {"documents": int, "shards": [_SHARD]} for name in ("train", "val")},
}


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}")


def problem(value: object, schema: object, where: str = "") -> str | None:
    """What is wrong with `value` against `schema` (None when it fits), naming the place, e.g. `splits.val`."""
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return f"{where or 'it'} is {_kind(value)}, not an object"
        for key, sub in schema.items():
            if key not in value:
                return f"{where + '.' if where else ''}{key} is missing"
            found = problem(value[key], sub, f"{where + '.' if where else ''}{key}")
            if found:
                return found
        return None
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{where} is {_kind(value)}, not a list"
        return next((found for i, item in enumerate(value) if (found := problem(item, schema[0], f"{where}[{i}]"))),
                    None)
    if schema is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{where} is {value!r}, not a whole number >= 0"
    if schema is FileName:
        ok = isinstance(value, str) and _FILE_NAME.fullmatch(value) is not None
        return None if ok else f"{where} is {value!r}, not a file name inside the folder"
    return None if isinstance(value, schema) else f"{where} is {_kind(value)}, not {_kind(schema())}"


def _checked(path: Path, value: object, schema: dict, way_out: str) -> dict:
    found = problem(value, schema)
    if found:
        raise AblateError(f"{path} is damaged ({found}); {way_out}")
    return value


def read_manifest_file(data_dir: str | Path) -> dict:
    """DIR/manifest.json, checked: its format and every field the readers use."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    way_out = f"prepare the data again (`ablate data prepare` into a new folder, or delete {data_dir} first)"
    value = read_json_file(path, way_out)
    if value.get("format") != FORMAT:
        raise AblateError(f"{path} has format {value.get('format')!r}, expected {FORMAT!r}: it is not a folder "
                          f"this version prepared; {way_out}")
    return _checked(path, value, _MANIFEST_SCHEMA, way_out)


def read_progress_file(out: str | Path) -> dict:
    """OUT/progress.json of an unfinished prepare, checked; a damaged one cannot be resumed from."""
    out = Path(out)
    way_out = (f"the unfinished prepare cannot resume from it: delete {out} and rerun the same "
               "`ablate data prepare` (it starts from the beginning)")
    path = out / PROGRESS
    return _checked(path, read_json_file(path, way_out), _PROGRESS_SCHEMA, way_out)
