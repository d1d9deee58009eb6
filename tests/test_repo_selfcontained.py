"""The repository stands on its own: nothing tracked points outside it, and its documents' links resolve.

Why: a fresh clone is all a user has. A reference to a file that lives only next to the author's
checkout (a specification, a design note, source notes) reads as documentation but leads nowhere;
the method is described in the repository's own `docs/`. The file list comes from `git ls-files`,
so the test sees exactly what a clone holds, and ignored or untracked files never count.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]

# Built from pieces so that this file does not contain what it forbids.
FORBIDDEN = ("../" + "shared", "SPEC" + ".md", "DESIGN" + ".md", "seeds" + "/0")

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def tracked_files() -> list[str]:
    result = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True)
    return [name for name in result.stdout.decode().split("\0") if name]


def documents() -> list[str]:
    return [name for name in tracked_files() if name == "README.md" or re.fullmatch(r"docs/.+\.md", name)]


def relative_links(text: str) -> list[str]:
    """Link targets outside code, without web addresses, mail addresses or in-page anchors."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


@pytest.mark.system
def test_no_tracked_file_refers_outside_the_repository():
    offenders = []
    for name in tracked_files():
        path = REPO / name
        if not path.is_file():  # deleted in the work tree but not yet in the index
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            offenders += [f"{name}:{number}: {needle}" for needle in FORBIDDEN if needle.encode() in line]
    assert not offenders, "tracked files refer to files outside the repository:\n" + "\n".join(offenders)


@pytest.mark.system
def test_readme_and_docs_links_point_to_tracked_files():
    tracked = set(tracked_files())
    folders = {parent.as_posix() for name in tracked for parent in Path(name).parents}
    docs = documents()
    assert "README.md" in docs and "docs/method.md" in docs
    broken = []
    for doc in docs:
        for target in relative_links((REPO / doc).read_text(encoding="utf-8")):
            try:
                relative = ((REPO / doc).parent / target).resolve().relative_to(REPO.resolve()).as_posix()
            except ValueError:  # outside the repository
                relative = None
            if relative not in tracked and relative not in folders:
                broken.append(f"{doc}: ({target})")
    assert not broken, "links to files that a clone does not have:\n" + "\n".join(broken)


@pytest.mark.unit
def test_the_link_check_would_catch_a_broken_link():
    text = "See [the method](docs/method.md#arms), [web](https://example.org), `[code](nowhere.md)`,\n" \
           "```\n[fenced](nowhere.md)\n```\n![figure](img/missing.png) and [anchor](#top)."
    assert relative_links(text) == ["docs/method.md", "img/missing.png"]


@pytest.mark.unit
def test_the_run_options_page_lists_exactly_the_run_options_resolve_config_accepts():
    """docs/run-options.md's "Run options" section names every key `ablate.train.resolve_config` accepts, and no
    other."""
    from ablate.experiment import RunSpec
    from ablate.train import resolve_config

    text = (REPO / "docs" / "run-options.md").read_text(encoding="utf-8")
    section = re.search(r"^## Run options\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "docs/run-options.md lost its 'Run options' section"
    listed = set(re.findall(r"^[-*] `([a-z_]+)`", section.group(1), re.M))
    from ablate.runconfig import implied_values

    # config.json's keys, and the options a config without the key ran with a value of (unset, `document_mask` is
    # not written: a run without it ran unmasked)
    accepted = set(resolve_config(RunSpec("adhoc", "smoke", "baseline", 0)).to_dict()) | {"max_steps"}
    accepted |= set(implied_values())
    assert listed == accepted, (f"missing from docs/run-options.md: {sorted(accepted - listed)}; "
                                f"not accepted: {sorted(listed - accepted)}")
