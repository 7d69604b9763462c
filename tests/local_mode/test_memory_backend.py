"""``LocalAws(dynamodb="memory")``: the handlers' DynamoDB is the in-memory store, and
everything around a call behaves as with moto: the hooks and ``CallFaults`` see the same
calls, a throttle is not executed, a lost response is, ``ApiFaults`` injections are retried
by botocore's standard retries (a transient one hidden, a persistent one surfacing), errors
are the client's own exception classes, and the emulator's inspection clients read the same
tables.

Each test runs one script of calls on both backends and compares what the caller saw.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError, ParamValidationError, ReadTimeoutError

from gpu_recovery.adapters import aws
from local_mode.emulator import DYNAMODB_BACKENDS, LocalAws
from local_mode.sim.api_errors import ATTEMPTS, INTERNAL
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE

ITEM = {"job_id_rank": "job-1#job", "job_state": "RUNNING", "attempt": Decimal(1),
        "nodes": {"node-a", "node-b"}, "spec": {"gpus": Decimal(8), "tags": ["a", "b"]}}
KEY = {"job_id_rank": "job-1#job"}


#: not compared: request metadata, and the capacity moto reports unasked (DynamoDB, and the
#: store, only when ReturnConsumedCapacity asks; nothing here asks)
UNCOMPARED = ("ResponseMetadata", "ConsumedCapacity")


def outcome(call: Any) -> Any:
    """What the caller sees: the response, or the error's class, code and modeled fields."""
    try:
        response = call()
    except ClientError as error:
        return ("error", type(error).__name__, error.response["Error"]["Code"],
                {k: v for k, v in error.response.items() if k not in ("Error", *UNCOMPARED)})
    except (ReadTimeoutError, ParamValidationError) as error:
        return ("raised", type(error).__name__)
    return {k: v for k, v in response.items() if k not in UNCOMPARED}


def _sets_sorted(value: Any) -> Any:
    """A DynamoDB set's members in no particular order (the API keeps none): compared sorted."""
    if isinstance(value, dict):
        return {k: (sorted(v) if k in ("SS", "NS", "BS") and isinstance(v, list) else _sets_sorted(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_sets_sorted(v) for v in value)
    return value


def on_both(script: Any) -> dict[str, Any]:
    seen = {}
    for backend in DYNAMODB_BACKENDS:
        with LocalAws(dynamodb=backend) as local:
            seen[backend] = _sets_sorted(script(local))
    assert seen["memory"] == seen["moto"]
    return seen["memory"]


def test_the_handlers_and_the_inspection_clients_share_the_tables() -> None:
    def script(local: LocalAws) -> Any:
        jobs = aws.resource("dynamodb").Table(local.job_table)
        seen = [outcome(lambda: jobs.put_item(Item=ITEM)),
                outcome(lambda: local.resource("dynamodb").Table(local.job_table).get_item(Key=KEY)),
                outcome(lambda: local.client("dynamodb").get_item(TableName=local.job_table,
                                                                  Key={"job_id_rank": {"S": "job-1#job"}})),
                outcome(lambda: aws.client("dynamodb").update_item(
                    TableName=local.job_table, Key={"job_id_rank": {"S": "job-1#job"}},
                    UpdateExpression="SET attempt = attempt + :one",
                    ExpressionAttributeValues={":one": {"N": "1"}}, ReturnValues="UPDATED_NEW")),
                outcome(lambda: jobs.query(KeyConditionExpression=Key("job_id_rank").eq("job-1#job"))),
                outcome(lambda: jobs.put_item(Item=ITEM, ConditionExpression=Attr("job_id_rank").not_exists(),
                                              ReturnValuesOnConditionCheckFailure="ALL_OLD")),
                outcome(lambda: jobs.meta.client.transact_write_items(TransactItems=[
                    {"ConditionCheck": {"TableName": local.job_table, "Key": KEY,
                                        "ConditionExpression": "attempt = :one",
                                        "ExpressionAttributeValues": {":one": Decimal(1)}}}])),
                outcome(lambda: aws.resource("dynamodb").Table("no-such-table").get_item(Key=KEY))]
        for table in (local.job_table, local.instance_table, local.node_token_table, local.quota_table,
                      local.idempotency_table):
            described = local.client("dynamodb").describe_table(TableName=table)["Table"]
            seen.append((table, described["KeySchema"], sorted(described["AttributeDefinitions"],
                                                               key=lambda a: a["AttributeName"]),
                         sorted(i["IndexName"] for i in described.get("GlobalSecondaryIndexes", []))))
        return seen

    seen = on_both(script)
    assert seen[2]["Item"]["attempt"] == {"N": "1"}  # the low-level client: DynamoDB JSON
    assert seen[5][2] == "ConditionalCheckFailedException"


@pytest.mark.parametrize("mode", [THROTTLE, LOST_RESPONSE])
def test_a_broken_call_is_counted_and_broken_as_on_moto(mode: str) -> None:
    def script(local: LocalAws) -> Any:
        jobs = aws.resource("dynamodb").Table(local.job_table)
        local.call_faults.arm(2, mode, record_sites=True)
        seen = [outcome(lambda: jobs.put_item(Item=ITEM)),
                outcome(lambda: jobs.update_item(Key=KEY, UpdateExpression="SET job_state = :s",
                                                 ExpressionAttributeValues={":s": "STOPPING"})),
                # invalid: refused by botocore's validation, before any hook counts it
                outcome(lambda: jobs.get_item(Key=KEY, ConsistentRead="yes")),
                outcome(lambda: jobs.get_item(Key=KEY, ConsistentRead=True))]
        fired = local.call_faults.fired
        local.call_faults.disarm()
        return seen, [(c.index, c.service, c.operation) for c in local.call_faults.calls], \
            (fired.index, fired.service, fired.operation) if fired else None

    seen, calls, fired = on_both(script)
    assert calls == [(1, "dynamodb", "PutItem"), (2, "dynamodb", "UpdateItem"), (3, "dynamodb", "GetItem")]
    assert fired == (2, "dynamodb", "UpdateItem")
    assert seen[2] == ("raised", "ParamValidationError")
    state = seen[3]["Item"]["job_state"]
    assert state == ("RUNNING" if mode == THROTTLE else "STOPPING")  # a throttle does not execute


def test_injected_errors_go_through_botocore_s_retries() -> None:
    def script(local: LocalAws) -> Any:
        jobs = aws.resource("dynamodb").Table(local.job_table)
        local.faults.transient("dynamodb", "PutItem", failures=2)
        hidden = outcome(lambda: jobs.put_item(Item=ITEM))
        transient = (local.faults.count("dynamodb", "PutItem"), len(local.retry_sleeps))
        local.faults.persistent("dynamodb", "GetItem", error=INTERNAL)
        surfaced = outcome(lambda: jobs.get_item(Key=KEY))
        persistent = local.faults.count("dynamodb", "GetItem")
        local.faults.clear()
        return hidden, transient, surfaced, persistent, outcome(lambda: jobs.get_item(Key=KEY))

    hidden, transient, surfaced, persistent, after = on_both(script)
    assert hidden == {} and transient == (2, 2)
    assert surfaced[:3] == ("error", "ClientError", "InternalError") and persistent == ATTEMPTS
    assert after["Item"]["job_state"] == "RUNNING"
