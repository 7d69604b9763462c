"""DynamoDB's limits that its API reference and its developer guide's "Constraints in Amazon
DynamoDB" state in prose, over a request in DynamoDB JSON (as botocore holds it after boto3's
mapping): item sizes (400 KB, by DynamoDB's item-size rules), key sizes, expression lengths,
batch and transaction sizes, one action an item.

An UpdateItem's resulting item is measured by the table itself: the emulator's DynamoDB (moto
or the in-memory store) refuses an item over 400 KB with a ValidationException, which the
request guard records as a violation however the code handles the error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from functools import lru_cache
from typing import Any

import regex

from .findings import Finding, ProseLimit, RequestState

CONSTRAINTS = "Amazon DynamoDB Developer Guide, Constraints in Amazon DynamoDB"
DDB_API = "Amazon DynamoDB API Reference"

MAX_ITEM_BYTES = 400 * 1024
MAX_PARTITION_KEY_BYTES = 2048
MAX_SORT_KEY_BYTES = 1024
MAX_EXPRESSION_BYTES = 4 * 1024
MAX_PLACEHOLDER_BYTES = 255
MAX_SUBSTITUTION_BYTES = 2 * 1024 * 1024
MAX_OPERATORS = 300
MAX_IN_OPERANDS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
MAX_BATCH_GET_KEYS = 100
MAX_BATCH_WRITE_REQUESTS = 25
MAX_BATCH_WRITE_BYTES = 16 * 1024 * 1024
EXPRESSIONS = (
    "ConditionExpression",
    "UpdateExpression",
    "KeyConditionExpression",
    "FilterExpression",
    "ProjectionExpression",
)


# ------------------------------------------------------------------------------ sizes
def _number_size(text: str) -> int:
    """1 byte per two significant digits, plus 1 (DynamoDB's rule for numbers)."""
    if "e" in text or "E" in text:
        significant = len(Decimal(text).normalize().as_tuple().digits)
    else:
        significant = len(text.lstrip("+-").replace(".", "").strip("0"))
    return (max(1, significant) + 1) // 2 + 1


def _binary_size(value: Any) -> int:
    if isinstance(value, bytes | bytearray):
        return len(value)
    try:
        return len(base64.b64decode(value))
    except (ValueError, TypeError):
        return len(str(value).encode())


def value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one attribute value in DynamoDB JSON, by DynamoDB's item-size rules."""
    kind, raw = next(iter(value.items()))
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        return _number_size(str(raw))
    if kind == "B":
        return _binary_size(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(s).encode()) for s in raw)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in raw)
    if kind == "BS":
        return sum(_binary_size(b) for b in raw)
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_size(v) for k, v in raw.items())
    return len(json.dumps(raw, default=str).encode())


def item_size(item: Mapping[str, Any]) -> int:
    """Bytes of an item in DynamoDB JSON: names plus values."""
    return sum(len(name.encode()) + value_size(v) for name, v in item.items() if isinstance(v, Mapping) and v)


def _within(item: Mapping[str, Any], limit: int) -> bool:
    """Certainly at most ``limit`` bytes: its JSON text (every string escaped, every number
    quoted, every map and list spelled out) is never shorter than its DynamoDB size."""
    try:
        return len(json.dumps(item, default=str)) <= limit
    except (TypeError, ValueError):
        return False


def _key_text(key: Mapping[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, default=str)


# ------------------------------------------------------------------------------ checks
def _key_sizes(
    member: str, table: str, key: Mapping[str, Any] | None, state: RequestState
) -> Iterator[Finding]:
    schema = state.key_schema(table) if key else None
    if not schema or not key:
        return
    for name, limit in ((schema[0], MAX_PARTITION_KEY_BYTES), (schema[1], MAX_SORT_KEY_BYTES)):
        if name is None or not isinstance(key.get(name), Mapping):
            continue
        size = value_size(key[name])
        if size > limit:
            yield Finding(
                f"{member}.{name}",
                f"{size} bytes",
                f"a {'partition' if limit > 1024 else 'sort'} key value of at most {limit} bytes",
            )


def _item(member: str, table: str, item: Mapping[str, Any] | None, state: RequestState) -> Iterator[Finding]:
    if not item:
        return
    size = 0 if _within(item, MAX_ITEM_BYTES) else item_size(item)
    if size > MAX_ITEM_BYTES:
        yield Finding(member, f"{size} bytes", f"an item of at most {MAX_ITEM_BYTES} bytes (400 KB)")
    yield from _key_sizes(member, table, item, state)


_FUNCTION = regex.compile(
    r"\b(attribute_exists|attribute_not_exists|attribute_type|begins_with|contains|size|"
    r"if_not_exists|list_append)\s*\(",
    regex.IGNORECASE,
)
_LOGICAL = regex.compile(r"\b(AND|OR|NOT|BETWEEN|IN)\b", regex.IGNORECASE)
_COMPARATOR = regex.compile(r"<>|<=|>=|=|<|>")
_ARITHMETIC = regex.compile(r"(?<=[\s)\w])[+-](?=[\s(:#\w])")
_IN_LIST = regex.compile(r"\bIN\s*\(([^)]*)\)", regex.IGNORECASE)


@lru_cache(maxsize=4096)
def operator_count(expression: str, *, update: bool) -> int:
    """Operators and functions of an expression (comparators, AND/OR/NOT, BETWEEN, IN, the
    functions, and + - of an update): a lower bound of DynamoDB's count."""
    count = len(_FUNCTION.findall(expression)) + len(_LOGICAL.findall(expression))
    count += len(_COMPARATOR.findall(expression)) if not update else 0
    if update:
        count += len(_ARITHMETIC.findall(expression))
    return count


@lru_cache(maxsize=4096)
def _widest_in(expression: str) -> int:
    return max((operands.count(",") + 1 for operands in _IN_LIST.findall(expression)), default=0)


def _expressions(prefix: str, params: Mapping[str, Any]) -> Iterator[Finding]:
    """Each expression up to 4 KB and 300 operators, IN up to 100 operands, placeholders up
    to 255 bytes, all substitution variables up to 2 MB."""
    for name in EXPRESSIONS:
        text = params.get(name)
        if not isinstance(text, str):
            continue
        size = len(text.encode())
        if size > MAX_EXPRESSION_BYTES:
            yield Finding(
                f"{prefix}{name}",
                f"{size} bytes",
                f"an expression of at most {MAX_EXPRESSION_BYTES} bytes (4 KB)",
            )
        operators = operator_count(text, update=name == "UpdateExpression")
        if operators > MAX_OPERATORS:
            yield Finding(
                f"{prefix}{name}",
                f"{operators} operators",
                f"at most {MAX_OPERATORS} operators or functions an expression",
            )
        widest = _widest_in(text)
        if widest > MAX_IN_OPERANDS:
            yield Finding(
                f"{prefix}{name}", f"IN with {widest} operands", f"at most {MAX_IN_OPERANDS} operands for IN"
            )
    names = params.get("ExpressionAttributeNames") or {}
    values = params.get("ExpressionAttributeValues") or {}
    for member, placeholders in (("ExpressionAttributeNames", names), ("ExpressionAttributeValues", values)):
        for placeholder in placeholders:
            if len(str(placeholder).encode()) > MAX_PLACEHOLDER_BYTES:
                yield Finding(
                    f"{prefix}{member}",
                    placeholder,
                    f"a placeholder of at most {MAX_PLACEHOLDER_BYTES} bytes",
                )
    total = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in names.items())
    total += sum(
        len(str(k).encode()) + value_size(v) for k, v in values.items() if isinstance(v, Mapping) and v
    )
    if total > MAX_SUBSTITUTION_BYTES:
        yield Finding(
            f"{prefix}ExpressionAttributeValues",
            f"{total} bytes of substitution variables",
            f"at most {MAX_SUBSTITUTION_BYTES} bytes (2 MB)",
        )


def _single(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    """GetItem, PutItem, UpdateItem, DeleteItem, Query, Scan: item, keys, expressions."""
    table = str(params.get("TableName", ""))
    yield from _item("Item", table, params.get("Item"), state)
    yield from _key_sizes("Key", table, params.get("Key"), state)
    yield from _key_sizes("ExclusiveStartKey", table, params.get("ExclusiveStartKey"), state)
    yield from _expressions("", params)


def _transact_write(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    """No two actions on one item; 4 MB of items in all; each action's item, key, expressions."""
    seen: dict[tuple[str, str], int] = {}
    total = 0
    for i, action in enumerate(params.get("TransactItems") or []):
        for kind, body in action.items():
            if not isinstance(body, Mapping):
                continue
            table = str(body.get("TableName", ""))
            path = f"TransactItems[{i}].{kind}"
            item = body.get("Item")
            key = body.get("Key")
            schema = state.key_schema(table)
            if item is not None and schema:
                key = {n: item[n] for n in schema if n and n in item}
            if key:
                identity = (table, _key_text(key))
                if identity in seen:
                    yield Finding(
                        path, key, f"no two actions on one item (action {seen[identity]} names it too)"
                    )
                seen.setdefault(identity, i)
                total += item_size(key)
            if item is not None:
                total += item_size(item)
                yield from _item(f"{path}.Item", table, item, state)
            else:
                yield from _key_sizes(f"{path}.Key", table, key, state)
                total += sum(
                    value_size(v)
                    for v in (body.get("ExpressionAttributeValues") or {}).values()
                    if isinstance(v, Mapping) and v
                )
            yield from _expressions(f"{path}.", body)
    if total > MAX_TRANSACTION_BYTES:
        yield Finding(
            "TransactItems", f"{total} bytes", f"at most {MAX_TRANSACTION_BYTES} bytes (4 MB) of items"
        )


def _batch_get(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    """100 keys in all tables together; no key twice; key sizes; projection."""
    total = 0
    for table, request in (params.get("RequestItems") or {}).items():
        keys = list((request or {}).get("Keys") or [])
        total += len(keys)
        seen: set[str] = set()
        for i, key in enumerate(keys):
            text = _key_text(key)
            if text in seen:
                yield Finding(
                    f"RequestItems[{table!r}].Keys[{i}]",
                    key,
                    "no key twice (ValidationException: duplicates)",
                )
            seen.add(text)
            yield from _key_sizes(f"RequestItems[{table!r}].Keys[{i}]", table, key, state)
        yield from _expressions(f"RequestItems[{table!r}].", request or {})
    if total > MAX_BATCH_GET_KEYS:
        yield Finding("RequestItems", f"{total} keys", f"at most {MAX_BATCH_GET_KEYS} keys in all tables")


def _batch_write(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    """25 put or delete requests in all; no item twice; items up to 400 KB; 16 MB in all."""
    count = total = 0
    for table, requests in (params.get("RequestItems") or {}).items():
        seen: set[str] = set()
        schema = state.key_schema(table)
        for i, request in enumerate(requests or []):
            count += 1
            path = f"RequestItems[{table!r}][{i}]"
            item = ((request or {}).get("PutRequest") or {}).get("Item")
            key = ((request or {}).get("DeleteRequest") or {}).get("Key")
            if item is not None:
                total += item_size(item)
                yield from _item(f"{path}.PutRequest.Item", table, item, state)
                key = {n: item[n] for n in schema or () if n and n in item}
            elif key is not None:
                total += item_size(key)
                yield from _key_sizes(f"{path}.DeleteRequest.Key", table, key, state)
            if key:
                text = _key_text(key)
                if text in seen:
                    yield Finding(path, key, "no two requests on one item")
                seen.add(text)
    if count > MAX_BATCH_WRITE_REQUESTS:
        yield Finding(
            "RequestItems", f"{count} requests", f"at most {MAX_BATCH_WRITE_REQUESTS} put or delete requests"
        )
    if total > MAX_BATCH_WRITE_BYTES:
        yield Finding("RequestItems", f"{total} bytes", f"at most {MAX_BATCH_WRITE_BYTES} bytes (16 MB)")


ITEM_RULES = (
    "items up to 400 KB; partition key value up to 2048 bytes, sort key up to 1024; expressions up "
    "to 4 KB and 300 operators, IN up to 100 operands, placeholders up to 255 bytes, substitution "
    "variables up to 2 MB"
)
LIMITS: tuple[ProseLimit, ...] = (
    *(
        ProseLimit(
            f"dynamodb:{op}",
            "Item, Key, expressions",
            ITEM_RULES,
            f"{CONSTRAINTS} (Items, Partition keys and sort keys, Expression parameters); {DDB_API}, {op}",
            _single,
            stateful=True,
        )
        for op in ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan")
    ),
    ProseLimit(
        "dynamodb:TransactWriteItems",
        "TransactItems",
        "no two actions on one item; 4 MB of items in all; per action: " + ITEM_RULES,
        f"{DDB_API}, TransactWriteItems; {CONSTRAINTS} (DynamoDB transactions)",
        _transact_write,
        stateful=True,
    ),
    ProseLimit(
        "dynamodb:BatchGetItem",
        "RequestItems",
        "up to 100 keys in all tables; no key twice",
        f"{DDB_API}, BatchGetItem",
        _batch_get,
        stateful=True,
    ),
    ProseLimit(
        "dynamodb:BatchWriteItem",
        "RequestItems",
        "up to 25 put or delete requests, 16 MB in all; no item twice; items up to 400 KB",
        f"{DDB_API}, BatchWriteItem",
        _batch_write,
        stateful=True,
    ),
)

OPERATIONS = {
    f"dynamodb:{op}": f"{DDB_API}, {op}; {CONSTRAINTS}"
    for op in (
        "GetItem",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "Query",
        "Scan",
        "TransactWriteItems",
        "BatchGetItem",
        "BatchWriteItem",
    )
}
