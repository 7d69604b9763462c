"""docs/aws-contract.md keeps up with the contract it documents (no moto, no synthesis):

* every operation the request guard covers (``prose_limits.OPERATIONS``) has a row in one of
  the page's operation tables (a table whose first column is ``Operation``);
* every IAM action ``grants.json`` grants a function (its statements, its variants' and what
  Lambda does with its role) is named in one of the page's tables;
* every function of ``grants.json`` is in the page's function table with its handler module;
* every test the page names (``tests/<file>.py::<name>``) exists: the file is there and
  defines ``<name>``; every repository file it quotes exists.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from local_mode.sim.contract import prose_limits

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "aws-contract.md"
GRANTS = REPO / "local_mode" / "sim" / "contract" / "grants.json"
#: a backticked ``service:Action`` in a table cell
ACTION = re.compile(r"`([a-z0-9-]+:[A-Z][A-Za-z0-9]+)`")
TEST_REFERENCE = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")
QUOTED_PATH = re.compile(r"`((?:lambdas|local_mode|tests|cli|infra|bench|docs)/[\w./-]+\.(?:py|json|md))`")
HANDLER_MODULE = re.compile(r"`lambdas/handlers/(\w+)\.py`")


def cells(line: str) -> list[str]:
    """The cells of a Markdown table row (``| a | b |``)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(markdown: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of ``markdown`` outside code blocks: (header cells, data rows' cells)."""
    found: list[tuple[list[str], list[list[str]]]] = []
    lines: list[str] = []
    in_code = False
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            lines.append(line)
            continue
        if len(lines) >= 2 and re.fullmatch(r"[\s|:-]+", lines[1]):
            found.append((cells(lines[0]), [cells(row) for row in lines[2:]]))
        lines = []
    return found


@cache
def page() -> str:
    return PAGE.read_text()


@cache
def grants() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GRANTS.read_text())
    return data


def documented_operations(markdown: str) -> set[str]:
    """The ``service:Operation`` of each row of the operation tables (first column)."""
    return {match for header, rows in tables(markdown) if header and header[0] == "Operation"
            for row in rows for match in ACTION.findall(row[0])}


def named_actions(markdown: str) -> set[str]:
    """Every backticked ``service:Action`` in any table cell of the page."""
    return {match for _, rows in tables(markdown) for row in rows for cell in row
            for match in ACTION.findall(cell)}


def granted_actions(data: dict[str, Any]) -> dict[str, set[str]]:
    """IAM action -> the functions granted it (statements, variants, platform needs)."""
    found: dict[str, set[str]] = {}
    for module, entry in data["functions"].items():
        statements = list(entry["statements"])
        for variant in data.get("variants", {}).values():
            statements += variant.get(module, [])
        actions = [a for s in statements for a in s.get("Action", [])]
        actions += [need["action"] for need in entry.get("platform", [])]
        for action in actions:
            found.setdefault(action, set()).add(entry["function"])
    return found


def missing_tests(markdown: str, root: Path) -> list[str]:
    """The ``file::name`` references whose file is absent or does not define ``name``."""
    missing = []
    for path, name in sorted(set(TEST_REFERENCE.findall(markdown))):
        source = root / path
        defined = re.compile(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", re.MULTILINE)
        if not source.is_file() or not defined.search(source.read_text()):
            missing.append(f"{path}::{name}")
    return missing


def test_every_operation_the_request_guard_covers_has_a_row() -> None:
    documented = documented_operations(page())
    missing = sorted(set(prose_limits.OPERATIONS) - documented)
    assert not missing, f"docs/aws-contract.md has no row for: {missing}"
    unknown = sorted(documented - set(prose_limits.OPERATIONS))
    assert not unknown, f"docs/aws-contract.md has rows the request guard does not list: {unknown}"


def test_every_granted_action_is_named_in_a_table() -> None:
    named = named_actions(page())
    missing = {action: sorted(functions) for action, functions in granted_actions(grants()).items()
               if action not in named}
    assert not missing, f"grants.json grants actions docs/aws-contract.md does not name: {missing}"


def test_every_function_is_in_the_function_table_with_its_handler_module() -> None:
    [(_, rows)] = [t for t in tables(page()) if t[0][:2] == ["Function", "Handler module"]]
    listed = {row[0]: module for row in rows for module in HANDLER_MODULE.findall(row[1])}
    deployed = {entry["function"]: module for module, entry in grants()["functions"].items()}
    assert listed == deployed, {"missing or wrong": sorted(set(deployed.items()) - set(listed.items())),
                                "not deployed": sorted(set(listed.items()) - set(deployed.items()))}
    assert all((REPO / "lambdas" / "handlers" / f"{module}.py").is_file() for module in listed.values())


def test_every_test_and_file_the_page_names_exists() -> None:
    assert len(TEST_REFERENCE.findall(page())) > 40
    missing = missing_tests(page(), REPO)
    assert not missing, f"docs/aws-contract.md names tests that do not exist: {missing}"
    absent = sorted({path for path in QUOTED_PATH.findall(page()) if not (REPO / path).exists()})
    assert not absent, f"docs/aws-contract.md quotes files that do not exist: {absent}"


def test_the_checks_find_a_missing_row_action_and_test(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_here() -> None:\n    pass\n")
    text = ("| Operation | Proved by |\n| --- | --- |\n"
            "| `ecs:StopTask` | tests/test_x.py::test_here; tests/test_x.py::test_gone |\n\n"
            "```\n| `ecs:StartTask` | in a code block |\n```\n"
            "| Action | Why |\n|---|---|\n| `iam:PassRole` | StartTask's roles |\n")
    assert documented_operations(text) == {"ecs:StopTask"}
    assert named_actions(text) == {"ecs:StopTask", "iam:PassRole"}
    assert missing_tests(text, tmp_path) == ["tests/test_x.py::test_gone"]
    data = {"functions": {"m": {"function": "F", "statements": [{"Action": ["ecs:StopTask"]}],
                                "platform": [{"action": "xray:PutTraceSegments"}]}},
            "variants": {"v": {"m": [{"Action": ["autoscaling:TerminateInstanceInAutoScalingGroup"]}]}}}
    assert set(granted_actions(data)) == {"ecs:StopTask", "xray:PutTraceSegments",
                                          "autoscaling:TerminateInstanceInAutoScalingGroup"}
