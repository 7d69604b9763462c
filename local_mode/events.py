"""AWS-shaped EventBridge events, built the way AWS documents them.

* :func:`task_state_change` — "ECS Task State Change" (detail = the ECS Task object:
  attachments, availabilityZone, clusterArn, containerInstanceArn, containers, cpu,
  memory, createdAt, desiredStatus, group, launchType, lastStatus, overrides,
  startedAt, startedBy, stoppedAt, stoppedReason, stopCode, stoppingAt, taskArn,
  taskDefinitionArn, updatedAt, version). Real task events carry **no tags**, and a
  container's ``exitCode`` appears only once it has stopped.
* :func:`container_instance_state_change` — "ECS Container Instance State Change"
  (detail = the ContainerInstance object incl. GPU ``STRINGSET`` resources).
* :func:`scheduled_event` — an EventBridge rule's "Scheduled Event".

Times accept epoch seconds, ``datetime`` or an ISO string and are emitted as
``2026-11-20T14:03:10.123Z``. Omitted detail times are left out, like AWS does.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

ACCOUNT_ID = "123456789012"
REGION = "us-east-1"

TASK_DETAIL_TYPE = "ECS Task State Change"
CONTAINER_INSTANCE_DETAIL_TYPE = "ECS Container Instance State Change"

# Detail keys in documented order (AWS example events).
TASK_DETAIL_KEYS = (
    "attachments",
    "availabilityZone",
    "clusterArn",
    "containerInstanceArn",
    "containers",
    "cpu",
    "createdAt",
    "desiredStatus",
    "group",
    "launchType",
    "lastStatus",
    "memory",
    "overrides",
    "connectivity",
    "connectivityAt",
    "pullStartedAt",
    "pullStoppedAt",
    "startedAt",
    "startedBy",
    "stoppingAt",
    "stoppedAt",
    "stoppedReason",
    "stopCode",
    "executionStoppedAt",
    "taskArn",
    "taskDefinitionArn",
    "updatedAt",
    "version",
)
TASK_TIME_KEYS = frozenset(
    {
        "createdAt",
        "connectivityAt",
        "pullStartedAt",
        "pullStoppedAt",
        "startedAt",
        "stoppingAt",
        "stoppedAt",
        "executionStoppedAt",
        "updatedAt",
    }
)
CONTAINER_KEYS = (
    "containerArn",
    "exitCode",
    "lastStatus",
    "name",
    "image",
    "taskArn",
    "networkInterfaces",
    "cpu",
    "memory",
    "gpuIds",
    "reason",
)
CONTAINER_INSTANCE_DETAIL_KEYS = (
    "agentConnected",
    "attributes",
    "clusterArn",
    "containerInstanceArn",
    "ec2InstanceId",
    "registeredResources",
    "remainingResources",
    "status",
    "version",
    "versionInfo",
    "registeredAt",
    "updatedAt",
    "accountType",
)


def iso(value: float | datetime | str | None) -> str | None:
    """ISO 8601 UTC with milliseconds and a ``Z``, as EventBridge writes times."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        dt = datetime.fromtimestamp(float(value), tz=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def envelope(
    detail_type: str,
    source: str,
    detail: dict[str, Any],
    resources: list[str],
    *,
    time: float | datetime | str | None = None,
    account: str = ACCOUNT_ID,
    region: str = REGION,
    event_id: str | None = None,
) -> dict[str, Any]:
    """The EventBridge envelope (``version`` "0", fresh ``id`` unless given)."""
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": account,
        "time": (iso(time) or iso(datetime.now(tz=UTC)) or "")[:19] + "Z",
        "region": region,
        "resources": list(resources),
        "detail": detail,
    }


def _container(c: Mapping[str, Any], task_stopped: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in CONTAINER_KEYS:
        if key not in c or c[key] is None:
            continue
        if key == "exitCode" and not (task_stopped or c.get("lastStatus") == "STOPPED"):
            continue
        out[key] = c[key]
    out.setdefault("networkInterfaces", [])
    return out


def _documented(item: Mapping[str, Any], keys: Iterable[str], time_keys: Collection[str]) -> dict[str, Any]:
    """The documented keys ``item`` has a value for, in the documented order, times as ISO."""
    return {key: iso(item[key]) if key in time_keys else item[key]
            for key in keys if item.get(key) is not None}


def task_detail(task: Mapping[str, Any]) -> dict[str, Any]:
    """A documented task detail from a DescribeTasks-shaped mapping (tags dropped)."""
    stopped = task.get("lastStatus") == "STOPPED"
    detail = _documented(task, TASK_DETAIL_KEYS, TASK_TIME_KEYS)
    if "containers" in detail:
        detail["containers"] = [_container(c, stopped) for c in detail["containers"]]
    detail.setdefault("attachments", [])
    detail.setdefault("overrides", {"containerOverrides": []})
    detail.setdefault("launchType", "EC2")
    return detail


def task_state_change(task: Mapping[str, Any], *, time: float | datetime | str | None = None,
                      account: str = ACCOUNT_ID, region: str = REGION,
                      event_id: str | None = None) -> dict[str, Any]:
    """An "ECS Task State Change" event for ``task`` (camelCase ECS Task fields).

    ``time`` defaults to the task's ``updatedAt``.
    """
    return _ecs_state_change(TASK_DETAIL_TYPE, task_detail(task), "taskArn", task,
                             time, account, region, event_id)


def container_instance_detail(ci: Mapping[str, Any]) -> dict[str, Any]:
    detail = _documented(ci, CONTAINER_INSTANCE_DETAIL_KEYS, ("registeredAt", "updatedAt"))
    detail.setdefault("accountType", "ec2_instance")
    return detail


def container_instance_state_change(ci: Mapping[str, Any], *, time: float | datetime | str | None = None,
                                    account: str = ACCOUNT_ID, region: str = REGION,
                                    event_id: str | None = None) -> dict[str, Any]:
    """An "ECS Container Instance State Change" event for ``ci`` (ContainerInstance)."""
    return _ecs_state_change(CONTAINER_INSTANCE_DETAIL_TYPE, container_instance_detail(ci),
                             "containerInstanceArn", ci, time, account, region, event_id)


def _ecs_state_change(detail_type: str, detail: dict[str, Any], arn_key: str, item: Mapping[str, Any],
                      time: float | datetime | str | None, account: str, region: str,
                      event_id: str | None) -> dict[str, Any]:
    """The event of an ECS state change: its resource is the detail's ARN, its time (unless
    given) the item's ``updatedAt``."""
    return envelope(detail_type, "aws.ecs", detail, [detail[arn_key]],
                    time=time if time is not None else item.get("updatedAt"),
                    account=account, region=region, event_id=event_id)


def gpu_resource(gpu_ids: list[str]) -> dict[str, Any]:
    """The ``GPU`` entry of registered/remainingResources, as ECS reports it."""
    return {
        "name": "GPU",
        "type": "STRINGSET",
        "doubleValue": 0.0,
        "integerValue": 0,
        "longValue": 0,
        "stringSetValue": list(gpu_ids),
    }


def scheduled_event(
    rule_arn: str,
    *,
    time: float | datetime | str | None = None,
    account: str = ACCOUNT_ID,
    region: str = REGION,
) -> dict[str, Any]:
    """What an EventBridge schedule rule delivers to its target."""
    return envelope(
        "Scheduled Event",
        "aws.events",
        {},
        [rule_arn],
        time=time,
        account=account,
        region=region,
    )


_RECEIPT_PREFIX = "AQEB"


def receipt_handle(message_id: str) -> str:
    """The receipt handle a received message's record carries (the simulated queues read the
    message back from it: ``message_id_of``)."""
    return f"{_RECEIPT_PREFIX}{message_id}"


def message_id_of(handle: str) -> str | None:
    """The message a receipt handle of ``receipt_handle``'s names (None: not one of ours)."""
    return handle[len(_RECEIPT_PREFIX):] if handle.startswith(_RECEIPT_PREFIX) else None


def sqs_record(message_id: str, body: str, queue_arn: str, *, receive_count: int = 1,
               sent_at: float | None = None, first_received_at: float | None = None,
               region: str = REGION) -> dict[str, Any]:
    """One record of the event an SQS event source mapping gives its Lambda function (first
    received when sent unless ``first_received_at`` says)."""
    sent_ms = str(int((sent_at if sent_at is not None else 0.0) * 1000))
    first_ms = sent_ms if first_received_at is None else str(int(first_received_at * 1000))
    return {
        "messageId": message_id,
        "receiptHandle": receipt_handle(message_id),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": str(receive_count),
            "SentTimestamp": sent_ms,
            "SenderId": "AROAEXAMPLE:gpu-recovery",
            "ApproximateFirstReceiveTimestamp": first_ms,
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode(), usedforsecurity=False).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }
