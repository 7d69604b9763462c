"""The limits AWS states only in the API references' prose (botocore's service models do not
carry them), for every operation the stack calls; each with the page that states it.

``OPERATIONS`` names every operation the stack's code calls (adapters/, the repository, the
Powertools idempotency layer of the jobs API) with the API reference page reviewed for it;
``LIMITS`` holds the prose limits found there, as checks over a request's parameters (as
botocore holds them before serializing: DynamoDB attribute values in DynamoDB JSON). The
request guard (:mod:`.requests`) runs them after the model's own constraints.

A limit that depends on state the stack does not own (the custom attributes users put on
their own container instances) gives an ``answer``: the emulator refuses the call with AWS's
error, as AWS would, and the code must handle it; a limit the stack's own request breaks is a
violation that fails the run.

Where partitions differ, the stricter figure is used: SQS messages and asynchronous Lambda
payloads are 256 KiB in the API references of the China partition (the stack synthesizes for
it), 1 MiB in the commercial one since 2025. DynamoDB's limits are ``dynamodb_limits``', SNS's
and SQS's ``messaging_limits``'.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import regex

from . import dynamodb_limits as ddb
from . import messaging_limits as messaging
from .findings import Finding, ProseLimit, RequestState, out_of_range, too_many, utf8_bytes

# ------------------------------------------------------------------------------ citations
ECS_API = "Amazon ECS API Reference"
ECS_TAG = f"{ECS_API}, Tag (data type): 'The following basic restrictions apply to tags'"
ECS_ATTRIBUTE = f"{ECS_API}, Attribute (data type): name, value"


# =================================================================================== ECS
STARTED_BY = regex.compile(r"[A-Za-z0-9/_-]{1,36}")
ATTRIBUTE_NAME = regex.compile(r"[A-Za-z0-9_./\\-]{1,128}")
ATTRIBUTE_VALUE = regex.compile(r"[A-Za-z0-9_.@/\\: -]{1,128}")
MAX_CUSTOM_ATTRIBUTES = 10
MAX_OVERRIDES_CHARS = 8192
BUILT_IN_ATTRIBUTE_PREFIXES = ("ecs.", "com.amazonaws.ecs.")
LIST_TASKS_FILTERS = ("containerInstance", "family", "serviceName", "desiredStatus", "launchType")


def _started_by(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    value = params.get("startedBy")
    if value is not None and not STARTED_BY.fullmatch(str(value)):
        yield Finding(
            "startedBy", value, "up to 36 letters, digits, hyphens, forward slashes and underscores"
        )


def _start_task_instances(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("containerInstances", params.get("containerInstances"), 10, "container instances")


def _overrides_size(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    overrides = params.get("overrides")
    if overrides:
        size = len(json.dumps(overrides, separators=(",", ":"), default=str))
        if size > MAX_OVERRIDES_CHARS:
            yield Finding(
                "overrides",
                f"{size} characters of JSON",
                f"at most {MAX_OVERRIDES_CHARS} characters, JSON formatting included",
            )


def _tags(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    seen: set[str] = set()
    for i, tag in enumerate(params.get("tags") or []):
        key, value = str(tag.get("key", "")), str(tag.get("value", ""))
        if key.lower().startswith("aws:") or value.lower().startswith("aws:"):
            yield Finding(
                f"tags[{i}]", tag, "the aws: prefix (any case) is reserved for AWS, keys and values"
            )
        if key in seen:
            yield Finding(f"tags[{i}].key", key, "each tag key unique on a resource")
        seen.add(key)


def _stop_reason(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    reason = params.get("reason")
    if reason is not None and len(str(reason)) > 255:
        yield Finding("reason", reason, "up to 255 characters")


def _describe_tasks(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("tasks", params.get("tasks"), 100, "tasks")


def _describe_cis(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("containerInstances", params.get("containerInstances"), 100, "container instances")


def _describe_clusters(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("clusters", params.get("clusters"), 100, "clusters")


def _list_attributes(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from out_of_range("maxResults", params.get("maxResults"), 1, 100)


def _update_cis_state(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("containerInstances", params.get("containerInstances"), 10, "container instances")
    status = params.get("status")
    if status is not None and status not in ("ACTIVE", "DRAINING"):
        yield Finding("status", status, "ACTIVE or DRAINING (the only valid values for this action)")


def _list_tasks(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    if params.get("startedBy"):
        others = [f for f in LIST_TASKS_FILTERS if params.get(f)]
        if others:
            yield Finding(
                "startedBy",
                {"startedBy": params["startedBy"], **{f: params[f] for f in others}},
                "startedBy must be the only filter",
            )
        yield from _started_by(params, state)
    yield from out_of_range("maxResults", params.get("maxResults"), 1, 100)


def _list_cis(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from out_of_range("maxResults", params.get("maxResults"), 1, 100)


def _attribute_targets(params: Mapping[str, Any], *, deleting: bool) -> Iterator[Finding]:
    attributes = list(params.get("attributes") or [])
    yield from too_many("attributes", attributes, 10, "attributes a call")
    for i, attribute in enumerate(attributes):
        name, value = attribute.get("name"), attribute.get("value")
        if name is not None and not ATTRIBUTE_NAME.fullmatch(str(name)):
            yield Finding(
                f"attributes[{i}].name",
                name,
                "1 to 128 letters, digits, hyphens, underscores, forward or back slashes, periods",
            )
        if value is not None and deleting:
            yield Finding(
                f"attributes[{i}].value",
                value,
                "a custom attribute is deleted by name and target, without its value",
            )
        elif value is not None and (
            not ATTRIBUTE_VALUE.fullmatch(str(value)) or str(value) != str(value).strip()
        ):
            yield Finding(
                f"attributes[{i}].value",
                value,
                "1 to 128 letters, digits, hyphens, underscores, periods, "
                "at signs, slashes, colons or spaces, not starting or "
                "ending with a space",
            )
        target = str(attribute.get("targetId") or "")
        if target and not target.startswith("arn:") and not attribute.get("targetType"):
            yield Finding(f"attributes[{i}].targetType", None, "required with a short target ID")


def _put_attributes(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from _attribute_targets(params, deleting=False)


def _delete_attributes(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from _attribute_targets(params, deleting=True)


def is_custom_attribute(name: str) -> bool:
    return not str(name).startswith(BUILT_IN_ATTRIBUTE_PREFIXES)


def _custom_attribute_count(params: Mapping[str, Any], state: RequestState) -> Iterator[Finding]:
    """10 custom attributes a container instance, counted with those already on it. The
    stack's own names past 10 are its violation; other names (users' own attributes) are
    the account's state: AWS refuses the call, which the code must handle."""
    by_target: dict[str, set[str]] = {}
    for attribute in params.get("attributes") or []:
        name = str(attribute.get("name", ""))
        if attribute.get("targetId") and is_custom_attribute(name):
            by_target.setdefault(str(attribute["targetId"]), set()).add(name)
    for target, names in by_target.items():
        existing = state.custom_attributes(params.get("cluster"), target)
        if existing is None:
            continue
        after = set(existing) | names
        if len(after) <= MAX_CUSTOM_ATTRIBUTES:
            continue
        ours = len(names)
        if ours > MAX_CUSTOM_ATTRIBUTES:
            yield Finding(
                "attributes",
                f"{ours} custom attributes on {target}",
                f"at most {MAX_CUSTOM_ATTRIBUTES} custom attributes a resource",
            )
        else:
            yield Finding(
                "attributes",
                f"{len(after)} custom attributes on {target} ({sorted(after)})",
                f"at most {MAX_CUSTOM_ATTRIBUTES} custom attributes a resource",
                answer=(
                    "AttributeLimitExceededException",
                    "You can apply up to 10 custom attributes for each resource.",
                ),
            )


# ======================================================================= the other services
LAMBDA_EVENT_PAYLOAD = 262_144
LAMBDA_SYNC_PAYLOAD = 6 * 1024 * 1024


def _invoke(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    payload = params.get("Payload") or b""
    size = len(payload) if isinstance(payload, bytes | bytearray) else utf8_bytes(payload)
    limit = LAMBDA_EVENT_PAYLOAD if params.get("InvocationType") == "Event" else LAMBDA_SYNC_PAYLOAD
    if size > limit:
        yield Finding("Payload", f"{size} bytes", f"at most {limit} bytes for this invocation type")
    name = str(params.get("FunctionName", ""))
    if ":" not in name and len(name) > 64:
        yield Finding("FunctionName", name, "a function name alone: up to 64 characters")


def _get_log_events(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    if params.get("logGroupName") and params.get("logGroupIdentifier"):
        yield Finding(
            "logGroupIdentifier",
            params["logGroupIdentifier"],
            "either logGroupIdentifier or logGroupName, not both",
        )


def _describe_asg_instances(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from too_many("InstanceIds", params.get("InstanceIds"), 50, "instance IDs")
    yield from out_of_range("MaxRecords", params.get("MaxRecords"), 1, 50)


def _describe_instances(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    if params.get("InstanceIds") and params.get("MaxResults") is not None:
        yield Finding("MaxResults", params["MaxResults"], "not with InstanceIds in the same request")


# ============================================================================ the tables
ECS_START = "ecs:StartTask"
LIMITS: tuple[ProseLimit, ...] = (
    ProseLimit(
        ECS_START,
        "containerInstances",
        "up to 10 container instances",
        f"{ECS_API}, StartTask (containerInstances)",
        _start_task_instances,
    ),
    ProseLimit(
        ECS_START,
        "startedBy",
        "up to 36 letters, digits, hyphens, forward slashes, underscores",
        f"{ECS_API}, StartTask (startedBy)",
        _started_by,
    ),
    ProseLimit(
        ECS_START,
        "overrides",
        "8192 characters of overrides, JSON formatting included",
        f"{ECS_API}, StartTask (overrides) / TaskOverride",
        _overrides_size,
    ),
    ProseLimit(
        ECS_START,
        "tags",
        "keys unique; no aws: prefix on keys or values (50 tags, key 128, value 256 "
        "and the character pattern are the model's)",
        ECS_TAG,
        _tags,
    ),
    ProseLimit(
        "ecs:StopTask", "reason", "up to 255 characters", f"{ECS_API}, StopTask (reason)", _stop_reason
    ),
    ProseLimit(
        "ecs:DescribeTasks", "tasks", "up to 100 tasks", f"{ECS_API}, DescribeTasks (tasks)", _describe_tasks
    ),
    ProseLimit(
        "ecs:DescribeContainerInstances",
        "containerInstances",
        "up to 100 container instances",
        f"{ECS_API}, DescribeContainerInstances (containerInstances)",
        _describe_cis,
    ),
    ProseLimit(
        "ecs:DescribeClusters",
        "clusters",
        "up to 100 clusters",
        f"{ECS_API}, DescribeClusters (clusters)",
        _describe_clusters,
    ),
    ProseLimit(
        "ecs:ListAttributes",
        "maxResults",
        "1-100",
        f"{ECS_API}, ListAttributes (maxResults)",
        _list_attributes,
    ),
    ProseLimit(
        "ecs:UpdateContainerInstancesState",
        "containerInstances, status",
        "up to 10 container instances; status ACTIVE or DRAINING only",
        f"{ECS_API}, UpdateContainerInstancesState",
        _update_cis_state,
    ),
    ProseLimit(
        "ecs:ListTasks",
        "startedBy, maxResults",
        "startedBy the only filter when given, up to 36 characters; maxResults 1-100",
        f"{ECS_API}, ListTasks (startedBy, maxResults)",
        _list_tasks,
    ),
    ProseLimit(
        "ecs:ListContainerInstances",
        "maxResults",
        "1-100",
        f"{ECS_API}, ListContainerInstances (maxResults)",
        _list_cis,
    ),
    ProseLimit(
        "ecs:PutAttributes",
        "attributes",
        "up to 10 attributes a call; name 1-128 [A-Za-z0-9-_/\\.]; "
        "value 1-128 [A-Za-z0-9-_.@/\\: ], no leading or trailing space; targetType with a short ID",
        f"{ECS_API}, PutAttributes (attributes); {ECS_ATTRIBUTE}",
        _put_attributes,
    ),
    ProseLimit(
        "ecs:PutAttributes",
        "attributes",
        "at most 10 custom attributes a resource, those on it counted",
        f"{ECS_API}, PutAttributes (attributes); AttributeLimitExceededException",
        _custom_attribute_count,
        stateful=True,
    ),
    ProseLimit(
        "ecs:DeleteAttributes",
        "attributes",
        "up to 10 attributes a request; custom attributes by name "
        "and target, without a value; targetType with a short ID",
        f"{ECS_API}, DeleteAttributes (attributes)",
        _delete_attributes,
    ),
    *messaging.LIMITS,
    ProseLimit(
        "lambda:Invoke",
        "Payload, FunctionName",
        "asynchronous payload 256 KB (6 MB synchronous); a bare function name up to 64 characters",
        "AWS Lambda API Reference, Invoke; InvokeAsync (256 KB)",
        _invoke,
    ),
    ProseLimit(
        "logs:GetLogEvents",
        "logGroupName, logGroupIdentifier",
        "one of them, not both",
        "Amazon CloudWatch Logs API Reference, GetLogEvents",
        _get_log_events,
    ),
    ProseLimit(
        "autoscaling:DescribeAutoScalingInstances",
        "InstanceIds, MaxRecords",
        "up to 50 instance IDs; MaxRecords up to 50",
        "Amazon EC2 Auto Scaling API Reference, DescribeAutoScalingInstances",
        _describe_asg_instances,
    ),
    ProseLimit(
        "ec2:DescribeInstances",
        "MaxResults",
        "not with InstanceIds",
        "Amazon EC2 API Reference, DescribeInstances (MaxResults)",
        _describe_instances,
    ),
    *ddb.LIMITS,
)

#: every operation the stack calls, with the API reference page reviewed for it (the
#: operations not in LIMITS have no limit beyond botocore's model)
OPERATIONS: dict[str, str] = {
    "ecs:StartTask": f"{ECS_API}, StartTask; Tag",
    "ecs:StopTask": f"{ECS_API}, StopTask",
    "ecs:DescribeTasks": f"{ECS_API}, DescribeTasks",
    "ecs:ListTasks": f"{ECS_API}, ListTasks",
    "ecs:DescribeContainerInstances": f"{ECS_API}, DescribeContainerInstances",
    "ecs:ListContainerInstances": f"{ECS_API}, ListContainerInstances",
    "ecs:UpdateContainerInstancesState": f"{ECS_API}, UpdateContainerInstancesState",
    "ecs:PutAttributes": f"{ECS_API}, PutAttributes; Attribute",
    "ecs:DeleteAttributes": f"{ECS_API}, DeleteAttributes",
    "ecs:DescribeTaskDefinition": f"{ECS_API}, DescribeTaskDefinition (no limit beyond the model)",
    "ec2:RebootInstances": "Amazon EC2 API Reference, RebootInstances (no limit beyond the model)",
    "ec2:DescribeInstances": "Amazon EC2 API Reference, DescribeInstances",
    "ssm:SendCommand": "AWS Systems Manager API Reference, SendCommand (InstanceIds 50, Comment 100, "
    "TimeoutSeconds 30-2592000: the model's)",
    "ssm:DescribeInstanceInformation": "AWS Systems Manager API Reference, DescribeInstanceInformation "
    "(Filters values 1-100, MaxResults 5-50: the model's)",
    **messaging.OPERATIONS,
    "logs:GetLogEvents": "Amazon CloudWatch Logs API Reference, GetLogEvents (limit 1-10000: the model's)",
    "autoscaling:DescribeAutoScalingInstances": "Amazon EC2 Auto Scaling API Reference, "
    "DescribeAutoScalingInstances",
    "autoscaling:TerminateInstanceInAutoScalingGroup": "Amazon EC2 Auto Scaling API Reference, "
    "TerminateInstanceInAutoScalingGroup (the model's)",
    "lambda:Invoke": "AWS Lambda API Reference, Invoke",
    **ddb.OPERATIONS,
    # gpu-recovery-doctor's reads of the deployment (cli/doctor): no limit beyond the model's
    # but those named in LIMITS
    "ecs:DescribeClusters": f"{ECS_API}, DescribeClusters",
    "ecs:ListAttributes": f"{ECS_API}, ListAttributes",
    "dynamodb:DescribeContinuousBackups": "Amazon DynamoDB API Reference, DescribeContinuousBackups",
    "events:DescribeRule": "Amazon EventBridge API Reference, DescribeRule",
    "events:ListTargetsByRule": "Amazon EventBridge API Reference, ListTargetsByRule (Limit: the model's)",
    "lambda:ListEventSourceMappings": "AWS Lambda API Reference, ListEventSourceMappings",
    "logs:DescribeLogGroups": "Amazon CloudWatch Logs API Reference, DescribeLogGroups (limit: the model's)",
    "sns:GetTopicAttributes": "Amazon SNS API Reference, GetTopicAttributes",
    "sns:ListSubscriptionsByTopic": "Amazon SNS API Reference, ListSubscriptionsByTopic",
    "sqs:GetQueueAttributes": "Amazon SQS API Reference, GetQueueAttributes",
    "ssm:ListTagsForResource": "AWS Systems Manager API Reference, ListTagsForResource",
    # gpu-recovery-admin return-node: who returns the node (its history line)
    "sts:GetCallerIdentity": "AWS Security Token Service API Reference, GetCallerIdentity (no parameters)",
}


def limits_by_operation() -> dict[str, tuple[ProseLimit, ...]]:
    by: dict[str, list[ProseLimit]] = {}
    for limit in LIMITS:
        by.setdefault(limit.operation, []).append(limit)
    return {operation: tuple(found) for operation, found in by.items()}
