"""The emulator's direct serialization of DynamoDB attribute values changes no response.

``LocalAws`` routes moto's JSON serialization of ``AttributeValue`` structures through
``local_mode.moto_patches._attribute_value_wire`` (moto's generic, model-driven serializer is
most of the emulator's CPU time). The same script of DynamoDB calls runs against moto with
and without it, and every response (status, error type, body) must be byte-for-byte the
same: items of every attribute type, GetItem, PutItem / UpdateItem / DeleteItem with
ReturnValues, conditional failures (with ReturnValuesOnConditionCheckFailure), Query on the
table and on a GSI with pagination, BatchGetItem with unprocessed and missing keys,
BatchWriteItem, TransactWriteItems (success, and cancellation with its
CancellationReasons), TransactGetItems and Scan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from local_mode import emulator, moto_patches

TABLE = "serialization-check"

# Every attribute type, nested, with the edge values a serializer can get wrong.
RICH = {
    "s": {"S": "text with \"quotes\", unicode \u00e9\u4e2d and \\ backslash"},
    "empty_s": {"S": ""},
    "n": {"N": "42"},
    "n_float": {"N": "-1.5e-7"},
    "b": {"B": b"\x00\x01binary\xff"},
    "ss": {"SS": ["b", "a", "c"]},
    "ns": {"NS": ["1", "2.5", "-3"]},
    "bs": {"BS": [b"x", b"\x00y"]},
    "null": {"NULL": True},
    "t": {"BOOL": True},
    "f": {"BOOL": False},
    "empty_l": {"L": []},
    "empty_m": {"M": {}},
    "l": {"L": [{"S": "a"}, {"N": "1"}, {"L": [{"BOOL": False}]}, {"M": {"k": {"NULL": True}}},
                {"B": b"\x02"}]},
    "m": {"M": {"history": {"L": [{"M": {"at": {"N": "1795185121.5"}, "to": {"S": "RUNNING"},
                                          "why": {"S": "x" * 40}}} for _ in range(3)]},
                "suspects": {"M": {"i-1": {"S": "REBOOT"}, "i-2": {"SS": ["a"]}}},
                "nested": {"M": {"deeper": {"M": {"b": {"B": b"deep"}}}}}}},
}


def _create_table(ddb: Any) -> None:
    """Not compared: a table description holds its creation time."""
    ddb.create_table(
        TableName=TABLE, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                              {"AttributeName": "sk", "AttributeType": "N"},
                              {"AttributeName": "gpk", "AttributeType": "S"}],
        GlobalSecondaryIndexes=[
            {"IndexName": "by-g-keys", "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"},
                                                     {"AttributeName": "sk", "KeyType": "RANGE"}],
             "Projection": {"ProjectionType": "KEYS_ONLY"}},
            {"IndexName": "by-g-all", "KeySchema": [{"AttributeName": "gpk", "KeyType": "HASH"}],
             "Projection": {"ProjectionType": "ALL"}},
        ])


def _script(ddb: Any) -> Iterator[tuple[str, Any]]:
    """The calls to compare: (label, thunk). Errors are part of the compared output."""
    for i in range(7):
        item = {"pk": {"S": "job"}, "sk": {"N": str(i)}, "gpk": {"S": "g"}, **RICH}
        yield f"put {i}", lambda item=item: ddb.put_item(TableName=TABLE, Item=item)
    key = {"pk": {"S": "job"}, "sk": {"N": "0"}}
    yield "put returning old", lambda: ddb.put_item(
        TableName=TABLE, Item={**key, "gpk": {"S": "g"}, **RICH, "extra": {"S": "v2"}},
        ReturnValues="ALL_OLD")
    yield "put if absent (fails)", lambda: ddb.put_item(
        TableName=TABLE, Item={**key}, ConditionExpression="attribute_not_exists(pk)")
    yield "put if absent (fails, returns item)", lambda: ddb.put_item(
        TableName=TABLE, Item={**key}, ConditionExpression="attribute_not_exists(pk)",
        ReturnValuesOnConditionCheckFailure="ALL_OLD")
    yield "get", lambda: ddb.get_item(TableName=TABLE, Key=key, ConsistentRead=True)
    yield "get missing", lambda: ddb.get_item(TableName=TABLE, Key={"pk": {"S": "none"}, "sk": {"N": "0"}})
    yield "get projected", lambda: ddb.get_item(
        TableName=TABLE, Key=key, ProjectionExpression="#m.suspects, l[2], ss, b",
        ExpressionAttributeNames={"#m": "m"})
    yield "get with capacity", lambda: ddb.get_item(TableName=TABLE, Key=key, ReturnConsumedCapacity="TOTAL")
    for returns in ("ALL_NEW", "ALL_OLD", "UPDATED_NEW", "UPDATED_OLD", "NONE"):
        yield f"update {returns}", lambda returns=returns: ddb.update_item(
            TableName=TABLE, Key=key, ReturnValues=returns,
            UpdateExpression="SET #m.history = list_append(#m.history, :h), n = n + :one, "
                             "extra = if_not_exists(extra, :e) ADD ss :ss REMOVE empty_s",
            ConditionExpression="attribute_exists(pk) AND n >= :zero",
            ExpressionAttributeNames={"#m": "m"},
            ExpressionAttributeValues={":h": {"L": [{"M": {"to": {"S": "DONE"}, "b": {"B": b"1"}}}]},
                                       ":one": {"N": "1"}, ":zero": {"N": "0"}, ":e": {"S": "e"},
                                       ":ss": {"SS": ["z"]}})
    yield "update condition fails", lambda: ddb.update_item(
        TableName=TABLE, Key=key, UpdateExpression="SET n = :n", ConditionExpression="n = :other",
        ExpressionAttributeValues={":n": {"N": "1"}, ":other": {"N": "-1"}},
        ReturnValuesOnConditionCheckFailure="ALL_OLD")
    yield "update invalid", lambda: ddb.update_item(
        TableName=TABLE, Key=key, UpdateExpression="SET n = :missing")
    yield "query", lambda: ddb.query(
        TableName=TABLE, KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "job"}})
    start: dict[str, Any] = {}
    for page in range(4):
        def query_page(start: dict[str, Any] = start) -> Any:
            response = ddb.query(TableName=TABLE, KeyConditionExpression="pk = :p AND sk >= :s",
                                 ExpressionAttributeValues={":p": {"S": "job"}, ":s": {"N": "1"}},
                                 Limit=2, ScanIndexForward=False, **start)
            start.clear()
            if "LastEvaluatedKey" in response:
                start["ExclusiveStartKey"] = response["LastEvaluatedKey"]
            return response
        yield f"query page {page}", query_page
    yield "query gsi keys only", lambda: ddb.query(
        TableName=TABLE, IndexName="by-g-keys", KeyConditionExpression="gpk = :g",
        ExpressionAttributeValues={":g": {"S": "g"}}, Limit=3)
    yield "query gsi all, filtered", lambda: ddb.query(
        TableName=TABLE, IndexName="by-g-all", KeyConditionExpression="gpk = :g",
        FilterExpression="sk > :s", ExpressionAttributeValues={":g": {"S": "g"}, ":s": {"N": "3"}},
        Select="ALL_ATTRIBUTES")
    yield "query count", lambda: ddb.query(
        TableName=TABLE, KeyConditionExpression="pk = :p", Select="COUNT",
        ExpressionAttributeValues={":p": {"S": "job"}})
    yield "batch get", lambda: ddb.batch_get_item(RequestItems={TABLE: {
        "Keys": [{"pk": {"S": "job"}, "sk": {"N": str(i)}} for i in (3, 1, 99, 2)], "ConsistentRead": True}})
    yield "batch get projected", lambda: ddb.batch_get_item(RequestItems={TABLE: {
        "Keys": [{"pk": {"S": "job"}, "sk": {"N": "4"}}], "ProjectionExpression": "sk, m"}})
    yield "batch write", lambda: ddb.batch_write_item(RequestItems={TABLE: [
        {"PutRequest": {"Item": {"pk": {"S": "other"}, "sk": {"N": "1"}, "bs": {"BS": [b"q"]}}}},
        {"DeleteRequest": {"Key": {"pk": {"S": "job"}, "sk": {"N": "6"}}}}]})
    yield "transact write", lambda: ddb.transact_write_items(TransactItems=[
        {"Update": {"TableName": TABLE, "Key": key, "UpdateExpression": "SET n = :n",
                    "ConditionExpression": "attribute_exists(pk)",
                    "ExpressionAttributeValues": {":n": {"N": "7"}}}},
        {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "other"}, "sk": {"N": "2"}, "m": RICH["m"]},
                 "ConditionExpression": "attribute_not_exists(pk)"}},
        {"ConditionCheck": {"TableName": TABLE, "Key": {"pk": {"S": "job"}, "sk": {"N": "1"}},
                            "ConditionExpression": "attribute_exists(pk)"}},
        {"Delete": {"TableName": TABLE, "Key": {"pk": {"S": "job"}, "sk": {"N": "5"}}}}])
    yield "transact write canceled", lambda: ddb.transact_write_items(TransactItems=[
        {"Update": {"TableName": TABLE, "Key": key, "UpdateExpression": "SET n = :n",
                    "ConditionExpression": "n = :other",
                    "ExpressionAttributeValues": {":n": {"N": "8"}, ":other": {"N": "-1"}},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}},
        {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "other"}, "sk": {"N": "3"}}}},
        {"ConditionCheck": {"TableName": TABLE, "Key": {"pk": {"S": "job"}, "sk": {"N": "1"}},
                            "ConditionExpression": "attribute_not_exists(pk)"}}])
    yield "transact get", lambda: ddb.transact_get_items(TransactItems=[
        {"Get": {"TableName": TABLE, "Key": key}},
        {"Get": {"TableName": TABLE, "Key": {"pk": {"S": "none"}, "sk": {"N": "1"}}}},
        {"Get": {"TableName": TABLE, "Key": {"pk": {"S": "other"}, "sk": {"N": "2"}},
                 "ProjectionExpression": "m.suspects"}}])
    yield "delete returning old", lambda: ddb.delete_item(
        TableName=TABLE, Key={"pk": {"S": "job"}, "sk": {"N": "4"}}, ReturnValues="ALL_OLD")
    yield "delete condition fails", lambda: ddb.delete_item(
        TableName=TABLE, Key={"pk": {"S": "job"}, "sk": {"N": "3"}}, ConditionExpression="n = :x",
        ExpressionAttributeValues={":x": {"N": "-1"}})
    yield "scan", lambda: ddb.scan(TableName=TABLE)
    yield "scan page", lambda: ddb.scan(TableName=TABLE, Limit=2)
    yield "missing table", lambda: ddb.get_item(TableName="no-such-table", Key=key)


def _run_script(direct: bool, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, str, bytes]]:
    from moto.core.serialize import BaseJSONSerializer

    generic = getattr(BaseJSONSerializer._serialize_type_structure, "_generic",
                      BaseJSONSerializer._serialize_type_structure)
    with monkeypatch.context() as patch:
        if not direct:
            patch.setattr(BaseJSONSerializer, "_serialize_type_structure", generic)
            patch.setattr(moto_patches, "_serialize_attribute_values_directly", lambda: None)
        wire_calls = [0]
        real_wire = moto_patches._attribute_value_wire

        def counting_wire(value: Any, base64: Any) -> Any:
            wire_calls[0] += 1
            return real_wire(value, base64)

        patch.setattr(moto_patches, "_attribute_value_wire", counting_wire)
        responses: list[tuple[str, int, str, bytes]] = []
        with emulator.LocalAws() as local:
            ddb = local.client("dynamodb")
            _create_table(ddb)
            seen: dict[str, Any] = {}

            def keep(http_response: Any, **_: Any) -> None:
                seen["http"] = http_response

            ddb.meta.events.register("after-call.dynamodb", keep)
            for label, call in _script(ddb):
                seen.clear()
                with contextlib.suppress(ClientError):
                    call()
                http = seen["http"]
                responses.append((label, http.status_code, http.headers.get("x-amzn-ErrorType", ""),
                                  http.content))
        assert (wire_calls[0] > 0) == direct, "the direct path must run exactly when enabled"
    return responses


def test_every_response_is_byte_for_byte_moto_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    generic = _run_script(direct=False, monkeypatch=monkeypatch)
    direct = _run_script(direct=True, monkeypatch=monkeypatch)
    assert [label for label, *_ in direct] == [label for label, *_ in generic]
    for (label, *want), (_, *got) in zip(generic, direct, strict=True):
        assert got == want, label
    # The script reaches what it is meant to: errors and their details included.
    by_label = {label: (status, error, body) for label, status, error, body in direct}
    assert by_label["transact write canceled"][1].endswith("TransactionCanceledException")
    assert b"CancellationReasons" in by_label["transact write canceled"][2]
    assert b"ConditionalCheckFailed" in by_label["transact write canceled"][2]
    assert by_label["update condition fails"][1].endswith("ConditionalCheckFailedException")
    assert b'"Item"' in by_label["update condition fails"][2]
    assert b"LastEvaluatedKey" in by_label["query page 0"][2]
    assert b"LastEvaluatedKey" not in by_label["query page 3"][2]
    assert b'"B"' in by_label["get"][2] and b'"BS"' in by_label["get"][2]
    assert by_label["missing table"][1].endswith("ResourceNotFoundException")


def test_unusual_values_take_moto_s_own_path() -> None:
    """Anything the direct path does not mirror exactly is left to moto's serializer."""
    b64 = str
    generic = moto_patches._GENERIC
    assert moto_patches._attribute_value_wire({"S": 1}, b64) is generic
    assert moto_patches._attribute_value_wire({"s": "lower-case key"}, b64) is generic
    assert moto_patches._attribute_value_wire({"SS": ["a", None]}, b64) is generic
    assert moto_patches._attribute_value_wire({"M": {"k": {"S": 2}}}, b64) is generic
    assert moto_patches._attribute_value_wire({"L": [{"N": 3}]}, b64) is generic
    assert moto_patches._attribute_value_wire(["not", "a", "dict"], b64) is generic
    # None members, map values and list items: dropped, dropped, kept (as moto does).
    assert moto_patches._attribute_value_wire({"S": None, "N": "1"}, b64) == {"N": "1"}
    assert moto_patches._attribute_value_wire({"M": {"a": None, "b": {"S": "x"}}}, b64) == {
        "M": {"b": {"S": "x"}}}
    assert moto_patches._attribute_value_wire({"L": [None, {"S": "x"}]}, b64) == {"L": [None, {"S": "x"}]}
