"""Parameters generated from botocore shapes for tests/local_mode/test_param_validation.py: a
valid value of every member (nested structures, lists, maps), then variants of it, each with
one thing botocore's validator reports (or deliberately accepts) changed at one place, and one
per structure with everything at that level wrong at once (the errors' order)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from botocore.utils import is_json_value_header

MAX_DEPTH = 5  # past it a structure gets its required members only (recursive shapes end)
_UNSERIALIZABLE = {1, 2}  # json.dumps refuses a set


def _minimum(shape: Any) -> int | float | None:
    return shape.metadata.get("min")


def valid(shape: Any, depth: int = 0) -> Any:
    """A value botocore accepts for ``shape`` (every member set, lists and maps of two)."""
    if is_json_value_header(shape):
        return {"attributes": [1, "two", None]}
    kind = shape.type_name
    low = _minimum(shape)
    if kind == "structure":
        if shape.is_document_type:
            return {"k": [1, "s", 2.5, True, None, {"n": "v"}]}
        names = list(shape.members)
        if shape.is_tagged_union:
            names = names[:1]
        elif depth >= MAX_DEPTH:
            names = [n for n in names if n in shape.metadata.get("required", [])]
        return {name: valid(shape.members[name], depth + 1) for name in names}
    if kind == "list":
        count = max(2, int(low or 0))
        return [valid(shape.member, depth + 1) for _ in range(min(count, 40))]
    if kind == "map":
        key_length = max(1, int(_minimum(shape.key) or 0))
        return {"k" * key_length + str(i): valid(shape.value, depth + 1) for i in range(2)}
    if kind == "string":
        return "s" * max(3, int(low or 0))
    if kind in ("integer", "long"):
        return max(5, int(low or 0))
    if kind in ("double", "float"):
        return max(1.5, float(low or 0))
    if kind == "boolean":
        return True
    if kind == "blob":
        return b"blob"
    if kind == "timestamp":
        return datetime(2024, 1, 2, 3, 4, 5)
    return "unknown type"


def replacements(shape: Any) -> list[Any]:
    """Values put in place of a valid one of ``shape``: wrong types, too short, None, and
    accepted near-misses (a tuple for a list, a Decimal for a double, a file for a blob...)."""
    if is_json_value_header(shape):
        return [_UNSERIALIZABLE, object(), "a string", None]
    kind = shape.type_name
    low = _minimum(shape)
    found: list[Any] = [None]
    if kind == "structure":
        if shape.is_document_type:
            return [None, {"a": _UNSERIALIZABLE}, [object(), {"b": [b"x"]}], b"x", 7, "s",
                    {"ok": {"nested": [1, {"bad": Decimal("1")}]}}]
        found += ["x", [], {"not a member": 1}]
        if shape.is_tagged_union:
            found.append({})
            if len(shape.members) > 1:
                first, second = list(shape.members)[:2]
                found.append({first: valid(shape.members[first], MAX_DEPTH),
                              second: valid(shape.members[second], MAX_DEPTH)})
    elif kind == "list":
        found += ["x", {}, (), tuple(valid(shape, MAX_DEPTH)), [7, "s", None, b"b"]]
        if low:
            found.append([valid(shape.member, MAX_DEPTH)] * (int(low) - 1))
    elif kind == "map":
        value = valid(shape.value, MAX_DEPTH)
        found += [[], "x", {}, {"k": None}, {7: value}, {"": value}]
    elif kind == "string":
        found += [7, b"bytes", "", ["s"]]
        if low:
            found += ["s" * (int(low) - 1), "s" * int(low)]
    elif kind in ("integer", "long"):
        found += ["7", 7.5, True, Decimal("7")]
        if low is not None:
            found += [int(low) - 1, low]
    elif kind in ("double", "float"):
        found += ["x", Decimal("1.5"), 3, True]
        if low is not None:
            found += [low - 1, Decimal(low) - 1, low]
    elif kind == "boolean":
        found += ["true", 1, False]
    elif kind == "blob":
        found += [7, bytearray(b"x"), "str", io.BytesIO(b"x"), b""]
    elif kind == "timestamp":
        found += ["not a date", "2024-01-01T00:00:00Z", 1700000000, "1700000000", object(), [2024]]
    if shape.serialization.get("hostLabel"):
        found.append("")
    return found


def variants(shape: Any, value: Any, depth: int = 0) -> Iterator[Any]:
    """``value`` (valid for ``shape``) with one change at one place, then, per structure, all
    its members wrong at once; recursive down to MAX_DEPTH."""
    yield from replacements(shape)
    kind = shape.type_name
    if depth >= MAX_DEPTH or is_json_value_header(shape):
        return
    if kind == "structure" and not shape.is_document_type and isinstance(value, dict):
        members = shape.members
        for required in shape.metadata.get("required", []):
            yield {k: v for k, v in value.items() if k != required}
        yield {**value, "UnknownMember": 1}
        for name, member_value in value.items():
            for changed in variants(members[name], member_value, depth + 1):
                yield {**value, name: changed}
        everything_wrong = {"Unknown1": 1}
        for name in value:
            if name not in shape.metadata.get("required", []):
                options = replacements(members[name])
                everything_wrong[name] = options[1] if len(options) > 1 else options[0]
        everything_wrong["Unknown2"] = None
        yield everything_wrong
    elif kind == "list" and isinstance(value, list) and value:
        for changed in variants(shape.member, value[0], depth + 1):
            yield [changed, *value[1:], changed]
    elif kind == "map" and isinstance(value, dict) and value:
        first = next(iter(value))
        for key in replacements(shape.key):
            if key is None or isinstance(key, (str, bytes, int, float, Decimal)):  # hashable
                yield {key: value[first], **value}
        for changed in variants(shape.value, value[first], depth + 1):
            yield {**value, first: changed}
