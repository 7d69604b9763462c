"""The README is for users: short, and every link in it (and in docs/) resolves."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
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


# docs/data-flow.md follows the gpu_fault campaign's unbroken run call by call: its tables'
# "#" column is the call's index in that run, so the numbers drift whenever the run gains or
# loses a call. These tests run the flow once and hold every row to it.
DATA_FLOW = REPO / "docs" / "data-flow.md"
CALL_NUMBERS = re.compile(r"^(\d+)(?:-(\d+))?$")
# `GetItem` (DynamoDB) or **ECS `StopTask`** (another service), maybe followed by a times sign and a count
NAMED_CALL = re.compile(r"(?:\*\*([A-Za-z0-9 ]+?) )?`([A-Z][A-Za-z0-9]+)`(?:\*\*)?(?: \u00d7(\d+))?")
SERVICES = {None: "dynamodb", "ECS": "ecs", "EC2": "ec2", "SNS": "sns", "CloudWatch Logs": "cloudwatch-logs"}


@dataclass(frozen=True)
class FlowRow:
    first: int
    last: int
    calls: tuple[tuple[str, str], ...]  # (service, operation) in the order the row names them
    text: str


def flow_rows(markdown: str) -> list[FlowRow]:
    """The rows of the tables whose header starts ``| # | call |``: their call numbers (a
    range ``a-b`` or one number) and the calls their ``call`` column names."""
    rows, in_table = [], False
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells[:2] == ["#", "call"]:
            in_table = True
            continue
        if not cells:
            in_table = False
        if not in_table or set(cells[0]) <= {"-"}:
            continue
        numbers = CALL_NUMBERS.match(cells[0])
        assert numbers, f"a '#' that is not a number or a range: {line}"
        named: list[tuple[str, str]] = []
        for label, operation, times in NAMED_CALL.findall(cells[1]):
            assert (label or None) in SERVICES, f"unknown service {label!r}: {line}"
            named += [(SERVICES[label or None], operation)] * int(times or 1)
        first = int(numbers.group(1))
        rows.append(FlowRow(first, int(numbers.group(2) or first), tuple(named), line))
    return rows


def is_subsequence(named: tuple[tuple[str, str], ...], made: list[tuple[str, str]]) -> bool:
    remaining = iter(made)
    return all(call in remaining for call in named)


def row_problems(rows: list[FlowRow], calls: list[tuple[str, str]]) -> list[str]:
    """What the rows get wrong about ``calls`` (the run's (service, operation), index 1 first):
    a row's first and last named calls are the run's at its first and last number, the calls
    it names come in that order in between (the ones it leaves out: tokens of the ECS budget,
    re-reads), and the numbers only grow down the page."""
    problems, previous = [], 0
    for row in rows:
        made = calls[row.first - 1:row.last]
        if not row.calls:
            problems.append(f"names no call: {row.text}")
        elif not previous < row.first <= row.last <= len(calls):
            problems.append(f"numbers out of order or past the run's {len(calls)} calls: {row.text}")
        elif (row.calls[0] != made[0] or row.calls[-1] != made[-1] or not is_subsequence(row.calls, made)
              or (row.first == row.last and len(row.calls) != 1)):
            problems.append(f"the run makes {made} at {row.first}-{row.last}: {row.text}")
        previous = row.last
    return problems


@cache
def gpu_fault_calls() -> tuple[list[tuple[str, str]], list[str]]:
    """The unbroken gpu_fault run's calls: (service, operation) and the site of each."""
    from local_mode.campaigns import recovery  # the emulator only for the tests that need it

    run = recovery.run("gpu_fault")
    assert [c.index for c in run.calls] == list(range(1, len(run.calls) + 1))
    return [(c.service, c.operation) for c in run.calls], [c.site for c in run.calls]


def test_data_flow_rows_name_the_calls_the_run_makes() -> None:
    """Given docs/data-flow.md's call tables and the gpu_fault campaign's unbroken run
    When each row's numbers are looked up in the run
    Then the run makes there the calls the row names (a call added to the flow shows up here)."""
    rows = flow_rows(DATA_FLOW.read_text())
    assert len(rows) > 40, rows
    calls, _ = gpu_fault_calls()
    problems = row_problems(rows, calls)
    assert not problems, "docs/data-flow.md's '#' drifted from the run:\n" + "\n".join(problems)


def test_data_flow_totals_are_the_runs() -> None:
    """The intro's counts: the calls from the fault to the job RUNNING again (the last RUNNING
    event's), DynamoDB's share and every other call by operation, and the run's calls in all."""
    text = " ".join(DATA_FLOW.read_text().split())
    calls, sites = gpu_fault_calls()
    running = max(i for i, site in enumerate(sites, 1) if site.endswith(":_on_running"))
    intro = text.split("to the job RUNNING again", 1)[1].split("No `DescribeTasks`", 1)[0]
    assert number(r"\*\*(\d+) AWS calls\*\*", intro) == running
    until_running = calls[:running]
    dynamodb = sum(1 for service, _ in until_running if service == "dynamodb")
    assert number(r"(\d+) DynamoDB calls", intro) == dynamodb
    others = {op: int(n) for n, op in re.findall(r"(\d+) (?:[A-Za-z ]+ )?`([A-Z]\w+)`", intro)}
    assert others == dict(Counter(op for service, op in until_running if service != "dynamodb"))
    assert number(r"(\d+) calls in all", text) == len(calls)


def number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found, f"docs/data-flow.md no longer says {pattern!r}"
    return int(found[1])


def test_the_row_check_finds_a_drifted_number() -> None:
    calls = [("dynamodb", "GetItem"), ("dynamodb", "UpdateItem"), ("ecs", "StopTask"),
             ("dynamodb", "UpdateItem")]
    text = ("| # | call | item |\n|---|---|---|\n"
            "| 1-3 | `GetItem`, **ECS `StopTask`** | x |\n| 4 | `UpdateItem` | y |\n\nafter\n"
            "| 9 | `Query` | not a call table |\n")
    rows = flow_rows(text)
    assert [(r.first, r.last, r.calls) for r in rows] == [
        (1, 3, (("dynamodb", "GetItem"), ("ecs", "StopTask"))), (4, 4, (("dynamodb", "UpdateItem"),))]
    assert row_problems(rows, calls) == []
    shifted = row_problems(flow_rows(text.replace("| 1-3 |", "| 2-4 |").replace("| 4 |", "| 5 |")), calls)
    assert len(shifted) == 2, shifted
    assert shifted[0].startswith("the run makes [('dynamodb', 'UpdateItem')"), shifted
    assert shifted[1].startswith("numbers out of order or past the run's 4 calls"), shifted
    assert row_problems(flow_rows(text.replace("| 1-3 |", "| 1-2 |")), calls)  # StopTask is 3
