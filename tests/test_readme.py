"""The README and the docs/ pages run as written: every command of their bash blocks parses (its experiment exists,
its make target, file or extra too), the `plan` lines run, and the examples run where they landed (the custom arm
and the submit preview here, the task-data files in docs/evals.md); the README's shape; what `make demo` installs."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest

from datafix import REPO, ablate_cli, ablate_on_path

PAGES = ("cluster", "trust", "power", "lr-sweeps", "testbed", "probes", "evals", "run-options", "gpu", "results",
         "architecture")  # the README's topics, one docs/ page each (docs/method.md beside them)


def documents() -> list:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def example_block(name: str, language: str = "bash") -> str:
    """The block marked `<!-- example: NAME ... -->`, in whichever document holds it (exactly one)."""
    found = [m.group(1) for path in documents() for m in
             re.finditer(rf"<!-- example: {name}\b.*?-->\s*```{language}\n(.*?)```", path.read_text(), re.S)]
    assert len(found) == 1, f"the {name} example is in {len(found)} documents, not one"
    return found[0]


def bash_commands(path) -> list[str]:
    """Each command of the page's bash blocks as a user types it: comments, heredoc bodies and `&&` chains split."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        block = re.sub(r"<<'EOF'\n.*?\nEOF", "<<'EOF'", block, flags=re.S)
        for line in block.splitlines():
            commands += [part.strip() for part in line.split("  #", 1)[0].split("&&") if part.strip()]
    return commands


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"<!-- example: custom-arm.*?-->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its custom-arm example"
    return match.group(1)


@pytest.mark.unit
def test_the_readme_is_short_and_leads_with_the_three_jobs_then_one_line_per_topic():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[:4] == ["What it is for", "1. Submit a grid and watch it", "2. Paired tables",
                            "3. Register a new arm"], sections
    topics = text.split("## More, one page per topic", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"^- \[[^\]]+\]\(docs/([\w-]+)\.md\)", topics, re.M)
    assert set(PAGES) <= set(linked) and len(linked) == len(set(linked)), linked
    assert all((REPO / "docs" / f"{page}.md").is_file() for page in linked)
    for block in ("submit", "custom-arm"):  # the jobs' worked examples stay in the README itself
        assert f"<!-- example: {block}" in text


@pytest.mark.unit
def test_every_command_in_the_readme_and_docs_parses_as_written():
    """Every `ablate` line of a bash block parses with the real parser, no argument left over, and the experiment
    it names exists; every other line names a make target, a file, a command or an extra that exists."""
    from ablate.cli import build_parser
    from ablate.experiment import load_experiment

    parser = build_parser()
    makefile = (REPO / "Makefile").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    checked = 0
    for path in documents():
        for command in bash_commands(path):
            words = shlex.split(command.split("<<", 1)[0])
            where = f"{path.relative_to(REPO)}: {command}"
            if words[0] == "ablate":
                try:
                    args, extra = parser.parse_known_args(words[1:])
                except SystemExit:
                    pytest.fail(f"does not parse: {where}")
                assert not extra and getattr(args, "func", None), where
                named = next((getattr(args, k) for k in ("experiment", "source", "target") if getattr(args, k, None)),
                             None)
                grid = args.command in ("plan", "submit", "status", "table", "report", "clean", "eval", "arms")
                if grid and isinstance(named, str) and not re.search(r"[/.]", named):
                    load_experiment(named)  # an unknown name raises, naming the valid ones
            elif words[0] == "make":
                assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), where
            elif words[0] == "cp":
                assert (REPO / words[1]).is_file(), where
            elif words[0] == "pip":
                assert words[1:3] == ["install", "-e"] and re.fullmatch(r"\.\[(\w+)\]", words[3]), where
                assert re.fullmatch(r"\.\[(\w+)\]", words[3]).group(1) in extras, where
            else:
                known = ("mkdir", "cat", "tensorboard", "wandb")
                assert words[0] in known, "a command this test does not know: " + where
            checked += 1
    assert checked >= 40


@pytest.mark.unit
def test_the_plan_commands_of_the_readme_and_docs_run_as_written(capsys):
    """`ablate plan` needs no data and no run: each such line (but a pilot's, which reads a results folder of
    one's own) runs as written and exits 0."""
    from ablate.cli import main

    plans = [c for path in documents() for c in bash_commands(path) if c.startswith("ablate plan ")
             and "--pilot" not in c]
    assert len(plans) >= 4
    for command in plans:
        assert main(shlex.split(command)[1:]) == 0, (command, capsys.readouterr().err[-2000:])
        capsys.readouterr()


@pytest.mark.unit
def test_readme_shows_the_two_commands_first():
    text = (REPO / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "make demo" in first_block and "make test" in first_block


@pytest.mark.system
def test_custom_arm_example_runs_as_written(tmp_path, sample_data):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 30
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(sample_data)
    (tmp_path / "my_arm.py").write_text(code)
    # the results default is the checkout's results/ from any folder ($ABLATE_RESULTS moves it): here, the test's own
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ABLATE_RESULTS": str(tmp_path / "results")}
    result = subprocess.run([sys.executable, "my_arm.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    status, val_loss, extra = result.stdout.split()[-3:]
    assert status == "completed" and float(val_loss) < 10.8 and int(extra) == 2 * 2  # 2 layers × 2 heads
    assert (tmp_path / "results" / "adhoc" / "smoke" / "learned-alibi" / "seed0" / "summary.json").is_file()


def readme_block(name: str) -> str:
    return example_block(name)


@pytest.mark.unit
def test_what_make_demo_installs_covers_the_readme_s_tensorboard_logger():
    makefile = (REPO / "Makefile").read_text()
    base = re.search(r"^\$\(BASE\):.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    installs = re.findall(r"pip install -q -e '?\.(?:\[([\w,]+)\])?'?", base)
    assert "tensorboard" in ",".join(installs).split(","), base  # `ablate run ... --logger tensorboard` after make demo
    assert re.search(r"^demo: \$\(BASE\)", makefile, re.M)
    readme = (REPO / "README.md").read_text()
    assert "--logger tensorboard" in readme and "pip install -e '.[eval]'" in readme  # eval: the extra, named
    assert "--logger tensorboard" in bash_commands(REPO / "docs" / "run-options.md")[0]


@pytest.mark.unit
def test_the_readme_s_task_data_example_has_the_columns_ablate_eval_reads():
    from ablate.evals.tasks import TASKS

    block = readme_block("task-data")
    files = dict(re.findall(r"cat > tasks/(\w+)\.jsonl <<'EOF'\n(.*?)\nEOF", block, re.S))
    assert set(files) == {"lambada_openai", "wikitext"}
    for task, body in files.items():
        for line in body.splitlines():  # one JSON object per line, in the Hub dataset's columns
            assert tuple(json.loads(line)) == TASKS[task][1], (task, line)
    assert "--task-data tasks" in block and "--tasks lambada_openai wikitext" in block


@pytest.mark.system
def test_the_readme_s_submit_preview_runs_as_written_and_needs_the_profile_copied(tmp_path, sample_data):
    lines = [line.split("  #", 1)[0].strip() for line in readme_block("submit").strip().splitlines()]
    assert lines[0] == "cp slurm/example.toml slurm/mycluster.toml" and "--data data/sample" in lines[2]
    (tmp_path / "slurm").mkdir()
    shutil.copy(REPO / "slurm" / "example.toml", tmp_path / "slurm")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(sample_data)
    env = ablate_on_path(tmp_path)

    def sh(line):
        return subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    def here(line):  # the same `ablate` command in this process (the preview itself runs as typed, below)
        return ablate_cli(*shlex.split(line)[1:], cwd=tmp_path, check=False)

    before = here(lines[2])  # without the copied profile: refused, one line naming the profiles there are
    assert (before.returncode != 0 and "unknown profile 'mycluster'" in before.stderr
            and "Traceback" not in before.stderr)
    for line in lines[:3]:
        result = here(line) if line.startswith("ablate plan") else sh(line)
        assert result.returncode == 0, (line, result.stderr[-2000:])
    assert "27 of 27 runs would be submitted" in result.stdout and "124M/combo2/seed2" in result.stdout
    refused = here(lines[4])  # the real dry run: refused until FineWeb-Edu is prepared
    assert refused.returncode != 0 and "ablate data prepare" in refused.stderr


@pytest.mark.unit
def test_the_readme_says_how_to_reach_ablate_where_its_first_command_appears():
    """After `make demo` the command lives in .venv/bin, not on PATH: said once, before the first `ablate` line."""
    text = (REPO / "README.md").read_text()
    blocks = [m for m in re.finditer(r"```bash\n(.*?)```", text, re.S)]
    first = next(m.start() + m.group(1).index(line) for m in blocks for line in m.group(1).splitlines()
                 if line.startswith("ablate "))
    said = text.index(". .venv/bin/activate")
    assert blocks[0].end() < said < first and ".venv/bin/ablate" in text[said:first]
    assert text.count(". .venv/bin/activate") == 1


@pytest.mark.unit
def test_the_readme_s_eval_example_scores_a_pair_the_table_can_show():
    from ablate.cli import build_parser
    from ablate.experiment import load_experiment

    lines = readme_block("task-data").splitlines()
    parser = build_parser()
    evaluated = parser.parse_args(next(line for line in lines if line.startswith("ablate eval")).split()[1:])
    table = parser.parse_args(next(line for line in lines if line.startswith("ablate table")).split()[1:])
    experiment = load_experiment(evaluated.target)  # an experiment's grid, not one run folder
    arms = evaluated.arms or experiment.arm_names()
    assert "baseline" in arms and len(arms) >= 2 and table.source == experiment.name
    assert table.metric.split("/")[0] in evaluated.tasks


@pytest.mark.unit
def test_the_readme_s_gpu_section_is_short_and_says_what_the_code_does():
    """"On a GPU" (≤ 25 lines, details in docs/gpu.md): the command, the defaults on CUDA, each arm's path there, the
    plan's assumed MFU, and what has not run on a GPU; each claim read against the code that decides it."""
    import ablate.arms.testbed  # noqa: F401 (registers oracle-gate, as the testbed's file does)
    from ablate.arms import get_arm, list_arms
    from ablate.plan import ASSUMED_MFU
    from ablate.runconfig import RunConfig

    text = (REPO / "README.md").read_text()
    section = text.split("\n## On a GPU\n", 1)[1].split("\n## ", 1)[0]
    assert len(section.strip().splitlines()) <= 25 and "docs/gpu.md" in section
    cuda = RunConfig(tier="smoke", arm="baseline").with_device_defaults(True)
    assert cuda.precision == "bf16-mixed" and "`bf16-mixed`" in section
    assert RunConfig().compile is False and "`--compile` (`torch.compile`) is off unless asked" in section
    assert f"{ASSUMED_MFU:.0%} MFU" in section and "Nothing here has run on a GPU yet" in section
    ours = [name for name in list_arms() if get_arm(name).__module__.startswith("ablate.")]  # not a test's own
    flex = sorted(name for name in ours if get_arm(name).path("cuda") == "flex")
    assert flex == sorted(re.search(r"\(softcap[^)]*\)", section).group(0).strip("()").split(", "))
    page = (REPO / "docs" / "gpu.md").read_text()
    rows = re.findall(r"^\| ([a-z0-9, -]+) \| [^|]+ \| (fused|flex|reference)\b", page, re.M)
    listed = {arm: path for arms, path in rows for arm in arms.split(", ")}
    assert listed == {name: get_arm(name).path("cuda") for name in ours}  # every arm of the package, as it runs
