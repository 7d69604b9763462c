"""ProjectionExpression: the document paths a read returns, checked and resolved once per
(expression, names), and applied to each item read."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import cache
from typing import Any

from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.reserved_keywords import ReservedKeywords

from .expressions import _check_tokens_used
from .values import _TOKEN, _new_item, _validation

Paths = tuple[tuple[str, ...], ...]

_lock = threading.Lock()
#: (expression, sorted names) -> its paths: they depend on nothing else
_paths: dict[tuple[str, tuple[tuple[str, str], ...]], Paths] = {}
_CACHE_LIMIT = 4096  # entries: past it, paths are resolved per read


def read_projection(p: Mapping[str, Any]) -> Paths | None:
    """The paths of a read's (GetItem's, one BatchGetItem table's) ProjectionExpression, None
    without one; DynamoDB's refusals of its ExpressionAttributeNames first."""
    expression = p.get("ProjectionExpression")
    if not expression:
        if p.get("ExpressionAttributeNames"):
            raise _validation("ExpressionAttributeNames can only be specified when using expressions")
        return None
    _check_tokens_used(p, expression)
    return projection_paths(expression, p.get("ExpressionAttributeNames") or {})


def projection_paths(expression: str, names: Mapping[str, str]) -> Paths:
    """The document paths of ``expression`` (attribute names, placeholders replaced); an
    undefined ``#name`` is refused as DynamoDB refuses it (not taken as a literal name), and
    so is a reserved word used as a name."""
    key = (expression, tuple(sorted(names.items())))
    with _lock:
        known = _paths.get(key)
    if known is not None:
        return known
    paths = []
    for part in expression.split(","):
        path = []
        for element in part.strip().split("."):
            placeholder = _TOKEN.match(element) if element.startswith("#") else None
            if placeholder is not None and placeholder.group() not in names:
                raise _validation("Invalid ProjectionExpression: An expression attribute name used in the "
                                  f"document path is not defined; attribute name: {placeholder.group()}")
            literal = element.split("[", 1)[0]
            if placeholder is None and literal.upper() in _reserved_words():
                raise _validation("Invalid ProjectionExpression: Attribute name is a reserved keyword; "
                                  f"reserved keyword: {literal}")
            path.append(names.get(element, element))
        paths.append(tuple(path))
    found = tuple(paths)
    with _lock:
        if len(_paths) < _CACHE_LIMIT:  # bounded, as the emulator's other caches
            _paths[key] = found
    return found


@cache
def _reserved_words() -> frozenset[str]:
    return frozenset(ReservedKeywords.get_reserved_keywords())


def project(item: Item, paths: Paths) -> Item:
    """The item with only ``paths`` (a path the item does not have is left out)."""
    result: dict[str, DynamoType] = {}
    for path in paths:
        top = item.attrs.get(path[0])
        if top is None:
            continue
        if len(path) == 1:
            result[path[0]] = top
            continue
        value: DynamoType | None = top
        for element in path[1:]:
            value = value.child_attr(element) if value is not None else None
        if value is None:
            continue
        nested = result.setdefault(path[0], DynamoType({"M": {}}))
        target = nested
        for element in path[1:-1]:
            target = target.value.setdefault(element, DynamoType({"M": {}}))
        target.value[path[-1]] = value
    return _new_item(item.hash_key, item.range_key, result)
