"""The table kinds finished: what the commands and the report ask of a kind is an attribute of its `TableKind`
(never its name compared), each builder registers itself for its kind, and kinds.py imports no builder, by name
or by string; a built-in arm is one edit (its class in builtin.py), its order and style derived."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_fixtures import reference_losses, write_csv
from ablate.analysis import kinds
from ablate.analysis.build import build_losses, build_table
from ablate.analysis.kinds import BUILDERS, KINDS, TableKind, builds, get_kind, register_kind, report_kinds
from ablate.analysis.load import load_runs
from ablate.analysis.plots import arm_styles
from ablate.analysis.render import render
from ablate.arms.names import BUILTIN_ARMS, BUILTIN_SOURCE, registered_names
from ablate.cli import main
from ablate.errors import AblateError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    losses = {k: v for k, v in reference_losses().items() if k[0] == "10M"}
    return write_csv(tmp_path_factory.mktemp("kinds") / "runs.csv", losses)


@pytest.fixture
def test_kind():
    """A kind registered in a test (a loss table under another name that takes no metric), removed after it."""
    kind = register_kind(TableKind("final-losses", "Final losses", "e", "a kind added in a test", takes_metric=False))
    builds("final-losses", render)(build_losses)
    yield kind
    KINDS.pop("final-losses")
    BUILDERS.pop("final-losses", None)


@pytest.mark.unit
def test_every_kind_has_its_builder_once_build_table_is_importable():
    assert set(BUILDERS) == set(KINDS)
    assert BUILDERS["paired"][1] is render and BUILDERS["scale"][1].__name__ == "render_scale"
    assert BUILDERS["lr"][1].__name__ == "render_lr"


@pytest.mark.unit
def test_a_builder_registers_itself_for_its_kind(csv, test_kind, capsys):
    runs = load_runs(csv)
    assert build_table(runs, "final-losses").kind == "losses"
    assert main(["table", str(csv), "--kind", "final-losses", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("tier,arm,")


@pytest.mark.unit
def test_a_builder_for_an_undeclared_kind_or_a_second_builder_is_refused(test_kind):
    with pytest.raises(AblateError, match=r"^unknown kind 'no-such'; valid kinds: paired, .*final-losses$"):
        builds("no-such", render)
    with pytest.raises(AblateError, match=r"'final-losses' is already built by ablate.analysis.build.build_losses"):
        builds("final-losses", render)(lambda runs, reference, declared: None)
    builds("final-losses", render)(build_losses)  # the same builder again (its module loaded twice) is no clash


@pytest.mark.unit
def test_a_kind_without_a_builder_is_refused_in_one_line(csv, test_kind):
    BUILDERS.pop("final-losses")
    with pytest.raises(AblateError, match=r"^table kind 'final-losses' has no builder: decorate one with "
                                          r"@builds\('final-losses', renderer\)"):
        build_table(load_runs(csv), "final-losses")


@pytest.mark.unit
def test_the_commands_ask_the_kind_not_its_name(csv, test_kind, capsys):
    """A kind registered in a test is refused --metric because it says so, and each option's error names the kinds
    that take it (read from the registry, the test's kind among them where it qualifies)."""
    cases = [(["--kind", "final-losses", "--metric", "hellaswag/acc"],
              "--metric (a downstream metric instead of the loss) applies to --kind paired, increments, overlap, "
              "losses or scale only, not final-losses"),
             (["--kind", "losses", "--tuned"],
              "--tuned pairs the arms at their own best LRs: use it with --kind paired, increments, overlap or "
              "declared, not losses"),
             (["--kind", "lr", "--tuned"], "use it with --kind paired, increments, overlap or declared, not lr"),
             (["--kind", "lr", "--metric", "hellaswag/acc"], "applies to --kind paired, increments, overlap, losses "
                                                             "or scale only, not lr"),
             (["--kind", "lr", "--reference", "sink-logit"],
              "--reference applies to --kind paired or budgets only; the lr table has fixed arms (each arm's sweep)"),
             (["--kind", "overlap", "--by-item", "--metric", "hellaswag/acc"],
              "--by-item makes the paired table only, not --kind overlap; drop --kind or --by-item"),
             (["--tuned", "--metric", "hellaswag/acc"], "--tuned compares the validation loss at each arm's own best "
                                                        "LR: drop --metric")]
    for argv, message in cases:
        assert main(["table", str(csv), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (argv, err)


@pytest.mark.unit
def test_what_the_report_asks_is_in_the_kind():
    assert report_kinds(False) == ("paired", "increments", "overlap", "losses")
    assert report_kinds(True) == ("paired", "increments", "overlap", "losses", "declared")
    named = {kind: get_kind(kind).effect_name(row, key, "baseline") for kind, key, row in (
        ("paired", "arm", {"tier": "10M", "arm": "sink-logit"}),
        ("increments", "quantity", {"tier": "10M", "quantity": "zero_option"}),
        ("overlap", "gate", {"tier": "10M", "gate": "norm"}))}
    assert named == {"paired": "10M sink-logit vs baseline", "increments": "10M zero_option (baseline − sink-logit)",
                     "overlap": "10M norm overlap (norm-gate with combo)"}


@pytest.mark.unit
def test_kinds_imports_no_builder_by_name_or_by_string():
    """Words only: kinds.py imports the standard library, the errors and the increments, and calls no importer
    (a builder named as "module:function" and imported on use was a circle with build.py no linter saw)."""
    tree = ast.parse(Path(kinds.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported <= {"__future__", "dataclasses", "typing", "ablate.errors", "ablate.increments"}, imported
    calls = {getattr(node.func, "id", getattr(node.func, "attr", None)) for node in ast.walk(tree)
             if isinstance(node, ast.Call)}
    assert not calls & {"import_module", "__import__", "find_spec", "_named"}
    assert not [s for s in kinds.__dict__.values() if isinstance(s, str) and ":" in s and s.startswith("ablate.")]


@pytest.mark.unit
def test_the_kinds_stay_below_their_builders_in_the_import_contract():
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    below = next(c for c in contracts if c.get("source_modules") == ["ablate.analysis.kinds"])
    assert {"polars", "ablate.analysis.build", "ablate.analysis.render"} <= set(below["forbidden_modules"])


# ---------------------------------------------------------------- a built-in arm is one edit

# Each built-in arm's colour as it was when the colours were still listed by hand (deriving them must not move one),
# but for the last three, which shared the first three's colours and now have their own (issue 58: sink-token and
# g2-value were one green).
COLOURS_TODAY = {
    "baseline": "#000000", "sink-logit": "#1f77b4", "off-by-one": "#ff7f0e", "sink-token": "#2ca02c",
    "norm-gate": "#d62728", "proj-gate": "#9467bd", "renorm": "#8c564b", "combo": "#e377c2", "combo2": "#17becf",
    "g1-elementwise": "#bcbd22", "g1-headwise": "#7f7f7f", "g2-value": "#000080",
}


@pytest.mark.unit
def test_the_built_in_arms_are_read_from_their_registrations():
    from ablate.arms import get_arm, list_arms  # reason: registering the built-ins loads torch

    assert BUILTIN_ARMS == tuple(list_arms()[:len(BUILTIN_ARMS)])
    assert all(get_arm(name).__module__ == "ablate.arms.builtin" for name in BUILTIN_ARMS)
    assert {arm: s["color"] for arm, s in arm_styles(list(BUILTIN_ARMS)).items()} == COLOURS_TODAY


@pytest.mark.unit
def test_a_new_built_in_arm_gets_its_order_and_style_with_no_other_edit(monkeypatch, tmp_path):
    """The one edit: a registered class appended to builtin.py. Its name follows the others, its style is its own,
    and no other arm's style moves; a custom arm still follows the built-ins."""
    source = BUILTIN_SOURCE.read_text() + '\n\n@register_arm("new-arm")\nclass NewArm(Arm):\n    description = "x"\n'
    names = registered_names(source)
    assert names == (*BUILTIN_ARMS, "new-arm")
    before = arm_styles(list(BUILTIN_ARMS))
    monkeypatch.setattr("ablate.analysis.plots.BUILTIN_ARMS", names)
    monkeypatch.setattr("ablate.analysis.runs.BUILTIN_ARMS", names)
    styles = arm_styles([*names, "my-own"])
    assert {arm: styles[arm] for arm in BUILTIN_ARMS} == before
    new = styles["new-arm"]
    assert new["color"] and all((new["color"], new["marker"]) != (s["color"], s["marker"])
                                for arm, s in styles.items() if arm != "new-arm")
    table = tmp_path / "runs.csv"
    table.write_text("tier,arm,seed,val_loss\n10M,my-own,0,3.5\n10M,new-arm,0,3.5\n10M,baseline,0,3.5\n")
    assert load_runs(table).arm_order == ["baseline", "new-arm", "my-own"]  # the tables' order reads the same names


@pytest.mark.unit
def test_an_arm_registered_under_a_computed_name_is_refused_naming_its_line():
    with pytest.raises(TypeError, match=r"builtin.py:3: a built-in arm is registered with a literal name"):
        registered_names('NAME = "x"\n\n@register_arm(NAME)\nclass X(Arm):\n    pass\n', "builtin.py")


@pytest.mark.system
def test_the_built_in_names_load_no_torch():
    code = "import ablate.arms.names, sys\nprint(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
