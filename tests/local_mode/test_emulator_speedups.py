"""The emulator's CPU-only speedups change nothing but the CPU (local_mode/moto_patches.py)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import boto3
import pytest
from boto3.dynamodb import transform
from boto3.dynamodb.conditions import Attr, Key
from boto3.dynamodb.transform import ParameterTransformer, TransformationInjector
from boto3.dynamodb.types import Binary

from local_mode.moto_patches import copied_params, install_emulator_speedups, shapes_below
from local_mode.world import build_world

ITEM = {"pk": "job#1", "sk": Decimal(3), "flag": True, "none": None, "blob": Binary(b"\x00\x01"),
        "tags": {"a", "b"}, "nums": {Decimal(1), Decimal(2)},
        "nested": {"list": [1, "two", {"deep": [Decimal("1.5"), {"x": {"y": "z"}}]}], "empty": {}}}

#: (operation, parameters as a boto3 Table or resource call passes them)
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("PutItem", {"TableName": "t", "Item": ITEM, "ConditionExpression": Attr("pk").not_exists()}),
    ("PutItem", {"TableName": "t", "Item": ITEM, "ConditionExpression": "attribute_not_exists(pk)"}),
    ("GetItem", {"TableName": "t", "Key": {"pk": "job#1", "sk": 3}, "ConsistentRead": True}),
    ("UpdateItem", {"TableName": "t", "Key": {"pk": "job#1"}, "UpdateExpression": "SET #a = :v, n = n + :one",
                    "ExpressionAttributeNames": {"#a": "nested"}, "ReturnValues": "ALL_NEW",
                    "ExpressionAttributeValues": {":v": ITEM["nested"], ":one": 1},
                    "ConditionExpression": Attr("state").eq("RUNNING") & Attr("n").lt(Decimal(5))}),
    ("DeleteItem", {"TableName": "t", "Key": {"pk": "job#1"},
                    "ConditionExpression": Attr("tags").contains("a") | Attr("none").attribute_type("NULL")}),
    ("Query", {"TableName": "t", "IndexName": "by_due",
               "KeyConditionExpression": Key("shard").eq(4) & Key("due").lte(Decimal(99)),
               "FilterExpression": Attr("nested.list").size().gt(1),
               "ExclusiveStartKey": {"pk": "a", "due": 1}}),
    ("Scan", {"TableName": "t", "FilterExpression": Attr("blob").exists(), "Limit": 5}),
    ("BatchGetItem", {"RequestItems": {"t": {"Keys": [{"pk": "a"}, {"pk": "b", "sk": 2}],
                                             "ProjectionExpression": "pk, #s",
                                             "ExpressionAttributeNames": {"#s": "sk"}}}}),
    ("BatchWriteItem", {"RequestItems": {"t": [{"PutRequest": {"Item": ITEM}},
                                               {"DeleteRequest": {"Key": {"pk": "b"}}}]}}),
    ("TransactWriteItems", {"TransactItems": [
        {"Put": {"TableName": "t", "Item": ITEM, "ConditionExpression": Attr("pk").not_exists()}},
        {"Update": {"TableName": "t", "Key": {"pk": "c"}, "UpdateExpression": "SET v = :v",
                    "ExpressionAttributeValues": {":v": [ITEM["nested"]]},
                    "ConditionExpression": Attr("v").ne(Decimal(0))}},
        {"ConditionCheck": {"TableName": "t", "Key": {"pk": "d"}, "ConditionExpression": Attr("x").exists()}},
        {"Delete": {"TableName": "t", "Key": {"pk": "e"}}}]}),
    ("TransactGetItems", {"TransactItems": [{"Get": {"TableName": "t", "Key": {"pk": "a"}}}]}),
]


class _Unpruned(ParameterTransformer):
    """boto3's own walk, every member entered (what the speedup replaces)."""


def _transformed(params: dict[str, Any], model: Any, transformer: ParameterTransformer) -> dict[str, Any]:
    """``params`` through boto3's resource input chain (conditions, then values) with
    ``transformer``'s walks."""
    injector = TransformationInjector(transformer=transformer)
    params = copy.deepcopy(params)
    injector.inject_condition_expressions(params, model)
    injector.inject_attribute_value_input(params, model)
    return params


@pytest.mark.parametrize(("operation", "params"), CALLS, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CALLS)])
def test_the_pruned_parameter_walk_rewrites_exactly_what_boto3_s_full_walk_does(
        operation: str, params: dict[str, Any]) -> None:
    install_emulator_speedups()
    _Unpruned._transform_parameters = ParameterTransformer._transform_parameters.__wrapped__  # type: ignore[attr-defined]
    model = boto3.session.Session(region_name="us-east-1").client("dynamodb").meta.service_model \
        .operation_model(operation)
    pruned = _transformed(params, model, ParameterTransformer())
    full = _transformed(params, model, _Unpruned())
    assert pruned == full
    assert pruned != params  # something was rewritten: the comparison is not vacuous


def test_the_walk_skips_an_item_s_values_where_no_condition_can_be() -> None:
    """What the pruning saves: an item's AttributeValue tree holds no condition shape, so the
    condition walk does not enter it; the operations' inputs do hold both targets."""
    service = boto3.session.Session(region_name="us-east-1").client("dynamodb").meta.service_model
    update = service.operation_model("UpdateItem").input_shape
    assert {"AttributeValue", "ConditionExpression"} <= shapes_below(update)
    attribute_value = update.members["Key"].value
    assert attribute_value.name == "AttributeValue"
    assert "ConditionExpression" not in shapes_below(attribute_value)
    assert "AttributeValue" in shapes_below(attribute_value)  # recursive: M and L hold AttributeValues


@pytest.mark.parametrize(("operation", "params"), CALLS, ids=[f"{op}-{i}" for i, (op, _) in enumerate(CALLS)])
def test_the_direct_parameter_copy_is_boto3_s_deep_copy(operation: str, params: dict[str, Any]) -> None:
    install_emulator_speedups()
    assert transform.copy_dynamodb_params is not transform.copy_dynamodb_params.__wrapped__  # installed
    boto3_copy = transform.copy_dynamodb_params.__wrapped__(params)
    direct = transform.copy_dynamodb_params(params)
    assert direct == boto3_copy == params
    # As deep: no dict, list or set is shared with the caller's parameters.
    assert not _containers(direct) & _containers(params)


def test_the_direct_copy_keeps_what_deepcopy_keeps_and_copies_the_rest() -> None:
    condition = Attr("a").eq(1)
    value = {"k": [ITEM, condition, ("t", 1), Decimal("1.5")]}
    copied = copied_params(value)
    assert copied["k"][3] is value["k"][3]  # Decimal: deepcopy keeps it too
    assert copied["k"][1] is not condition and copied["k"][1] == condition  # through deepcopy
    assert copied["k"][0]["tags"] == ITEM["tags"] and copied["k"][0]["tags"] is not ITEM["tags"]


def _containers(value: Any) -> set[int]:
    found: set[int] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list | set):
            found.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


def test_the_grants_guard_reads_task_definitions_and_tags_as_moto_s_api_answers_them() -> None:
    """The moto world's guard reads a task definition's ARN and roles and an instance's tags
    from moto's backends directly (local_mode/sim/contract/worlds.py): the same as the
    emulated DescribeTaskDefinition and DescribeTags answer."""
    with build_world(handlers=False) as world:
        assert world.aws.grants is not None
        facts: Any = world.aws.grants.facts
        ecs, ec2 = world.aws.client("ecs"), world.aws.client("ec2")
        role = f"arn:aws:iam::{world.aws.account_id}:role/train"
        container = [{"name": "c", "image": "i", "memory": 128}]
        arn = ecs.register_task_definition(family="roles", taskRoleArn=role, executionRoleArn=f"{role}-exec",
                                           containerDefinitions=container)["taskDefinition"]["taskDefinitionArn"]
        ecs.register_task_definition(family="roles", containerDefinitions=container)  # revision 2: no roles
        for reference in ("roles", "roles:1", "roles:2", arn, "missing", "missing:3", f"{arn[:-2]}:9"):
            try:
                answered = ecs.describe_task_definition(taskDefinition=reference)["taskDefinition"]
            except Exception:
                answered = {"taskDefinitionArn": reference}
            wanted = {k: answered[k] for k in ("taskDefinitionArn", "taskRoleArn", "executionRoleArn")
                      if answered.get(k)}
            assert facts._definition(reference) == wanted, reference
        assert facts.task_definition_roles(arn) == [role, f"{role}-exec"]
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        ec2.create_tags(Resources=[instance], Tags=[{"Key": "gpu-recovery", "Value": "yes"},
                                                    {"Key": "b", "Value": ""}])
        bare = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
        instance_arn = f"arn:aws:ec2:{world.aws.region}:{world.aws.account_id}:instance/{{}}".format
        for resource in (instance, bare, "i-0000000000000000f"):
            tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [resource]}])["Tags"]
            assert facts.resource_tags(instance_arn(resource)) == {t["Key"]: t["Value"] for t in tags}
        assert facts.resource_tags(instance_arn(instance)) == {"gpu-recovery": "yes", "b": ""}


def test_a_simulated_world_s_log_events_are_judged_on_its_own_clock() -> None:
    """CloudWatch Logs refuses events over 14 days old; the simulated day is fixed, so on the
    wall clock every simulated event became too old two weeks after it (the training programs'
    and the health checks' log lines were dropped from 2026-12-04). In a world they are judged
    on its clock: an event of the simulated now is kept, whatever the date, and one 15 days
    before it is refused as AWS refuses it."""
    from gpu_recovery import clock

    with build_world(handlers=False) as world:
        logs = world.aws.client("logs")
        logs.create_log_group(logGroupName="/test/clock")
        logs.create_log_stream(logGroupName="/test/clock", logStreamName="s")
        now_ms = int(clock.now() * 1000)
        old_ms = now_ms - 15 * 86400 * 1000
        answer = logs.put_log_events(logGroupName="/test/clock", logStreamName="s", logEvents=[
            {"timestamp": old_ms, "message": "too old"}, {"timestamp": now_ms, "message": "now"}])
        assert answer.get("rejectedLogEventsInfo") == {"tooOldLogEventEndIndex": 0}
        events = logs.get_log_events(logGroupName="/test/clock", logStreamName="s", startFromHead=True)
        assert [e["message"] for e in events["events"]] == ["now"]
