"""Plain update expressions (local_mode/sim/dynamo/plain_updates.py: top-level SET to values and
REMOVE, applied without moto's passes) against moto's own validator and executor on a fresh
parse: the same item, attributes in the same order, or the same error; and through the store,
the same answers as the store's moto path."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from botocore.exceptions import ClientError
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.parsing.executors import UpdateExpressionExecutor
from moto.dynamodb.parsing.expressions import UpdateExpressionParser
from moto.dynamodb.parsing.validators import UpdateExpressionValidator

from local_mode.sim.dynamo import MemoryDynamo, core, plain_updates
from local_mode.sim.dynamo.expressions import _check_structure
from local_mode.sim.dynamo.plain_updates import plain_update
from local_mode.sim.dynamo.storage import _TableShape
from local_mode.sim.dynamo.values import _new_item

_TABLE = _TableShape(["pk", "sk"], ["pk", "sk", "gsi_pk"],
                     [{"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk", "gsi_pk")]
                     + [{"AttributeName": "#g", "AttributeType": "N"}])

#: plain expressions (moto's structure checks, run before a plan, refuse the last three)
_PLAIN = [
    ("SET #s = :s, #v = :one, updated = :now", {"#s": "status", "#v": "version"}),
    ("SET #s = :s REMOVE #l, gone", {"#s": "status", "#l": "lease"}),
    ("REMOVE #l SET #n = :now, #s = :s", {"#l": "lease", "#s": "status", "#n": "new"}),
    ("SET fresh = :s, #a = :now REMOVE #v", {"#a": "another", "#v": "version"}),
    ("SET gsi_pk = :s", {}),  # an index key by its name: the empty-string and type checks
    ("SET #g = :s", {"#g": "gsi_pk"}),  # by a placeholder: moto checks the raw text "#g"
    ("SET #g = :one, #x = :missing", {"#g": "gsi_pk", "#x": "x"}),
    ("REMOVE #l", {"#l": "lease"}),
    ("SET #s = :s ADD #t :tags, #v :one", {"#s": "status", "#t": "tags", "#v": "version"}),
    ("ADD #n :one, #t :tags REMOVE #l", {"#n": "new", "#t": "tags", "#l": "lease"}),
    ("DELETE #t :tags SET #s = :s", {"#t": "tags", "#s": "status"}),
    ("DELETE #t :tags, #o :tags", {"#t": "tags", "#o": "others"}),
    ("ADD #s :one", {"#s": "status"}),  # a string: not a number
    ("SET pk = :s", {}),  # a key attribute
    ("SET #s = :s REMOVE #k", {"#s": "status", "#k": "sk"}),  # a key attribute by a placeholder
    ("SET #s = :s SET #v = :one", {"#s": "status", "#v": "version"}),  # two SET clauses
]
#: not plain: moto's path
_NOT_PLAIN = [
    ("SET #v = #v + :one", {"#v": "version"}),
    ("SET #m.#k = :s", {"#m": "nodes", "#k": "n1"}),
    ("SET #h = list_append(#h, :s)", {"#h": "history"}),
    ("SET #s = :s ADD #t.#u :tags", {"#s": "status", "#t": "tags", "#u": "u"}),
    ("DELETE #t :tags, #t :tags", {"#t": "tags"}),  # the same attribute twice
    ("REMOVE #h[0]", {"#h": "history"}),
    ("SET #s = :s, #s2 = #s", {"#s": "status", "#s2": "copy"}),
    ("SET size = :s", {}),  # a reserved word: moto refuses it
    ("SET #u = :s", {}),  # an undefined placeholder
]

_FULL: dict[str, Any] = {
    "pk": {"S": "job#1"}, "sk": {"S": "meta"}, "status": {"S": "RUNNING"}, "version": {"N": "3"},
    "lease": {"S": "me"}, "gone": {"BOOL": True}, "gsi_pk": {"S": "p"}, "nodes": {"M": {"n1": {"S": "x"}}},
    "tags": {"SS": ["t1", "t2"]}, "others": {"SS": ["t2"]}}
_ITEMS: dict[str, dict[str, Any]] = {
    "full": _FULL, "keys only": {"pk": {"S": "job#1"}, "sk": {"S": "meta"}},
    "other types": {**_FULL, "version": {"S": "3"}, "tags": {"NS": ["1"]}, "others": {"L": []}}}
_VALUES: dict[str, dict[str, Any]] = {
    "fitting": {":s": {"S": "DONE"}, ":one": {"N": "1"}, ":now": {"N": "1700000000"},
                ":missing": {"NULL": True}, ":tags": {"SS": ["t2", "t3"]}},
    "decimal": {":s": {"S": "x"}, ":one": {"N": "-1.5"}, ":now": {"N": "2"}, ":missing": {"BOOL": False},
                ":tags": {"SS": []}},
    "number sets": {":s": {"S": "x"}, ":one": {"NS": ["1", "2"]}, ":now": {"N": "2"}, ":missing": {"N": "1"},
                    ":tags": {"NS": ["1"]}},
    "empty strings": {":s": {"S": ""}, ":one": {"S": ""}, ":now": {"B": b""}, ":missing": {"S": ""},
                      ":tags": {"S": ""}},
    "containers": {":s": {"M": {"a": {"L": [{"S": "x"}]}}}, ":one": {"N": "1"}, ":now": {"SS": ["a"]},
                   ":missing": {"L": []}, ":tags": {"L": [{"S": "t2"}]}},
    "one missing": {":s": {"S": "DONE"}, ":now": {"N": "1"}, ":missing": {"N": "2"}},
    "none": {},
}


def _dump(attrs: dict[str, DynamoType]) -> list[Any]:
    return [(name, value.type, repr(value.value)) for name, value in attrs.items()]


def _item(attrs: dict[str, Any]) -> Item:
    return Item(DynamoType(attrs["pk"]), DynamoType(attrs["sk"]), copy.deepcopy(attrs))


def _moto(expression: str, names: dict[str, str], values: dict[str, Any], attrs: dict[str, Any]) -> Any:
    item = _item(attrs)
    try:
        tree = UpdateExpressionValidator(UpdateExpressionParser.make(expression), names, values, item,
                                         _TABLE).validate()  # type: ignore[arg-type]
        tree.normalize()
        UpdateExpressionExecutor(tree, item, names).execute()
    except Exception as error:
        return "error", type(error).__name__, str(error)
    return _dump(item.attrs)


def _planned(expression: str, names: dict[str, str], values: dict[str, Any], attrs: dict[str, Any]) -> Any:
    tree = UpdateExpressionParser.make(expression)
    plan = plain_update(expression, names, tree)
    assert plan is not None
    old = _item(attrs)
    before = _dump(old.attrs)
    item = _new_item(old.hash_key, old.range_key, dict(old.attrs))  # sharing the old values, as the store
    try:
        _check_structure(tree, names, _TABLE, expression)
        plan.apply(item, values, _TABLE, names)
    except Exception as error:
        return "error", type(error).__name__, str(error)
    finally:
        assert _dump(old.attrs) == before  # the old item unchanged
    return _dump(item.attrs)


@pytest.mark.parametrize("values", sorted(_VALUES))
@pytest.mark.parametrize("item", sorted(_ITEMS))
@pytest.mark.parametrize(("expression", "names"), _PLAIN, ids=[e for e, _ in _PLAIN])
def test_a_plain_update_is_motos(expression: str, names: dict[str, str], item: str, values: str) -> None:
    expected = _moto(expression, names, _VALUES[values], _ITEMS[item])
    for _ in range(2):  # the second time from the cached plan
        assert _planned(expression, names, _VALUES[values], _ITEMS[item]) == expected


@pytest.mark.parametrize(("expression", "names"), _NOT_PLAIN, ids=[e for e, _ in _NOT_PLAIN])
def test_other_updates_get_no_plan(expression: str, names: dict[str, str]) -> None:
    assert plain_update(expression, names, UpdateExpressionParser.make(expression)) is None


def test_the_cases_reach_every_outcome() -> None:
    """The cases above exercise applied updates and each of moto's errors on the way (the
    structure checks' among them)."""
    outcomes = [_moto(e, n, v, i) for e, n in _PLAIN for v in _VALUES.values() for i in _ITEMS.values()]
    errors = {o[1] for o in outcomes if o[0] == "error"}
    assert sum(o[0] != "error" for o in outcomes) >= 20
    assert errors >= {"ExpressionAttributeValueNotDefined", "InvalidAttributeTypeError",
                      "EmptyKeyAttributeException", "IncorrectDataType", "IncorrectOperandType",
                      "MockValidationException", "UpdateHashRangeKeyException", "TooManyClauses"}, errors


def test_a_plan_is_kept_per_expression_and_names() -> None:
    """The same text with other names updates other attributes (a plan keyed by the text
    alone would update the first call's)."""
    expression = "SET #a = :v REMOVE #b"
    tree = UpdateExpressionParser.make(expression)
    first = plain_update(expression, {"#a": "x", "#b": "y"}, tree)
    second = plain_update(expression, {"#a": "y", "#b": "x"}, tree)
    assert first is not None and second is not None
    assert (first.sets, first.removes) == ([("#a", "x", ":v")], ["y"])
    assert (second.sets, second.removes) == ([("#a", "y", ":v")], ["x"])


_TABLE_DEFINITION: dict[str, Any] = {
    "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
    "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"},
                             {"AttributeName": "gsi_pk", "AttributeType": "S"}],
    "GlobalSecondaryIndexes": [{"IndexName": "by_gsi", "KeySchema": [{"AttributeName": "gsi_pk",
                                                                     "KeyType": "HASH"}],
                                "Projection": {"ProjectionType": "ALL"}}],
    "BillingMode": "PAY_PER_REQUEST"}

#: (UpdateItem parameters beyond the table and key), run in turn on one item
_SCRIPT: list[dict[str, Any]] = [
    {"UpdateExpression": "SET #s = :s, #n = :n", "ExpressionAttributeNames": {"#s": "status", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": "RUNNING", ":n": {"a": ["x", Decimal(1)]}},
     "ReturnValues": "ALL_NEW"},
    {"UpdateExpression": "SET #s = :s, #n = :n", "ExpressionAttributeNames": {"#s": "status", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": "DONE", ":n": {"b": {"c"}}}, "ReturnValues": "UPDATED_OLD"},
    {"UpdateExpression": "SET #s = :s REMOVE #n", "ExpressionAttributeNames": {"#s": "gsi_pk", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": "p1"}, "ReturnValues": "ALL_OLD"},
    {"UpdateExpression": "SET #s = :s REMOVE #n", "ExpressionAttributeNames": {"#s": "gsi_pk", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": ""}, "ReturnValues": "UPDATED_NEW"},  # empty index key
    {"UpdateExpression": "SET #s = :s REMOVE #n", "ExpressionAttributeNames": {"#s": "gsi_pk", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": Decimal(3)}},  # wrong index key type
    {"UpdateExpression": "SET #s = :s, #n = :n", "ExpressionAttributeNames": {"#s": "status", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": "x"}},  # :n undefined
    {"UpdateExpression": "SET #s = :s, #n = :n", "ExpressionAttributeNames": {"#s": "status", "#n": "nodes"},
     "ExpressionAttributeValues": {":s": "AGAIN", ":n": []}, "ConditionExpression": "#s = :s",
     "ReturnValues": "ALL_NEW"},
    {"UpdateExpression": "SET pk = :s", "ExpressionAttributeValues": {":s": "other"}},  # the key
    {"UpdateExpression": "ADD #c :one, #t :t", "ExpressionAttributeNames": {"#c": "count", "#t": "tags"},
     "ExpressionAttributeValues": {":one": Decimal(1), ":t": {"a", "b"}}, "ReturnValues": "UPDATED_NEW"},
    {"UpdateExpression": "ADD #c :one, #t :t", "ExpressionAttributeNames": {"#c": "count", "#t": "tags"},
     "ExpressionAttributeValues": {":one": Decimal(2), ":t": {"c", "b"}}, "ReturnValues": "ALL_OLD"},
    {"UpdateExpression": "ADD #c :one, #t :t", "ExpressionAttributeNames": {"#c": "count", "#t": "tags"},
     "ExpressionAttributeValues": {":one": "x", ":t": {"c"}}},  # not a number
    {"UpdateExpression": "DELETE #t :t", "ExpressionAttributeNames": {"#t": "tags"},
     "ExpressionAttributeValues": {":t": {"a", "b"}}, "ReturnValues": "UPDATED_OLD"},
    {"UpdateExpression": "DELETE #t :t", "ExpressionAttributeNames": {"#t": "tags"},
     "ExpressionAttributeValues": {":t": {"c"}}, "ReturnValues": "ALL_NEW"},
]


def _run_script(store: MemoryDynamo) -> list[Any]:
    table = store.Table("t")
    seen: list[Any] = []
    for params in _SCRIPT:
        try:
            seen.append(table.update_item(Key={"pk": "k"}, **copy.deepcopy(params)))
        except ClientError as error:
            seen.append(("error", error.response["Error"]))
        seen.append((store.peek("t", {"pk": "k"}), list((store.peek("t", {"pk": "k"}) or {}).keys())))
    seen.append(table.query(IndexName="by_gsi", KeyConditionExpression="gsi_pk = :p",
                            ExpressionAttributeValues={":p": "p1"})["Items"])
    return [_without_metadata(s) for s in seen]


def _without_metadata(seen: Any) -> Any:
    return {k: v for k, v in seen.items() if k != "ResponseMetadata"} if isinstance(seen, dict) else seen


def test_the_store_answers_as_on_moto_s_path(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = MemoryDynamo()
    planned.create_table(TableName="t", **_TABLE_DEFINITION)
    applied: list[str] = []
    apply = plain_updates.PlainUpdate.apply

    def counted(self: Any, *args: Any) -> None:
        applied.append("plan")
        apply(self, *args)

    monkeypatch.setattr(plain_updates.PlainUpdate, "apply", counted)
    with_plans = _run_script(planned)
    assert len(applied) == 11  # every update that got that far took its plan (not "SET pk", refused first)
    monkeypatch.setattr(core, "plain_update", lambda *_: None)
    motos = MemoryDynamo()
    motos.create_table(TableName="t", **_TABLE_DEFINITION)
    assert _run_script(motos) == with_plans
    errors = [s[1]["Code"] for s in with_plans if isinstance(s, tuple) and s[0] == "error"]
    assert len(errors) == 6, with_plans
