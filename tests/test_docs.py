"""The README is for users: short, and every link in it (and in docs/) resolves."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")


def github_anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub renders them (lowercase, punctuation dropped, spaces -)."""
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not in code blocks
    return LINK.findall(text)


def test_readme_is_shorter_than_12_kb() -> None:
    assert len(README.read_bytes()) < 12_000


def test_readme_quick_start_and_sections() -> None:
    text = README.read_text()
    for needed in ("make demo", "make test", "make synth", "make deploy", "## Deploy", "## Configure",
                   "## Operate", "## Code map", "## Security", "docs/security.md", "make test-all",
                   "gpu-recovery-admin doctor"):
        assert needed in text, needed


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_link_resolves(path: Path) -> None:
    """Relative links name an existing file (and an existing heading when they carry an
    anchor); web links are well-formed https URLs (checked offline)."""
    broken = []
    for target in links(path):
        if target.startswith(("http://", "https://")):
            if not re.match(r"^https://[\w.-]+\.[a-z]{2,}(/\S*)?$", target):
                broken.append(target)
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved.read_text()):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_readme_links_every_doc() -> None:
    """Every page in docs/ is reachable from the README (directly or through a linked page)."""
    reachable: set[Path] = set()
    todo = [README]
    while todo:
        page = todo.pop()
        for target in links(page):
            file_part = target.partition("#")[0]
            if not file_part or file_part.startswith("http"):
                continue
            resolved = (page.parent / file_part).resolve()
            if resolved.suffix == ".md" and resolved.exists() and resolved not in reachable:
                reachable.add(resolved)
                todo.append(resolved)
    assert {d.resolve() for d in DOCS} <= reachable, {d.name for d in DOCS} - {r.name for r in reachable}


CODE_MAP_NAME = re.compile(r"`([\w*./-]+(?:\.py|/))`")
SKIPPED_PARTS = {".venv", "node_modules", ".git", "cdk.out", "__pycache__"}


def code_map_names(markdown: str) -> list[str]:
    """The module and folder names the README's code map section quotes (``foo.py``, ``bar/``)."""
    section = markdown.split("## Code map", 1)[1].split("\n## ", 1)[0]
    return CODE_MAP_NAME.findall(section)


def missing_from_tree(names: list[str], root: Path) -> list[str]:
    """The quoted names no file (``x.py``, globs allowed) or folder (``x/``) under ``root`` matches."""
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_PARTS]
        paths += [Path(folder, name) for name in [*dirs, *files]]
    return [name for name in names
            if not any(p.is_dir() == name.endswith("/") and p.match(name.rstrip("/")) for p in paths)]


def test_the_code_map_names_only_what_exists() -> None:
    """Given the README's code map
    When each module or folder it quotes is looked up in the repository
    Then each exists (a module moved or deleted must leave the map too)."""
    names = code_map_names(README.read_text())
    assert len(names) > 20, names
    missing = missing_from_tree(names, REPO)
    assert not missing, f"the README's code map names what is not in the tree: {missing}"


def test_the_code_map_check_finds_a_missing_module(tmp_path: Path) -> None:
    (tmp_path / "local_mode" / "sim").mkdir(parents=True)
    (tmp_path / "local_mode" / "sim" / "ecs_cluster.py").write_text("")
    text = "## Code map\n- `local_mode/`: `scale_sim.py` (gone), `ecs_cluster*.py`, `sim/`\n## Security\n"
    names = code_map_names(text)
    assert names == ["local_mode/", "scale_sim.py", "ecs_cluster*.py", "sim/"]
    assert missing_from_tree(names, tmp_path) == ["scale_sim.py"]
