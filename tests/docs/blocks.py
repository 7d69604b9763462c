"""The code blocks of the user documentation (README.md, cli/README.md, docs/*.md), each with
what the documentation tests do with it.

A block's *mode* comes from an HTML comment on the line before its fence (invisible once
rendered), else from its language:

* ``run`` (the default of ``bash`` / ``sh`` / ``python`` blocks): run as written, against
  the playground (shell) or as a program (Python); see ``runner.py``;
* ``<!-- doc-test: needs-aws: <why> -->``: needs an AWS account (a deployed stack, the AWS
  CLI): checked for syntax, and for naming only commands, options and context keys that
  exist (``names.py``), not run;
* ``<!-- doc-test: checked: <why> -->``: the same, for a block that runs elsewhere (e.g.
  the test suite running itself);
* ``<!-- doc-test: fragment: <why> -->``: Python that is part of a program (a training
  loop): compiled, and every attribute it takes from a module it imports must exist;
* ``<!-- doc-test: output -->``: what the ``run`` block before it prints: its stable lines
  (table headers, ``Label:`` names) must be in what that block printed;
* blocks of any other language (diagrams, JSON, YAML, query languages) are text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the pages whose blocks are tested, in the order a newcomer reads them
PAGES = ("README.md", "cli/README.md", "docs/playground.md",
         *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md") if p.name != "playground.md"))
MODES = ("run", "needs-aws", "checked", "fragment", "output", "text")
SHELL, PYTHON = ("bash", "sh", "shell", "console"), ("python", "py")
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # repository-relative path
    line: int  # the opening fence's line (1-based)
    lang: str
    mode: str
    reason: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELL

    @property
    def python(self) -> bool:
        return self.lang in PYTHON


def page_blocks(page: str, markdown: str | None = None) -> list[Block]:
    """Every fenced block of ``page`` with its mode (a bad marker raises ValueError)."""
    text = (REPO / page).read_text() if markdown is None else markdown
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, lang = opened.group(1), opened.group(2).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code block is never closed")
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                         for line in lines[i + 1:end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = MARKER.match(before)
        if marked:
            mode, reason = marked.group(1), marked.group(2) or ""
            if mode not in MODES:
                raise ValueError(f"{page}:{i + 1}: unknown doc-test mode {mode!r} "
                                 f"(modes: {', '.join(MODES)})")
        else:
            mode, reason = ("run" if lang in SHELL + PYTHON else "text"), ""
        blocks.append(Block(page, i + 1, lang, mode, reason, body))
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def inline_commands(page: str) -> list[tuple[int, str]]:
    """(line, text) of each inline code span (outside code blocks) that starts with one of the
    project's commands: ``gpujobs``, ``gpu-recovery-admin``, ``make``."""
    found = []
    in_block = False
    for number, line in enumerate((REPO / page).read_text().splitlines(), 1):
        if FENCE.match(line) or line.strip() == "```":
            in_block = not in_block
            continue
        if in_block:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"(gpujobs|gpu-recovery-admin|make) ", span + " "):
                found.append((number, span))
    return found
