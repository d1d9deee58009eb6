"""Tables: names from files are data, never markup; a damaged CSV cell is one line."""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import polars as pl
import pytest
from analysis_fixtures import write_run
from datafix import ablate_cli

from ablate.analysis.load import RUN_SCHEMA, load_runs
from ablate.analysis.runs import Runs
from ablate.analysis.render import render
from ablate.analysis.build import build_table
from ablate.analysis.tables import losses_table
from ablate.errors import AblateError
from ablate.analysis.probes import summarise_injections, summarise_probes

pytestmark = pytest.mark.unit

CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a pipe that is not escaped ends a markdown cell


def _cells(line: str) -> int:
    return len(CELL_SPLIT.split(line)) - 2  # the leading and trailing pipes


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _csv(tmp_path, body: str, name: str = "t.csv"):
    path = tmp_path / name
    path.write_text("tier,arm,seed,val_loss\n10M,baseline,0,4.0\n10M,baseline,1,4.1\n" + body)
    return path


@pytest.mark.parametrize("cell, shown", [
    ("a|b", "'a|b'"), ('"x\n| 10M | forged |"', "'x\\n| 10M | forged |'"), (r"\input{/etc/passwd}", "input"),
    ("$x$", "'$x$'"), ("#1", "'#1'"), ("{x}", "'{x}'"), ("../up", "'../up'"),
])
def test_a_bad_arm_name_in_a_csv_is_refused_naming_row_and_value(tmp_path, cell, shown):
    path = _csv(tmp_path, f"10M,{cell},0,3.9\n")
    with pytest.raises(AblateError) as err:
        load_runs(path)
    message = str(err.value)
    assert str(path) in message and "row 3" in message and "column arm" in message and shown in message
    assert "letters, digits" in message and "\n" not in message.replace("\\n", "")


def test_a_bad_tier_name_and_a_parquet_file_are_refused_too(tmp_path):
    with pytest.raises(AblateError, match=r"row 3 .*column tier: invalid tier name '1\$0M'"):
        load_runs(_csv(tmp_path, "1$0M,sink-logit,0,3.9\n"))
    parquet = tmp_path / "t.parquet"
    pl.DataFrame({"tier": ["10M", "10M"], "arm": ["baseline", "x&y"], "seed": [0, 0],
                  "val_loss": [4.0, 3.9]}).write_parquet(parquet)
    with pytest.raises(AblateError, match=r"t.parquet' row 2 .*column arm: invalid arm name 'x&y'"):
        load_runs(parquet)


@pytest.mark.parametrize("body, expected", [
    ("10M,,0,3.9\n", r"row 3 .*column arm: empty cell"),
    (",sink-logit,0,3.9\n", r"row 3 .*column tier: empty cell"),
    ("10M,sink-logit,,3.9\n", r"row 3 .*column seed: empty cell"),
    ("10M,sink-logit,9223372036854775808,3.9\n", r"row 3 .*column seed: seed 9223372036854775808 is out of range"),
    ("10M,sink-logit,-1,3.9\n", r"row 3 .*column seed: seed -1 is out of range; seeds are integers from 0"),
    ("10M,sink-logit,1e30,3.9\n", r"row 3 .*column seed: seed 1e\+30 is out of range"),
])
def test_damaged_csv_cells_are_one_line_naming_the_cell(tmp_path, body, expected):
    path = _csv(tmp_path, body)
    with pytest.raises(AblateError, match=expected):
        load_runs(path)
    result = ablate_cli("table", path, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr
    assert "correct that cell or delete the row" in result.stderr


def test_a_run_folder_with_an_unsafe_name_is_refused(tmp_path):
    folder = write_run(tmp_path, "study", "10M", "baseline", 0, 4.0, curve_points=2)
    write_run(tmp_path, "study", "10M", "sink-logit", 0, 3.9, curve_points=2)
    shutil.copytree(folder.parent, tmp_path / "study" / "10M" / "a|b")
    with pytest.raises(AblateError, match=r"a\|b/seed0: invalid arm name 'a\|b'.*move that folder out"):
        load_runs(tmp_path / "study")


def _runs(arms: list[str], tier: str = "10M") -> Runs:
    """Runs as a loader that did not check names would give them (the renderers' second wall)."""
    rows = [{"tier": tier, "arm": arm, "seed": seed, "status": "completed", "val_loss": 4.0 - 0.01 * i + 0.001 * seed,
             "verified": False, "reason": None} for i, arm in enumerate(arms) for seed in (0, 1)]
    rows.append({"tier": tier, "arm": arms[-1], "seed": 2, "status": "x\n| 10M | forged |", "val_loss": None,
                 "verified": False, "reason": "x\n| 10M | forged | \\input{y}"})
    return Runs(name="t", frame=pl.DataFrame(rows, schema=RUN_SCHEMA))


def test_every_cell_is_escaped_for_its_format():
    nasty = ["baseline", "a|b", "c\n| 10M | forged", r"\input{x}$#{"]
    runs = _runs(nasty, tier="my_tier")
    for table in (build_table(runs, "paired"), losses_table(runs)):
        md = render(table, "md")
        rows = _table_lines(md)
        assert len({_cells(line) for line in rows}) == 1, md  # no row shifted, none forged
        assert len(rows) == 2 + table.frame.height
        assert not any(line.startswith("| 10M | forged") for line in md.splitlines())
        latex = render(table, "latex")
        assert r"\input" not in latex and "my\\_tier" in latex and "my_tier" not in latex
        body = [line for line in latex.splitlines() if line.endswith("\\\\") and "toprule" not in line]
        assert len({len(re.findall(r"(?<!\\)&", line)) for line in body}) == 1, latex  # every row as many columns
        assert all(line.startswith(("%", "\\")) or line.endswith("\\\\") for line in latex.splitlines()), latex
        assert json.loads(render(table, "json"))["rows"]
        assert pl.read_csv(render(table, "csv").encode()).height == table.frame.height


WEIGHTS = b"weights"  # a run folder's final weights, as bytes: probe.json names their sha256


def _probe(folder, arm: str, seed: int, summary: dict):
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoints" / "model.pt").write_bytes(WEIGHTS)
    (folder / "probe.json").write_text(json.dumps({"run": {"tier": "10M", "arm": arm, "seed": seed}, "summary": summary,
                                                   "weights_sha256": hashlib.sha256(WEIGHTS).hexdigest()}))


def test_the_probes_table_has_as_many_cells_as_its_delimiter_row(tmp_path):
    summary = {"first_key_mass": 0.4, "max_abs_residual": 12.0, "mean_layer_max_abs_residual": 6.0}
    _probe(tmp_path / "10M" / "baseline" / "seed0", "baseline", 0, summary)
    _probe(tmp_path / "10M" / "x" / "seed0", "x|y", 0, summary)  # an arm read from a file
    rows = _table_lines(summarise_probes(tmp_path))
    assert "max \\|residual\\|" in rows[0]
    assert len({_cells(line) for line in rows}) == 1, rows
    inject = tmp_path / "10M" / "x" / "seed0" / "inject.json"
    # the run is named by its folder (a file naming another run is left out); a junk name is data too
    inject.write_text(json.dumps({"run": {"tier": "10M", "arm": "x", "seed": 0},
                                  "weights_sha256": hashlib.sha256(WEIGHTS).hexdigest(), "by_cutoff": {"p25": {"rows": [
        {"junk": "a|b", "eps": 0.1, "increase": 0.2}]}}}))
    rows = _table_lines(summarise_injections(tmp_path))
    assert len(rows) >= 3 and len({_cells(line) for line in rows}) == 1, rows
