"""Update expressions on top-level attributes whose operands are ``:values`` (``SET #a = :a,
#b = :b ADD #n :one REMOVE #c``: most of the campaigns' updates), applied without moto's
validation passes, with the same outcome.

What moto does with such an expression, pass by pass (``UpdateExpressionValidator``):

1. its structure checks (action counts, overlapping paths, key attributes): read only the
   expression, its names and the table's key; run before a plan as before moto's passes
   (``expressions._check_structure``, once per expression, names and key). A plan exists
   only where every placeholder of a path is defined and no top-level attribute is named by
   two actions (else moto's path, whose checks refuse it);
2. each ``:value`` in the expression's order: undefined -> ``ExpressionAttributeValueNotDefined``,
   else ``DynamoType(value)``;
3. each path resolved on the item: a top-level name resolves or is creatable, never an
   error; a plain name that is a reserved keyword is one (no plan for such an expression,
   moto's path raises it);
4. functions, missing paths, operations: none in such an expression;
5. each SET in order: ``TypeMismatchValidator`` (the path's raw text, ``#a`` or ``a``,
   against the attribute definitions), then each SET again: ``EmptyStringKeyValueValidator``;
6. executed (``normalize`` keeps the order of the actions other than REMOVE): SET is
   ``attrs[name] = value``; ADD and DELETE run moto's own executors (on a copy of the value
   they change in place); REMOVE ``attrs.pop(name, None)``. The attributes are distinct (1.),
   so the actions in order, then the REMOVEs, leave the same attributes in the same order.

A SET replaces a value and a REMOVE drops it: their old values are not copied first.
tests/local_mode/test_plain_updates.py compares this with moto's path on each outcome."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from moto.dynamodb.exceptions import (
    EmptyKeyAttributeException,
    ExpressionAttributeValueNotDefined,
    InvalidAttributeTypeError,
)
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.ast_nodes import (
    DDBTypedValue,
    ExpressionAttribute,
    ExpressionAttributeName,
    ExpressionAttributeValue,
    UpdateExpression,
    UpdateExpressionAddAction,
    UpdateExpressionAddActions,
    UpdateExpressionAddClause,
    UpdateExpressionDeleteAction,
    UpdateExpressionDeleteActions,
    UpdateExpressionDeleteClause,
    UpdateExpressionPath,
    UpdateExpressionRemoveAction,
    UpdateExpressionRemoveActions,
    UpdateExpressionRemoveClause,
    UpdateExpressionSetAction,
    UpdateExpressionSetActions,
    UpdateExpressionSetClause,
    UpdateExpressionValue,
)
from moto.dynamodb.parsing.executors import AddExecutor, DeleteExecutor
from moto.dynamodb.parsing.reserved_keywords import ReservedKeywords

from .values import _clone_value

#: the node classes of such an expression's parse (exactly these classes: ``type(node) in``)
_PLAIN_KINDS = frozenset({
    UpdateExpression, UpdateExpressionSetClause, UpdateExpressionSetActions, UpdateExpressionSetAction,
    UpdateExpressionRemoveClause, UpdateExpressionRemoveActions, UpdateExpressionRemoveAction,
    UpdateExpressionAddClause, UpdateExpressionAddActions, UpdateExpressionAddAction,
    UpdateExpressionDeleteClause, UpdateExpressionDeleteActions, UpdateExpressionDeleteAction,
    UpdateExpressionPath, UpdateExpressionValue, ExpressionAttributeName, ExpressionAttribute,
    ExpressionAttributeValue,
})
_ACTIONS = (UpdateExpressionSetAction, UpdateExpressionAddAction, UpdateExpressionDeleteAction,
            UpdateExpressionRemoveAction)


class PlainUpdate:
    """The plan of a plain update expression with its names: ``actions`` (SET, ADD, DELETE)
    as (action class, the path's raw text, the attribute, the ``:value``, the parsed path)
    in the expression's order; ``removes``: the attributes it removes."""

    __slots__ = ("actions", "removes")

    def __init__(self, actions: list[tuple[type, str, str, str, Any]], removes: list[str]) -> None:
        self.actions = actions
        self.removes = removes

    @property
    def sets(self) -> list[tuple[str, str, str]]:
        return [(raw, name, placeholder) for kind, raw, name, placeholder, _ in self.actions
                if kind is UpdateExpressionSetAction]

    def apply(self, item: Item, values: Mapping[str, Any], shape: Any, names: dict[str, str]) -> None:
        """Runs the plan on ``item`` (the new item, sharing the old item's values), raising
        moto's errors in moto's order (module docstring); ``shape``: the table's
        ``_TableShape``."""
        attrs = item.attrs
        typed = []
        for _, _, _, placeholder, _ in self.actions:
            if placeholder not in values:
                raise ExpressionAttributeValueNotDefined(attribute_value=placeholder)
            typed.append(DynamoType(values[placeholder]))
        planned = list(zip(self.actions, typed, strict=True))
        for (kind, raw, _, _, _), value in planned:
            if kind is UpdateExpressionSetAction:
                for definition in shape.attr:
                    if definition["AttributeName"] == raw and definition["AttributeType"] != value.type:
                        raise InvalidAttributeTypeError(raw, definition["AttributeType"], value.type)
        for (kind, raw, _, _, _), value in planned:
            if kind is UpdateExpressionSetAction and not value.value and value.type in ("S", "B") \
                    and raw in shape.attribute_keys:
                raise EmptyKeyAttributeException(key_in_index=True)
        for (kind, _, name, _, path), value in planned:
            if kind is UpdateExpressionSetAction:
                attrs[name] = value
                continue
            if name in attrs:  # moto's executors change the value in place: the old item's
                attrs[name] = _clone_value(attrs[name])
            executor = AddExecutor if kind is UpdateExpressionAddAction else DeleteExecutor
            executor(_Action([path, DDBTypedValue(value)]), names).execute(item)
        for name in self.removes:
            attrs.pop(name, None)


class _Action:
    """What moto's ADD and DELETE executors read of their action node: its children (the
    parsed path, read only, and the value)."""

    __slots__ = ("children",)

    def __init__(self, children: list[Any]) -> None:
        self.children = children


_lock = threading.Lock()
_CACHE_LIMIT = 4096  # plans kept: past it, each is made per call
#: (expression, sorted names) -> its plan, or None where the expression is not plain. Sound
#: to keep: the plan is read off the expression's parse and its names only (the key)
_plans: dict[tuple[str, tuple[tuple[str, str], ...]], PlainUpdate | None] = {}


def plain_update(expression: str, names: Mapping[str, str], tree: Any) -> PlainUpdate | None:
    """The plan of ``expression`` (parsed: ``tree``, not validated) with ``names``, or None
    where moto's own path is needed."""
    key = (expression, tuple(sorted(names.items())))
    with _lock:
        if key in _plans:
            return _plans[key]
    plan = _plan(tree, names)
    with _lock:
        if len(_plans) < _CACHE_LIMIT:  # bounded, as the emulator's other caches
            _plans[key] = plan
    return plan


def _plan(tree: Any, names: Mapping[str, str]) -> PlainUpdate | None:
    actions: list[tuple[type, str, str, str, Any]] = []
    removes: list[str] = []
    stack = [tree]
    while stack:  # depth first, children in order: the expression's order
        node = stack.pop()
        kind = type(node)
        if kind not in _PLAIN_KINDS:
            return None
        if kind not in _ACTIONS:
            stack.extend(reversed([c for c in node.children or () if c is not None]))
            continue
        path = node.children[0]
        if type(path) is not UpdateExpressionPath or len(path.children) != 1:
            return None
        element = path.children[0]
        raw = element.children[0]
        if type(element) is ExpressionAttributeName:
            if raw not in names:
                return None
            name = names[raw]
        elif type(element) is ExpressionAttribute:
            if raw.upper() in ReservedKeywords.get_reserved_keywords():
                return None
            name = raw
        else:
            return None
        if kind is UpdateExpressionRemoveAction:
            if len(node.children) != 1:
                return None
            removes.append(name)
            continue
        operand = node.children[1] if len(node.children) == 2 else None
        if kind is UpdateExpressionSetAction:  # SET's operand: a value of one value
            if type(operand) is not UpdateExpressionValue or len(operand.children) != 1:
                return None
            operand = operand.children[0]
        if type(operand) is not ExpressionAttributeValue:
            return None
        actions.append((kind, raw, name, operand.get_value_name(), path))
    targets = [name for _, _, name, _, _ in actions] + removes
    if len(set(targets)) != len(targets):
        return None
    return PlainUpdate(actions, removes)
