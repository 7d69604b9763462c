"""ProjectionExpression on the in-memory DynamoDB (local_mode/sim/dynamo/projections.py):
GetItem, BatchGetItem, Query and Scan return the document paths asked for (nested paths,
placeholders, a path the item lacks left out) as moto does, and refuse what DynamoDB refuses:
ExpressionAttributeNames no expression uses (as moto) and, where moto answers anyway, an
undefined ``#name`` (not a literal attribute name) and a reserved word used as a name."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.conditions import Key
from botocore.exceptions import ClientError

from gpu_recovery.adapters import aws
from local_mode.emulator import DYNAMODB_BACKENDS, LocalAws
from local_mode.sim.dynamo.projections import projection_paths
from local_mode.sim.dynamo.values import _Failure

ITEM = {"job_id_rank": "job-1#job", "job_state": "RUNNING", "attempt": Decimal(1),
        "nodes": {"node-a", "node-b"}, "spec.flat": "dotted name",
        "spec": {"gpus": Decimal(8), "tags": ["a", "b"], "nested": {"deep": "d", "kept": "o"}}}
KEY = {"job_id_rank": "job-1#job"}
ABSENT_KEY = {"job_id_rank": "job-9#job"}

#: (ProjectionExpression, ExpressionAttributeNames or None)
PROJECTIONS = [
    ("job_state, spec.gpus", None),
    ("#s, #p.#g", {"#s": "job_state", "#p": "spec", "#g": "gpus"}),
    ("spec.nested.deep, spec.tags, attempt", None),
    ("spec.#i", {"#i": "nested"}),
    ("spec.#o.deep", {"#o": "nested"}),
    ("#f", {"#f": "spec.flat"}),  # a placeholder is one name, dots and all
    ("job_state, absent, spec.absent, spec.nested.deep, absent.deep", None),  # absent paths left out
    ("absent", None),
    (" nodes ,attempt", None),
]


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        response = call()
    except ClientError as error:
        return "error", error.response["Error"]["Code"], error.response["Error"]["Message"]
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in response.items()
            if k not in ("ResponseMetadata", "ConsumedCapacity")}


def _sorted_sets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_sets(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_sorted_sets(v) for v in value)
    if isinstance(value, set):
        return sorted(value)
    return value


def _reads(local: LocalAws, projection: str, names: dict[str, str] | None) -> list[Any]:
    """A projection's answers: GetItem (resource and low-level client), BatchGetItem, Query,
    Scan, and GetItem / BatchGetItem / Query of an absent item."""
    jobs = aws.resource("dynamodb").Table(local.job_table)
    asked: dict[str, Any] = {"ProjectionExpression": projection}
    if names is not None:
        asked["ExpressionAttributeNames"] = names
    client = aws.client("dynamodb")
    return [_sorted_sets(_outcome(call)) for call in (
        lambda: jobs.get_item(Key=KEY, **asked),
        lambda: client.get_item(TableName=local.job_table, Key={"job_id_rank": {"S": KEY["job_id_rank"]}},
                                **asked),
        lambda: aws.resource("dynamodb").batch_get_item(
            RequestItems={local.job_table: {"Keys": [KEY, ABSENT_KEY], **asked}}),
        lambda: jobs.query(KeyConditionExpression=Key("job_id_rank").eq(KEY["job_id_rank"]), **asked),
        lambda: jobs.scan(**asked),
        lambda: jobs.get_item(Key=ABSENT_KEY, **asked),
        lambda: jobs.query(KeyConditionExpression=Key("job_id_rank").eq(ABSENT_KEY["job_id_rank"]),
                           **asked))]


def _on(backend: str, script: Callable[[LocalAws], Any]) -> Any:
    with LocalAws(dynamodb=backend) as local:
        aws.resource("dynamodb").Table(local.job_table).put_item(Item=ITEM)
        seen = script(local)
        local.requests.take()  # the refusals the script expects
    return seen


@pytest.mark.parametrize(("projection", "names"), PROJECTIONS, ids=[p for p, _ in PROJECTIONS])
def test_a_projection_answers_as_on_moto(projection: str, names: dict[str, str] | None) -> None:
    seen = {backend: _on(backend, lambda local: _reads(local, projection, names))
            for backend in DYNAMODB_BACKENDS}
    assert seen["memory"] == seen["moto"]
    assert not any(isinstance(s, tuple) for s in seen["memory"])  # answered, not refused


def test_the_projections_return_nested_paths_and_leave_absent_ones_out() -> None:
    """What the comparison above compares (moto's answers are right here)."""
    get, wire, batch, query, scan, absent, empty = _on("memory", lambda local: _reads(
        local, "#s, spec.nested.deep, spec.#g, absent, spec.absent", {"#s": "job_state", "#g": "gpus"}))
    expected = {"job_state": "RUNNING", "spec": {"nested": {"deep": "d"}, "gpus": Decimal(8)}}
    assert get == {"Item": expected}
    assert wire == {"Item": {"job_state": {"S": "RUNNING"},
                             "spec": {"M": {"nested": {"M": {"deep": {"S": "d"}}}, "gpus": {"N": "8"}}}}}
    assert list(batch["Responses"].values()) == [[expected]]
    assert query["Items"] == [expected] and scan["Items"] == [expected]
    assert absent == {} and empty["Items"] == []


#: requests DynamoDB and moto refuse alike: (projection, names)
REFUSED_ALIKE = [
    ("job_state", {"#x": "attempt"}),  # a name no expression uses
    ("#s", {"#s": "job_state", "#u": "unused"}),
]


@pytest.mark.parametrize(("projection", "names"), REFUSED_ALIKE, ids=[p for p, _ in REFUSED_ALIKE])
def test_unused_names_are_refused_as_on_moto(projection: str, names: dict[str, str]) -> None:
    seen = {backend: _on(backend, lambda local: _reads(local, projection, names))
            for backend in DYNAMODB_BACKENDS}
    assert seen["memory"] == seen["moto"]
    unused = next(iter(n for n in names if n not in projection))
    refusal = ("error", "ValidationException",
               f"Value provided in ExpressionAttributeNames unused in expressions: keys: {{{unused}}}")
    assert seen["memory"] == [refusal] * 7  # BatchGetItem too, and with the item absent


def test_batch_get_names_without_a_projection_are_refused_as_get_item_refuses_them() -> None:
    def script(local: LocalAws) -> Any:
        names = {"ExpressionAttributeNames": {"#x": "attempt"}}
        return [_outcome(lambda: aws.resource("dynamodb").Table(local.job_table).get_item(Key=KEY, **names)),
                _outcome(lambda: aws.resource("dynamodb").batch_get_item(
                    RequestItems={local.job_table: {"Keys": [KEY], **names}}))]

    refusal = ("error", "ValidationException", "ExpressionAttributeNames can only be specified when using "
               "expressions")
    assert _on("memory", script) == [refusal, refusal]


#: requests DynamoDB refuses and moto answers: (projection, names, the message)
UNDEFINED = "Invalid ProjectionExpression: An expression attribute name used in the document path is not " \
            "defined; attribute name: "
REFUSED_HERE = [
    ("#s, #x", {"#s": "job_state"}, UNDEFINED + "#x"),
    ("#x", None, UNDEFINED + "#x"),
    ("#p.#g", {"#p": "spec"}, UNDEFINED + "#g"),
    ("spec.#g[0]", None, UNDEFINED + "#g"),
]


@pytest.mark.parametrize(("projection", "names", "message"), REFUSED_HERE,
                         ids=[p for p, _, _ in REFUSED_HERE])
def test_an_undefined_placeholder_is_refused_not_taken_as_a_name(
        projection: str, names: dict[str, str] | None, message: str) -> None:
    seen = _on("memory", lambda local: _reads(local, projection, names))
    assert seen == [("error", "ValidationException", message)] * 7  # the item there or not


def test_a_reserved_word_as_a_name_is_refused() -> None:
    seen = {backend: _on(backend, lambda local: _reads(local, "job_state, size", None))
            for backend in DYNAMODB_BACKENDS}
    message = "Invalid ProjectionExpression: Attribute name is a reserved keyword; reserved keyword: "
    assert seen["memory"] == [("error", "ValidationException", message + "size")] * 7
    # moto refuses it too (its message lacks DynamoDB's "Invalid ")
    assert [s[:2] for s in seen["moto"]] == [("error", "ValidationException")] * 7
    # in a document path too (moto checks only a whole path), and not behind a placeholder
    nested = _on("memory", lambda local: _reads(local, "spec.other, spec.#o", {"#o": "other"}))
    assert nested == [("error", "ValidationException", message + "other")] * 7


def test_the_paths_are_kept_per_expression_and_names() -> None:
    """The same text with other names projects other attributes (paths cached by the text
    alone would project the first call's), and a refusal is not kept as an answer."""
    assert projection_paths("#a, #b.c", {"#a": "x", "#b": "y"}) == (("x",), ("y", "c"))
    assert projection_paths("#a, #b.c", {"#a": "y", "#b": "x"}) == (("y",), ("x", "c"))
    with pytest.raises(_Failure):
        projection_paths("#a, #b.c", {"#a": "x"})
    assert projection_paths("#a, #b.c", {"#a": "x", "#b": "z"}) == (("x",), ("z", "c"))
