"""The request guard (local_mode/sim/contract/requests.py, issue 40 2a): each kind of
constraint of botocore's models, the prose limits with their citations, the stateful limits
read from the emulated account, DynamoDB's own refusals, and a violation that no ``except``
of the code can hide."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from gpu_recovery.adapters import aws
from gpu_recovery.adapters.ecs import AttributeLimitExceeded, EcsAdapter
from gpu_recovery.domain import launch_plan
from gpu_recovery.recovery import gang
from local_mode.emulator import LocalAws
from local_mode.sim.contract import listing, prose_limits
from local_mode.sim.contract.__main__ import main as contract_main
from local_mode.sim.contract.findings import NoState
from local_mode.sim.contract.requests import ContractViolation, RequestGuard, Violation, acknowledge

MODELS = botocore.session.get_session()
TABLE = "jobs"


class Tables(NoState):
    """Key schemas only (the DynamoDB limits that need them)."""

    def key_schema(self, table: str) -> tuple[str, str | None] | None:
        return ("pk", "sk") if table == TABLE else None


def refused(service: str, operation: str, params: Mapping[str, Any], state: Any = None) -> list[Violation]:
    """The violations the guard finds in one request (none: [])."""
    guard = RequestGuard(state or Tables())
    model = MODELS.get_service_model(service).operation_model(operation)
    try:
        guard.check(service, model, params)
    except ContractViolation as error:
        assert guard.take() == error.violations
        return error.violations
    return []


def rules(found: list[Violation]) -> list[tuple[str, str]]:
    return [(v.member, v.rule) for v in found]


def start_task(**params: Any) -> dict[str, Any]:
    return {"cluster": "gpu", "taskDefinition": "train:1", "containerInstances": ["ci-1"], **params}


# ================================================================ botocore's model
def test_a_pattern_is_matched_whole_with_unicode_classes() -> None:
    [found] = refused("ecs", "StartTask", start_task(tags=[{"key": "gpu-recovery:ranks", "value": "0,1,2"}]))
    assert (found.operation, found.member, found.value) == ("ecs:StartTask", "tags[0].value", "0,1,2")
    assert found.rule.startswith("matches ") and "shape TagValue" in found.source
    assert refused("ecs", "StartTask", start_task(tags=[{"key": "équipe", "value": "0-3 5 über @x"}])) == []
    # Java's surrogate pairs in a pattern (Auto Scaling's) stand for the code points they spell.
    assert (
        refused(
            "autoscaling",
            "TerminateInstanceInAutoScalingGroup",
            {"InstanceId": "i-0123\U0001f600", "ShouldDecrementDesiredCapacity": False},
        )
        == []
    )


def test_lengths_of_strings_lists_and_maps() -> None:
    assert rules(refused("ecs", "StartTask", start_task(tags=[{"key": "", "value": "v" * 257}]))) == [
        ("tags[0].key", "at least 1 characters"),
        ("tags[0].value", "at most 256 characters"),
    ]
    fifty_one = [{"key": f"k{i}", "value": "v"} for i in range(51)]
    assert rules(refused("ecs", "StartTask", start_task(tags=fifty_one))) == [("tags", "at most 50 items")]
    assert ("Comment", "at most 100 characters") in rules(
        refused(
            "ssm",
            "SendCommand",
            {"DocumentName": "gpu-reboot", "InstanceIds": ["mi-0123456789abcdef0"], "Comment": "x" * 101},
        )
    )
    tables = {f"t{i:03d}": {"Keys": [{"pk": {"S": "a"}}]} for i in range(101)}
    assert ("RequestItems", "at most 100 entries") in rules(
        refused("dynamodb", "BatchGetItem", {"RequestItems": tables})
    )


def test_enums_and_numeric_ranges() -> None:
    assert rules(refused("ecs", "ListTasks", {"cluster": "gpu", "desiredStatus": "RUNING"})) == [
        ("desiredStatus", "one of ['PENDING', 'RUNNING', 'STOPPED']")
    ]
    for limit in (0, 10_001):
        assert rules(
            refused("logs", "GetLogEvents", {"logGroupName": "g", "logStreamName": "s", "limit": limit})
        ) == [("limit", "between 1 and 10000")]
    assert ("TimeoutSeconds", "between 30 and 2592000") in rules(
        refused("ssm", "SendCommand", {"DocumentName": "gpu-reboot", "TimeoutSeconds": 29})
    )


def test_structures_lists_and_maps_are_checked_all_the_way_down() -> None:
    nested = {
        "pk": {"S": "a"},
        "sk": {"S": "b"},
        "doc": {"M": {"inner": {"L": [{"M": {"k" * 65_536: {"N": "1"}}}]}}},
    }
    [found] = refused("dynamodb", "PutItem", {"TableName": TABLE, "Item": nested})
    assert found.member == "Item['doc'].M['inner'].L[0].M['" + "k" * 39 + "...(65536 characters)] (key)"
    assert found.rule == "at most 65535 characters" and found.value == "65536 characters"


# ================================================================ the prose limits
@pytest.mark.parametrize(
    ("service", "operation", "params", "member", "rule"),
    [
        ("ecs", "StartTask", start_task(startedBy="x" * 37), "startedBy", "up to 36 letters"),
        ("ecs", "StartTask", start_task(startedBy="gang,1"), "startedBy", "up to 36 letters"),
        (
            "ecs",
            "StartTask",
            start_task(containerInstances=[f"ci-{i}" for i in range(11)]),
            "containerInstances",
            "at most 10 container instances",
        ),
        ("ecs", "StartTask", start_task(tags=[{"key": "aws:x", "value": "1"}]), "tags[0]", "the aws: prefix"),
        (
            "ecs",
            "StartTask",
            start_task(overrides={"containerOverrides": [{"name": "t", "command": ["x" * 8200]}]}),
            "overrides",
            "at most 8192 characters",
        ),
        ("ecs", "StopTask", {"task": "t", "reason": "r" * 256}, "reason", "up to 255 characters"),
        ("ecs", "DescribeTasks", {"tasks": [f"t{i}" for i in range(101)]}, "tasks", "at most 100 tasks"),
        (
            "ecs",
            "DescribeContainerInstances",
            {"containerInstances": [f"c{i}" for i in range(101)]},
            "containerInstances",
            "at most 100",
        ),
        (
            "ecs",
            "UpdateContainerInstancesState",
            {"containerInstances": [f"c{i}" for i in range(11)], "status": "DRAINING"},
            "containerInstances",
            "at most 10",
        ),
        (
            "ecs",
            "UpdateContainerInstancesState",
            {"containerInstances": ["c"], "status": "REGISTERING"},
            "status",
            "ACTIVE or DRAINING",
        ),
        (
            "ecs",
            "ListTasks",
            {"startedBy": "gang", "desiredStatus": "RUNNING"},
            "startedBy",
            "the only filter",
        ),
        (
            "ecs",
            "PutAttributes",
            {"attributes": [{"name": "bad name", "targetId": "arn:aws:ecs:c"}]},
            "attributes[0].name",
            "1 to 128 letters",
        ),
        (
            "ecs",
            "PutAttributes",
            {"attributes": [{"name": "a", "value": " x", "targetId": "arn:aws:ecs:c"}]},
            "attributes[0].value",
            "not starting or ending with a space",
        ),
        (
            "ecs",
            "PutAttributes",
            {"attributes": [{"name": "a", "targetId": "0123abcd"}]},
            "attributes[0].targetType",
            "required with a short target ID",
        ),
        (
            "ecs",
            "DeleteAttributes",
            {"attributes": [{"name": "a", "value": "v", "targetId": "arn:aws:ecs:c"}]},
            "attributes[0].value",
            "without its value",
        ),
        ("sns", "Publish", {"Message": "m", "Subject": "s" * 100}, "Subject", "less than 100"),
        ("sns", "Publish", {"Message": "m", "Subject": "two\nlines"}, "Subject", "printable ASCII"),
        ("sns", "Publish", {"Message": "m", "Subject": "naïve"}, "Subject", "printable ASCII"),
        (
            "sns",
            "Publish",
            {
                "Message": "x" * 262_000,
                "MessageAttributes": {"kind": {"DataType": "String", "StringValue": "y" * 200}},
            },
            "Message",
            "at most 262144 bytes",
        ),
        (
            "sns",
            "Publish",
            {"Message": "m", "MessageAttributes": {"AWS.kind": {"DataType": "String", "StringValue": "v"}}},
            "MessageAttributes['AWS.kind']",
            "not starting with AWS.",
        ),
        (
            "sns",
            "Publish",
            {"Message": "m", "MessageAttributes": {"kind": {"DataType": "String", "StringValue": ""}}},
            "MessageAttributes['kind'].StringValue",
            "not empty",
        ),
        (
            "sqs",
            "SendMessageBatch",
            {"QueueUrl": "q", "Entries": [{"Id": str(i), "MessageBody": "{}"} for i in range(11)]},
            "Entries",
            "at most 10 entries",
        ),
        (
            "sqs",
            "SendMessageBatch",
            {"QueueUrl": "q", "Entries": [{"Id": "a", "MessageBody": "1"}, {"Id": "a", "MessageBody": "2"}]},
            "Entries[1].Id",
            "unique",
        ),
        (
            "sqs",
            "SendMessageBatch",
            {
                "QueueUrl": "q",
                "Entries": [
                    {"Id": "a", "MessageBody": "x" * 200_000},
                    {"Id": "b", "MessageBody": "y" * 100_000},
                ],
            },
            "Entries",
            "at most 262144 bytes",
        ),
        (
            "sqs",
            "SendMessageBatch",
            {"QueueUrl": "q", "Entries": [{"Id": "a", "MessageBody": "{}", "DelaySeconds": 901}]},
            "Entries[0].DelaySeconds",
            "between 0 and 900",
        ),
        (
            "lambda",
            "Invoke",
            {"FunctionName": "scheduler", "InvocationType": "Event", "Payload": b"x" * 262_145},
            "Payload",
            "at most 262144 bytes",
        ),
        (
            "autoscaling",
            "DescribeAutoScalingInstances",
            {"InstanceIds": [f"i-{i:08x}" for i in range(51)]},
            "InstanceIds",
            "at most 50",
        ),
        (
            "dynamodb",
            "PutItem",
            {"TableName": TABLE, "Item": {"pk": {"S": "a"}, "sk": {"S": "b"}, "big": {"S": "x" * 410_000}}},
            "Item",
            "400 KB",
        ),
        (
            "dynamodb",
            "GetItem",
            {"TableName": TABLE, "Key": {"pk": {"S": "p" * 2049}, "sk": {"S": "b"}}},
            "Key.pk",
            "partition key value of at most 2048 bytes",
        ),
        (
            "dynamodb",
            "UpdateItem",
            {
                "TableName": TABLE,
                "Key": {"pk": {"S": "a"}, "sk": {"S": "b"}},
                "UpdateExpression": "SET " + ", ".join(f"a{i} = :v" for i in range(500)),
                "ExpressionAttributeValues": {":v": {"N": "1"}},
            },
            "UpdateExpression",
            "at most 4096 bytes",
        ),
        (
            "dynamodb",
            "Query",
            {
                "TableName": TABLE,
                "KeyConditionExpression": "pk = :p",
                "FilterExpression": "#s IN (" + ", ".join(f":v{i}" for i in range(101)) + ")",
            },
            "FilterExpression",
            "at most 100 operands for IN",
        ),
        (
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": [
                    {
                        "ConditionCheck": {
                            "TableName": TABLE,
                            "Key": {"pk": {"S": "a"}, "sk": {"S": "b"}},
                            "ConditionExpression": "attribute_exists(pk)",
                        }
                    },
                    {
                        "Update": {
                            "TableName": TABLE,
                            "Key": {"sk": {"S": "b"}, "pk": {"S": "a"}},
                            "UpdateExpression": "SET n = :n",
                            "ExpressionAttributeValues": {":n": {"N": "1"}},
                        }
                    },
                ]
            },
            "TransactItems[1].Update",
            "no two actions on one item",
        ),
        (
            "dynamodb",
            "TransactWriteItems",
            {
                "TransactItems": [
                    {
                        "Put": {
                            "TableName": TABLE,
                            "Item": {"pk": {"S": f"{i}"}, "sk": {"S": "b"}, "x": {"S": "x" * 350_000}},
                        }
                    }
                    for i in range(13)
                ]
            },
            "TransactItems",
            "4194304 bytes",
        ),
        (
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    TABLE: {"Keys": [{"pk": {"S": f"{i}"}, "sk": {"S": "b"}} for i in range(60)]},
                    "other": {"Keys": [{"id": {"S": f"{i}"}} for i in range(41)]},
                }
            },
            "RequestItems",
            "at most 100 keys in all tables",
        ),
        (
            "dynamodb",
            "BatchGetItem",
            {"RequestItems": {TABLE: {"Keys": [{"pk": {"S": "a"}, "sk": {"S": "b"}}] * 2}}},
            "RequestItems['jobs'].Keys[1]",
            "no key twice",
        ),
        (
            "dynamodb",
            "BatchWriteItem",
            {
                "RequestItems": {
                    TABLE: [
                        {"PutRequest": {"Item": {"pk": {"S": f"{i}"}, "sk": {"S": "b"}}}} for i in range(20)
                    ],
                    "other": [{"DeleteRequest": {"Key": {"id": {"S": f"{i}"}}}} for i in range(6)],
                }
            },
            "RequestItems",
            "at most 25 put or delete requests",
        ),
    ],
)
def test_a_prose_limit_names_the_operation_member_and_value_and_cites_its_page(
    service: str, operation: str, params: dict[str, Any], member: str, rule: str
) -> None:
    found = [v for v in refused(service, operation, params) if v.member == member and rule in v.rule]
    assert found, refused(service, operation, params)
    assert found[0].operation == f"{service}:{operation}"
    cited = {limit.citation for limit in prose_limits.LIMITS if limit.operation == f"{service}:{operation}"}
    assert found[0].source in cited | {"botocore service model"} or found[0].source.startswith(
        "botocore model"
    )


def test_requests_the_stack_sends_pass() -> None:
    assert (
        refused(
            "ecs",
            "StartTask",
            start_task(
                startedBy="gpurec-0123456789-a2-g0",
                tags=[{"key": "gpu-recovery:ranks", "value": "0-7 9"}],
                overrides={
                    "containerOverrides": [{"name": "t", "environment": [{"name": "ATTEMPT", "value": "2"}]}]
                },
            ),
        )
        == []
    )
    assert (
        refused(
            "sns",
            "Publish",
            {
                "TopicArn": "arn:aws:sns:us-east-1:123456789012:t",
                "Message": "body",
                "Subject": "[GPU recovery] Job recovered: job llama",
                "MessageAttributes": {"event_kind": {"DataType": "String", "StringValue": "RECOVERED"}},
            },
        )
        == []
    )
    assert (
        refused(
            "dynamodb",
            "BatchGetItem",
            {
                "RequestItems": {
                    TABLE: {"Keys": [{"pk": {"S": f"{i}"}, "sk": {"S": "b"}} for i in range(100)]}
                }
            },
        )
        == []
    )


def test_every_prose_limit_cites_a_page_and_every_operation_was_reviewed() -> None:
    assert all(limit.citation and limit.operation in prose_limits.OPERATIONS for limit in prose_limits.LIMITS)
    entries = {e.operation: e for e in listing.coverage()}
    assert set(entries) == set(prose_limits.OPERATIONS)
    start = entries["ecs:StartTask"]
    assert any(line.startswith("tags[].value: 0-256 characters; pattern") for line in start.model)
    assert any("36" in rule for _, rule, _ in start.prose)


def test_an_operation_nobody_reviewed_fails_the_run_until_it_is_listed_with_its_limits() -> None:
    guard = RequestGuard(Tables())
    model = MODELS.get_service_model("ecs").operation_model("DeregisterContainerInstance")
    assert guard.check("ecs", model, {"containerInstance": "ci"}) is None  # the call itself goes on
    guard.check("ecs", model, {"containerInstance": "ci"})
    [found] = guard.take()  # once per operation
    assert found.operation == "ecs:DeregisterContainerInstance" and "prose_limits.OPERATIONS" in found.rule


def test_the_list_prints_each_operation_with_its_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert contract_main(["requests", "--list", "--no-model"]) == 0
    out = capsys.readouterr().out
    assert "ecs:StartTask\n  reviewed: Amazon ECS API Reference, StartTask" in out
    assert "[Amazon ECS API Reference, StopTask (reason)]" in out


# ================================================================ in the emulator
def _cordon_target(local: LocalAws) -> str:
    """A container instance of the emulated cluster (moto's) and its ARN."""
    ec2 = local.client("ec2")
    instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)["Instances"][0]
    import json

    return str(
        local.client("ecs").register_container_instance(
            cluster=local.cluster_name,
            instanceIdentityDocument=json.dumps({"instanceId": instance["InstanceId"]}),
        )["containerInstance"]["containerInstanceArn"]
    )


def test_custom_attributes_past_ten_on_a_node_are_refused_as_ecs_refuses_them() -> None:
    """Users' own attributes count: the stack's cordon on a node carrying 9 of them is
    answered AttributeLimitExceededException (the code must handle it, not the guard); the
    stack's own requests past 10 are its violation."""
    with LocalAws() as local:
        arn = _cordon_target(local)
        local.client("ecs").put_attributes(
            cluster=local.cluster_name,
            attributes=[{"name": f"team.label{i}", "value": "x", "targetId": arn} for i in range(9)],
        )
        ecs = EcsAdapter(aws.client("ecs"), local.cluster_name)
        assert ecs.put_attributes(arn, {"gpu-recovery.unavailable": "spare"})  # the 10th: fine
        with pytest.raises(AttributeLimitExceeded) as error:  # the adapter's word for ECS's refusal
            ecs.put_attributes(arn, {"gpu-recovery.cordoned": ""})
        cause = error.value.__cause__
        assert isinstance(cause, ClientError)
        assert cause.response["Error"]["Code"] == "AttributeLimitExceededException"
        assert local.requests.refusals["ecs:PutAttributes"] == 1 and local.requests.violations == []
        with pytest.raises(ContractViolation, match="at most 10 custom attributes"):
            aws.client("ecs").put_attributes(
                cluster=local.cluster_name,
                attributes=[{"name": f"gpu-recovery.x{i}", "targetId": arn} for i in range(11)],
            )
        assert [v.member for v in local.requests.take()] == ["attributes", "attributes"]


def test_dynamodbs_own_refusal_is_recorded_however_the_code_handles_it() -> None:
    """An UpdateItem whose item would pass 400 KB: the table answers ValidationException
    (the request alone cannot show it); caught by the code, it still fails the run."""
    local = LocalAws()
    with pytest.raises(ContractViolation, match="Item size to update has exceeded") as error, local:
        table = aws.resource("dynamodb").Table(local.instance_table)
        table.put_item(Item={"container_inst_id": "n1", "blob": "x" * 300_000})
        with contextlib.suppress(ClientError):  # what code that swallows errors does
            table.update_item(
                Key={"container_inst_id": "n1"},
                UpdateExpression="SET more = :m",
                ExpressionAttributeValues={":m": "y" * 200_000},
            )
    acknowledge(error.value.violations)


def test_a_violation_is_no_client_error_and_survives_a_broad_except() -> None:
    with LocalAws() as local:
        ecs = EcsAdapter(aws.client("ecs"), local.cluster_name)
        with pytest.raises(ContractViolation) as error:
            try:
                ecs.start_task(
                    task_definition=local.health_check_task_definition_arn,
                    container_instance_arn="ci",
                    started_by="gang,1",
                )
            except ClientError:
                pytest.fail("a violation must not look like AWS's error")
        assert not isinstance(error.value, ClientError)
        local.requests.take()
    with pytest.raises(ContractViolation, match="startedBy") as swallowed, LocalAws() as local:
        try:
            EcsAdapter(aws.client("ecs"), local.cluster_name).start_task(
                task_definition=local.health_check_task_definition_arn,
                container_instance_arn="ci",
                tags=[{"key": "gpu-recovery:ranks", "value": "0,1"}],
                started_by="a/b,c",
            )
        except Exception:
            logging.getLogger(__name__).info("swallowed")
    acknowledge(swallowed.value.violations)


# ================================================================ defect 1, end to end
def _old_ranks_tag_value(ranks: list[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))  # issue 40's defect 1, as it was


def test_the_guard_catches_the_comma_separated_ranks_tag_of_a_grouped_restart(monkeypatch: Any) -> None:
    """A grouped StartTask of a gang restart (scale world, real EcsAdapter) with the ranks tag
    written "0,1,...": the guard refuses it, naming StartTask, the tag and the value."""
    from local_mode.scale_recovery import launch_tagged_job
    from local_mode.world import build_world

    def recovery() -> None:
        """An 8-rank tag-registered job whose node 0 GPU fails: the gang restart's grouped start."""
        logging.disable(logging.CRITICAL)
        try:
            with build_world(backend="scale", seed=1) as world:
                nodes = [world.cluster.add_node(f"n{i}") for i in range(8)]
                world.cluster.add_node("spare")
                launch_tagged_job(world, "job1", nodes)
                world.sim.run(until=world.sim.now + 300)
                world.cluster.fail_gpu(nodes[0], nccl_cascade=True)
                world.sim.run(until=world.sim.now + 3600,
                              stop=lambda: (world.job("job1") or {}).get("attempt") == 2)
        finally:
            logging.disable(logging.NOTSET)

    monkeypatch.setattr(gang, "ranks_tag_value", _old_ranks_tag_value)
    with pytest.raises(ContractViolation) as error:
        recovery()
    acknowledge(error.value.violations)
    found = {(v.operation, v.value) for v in error.value.violations}
    assert ("ecs:StartTask", "0,1,2,3,4,5,6,7") in found
    assert all(v.member.startswith("tags[") and v.member.endswith("].value") for v in error.value.violations)
    assert launch_plan.ranks_tag_value(range(8)) == "0-7"  # what the restart sends now
