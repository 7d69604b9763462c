"""What IAM authorizes one AWS call against: the action(s), the resource ARN(s) and the
condition keys of the request, per operation the stack calls.

From the Service Authorization Reference (the "Actions defined by ..." table of each
service: resource types and condition keys), the services' guides where the reference is
silent, and the exceptions known in practice:

* **DynamoDB.** An item operation is authorized against its table's ARN; ``Query`` /
  ``Scan`` on an index against ``table/<t>/index/<i>``; ``BatchGetItem`` /
  ``BatchWriteItem`` as themselves against each table they touch; ``TransactWriteItems``
  per item, as the item's own action (``PutItem``, ``UpdateItem``, ``DeleteItem``,
  ``ConditionCheckItem``) against the item's table, ``TransactGetItems`` as ``GetItem``
  per item (DynamoDB Developer Guide, "Using IAM with DynamoDB transactions"). Condition
  keys supplied: ``dynamodb:LeadingKeys`` (the partition key values) and, inside a
  transaction, ``dynamodb:EnclosingOperation``.
* **ECS.** ``StartTask`` / ``RunTask`` against the task definition, with ``ecs:cluster``
  and ``ecs:container-instances``; tags passed to them need ``ecs:TagResource`` on the new
  task with ``ecs:CreateAction`` (ECS Developer Guide, "Grant permission to tag resources on
  creation"), and the task's roles (the overrides' and the task definition's task and
  execution roles) ``iam:PassRole`` with ``iam:PassedToService``. ``StopTask`` /
  ``DescribeTasks`` against each task, ``DescribeContainerInstances`` /
  ``UpdateContainerInstancesState`` / ``PutAttributes`` / ``DeleteAttributes`` against
  each container instance, all with ``ecs:cluster``; ``ListContainerInstances`` against
  the cluster. ``ListTasks`` against the container instance it names, and, naming none,
  against ``*`` with ``ecs:cluster`` (the reference lists only container-instance; AWS
  evaluates ``*``: cdklabs/construct-hub#1207, awsdocs/amazon-ecs-developer-guide#211).
  ``DescribeTaskDefinition`` supports no resource (``*``).
* **EC2 / SSM / Auto Scaling.** ``RebootInstances`` against each instance with its tags
  (``aws:ResourceTag/<key>``); ``SendCommand`` against the document and each target
  instance (``instance/i-...`` or ``managed-instance/mi-...``, with its tags);
  ``TerminateInstanceInAutoScalingGroup`` against the instance's group with the group's
  tags; the Describe calls against ``*``.
* **SNS, SQS, Logs, Lambda, CloudWatch.** ``Publish`` against the topic, plus
  ``kms:GenerateDataKey`` and ``kms:Decrypt`` on the topic's key when the topic is
  encrypted (SNS Developer Guide, "Key management": the publisher needs both);
  ``SendMessage[Batch]`` as ``sqs:SendMessage`` against the queue; ``GetLogEvents``
  against ``log-group:<g>:log-stream:<s>``; ``Invoke`` as ``lambda:InvokeFunction``
  against the function; ``PutMetricData`` against ``*`` with ``cloudwatch:namespace``.

An operation not listed here fails the run (:class:`UnknownOperation`): the guard must be
told what it is authorized against before the code may call it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: condition keys whose absent values are known to be absent (a resource without that tag),
#: not unknown to the evaluator
_TAG_PREFIXES = ("aws:resourcetag/", "ec2:resourcetag/", "ssm:resourcetag/", "autoscaling:resourcetag/")


class Context(dict[str, "tuple[str, ...] | None"]):
    """A request's condition keys (lower-case) -> values; a resource's tags answer every
    ``...:ResourceTag/<key>``, absent tags with None."""

    def __init__(self, values: Mapping[str, Sequence[str] | None] | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        super().__init__({k.lower(): (tuple(v) if v is not None else None)
                          for k, v in (values or {}).items()})
        self.tags = {k: v for k, v in (tags or {}).items()} if tags is not None else None

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str) and self.tags is not None and key.startswith(_TAG_PREFIXES):
            return True
        return super().__contains__(key)

    def __getitem__(self, key: str) -> tuple[str, ...] | None:
        if self.tags is not None and key.startswith(_TAG_PREFIXES) and not super().__contains__(key):
            tag = key.split("/", 1)[1]
            found = next((v for k, v in self.tags.items() if k.lower() == tag), None)
            return (found,) if found is not None else None
        return super().__getitem__(key)


@dataclass(frozen=True)
class Need:
    """One authorization the call needs."""

    action: str
    resource: str
    context: Context = field(default_factory=Context)
    #: the resource's form for the reports (ids replaced: ``task/<cluster>/<task-id>``)
    form: str = ""


class UnknownOperation(Exception):
    """The guard does not know what an operation is authorized against."""


class Facts(Protocol):
    """What the guard needs to know of the account it runs in."""

    region: str
    account: str
    cluster: str  # the default cluster's name (the ``cluster`` parameter left out)

    def partition_key(self, table: str) -> str | None: ...

    def resource_tags(self, arn: str) -> dict[str, str] | None: ...

    def task_definition_arn(self, reference: str) -> str: ...

    def task_definition_roles(self, arn: str) -> list[str]: ...

    def topic_key(self, topic_arn: str) -> str | None: ...

    def auto_scaling_group_of(self, instance_id: str) -> str | None: ...


# ======================================================================== helpers
def _p(facts: Facts, service: str, rest: str) -> str:
    return f"arn:aws:{service}:{facts.region}:{facts.account}:{rest}"


def _cluster_name(facts: Facts, params: Mapping[str, Any]) -> str:
    cluster = str(params.get("cluster") or facts.cluster or "default")
    return cluster.rsplit("/", 1)[-1] if cluster.startswith("arn:") else cluster


def _cluster_arn(facts: Facts, params: Mapping[str, Any]) -> str:
    return _p(facts, "ecs", f"cluster/{_cluster_name(facts, params)}")


def _ecs_arn(facts: Facts, params: Mapping[str, Any], kind: str, ref: str) -> str:
    if ref.startswith("arn:"):
        return ref
    return _p(facts, "ecs", f"{kind}/{_cluster_name(facts, params)}/{ref}")


def _in_cluster(facts: Facts, params: Mapping[str, Any], **more: Sequence[str] | None) -> Context:
    return Context({"ecs:cluster": (_cluster_arn(facts, params),), **more})


@functools.lru_cache(maxsize=16384)
def _form(arn: str) -> str:
    """An ARN with its generated ids replaced (``task/gpu-cluster/<id>``), for the reports."""
    arn = re.sub(r"(task|container-instance)/([^/]+)/[^/]+$", r"\1/\2/<id>", arn)
    arn = re.sub(r"instance/(i|mi)-[0-9a-f]+$", r"instance/\1-<id>", arn)
    arn = re.sub(r"task-definition/([^:]+):\d+$", r"task-definition/<family>:<revision>", arn)
    arn = re.sub(r"log-stream:.+$", "log-stream:<stream>", arn)
    return re.sub(r":\d{12}:", ":<account>:", arn)


def need(action: str, resource: str, context: Context | None = None) -> Need:
    return Need(action, resource, context if context is not None else Context(), _form(resource))


# ======================================================================== DynamoDB
def _key_value(value: Any) -> str | None:
    """A key attribute's value as IAM sees it (resource: Python; client: {"S": ...})."""
    if isinstance(value, Mapping):
        for kind in ("S", "N", "B"):
            if kind in value:
                return str(value[kind])
        return None
    return None if value is None else str(value)


def _leading_keys(facts: Facts, table: str, keys: Sequence[Mapping[str, Any]]) -> tuple[str, ...] | None:
    name = facts.partition_key(table)
    if name is None:
        return None
    values = [_key_value(k.get(name)) for k in keys]
    if any(v is None for v in values):
        return None
    return tuple(dict.fromkeys(v for v in values if v is not None))


def _query_leading_key(facts: Facts, params: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The partition key value of a Query's key condition (None: not found)."""
    table = str(params.get("TableName"))
    if params.get("IndexName"):
        return None  # an index's partition key is not the table's: LeadingKeys is the table's
    name = facts.partition_key(table)
    condition = params.get("KeyConditionExpression")
    if name is None or condition is None:
        return None
    if not isinstance(condition, str):  # boto3's Key(...).eq(...) & ...
        return _condition_value(condition, name)
    names = {v: k for k, v in (params.get("ExpressionAttributeNames") or {}).items()}
    values = params.get("ExpressionAttributeValues") or {}
    for match in re.finditer(r"([#\w.]+)\s*=\s*(:\w+)", condition):
        attribute = match.group(1)
        if attribute == name or names.get(name) == attribute:
            found = _key_value(values.get(match.group(2)))
            return (found,) if found is not None else None
    return None


def _condition_value(condition: Any, name: str) -> tuple[str, ...] | None:
    """boto3 conditions: ``Key(name).eq(v)``, possibly inside an ``And``."""
    values = getattr(condition, "get_expression", lambda: None)()
    if not values:
        return None
    operator, parts = values.get("operator"), values.get("values") or ()
    if operator == "=" and parts and getattr(parts[0], "name", None) == name:
        return (str(parts[1]),)
    for part in parts:
        found = _condition_value(part, name)
        if found is not None:
            return found
    return None


def _table_arn(facts: Facts, table: str, index: str | None = None) -> str:
    arn = _p(facts, "dynamodb", f"table/{table}")
    return f"{arn}/index/{index}" if index else arn


def _item_need(facts: Facts, action: str, table: str, key: Mapping[str, Any] | None,
               enclosing: str | None = None) -> Need:
    values: dict[str, Sequence[str] | None] = {
        "dynamodb:LeadingKeys": _leading_keys(facts, table, [key or {}])}
    if enclosing:
        values["dynamodb:EnclosingOperation"] = (enclosing,)
    return need(f"dynamodb:{action}", _table_arn(facts, table), Context(values))


def _dynamodb(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation in ("GetItem", "UpdateItem", "DeleteItem"):
        yield _item_need(facts, operation, str(params["TableName"]), params.get("Key"))
    elif operation == "PutItem":
        yield _item_need(facts, operation, str(params["TableName"]), params.get("Item"))
    elif operation in ("Query", "Scan"):
        table = str(params["TableName"])
        context = Context({"dynamodb:LeadingKeys": _query_leading_key(facts, params)} if operation == "Query"
                          else {})
        yield need(f"dynamodb:{operation}", _table_arn(facts, table, params.get("IndexName")), context)
    elif operation in ("BatchGetItem", "BatchWriteItem"):
        for table, request in (params.get("RequestItems") or {}).items():
            if operation == "BatchGetItem":
                keys = list(request.get("Keys") or [])
            else:
                keys = [(r.get("PutRequest") or {}).get("Item")
                        or (r.get("DeleteRequest") or {}).get("Key") or {} for r in request]
            yield need(f"dynamodb:{operation}", _table_arn(facts, str(table)),
                       Context({"dynamodb:LeadingKeys": _leading_keys(facts, str(table), keys)}))
    elif operation == "TransactWriteItems":
        for item in params.get("TransactItems") or []:
            (kind, body), = item.items()
            action = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                      "ConditionCheck": "ConditionCheckItem"}[kind]
            key = body.get("Item") if kind == "Put" else body.get("Key")
            yield _item_need(facts, action, str(body["TableName"]), key, "TransactWriteItems")
    elif operation == "TransactGetItems":
        for item in params.get("TransactItems") or []:
            body = item["Get"]
            yield _item_need(facts, "GetItem", str(body["TableName"]), body.get("Key"), "TransactGetItems")
    elif operation in ("DescribeTable", "DescribeTimeToLive"):
        yield need(f"dynamodb:{operation}", _table_arn(facts, str(params["TableName"])))
    else:
        raise UnknownOperation(f"dynamodb:{operation}")


# ======================================================================== ECS
def _start(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    definition = facts.task_definition_arn(str(params["taskDefinition"]))
    instances = tuple(_ecs_arn(facts, params, "container-instance", str(i))
                      for i in params.get("containerInstances") or ())
    yield need(f"ecs:{operation}", definition,
               _in_cluster(facts, params, **{"ecs:container-instances": instances or None}))
    tags = list(params.get("tags") or [])
    if tags:
        new_task = _p(facts, "ecs", f"task/{_cluster_name(facts, params)}/{'0' * 32}")
        requested: dict[str, Sequence[str] | None] = {f"aws:RequestTag/{t['key']}": (str(t.get("value", "")),)
                                                       for t in tags}
        yield need("ecs:TagResource", new_task, Context({
            "ecs:CreateAction": (operation,), "aws:TagKeys": tuple(str(t["key"]) for t in tags),
            **requested}))
    overrides = params.get("overrides") or {}
    roles = [str(overrides[k]) for k in ("taskRoleArn", "executionRoleArn") if overrides.get(k)]
    roles += facts.task_definition_roles(definition)
    for role in dict.fromkeys(roles):
        yield need("iam:PassRole", role, Context({"iam:PassedToService": ("ecs-tasks.amazonaws.com",)}))


def _ecs(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation in ("StartTask", "RunTask"):
        yield from _start(operation, params, facts)
    elif operation in ("StopTask",):
        yield need("ecs:StopTask", _ecs_arn(facts, params, "task", str(params["task"])),
                   _in_cluster(facts, params))
    elif operation == "DescribeTasks":
        for task in params.get("tasks") or []:
            yield need("ecs:DescribeTasks", _ecs_arn(facts, params, "task", str(task)),
                       _in_cluster(facts, params))
    elif operation == "ListTasks":
        instance = params.get("containerInstance")
        resource = _ecs_arn(facts, params, "container-instance", str(instance)) if instance else "*"
        yield need("ecs:ListTasks", resource, _in_cluster(facts, params))
    elif operation in ("DescribeContainerInstances", "UpdateContainerInstancesState"):
        for instance in params.get("containerInstances") or []:
            yield need(f"ecs:{operation}", _ecs_arn(facts, params, "container-instance", str(instance)),
                       _in_cluster(facts, params))
    elif operation in ("PutAttributes", "DeleteAttributes"):
        targets = dict.fromkeys(str(a.get("targetId") or "") for a in params.get("attributes") or [])
        for target in targets:
            yield need(f"ecs:{operation}", _ecs_arn(facts, params, "container-instance", target),
                       _in_cluster(facts, params))
    elif operation == "ListContainerInstances":
        yield need("ecs:ListContainerInstances", _cluster_arn(facts, params), _in_cluster(facts, params))
    elif operation == "DescribeTaskDefinition":
        yield need("ecs:DescribeTaskDefinition", "*")
    else:
        raise UnknownOperation(f"ecs:{operation}")


# ======================================================================== EC2, SSM, Auto Scaling
def _instance_arn(facts: Facts, instance_id: str) -> str:
    if instance_id.startswith("mi-"):
        return _p(facts, "ssm", f"managed-instance/{instance_id}")
    return _p(facts, "ec2", f"instance/{instance_id}")


def _tagged(facts: Facts, arn: str) -> Context:
    return Context(tags=facts.resource_tags(arn) or {})


def _on_instances(action: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    """``action`` on each of the request's ``InstanceIds``, with the instance's tags."""
    for instance in params.get("InstanceIds") or []:
        arn = _instance_arn(facts, str(instance))
        yield need(action, arn, _tagged(facts, arn))


def _ec2(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation == "RebootInstances":
        yield from _on_instances("ec2:RebootInstances", params, facts)
    elif operation == "DescribeInstances":
        yield need("ec2:DescribeInstances", "*")
    else:
        raise UnknownOperation(f"ec2:{operation}")


def _ssm(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation == "SendCommand":
        document = str(params["DocumentName"])
        if not document.startswith("arn:"):
            owner = "" if document.startswith(("AWS-", "AWSEC2-", "AWSSupport-", "Amazon")) else facts.account
            document = f"arn:aws:ssm:{facts.region}:{owner}:document/{document}"
        yield need("ssm:SendCommand", document)
        yield from _on_instances("ssm:SendCommand", params, facts)
    elif operation == "DescribeInstanceInformation":
        yield need("ssm:DescribeInstanceInformation", "*")
    else:
        raise UnknownOperation(f"ssm:{operation}")


def _autoscaling(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation == "TerminateInstanceInAutoScalingGroup":
        group = facts.auto_scaling_group_of(str(params["InstanceId"]))
        arn = group or _p(facts, "autoscaling", "autoScalingGroup:unknown:autoScalingGroupName/unknown")
        yield need("autoscaling:TerminateInstanceInAutoScalingGroup", arn, _tagged(facts, arn))
    elif operation == "DescribeAutoScalingInstances":
        yield need("autoscaling:DescribeAutoScalingInstances", "*")
    else:
        raise UnknownOperation(f"autoscaling:{operation}")


# ======================================================================== SNS, SQS, Logs, Lambda, CloudWatch
def _sns(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation != "Publish":
        raise UnknownOperation(f"sns:{operation}")
    topic = str(params.get("TopicArn") or params.get("TargetArn"))
    yield need("sns:Publish", topic)
    key = facts.topic_key(topic)
    if key is not None:
        yield need("kms:GenerateDataKey", key)
        yield need("kms:Decrypt", key)


def queue_arn(url: str) -> str:
    """``https://sqs.<region>.amazonaws.com/<account>/<name>`` -> the queue's ARN."""
    match = re.match(r"^https?://(?:sqs\.)?([a-z0-9-]+)\.[^/]+/(\d{12})/([^/?]+)", url)
    if match is None:
        raise ValueError(f"not an SQS queue URL: {url}")
    region, account, name = match.groups()
    return f"arn:aws:sqs:{region}:{account}:{name}"


def _sqs(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    actions = {"SendMessage": "SendMessage", "SendMessageBatch": "SendMessage",
               "ReceiveMessage": "ReceiveMessage",
               "DeleteMessage": "DeleteMessage", "DeleteMessageBatch": "DeleteMessage",
               "ChangeMessageVisibility": "ChangeMessageVisibility",
               "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
               "GetQueueAttributes": "GetQueueAttributes"}
    if operation not in actions:
        raise UnknownOperation(f"sqs:{operation}")
    yield need(f"sqs:{actions[operation]}", queue_arn(str(params["QueueUrl"])))


def _logs(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation != "GetLogEvents":
        raise UnknownOperation(f"logs:{operation}")
    group = str(params.get("logGroupName") or params.get("logGroupIdentifier") or "")
    if group.startswith("arn:"):
        group = group.split(":log-group:", 1)[1].removesuffix(":*")
    yield need("logs:GetLogEvents",
               _p(facts, "logs", f"log-group:{group}:log-stream:{params.get('logStreamName', '')}"))


def _lambda(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation != "Invoke":
        raise UnknownOperation(f"lambda:{operation}")
    name = str(params["FunctionName"])
    arn = name if name.startswith("arn:") else _p(facts, "lambda", f"function:{name}")
    yield need("lambda:InvokeFunction", arn)


def _cloudwatch(operation: str, params: Mapping[str, Any], facts: Facts) -> Iterator[Need]:
    if operation != "PutMetricData":
        raise UnknownOperation(f"cloudwatch:{operation}")
    yield need("cloudwatch:PutMetricData", "*",
               Context({"cloudwatch:namespace": (str(params["Namespace"]),)}))


SERVICES: dict[str, Callable[[str, Mapping[str, Any], Facts], Iterator[Need]]] = {
    "dynamodb": _dynamodb, "ecs": _ecs, "ec2": _ec2, "ssm": _ssm, "autoscaling": _autoscaling, "sns": _sns,
    "sqs": _sqs, "logs": _logs, "lambda": _lambda, "cloudwatch": _cloudwatch,
}
#: calls IAM never refuses (GetCallerIdentity needs no permission)
UNCHECKED = frozenset({("sts", "GetCallerIdentity")})


def needs(service: str, operation: str, params: Mapping[str, Any], facts: Facts) -> list[Need]:
    """Every authorization ``service:operation`` with ``params`` needs (``service``: botocore's
    name, e.g. "ecs")."""
    if (service, operation) in UNCHECKED:
        return []
    handler = SERVICES.get(service)
    if handler is None:
        raise UnknownOperation(f"{service}:{operation}")
    return list(handler(operation, params, facts))
