"""`ablate status` with a 300-character experiment name is one line naming the limit (minor item), not
`OSError: File name too long`."""

from ablate.cli import main
import pytest

pytestmark = pytest.mark.unit


def test_status_with_an_over_long_experiment_name_is_one_line(tmp_path, capsys):
    for name in ("x" * 300, str(tmp_path / ("y" * 300 + ".py"))):
        assert main(["status", name, "--results", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "invalid experiment name" in err and "characters" in err and "at most" in err
