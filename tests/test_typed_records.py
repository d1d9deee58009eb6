"""Status rows, ledger entries and cluster profiles travel typed (issue 59, items 3 and 5): each is a frozen record
with one reader and writer in its owner module (`StatusRow` in status.py, `LedgerEntry` and `Ledger` in store.py,
`Profile` in profiles.py), every other module reads its attributes, and the files and the output they make are
what they were, byte for byte (old folders still read). The submit trip resolves each tier once (the `Tier`
travels) and asks `status()` once."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from ablate.dispatch import Submission, submit
from ablate.experiment import Experiment
from ablate.profiles import load_profile
from ablate.status import StatusRow
from ablate.store import LEDGER, Ledger, LedgerEntry, atomic_write_json, read_ledger, record_ledger
from test_typed_reads import keyed_accesses

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ablate"
# record: (its owner, the keys only it has, the words its receivers are named by)
RECORDS = {
    "a status row": ("ablate/status.py", {"state", "queued", "stale", "val_loss_final", "elapsed_s", "eta_s", "job_id"},
                     ("row", "stopped")),
    "a ledger entry": ("ablate/store.py", {f.name for f in dataclasses.fields(LedgerEntry)} | {"runs", "submissions"},
                       ("entry", "ledger")),
    "a profile": ("ablate/profiles.py", {"name", "partition", "account", "qos", "gpus_per_run", "cpus_per_run",
                                         "mem_gb", "time_min", "constraint", "signal_delay_s", "array_parallelism",
                                         "extra_sbatch", "gpu", "processes_per_run"}, ("profile", "resources")),
}


def keyed_reads(path: Path):
    """(line, record, receiver, key) of every `x["key"]` and `x.get("key")` whose receiver is named as one of the
    records (`r` is a status row's) and whose key is one of that record's."""
    for line, receiver, key in keyed_accesses(path):
        for record, (_, keys, words) in RECORDS.items():
            named = receiver == "r" if record == "a status row" else False
            if key in keys and (named or any(word in receiver.lower() for word in words)):
                yield line, record, receiver, key


@pytest.mark.unit
def test_no_keyed_read_of_a_status_row_a_ledger_entry_or_a_profile_outside_its_owner():
    found = [f"{where}:{line}: {record}: {receiver}[{key!r}]" for path in sorted(PACKAGE.rglob("*.py"))
             for line, record, receiver, key in keyed_reads(path)
             if (where := str(path.relative_to(REPO))) != RECORDS[record][0]]
    assert found == [], "keyed reads of a typed record (read its attributes):\n" + "\n".join(found)


@pytest.mark.unit
def test_the_scan_sees_what_it_is_meant_to_see(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('a = row["state"]\nb = r["queued"]\nc = ledger["runs"].get(k)\nd = entry.get("job_id")\n'
                    'e = profile["gpus_per_run"]\nf = self.resources.get("name")\ng = plan["state"]\n')
    assert sorted((line, key) for line, _, _, key in keyed_reads(path)) == [
        (1, "state"), (2, "queued"), (3, "runs"), (4, "job_id"), (5, "gpus_per_run"), (6, "name")]


# ------------------------------------------------------------------------------------------ the ledger's bytes
WRITTEN = {  # what each writer put in ledger.json before the typed entry, as it put it
    "a SLURM run": {"executor": "slurm", "job_id": "54_1", "folder": "/r/e/slurm/smoke/%j",
                    "submitted": "2026-01-01T10:00:00"},
    "a SLURM evaluation": {"executor": "slurm", "job_id": "55_0", "folder": "/r/e/slurm/eval-smoke/%j",
                           "tasks": ["hellaswag"], "submitted": "2026-01-01T10:00:00"},
    "a local evaluation": {"executor": "local", "tasks": ["hellaswag", "wikitext"], "outcome": "evaluated"},
    "a local run, queued": {"executor": "local", "job_id": None, "submission": "abc", "submitted": "2026-01-01T10:00"},
    "a local run, ended": {"executor": "local", "job_id": "local-7", "submission": "abc",
                           "submitted": "2026-01-01T10:00:00", "pid": 7, "exit_code": 0, "error": None},
    "a local run, stopped": {"executor": "local", "job_id": "local-7", "submission": "abc",
                             "submitted": "2026-01-01T10:00:00", "pid": 7, "exit_code": 130, "error": "Ctrl-C",
                             "interrupted": True},
}
# how the writers make them now (dispatch.py, workers.py), and the merges a local run's life adds
MADE = {
    "a SLURM run": LedgerEntry("slurm", "54_1", "/r/e/slurm/smoke/%j", submitted="2026-01-01T10:00:00"),
    "a SLURM evaluation": LedgerEntry("slurm", "55_0", "/r/e/slurm/eval-smoke/%j", tasks=("hellaswag",),
                                      submitted="2026-01-01T10:00:00"),
    "a local evaluation": LedgerEntry("local", tasks=("hellaswag", "wikitext"), outcome="evaluated"),
    "a local run, queued": LedgerEntry("local", submission="abc", submitted="2026-01-01T10:00"),
}
LIFE = [LedgerEntry("local", submission="abc", submitted="2026-01-01T10:00:00"),
        LedgerEntry(job_id="local-7", pid=7)]


@pytest.mark.unit
@pytest.mark.parametrize("what", list(WRITTEN))
def test_each_entry_is_written_as_the_ledger_always_held_it_and_reads_back(tmp_path, what):
    """The same fields (a None written where it was written), so the same bytes: ledger.json sorts its keys."""
    entry = LedgerEntry.of(WRITTEN[what])
    assert entry.to_dict() == WRITTEN[what] and LedgerEntry.of(entry.to_dict()) == entry
    if what in MADE:
        record_ledger(tmp_path, {"k": MADE[what]})
        atomic_write_json(tmp_path / "before.json", {"runs": {"k": WRITTEN[what]}, "submissions": []})
        assert (tmp_path / LEDGER).read_bytes() == (tmp_path / "before.json").read_bytes()


@pytest.mark.unit
@pytest.mark.parametrize("end, what", [(LedgerEntry(exit_code=0, error=None), "a local run, ended"),
                                       (LedgerEntry(exit_code=130, error="Ctrl-C", interrupted=True),
                                        "a local run, stopped")])
def test_a_local_run_s_merges_make_the_bytes_they_made(tmp_path, end, what):
    other = {"executor": "slurm", "job_id": "1_0", "folder": "/x/%j", "a_field_of_another_version": [1, 2]}
    (tmp_path / LEDGER).write_text(json.dumps({"runs": {"other": other}, "submissions": []}))
    record_ledger(tmp_path, {"k": LIFE[0]})
    for step in (LIFE[1], end):
        record_ledger(tmp_path, {"k": step}, merge=True)
    # another entry is written back as it was read, fields of another version too
    atomic_write_json(tmp_path / "before.json", {"runs": {"other": other, "k": WRITTEN[what]}, "submissions": []})
    assert (tmp_path / LEDGER).read_bytes() == (tmp_path / "before.json").read_bytes()


@pytest.mark.unit
def test_an_older_ledger_reads_typed(tmp_path):
    """An entry without the fields of later versions, and with one this version does not know."""
    (tmp_path / LEDGER).write_text(json.dumps({"runs": {"k": {"executor": "local", "exit_code": 1, "retired": 3}},
                                               "submissions": [{"executor": "local", "runs": ["k"], "data": "/d"}]}))
    ledger = read_ledger(tmp_path)
    assert ledger.runs["k"] == LedgerEntry("local", exit_code=1) and ledger.runs["k"].submitted_at.year == 1970
    assert ledger.submitted_with("k") == ("local", None, "/d", False)
    assert ledger.submitted_with("x") == (None, None, None, False)
    assert read_ledger(tmp_path / "none") == Ledger({}, ())


# ------------------------------------------------------------------------------------- rows and profiles
@pytest.mark.unit
def test_a_status_row_is_written_as_status_json_wrote_it():
    row = StatusRow("smoke", "baseline", 0, "running", None, "54_1", 3, 10, 5.0, 7.0, 4.5, None, True, False)
    assert list(row.to_dict()) == ["tier", "arm", "seed", "state", "job_id", "steps", "total_steps", "elapsed_s",
                                   "eta_s", "val_loss", "error", "queued", "val_loss_final", "stale", "eval"]
    swept = dataclasses.replace(row, lr_factor=0.5).to_dict()
    assert list(swept)[3:5] == ["state", "lr_factor"] and swept["lr_factor"] == 0.5


@pytest.mark.unit
def test_a_profile_shows_what_the_dry_run_showed():
    """The shipped profile, as `submit --dry-run` printed it from the profile's dict."""
    shown = {"partition": "debug", "account": "", "qos": "", "gpus_per_run": 0, "cpus_per_run": 1, "mem_gb": 2,
             "time_min": 20, "constraint": "", "signal_delay_s": 30, "array_parallelism": 8, "extra_sbatch": [],
             "name": "local", "processes_per_run": 1}
    assert json.dumps(load_profile("local").to_dict()) == json.dumps(shown)
    example = load_profile("example")
    assert example.gpus_per_run == example.processes_per_run == 1 and example.constraint == "a100|h100"
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.gpus_per_run = 2


# ------------------------------------------------------------------------------------------ the submit trip
def _count_calls(monkeypatch, module_names: list[str], name: str) -> list[str]:
    """Wrap `name` in each module; the module and name of the function that calls it, one per call."""
    callers = []
    for module in module_names:
        real = getattr(sys.modules[module], name)

        def counted(*args, _real=real, **kwargs):
            caller = sys._getframe(1)
            callers.append(f"{caller.f_globals['__name__']}.{caller.f_code.co_qualname}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(f"{module}.{name}", counted)
    return callers


@pytest.mark.unit
def test_the_submit_trip_resolves_each_tier_once_and_the_tier_travels(tmp_path, monkeypatch, sample_data):
    import ablate.config  # noqa: F401  (every module that asks for a tier by its name)
    import ablate.plan  # noqa: F401
    import ablate.sizing  # noqa: F401

    callers = _count_calls(monkeypatch, ["ablate.dispatch", "ablate.config", "ablate.plan", "ablate.sizing",
                                         "ablate.experiment"], "get_tier")
    experiment = Experiment(name="trip", tiers=("smoke", "filter-norm"), arms=("baseline", "sink-logit"), seeds=2,
                            overrides={"smoke": {"data_dir": str(sample_data)}})
    report = submit(experiment, None, Submission(results=tmp_path, executor="local", dry_run=True))
    assert len(report["to_submit"]) == 8 and report["gpu_hours"] > 0
    # Experiment.runs checks the declared tiers exist; then submit resolves each once, and the Tier travels
    once, checked = "ablate.dispatch.submit.<locals>.<dictcomp>", "ablate.experiment.Experiment.runs"
    assert sorted(callers) == [once, once, checked, checked], callers


@pytest.mark.run
def test_submit_asks_status_once_and_evaluates_the_runs_it_said_completed(tmp_path, monkeypatch, finished_runs,
                                                                           sample_data):
    from ablate.evals.run import EvalJob

    results = finished_runs(tmp_path / "results", ("baseline", 0), experiment="once")
    asked = _count_calls(monkeypatch, ["ablate.dispatch"], "status")
    evaluated = []
    monkeypatch.setattr(EvalJob, "__call__", lambda job, spec: evaluated.append(spec.key))  # not lm-eval here
    experiment = Experiment(name="once", tiers=("smoke",), arms=("baseline", "sink-logit"), seeds=1,
                            overrides={"max_steps": 4, "data_dir": str(sample_data)})
    spec = experiment.runs(arms=["baseline"])
    report = submit(experiment, None, Submission(results=results, executor="local", grid=spec,
                                                 eval_tasks=["hellaswag"]))
    assert report["to_submit"] == [] and report["evals"] == {"smoke/baseline/seed0": "evaluated"}
    assert evaluated == ["smoke/baseline/seed0"] and len(asked) == 1, asked
    assert read_ledger(results / "once").runs["eval:smoke/baseline/seed0"].outcome == "evaluated"
