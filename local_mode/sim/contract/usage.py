"""What the grants guards allowed, written by each test process and read by the reports:
the statements no run used (least privilege) and each function's operations
(docs/aws-contract.md's table).

``GRANTS_USAGE_DIR=<dir> make test`` (any run of the tests) leaves one JSON file per process
in ``<dir>``; ``python -m local_mode.sim.contract grants --unused <dir>`` /
``--operations <dir>`` aggregate them.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from . import grants_file
from .grants import USAGE, Usage, statement_id


def write_usage(directory: Path, usage: Usage = USAGE) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"grants-usage-{os.getpid()}.json"
    path.write_text(json.dumps({
        "statements": sorted(usage.statements),
        "operations": [[*key, count] for key, count in sorted(usage.operations.items())],
    }))
    return path


def read_usage(directory: str | Path) -> Usage:
    usage = Usage()
    for path in sorted(Path(directory).glob("grants-usage-*.json")):
        data = json.loads(path.read_text())
        usage.statements.update(data["statements"])
        for *key, count in data["operations"]:
            usage.operations[(key[0], key[1], key[2], key[3], key[4])] += int(count)
    return usage


def all_statements(data: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(statement id, function entry, statement) of every statement of the grants file."""
    data = data or grants_file.read()
    found: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    for module, entry in data["functions"].items():
        for i, statement in enumerate(entry["statements"]):
            found.append((statement_id(module, i), entry, statement))
        for variant, by_module in data.get("variants", {}).items():
            for i, statement in enumerate(by_module.get(module, [])):
                found.append((statement_id(module, i, variant), entry, statement))
    return found


def unused_report(usage: Usage, data: dict[str, Any] | None = None) -> str:
    """The statements no run used, per function."""
    lines = ["Grants no run used (function: statement: actions on resources):"]
    count = 0
    for sid, entry, statement in all_statements(data):
        if sid in usage.statements:
            continue
        count += 1
        actions = ", ".join(statement.get("Action", statement.get("NotAction", [])))
        resources = ", ".join(statement.get("Resource", statement.get("NotResource", [])))
        lines.append(f"  {entry['function']}: {statement.get('Sid') or sid}: {actions} on {resources}")
    lines.append(f"{count} statement(s) unused of {len(all_statements(data))}")
    return "\n".join(lines)


def operations_report(usage: Usage, data: dict[str, Any] | None = None) -> str:
    """Markdown: function | operation | IAM action | resource form | statement (Sid)."""
    data = data or grants_file.read()
    sids = {sid: statement.get("Sid") or sid for sid, _, statement in all_statements(data)}
    names = {module: entry["function"] for module, entry in data["functions"].items()}
    rows: dict[tuple[str, str, str, str], Counter[str]] = defaultdict(Counter)
    for (module, operation, action, form, sid), count in usage.operations.items():
        rows[(names.get(module, module), operation, action, form)][sids.get(sid, sid)] += count
    lines = ["| function | operation | IAM action | resource | allowed by |", "|---|---|---|---|---|"]
    for (function, operation, action, form), by in sorted(rows.items()):
        lines.append(f"| {function} | {operation} | {action} | `{form}` | {', '.join(sorted(by))} |")
    return "\n".join(lines)
