"""The store's update-expression validation (local_mode/sim/dynamo/expressions.py: a cached
parse, cloned; structure checks once per expression; traversals that skip the subtrees where
a processor has nothing to process) against moto's own ``UpdateExpressionValidator`` on a
fresh parse: the same validated tree, the same item after execution, the same error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.ast_nodes import Node
from moto.dynamodb.parsing.executors import UpdateExpressionExecutor
from moto.dynamodb.parsing.expressions import UpdateExpressionParser
from moto.dynamodb.parsing.validators import UpdateExpressionValidator

from local_mode.sim.dynamo.expressions import _update_tree, _Validator
from local_mode.sim.dynamo.storage import _TableShape

_TABLE = _TableShape(["pk", "sk"], ["pk", "sk", "gsi_pk"],
                     [{"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk", "gsi_pk")])

_EXPRESSIONS = [
    ("SET #s = :s, #v = #v + :one, updated = :now", {"#s": "status", "#v": "version"}),
    ("SET #s = :s REMOVE #l", {"#s": "status", "#l": "lease"}),
    ("SET #h = list_append(if_not_exists(#h, :empty), :s)", {"#h": "history"}),
    ("SET #m.#k = :s, #c = if_not_exists(#c, :one)", {"#m": "nodes", "#k": "n1", "#c": "count"}),
    ("SET #v = #v - :one ADD #t :tags", {"#v": "version", "#t": "tags"}),
    ("SET #h[1] = :s, gsi_pk = :s", {"#h": "history"}),
    ("REMOVE #h[0], #m.#k", {"#h": "history", "#m": "nodes", "#k": "n1"}),
    ("SET #s = :s, #s = :now", {"#s": "status"}),  # the same path twice
    ("SET pk = :s", {}),  # a key attribute
    ("DELETE #t :tags", {"#t": "tags"}),
]

_FULL: dict[str, Any] = {
    "pk": {"S": "job#1"}, "sk": {"S": "meta"}, "status": {"S": "RUNNING"}, "version": {"N": "3"},
    "history": {"L": [{"S": "a"}, {"S": "b"}]}, "nodes": {"M": {"n1": {"S": "x"}}},
    "count": {"N": "1"}, "lease": {"S": "me"}, "tags": {"SS": ["t1"]}}
_ITEMS: dict[str, dict[str, Any]] = {
    "full": _FULL,
    "keys only": {"pk": {"S": "job#1"}, "sk": {"S": "meta"}},
    "wrong types": {**_FULL, "version": {"S": "three"}, "history": {"M": {}}, "nodes": {"S": "flat"}},
}
_VALUES: dict[str, dict[str, Any]] = {
    "fitting": {":s": {"S": "DONE"}, ":one": {"N": "1"}, ":now": {"N": "1700000000"},
                ":empty": {"L": []}, ":tags": {"SS": ["t2"]}},
    "strings": {":s": {"S": ""}, ":one": {"S": "1"}, ":now": {"S": "now"}, ":empty": {"S": ""},
                ":tags": {"S": "t"}},
    "lists": {":s": {"L": [{"S": "c"}]}, ":one": {"L": []}, ":now": {"N": "1"}, ":empty": {"L": []},
              ":tags": {"NS": ["1"]}},
    "one missing": {":s": {"S": "DONE"}, ":now": {"N": "1"}, ":empty": {"L": []}, ":tags": {"SS": ["t2"]}},
}


def _dump(value: Any) -> Any:
    if isinstance(value, Node):
        return type(value).__name__, None if value.children is None else [_dump(c) for c in value.children]
    if isinstance(value, DynamoType):
        return "DynamoType", value.type, repr(value.value)
    return repr(value)


def _outcome(validate: Any, expression: str, names: dict[str, str], values: dict[str, Any],
             attrs: dict[str, Any]) -> Any:
    item = Item(DynamoType(attrs["pk"]), DynamoType(attrs["sk"]), copy.deepcopy(attrs))
    try:
        tree = validate(expression, names, {k: DynamoType(v) for k, v in values.items()}, item)
        validated = _dump(tree)
        tree.normalize()
        UpdateExpressionExecutor(tree, item, names).execute()
    except Exception as error:
        return "error", type(error).__name__, str(error)
    return validated, {name: _dump(value) for name, value in item.attrs.items()}


def _moto(expression: str, names: dict[str, str], values: dict[str, Any], item: Item) -> Any:
    return UpdateExpressionValidator(UpdateExpressionParser.make(expression), names, values, item,
                                     _TABLE).validate()  # type: ignore[arg-type]


def _ours(expression: str, names: dict[str, str], values: dict[str, Any], item: Item) -> Any:
    return _Validator(_update_tree(expression), names, values, item, _TABLE, expression).validate()


@pytest.mark.parametrize("values", sorted(_VALUES))
@pytest.mark.parametrize("item", sorted(_ITEMS))
@pytest.mark.parametrize(("expression", "names"), _EXPRESSIONS, ids=[e for e, _ in _EXPRESSIONS])
def test_update_validation_is_motos(expression: str, names: dict[str, str], item: str, values: str) -> None:
    expected = _outcome(_moto, expression, names, _VALUES[values], _ITEMS[item])
    for _ in range(2):  # the second time: parse cached, structure checks already passed
        assert _outcome(_ours, expression, names, _VALUES[values], _ITEMS[item]) == expected


def test_cases_reach_both_outcomes() -> None:
    """The cases above exercise validated updates and refused ones (else they compare little)."""
    outcomes = [_outcome(_moto, e, n, v, i) for e, n in _EXPRESSIONS for v in _VALUES.values()
                for i in _ITEMS.values()]
    errors = {o[1] for o in outcomes if o[0] == "error"}
    assert sum(o[0] != "error" for o in outcomes) >= 20
    assert len(errors) >= 4, errors
