"""`ablate generate RUN --prompt … --tokens N`: a trained corpus run decodes GPT-2 text through its KV cache, greedy by
default and reproducibly sampled for a seed; a task tier's run and an arm that cannot decode are refused in one line."""

import json

from ablate.store import run_dir
from tests.datafix import ablate_cli
import pytest

pytestmark = pytest.mark.system


def test_generate_decodes_greedily_and_samples_by_seed_and_refuses_what_it_cannot(tmp_path, finished_runs,
                                                                                 monkeypatch):
    from ablate.arms import get_arm
    from ablate.data import decode, encode
    from ablate.modelio import generate_from_run

    results = finished_runs(tmp_path, ("baseline", 0))
    folder = run_dir(results, "study", "smoke", "baseline", 0)
    greedy = ablate_cli("generate", folder, "--prompt", "The cat", "--tokens", 5, "--device", "cpu", process=True)
    ids, new = generate_from_run(folder, "The cat", 5)
    assert ids == encode("The cat") and len(new) == 5 and greedy.stdout == "The cat" + decode(new) + "\n"
    assert generate_from_run(folder, "The cat", 5) == (ids, new)  # greedy: the same every time
    sampled = [generate_from_run(folder, "The cat", 8, temperature=1.0, seed=s)[1] for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]

    monkeypatch.setattr(get_arm("baseline"), "no_decoding", "its state lives outside the cache")
    refused = ablate_cli("generate", folder, "--prompt", "The cat", check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "ablate: error: arm 'baseline' cannot be decoded with a KV cache: its state lives outside the cache; score "
        "whole sequences instead (no cache)"]
    monkeypatch.undo()

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tier": "abstain-stream"}))
    task = ablate_cli("generate", folder, "--prompt", "The cat", check=False)
    assert task.returncode == 2 and len(task.stderr.strip().splitlines()) == 1
    assert "a run of the task tier 'abstain-stream'" in task.stderr and "decodes corpus runs only" in task.stderr
