"""The table kinds finished: what the commands and the report ask of a kind is an attribute of its `TableKind`
(never its name compared), each builder registers itself for its kind, and kinds.py imports no builder, by name
or by string; a built-in arm is one edit (its class in builtin.py), its order and style derived."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis_fixtures import reference_losses, write_csv, write_store
from ablate.analysis import kinds
from ablate.analysis.build import build_losses, build_table
from ablate.analysis.kinds import ABSOLUTE, KINDS, TableKind, builds, get_kind, register_kind, report_kinds
from ablate.analysis.load import load_runs
from ablate.analysis.plots import arm_styles
from ablate.analysis.render import render
from ablate.analysis.report import make_report
from ablate.analysis.tables import losses_table
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
    kind = register_kind(TableKind("final-losses", "Final losses", "e", "a kind added in a test", takes_metric=False,
                                   shape=ABSOLUTE))
    builds("final-losses", render)(build_losses)
    yield kind
    KINDS.pop("final-losses")


@pytest.mark.unit
def test_every_kind_has_its_builder_once_build_table_is_importable():
    assert all(kind.builder is not None and kind.renderer is not None for kind in KINDS.values())
    assert KINDS["paired"].renderer is render and KINDS["scale"].renderer.__name__ == "render_scale"
    assert KINDS["lr"].renderer.__name__ == "render_lr"


@pytest.mark.unit
def test_a_builder_registers_itself_for_its_kind(csv, test_kind, capsys):
    runs = load_runs(csv)
    assert build_table(runs, get_kind("final-losses")).kind == "final-losses"  # built from a losses table
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
    register_kind(test_kind)  # the kind as declared, before its builder attached
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


@pytest.fixture
def best_kind():
    """The issue's new kind, registered in ONE place (this one call, in this one file; no module of ablate edited):
    the lowest mean final loss of each tier, an absolute table the report writes. Its builder starts from the
    losses table, so the table is the kind's own only because build_table makes it so."""
    def build_best(runs, reference, declared):
        table = losses_table(runs)
        return dataclasses.replace(table, frame=table.frame.sort("mean").unique("tier", keep="first",
                                                                                 maintain_order=True))

    kind = register_kind(TableKind("best", "Best arm per tier", "the arm with the lowest mean final val_loss of each "
                                   "tier", "the best arm of each tier", shape=ABSOLUTE, in_report=True,
                                   builder=build_best, renderer=render))
    yield kind
    KINDS.pop("best")


@pytest.mark.unit
def test_a_kind_registered_in_one_place_renders_in_every_format_and_the_report(csv, best_kind, tmp_path, capsys):
    """`ablate table --kind best` used to fail with KeyError 'ci_low' (render.py laid out every kind but "losses" and
    "budgets" as differences); its layout is now its shape, in markdown, CSV, LaTeX, JSON and the report."""
    outputs = {}
    for fmt in ("md", "csv", "latex", "json"):
        assert main(["table", str(csv), "--kind", "best", "--format", fmt]) == 0, fmt
        outputs[fmt] = capsys.readouterr().out
    assert outputs["md"].startswith("## Best arm per tier — runs\n") and "Validation loss in nats" in outputs["md"]
    assert "| tier | arm | n | mean ± sd | se | min | max | marks |" in outputs["md"]
    assert outputs["csv"].splitlines()[0] == "tier,arm,n,mean,sd,se,min,max,marks"
    assert len(outputs["csv"].splitlines()) == 2  # one tier (10M): its best arm
    assert r"Tier & Arm & $n$ & Mean $\pm$ sd & se & Marks \\" in outputs["latex"]
    assert json.loads(outputs["json"])["kind"] == "best"
    folder = write_store(tmp_path, losses={k: v for k, v in reference_losses().items() if k[0] == "10M"})
    ctx = make_report(folder)
    assert (ctx.out_dir / "best.md").read_text() == best_kind.render(ctx.tables["best"], "md")
    assert (ctx.out_dir / "best.md").read_text().startswith("## Best arm per tier — study\n")
    assert "[best.md](best.md) ([csv](best.csv)): 1 rows" in (ctx.out_dir / "summary.md").read_text()


@pytest.mark.unit
def test_a_kind_s_shape_is_checked_and_a_table_shape_needs_a_table(csv):
    with pytest.raises(AblateError, match=r"^unknown shape 'wide'; valid shapes: difference, absolute, by-budget, "
                                          r"own$"):
        register_kind(TableKind("wide", "t", "e", "h", shape="wide"))
    assert "wide" not in KINDS
    with pytest.raises(AblateError, match=r"^table kind 'scale' has shape 'own', which a Table has not"):
        render(dataclasses.replace(build_table(load_runs(csv), get_kind("losses")), kind="scale"), "md")


@pytest.mark.unit
def test_the_renderers_and_the_report_ask_a_kind_s_attributes_never_its_name():
    """No comparison of a kind's name (`table.kind == "losses"`) and no table looked up by a kind's name
    (`ctx.tables["paired"]`) in the modules that lay out and write the tables, and build_table is handed the kind
    itself by every caller in the library."""
    readers = [REPO / "ablate" / "analysis" / f for f in ("render.py", "report.py", "lr_report.py", "tuned.py",
                                                          "hypotheses.py")]
    for path in [*readers, REPO / "ablate" / "cli" / "analysis.py"]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                assert not any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides), \
                    f"{path.name}:{node.lineno} compares a kind's name"
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                assert getattr(node.value, "attr", None) != "tables", f"{path.name}:{node.lineno} looks a table up"
    for path in (REPO / "ablate").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "build_table" and len(node.args) > 1:
                kind = node.args[1]
                assert not isinstance(kind, ast.Constant) and getattr(kind, "attr", None) != "name", \
                    f"{path.name}:{node.lineno} hands build_table a kind's name"


@pytest.mark.unit
def test_a_row_s_two_arms_are_read_by_the_kind_s_pairs_attribute():
    """Holm's family and the diverged-seed count match a row to its two arms by its kind's `pairs`, not its name: a
    new kind that pairs like the paired table is matched as it is."""
    from ablate.analysis.hypotheses import row_pair
    from ablate.analysis.kinds import REFERENCE_ARM, TableKind
    from ablate.analysis.tables import Table

    mine = TableKind("mine-vs-reference", "t", "e", "h", pairs=REFERENCE_ARM)
    assert mine.row_pair("baseline", {"arm": "sink-logit"}) == ("baseline", "sink-logit")
    assert get_kind("increments").row_pair(None, {"quantity": "zero_option"}) == ("baseline", "sink-logit")
    assert get_kind("declared").row_pair(None, {"minuend": "a", "subtrahend": "b"}) == ("a", "b")
    assert get_kind("losses").row_pair("baseline", {"arm": "x"}) is None
    table = Table(kind="paired", key="arm", frame=None, name="x", reference="baseline", missing=None, excluded=None)
    assert row_pair(table, {"arm": "g1"}) == ("baseline", "g1")


@pytest.mark.unit
def test_the_table_handler_resolves_source_once_for_all_its_paths():
    """`ablate table`: SOURCE's experiment and folder are resolved in one place (table_command), whichever path then
    makes the table (by item, the LR sweep's or the tuned one, the kind's own); each path used to resolve them."""
    tree = ast.parse((REPO / "ablate" / "cli" / "analysis.py").read_text())
    handler = ("table_command", "_kind_command", "_lr_command", "_by_item")
    calls = [getattr(node.func, "id", None) for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
             and function.name in handler for node in ast.walk(function) if isinstance(node, ast.Call)]
    assert calls.count("named_experiment") == 1 and calls.count("results_of") == 1, calls


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
    code = "import ablate.arms.names, sys\nprint(sorted(m for m in ('torch', 'lightning_fabric') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
