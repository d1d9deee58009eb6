"""The README's custom-arm example runs as written, and the README shows the two commands first."""

import os
import re
import subprocess
import sys

from datafix import REPO, sample_data  # noqa: F401  (fixture)


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"<!-- example: custom-arm.*?-->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its custom-arm example"
    return match.group(1)


def test_readme_shows_the_two_commands_first():
    text = (REPO / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "make demo" in first_block and "make test" in first_block


def test_custom_arm_example_runs_as_written(tmp_path, sample_data):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 30
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(sample_data)
    (tmp_path / "my_arm.py").write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "my_arm.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    status, val_loss, extra = result.stdout.split()[-3:]
    assert status == "completed" and float(val_loss) < 10.8 and int(extra) == 2 * 2  # 2 layers × 2 heads
    assert (tmp_path / "results" / "adhoc" / "smoke" / "scalar-gate" / "seed0" / "summary.json").is_file()
