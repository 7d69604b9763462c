"""What the request guard covers, for docs/aws-contract.md: every operation the stack calls,
the constraints of its input shape in botocore's model, the prose limits with their citations,
and (given a directory of ``GPU_RECOVERY_CONTRACT_SEEN`` records) how often a run made it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import botocore.session

from .prose_limits import OPERATIONS, limits_by_operation


@dataclass
class OperationCoverage:
    operation: str  # "ecs:StartTask"
    reviewed: str  # the API reference page reviewed for it
    model: list[str] = field(default_factory=list)  # "tags[].value: 0-256 characters, pattern ..."
    prose: list[tuple[str, str, str]] = field(default_factory=list)  # (member, rule, citation)
    calls: int | None = None  # in the runs recorded (None: no record given)


def _describe(shape: Any) -> str:
    md, parts = shape.metadata, []
    unit = {"string": "characters", "list": "items", "map": "entries", "blob": "bytes"}.get(shape.type_name)
    low, high = md.get("min"), md.get("max")
    if low is not None or high is not None:
        bounds = f"{low if low is not None else 0}-{high}" if high is not None else f">= {low}"
        parts.append(f"{bounds} {unit}" if unit else f"value {bounds}")
    if getattr(shape, "enum", None):
        parts.append("one of " + ", ".join(shape.enum))
    if md.get("pattern"):
        parts.append(f"pattern {md['pattern']}")
    return "; ".join(parts)


def _walk(shape: Any, path: str, seen: frozenset[str], depth: int) -> Iterator[str]:
    described = _describe(shape)
    if described and path:
        yield f"{path}: {described}"
    if shape.name in seen or depth > 4:
        return
    seen = seen | {shape.name}
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            yield from _walk(member, f"{path}.{name}" if path else name, seen, depth + 1)
    elif shape.type_name == "list":
        yield from _walk(shape.member, f"{path}[]", seen, depth + 1)
    elif shape.type_name == "map":
        yield from _walk(shape.key, f"{path}{{key}}", seen, depth + 1)
        yield from _walk(shape.value, f"{path}{{value}}", seen, depth + 1)


def coverage(seen: Counter[str] | None = None) -> list[OperationCoverage]:
    """Every operation of :data:`~.prose_limits.OPERATIONS` (and any other one ``seen``)."""
    session = botocore.session.get_session()
    prose = limits_by_operation()
    out = []
    for operation in sorted(set(OPERATIONS) | set(seen or ())):
        service, name = operation.split(":", 1)
        entry = OperationCoverage(operation, OPERATIONS.get(operation, "NOT REVIEWED"))
        shape = session.get_service_model(service).operation_model(name).input_shape
        if shape is not None:
            entry.model = list(_walk(shape, "", frozenset(), 0))
        entry.prose = [(limit.member, limit.rule, limit.citation) for limit in prose.get(operation, ())]
        if seen is not None:
            entry.calls = seen.get(operation, 0)
        out.append(entry)
    return out


def render(entries: list[OperationCoverage], *, model: bool = True) -> str:
    lines = []
    for entry in entries:
        calls = "" if entry.calls is None else f" ({entry.calls} calls recorded)"
        lines.append(f"{entry.operation}{calls}\n  reviewed: {entry.reviewed}")
        for member, rule, citation in entry.prose:
            lines.append(f"  prose: {member}: {rule}\n         [{citation}]")
        if model:
            lines.extend(f"  model: {line}" for line in entry.model)
    return "\n".join(lines)
