"""A mistyped field in a hand-edited or older summary.json is one line naming the file and the field, in the reader
and in `ablate table` / `ablate status`, never a traceback (issue 54, item 10)."""

from __future__ import annotations

import json

import pytest

from ablate.cli import main
from ablate.errors import AblateError
from ablate.store_summary import read_summary
from analysis_fixtures import write_run

pytestmark = pytest.mark.unit

MISTYPED = [("data_id", {"a": 1}), ("status", ["completed"]), ("numerics_history", 5), ("versions", "x"),
            ("val_loss", "3.49"), ("steps", "40"), ("seed", True), ("match_params", 1)]


@pytest.mark.parametrize(("field", "value"), MISTYPED)
def test_a_mistyped_field_is_refused_in_one_line_naming_the_file_and_field(tmp_path, capsys, field, value):
    for arm in ("baseline", "sink-logit"):
        folder = write_run(tmp_path, "study", "10M", arm, 0, 4.0)
    summary = json.loads((folder / "summary.json").read_text())
    summary[field] = value
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(AblateError, match=f"{folder / 'summary.json'}: field '{field}' holds") as caught:
        read_summary(folder)
    assert "\n" not in str(caught.value)
    for command in (["table", str(tmp_path / "study")], ["status", "study", "--results", str(tmp_path)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"field '{field}'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_declared_types_read_what_runs_write(tmp_path):
    """An int where a float is declared (JSON writes 3.0 as 3), nulls, and fields of another version pass."""
    folder = write_run(tmp_path, "study", "10M", "baseline", 0, 4.0, wall_seconds=12, error=None, unknown=[1])
    assert read_summary(folder).wall_seconds == 12 and read_summary(folder).completed
