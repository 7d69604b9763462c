"""``gpu-recovery-admin return-node`` on the recovery loop: a node an operator returns goes
through the stack's own check, the lifecycle a lost node's reconnect uses. The command writes
the intent and starts no task; the recovery sweep starts the check (a validation opened with
no task); a pass makes the node AVAILABLE, a DCGM failure keeps it SUSPECT for a person with
the check's evidence and one e-mail (no failed repair)."""

from __future__ import annotations

from typing import Any

from cli import admin
from gpu_recovery.constants import DEADLINE_SK, InstanceState
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.repository.heartbeat import HeartbeatRepository
from tests.heartbeat.world import NODE, NODE_ARN, RecoveryLoop

OPERATOR = "arn:aws:iam::123456789012:user/oncall"


class _EcsClient:
    """The CLI's ECS client, boto3's shape: the node's status until set ACTIVE."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.updates: list[str] = []  # each status set, and "put <name>=<value>" of each attribute put

    def describe_container_instances(self, *, cluster: str, containerInstances: list[str]) -> dict[str, Any]:
        assert cluster == "gpu-cluster"  # the node's ARN names it
        found = {"containerInstanceArn": containerInstances[0], "status": self.status}
        return {"containerInstances": [found], "failures": []}

    def put_attributes(self, *, cluster: str, attributes: list[dict[str, str]]) -> dict[str, Any]:
        assert cluster == "gpu-cluster" and all(a["targetId"] == NODE_ARN for a in attributes)
        self.updates += [f"put {a['name']}={a.get('value', '')}" for a in attributes]
        return {"attributes": attributes}

    def update_container_instances_state(self, *, cluster: str, containerInstances: list[str],
                                         status: str) -> dict[str, Any]:
        self.updates.append(status)
        self.status = status
        return {"containerInstances": [{"containerInstanceArn": containerInstances[0]}], "failures": []}


class _Session:
    def __init__(self, ecs: _EcsClient) -> None:
        self.ecs = ecs

    def client(self, name: str) -> Any:
        if name == "sts":
            return type("Sts", (), {"get_caller_identity": lambda _self: {"Arn": OPERATOR}})()
        assert name == "ecs"
        return self.ecs


def _return_node(world: Any, ecs: _EcsClient, *argv: str) -> int:
    return admin.main(["return-node", "--node-id", NODE, *argv], repo=world.repo, session=_Session(ecs))


def _quarantined(world: Any) -> tuple[RecoveryLoop, _EcsClient]:
    """A node the stack quarantined (DRAINING in ECS), repaired since."""
    loop = RecoveryLoop(world)
    assert world.repo.instances.put_instance_if_absent(Instance(NODE, state=InstanceState.QUARANTINED,
                                                                container_instance_arn=NODE_ARN))
    world.ddb.update_item(TableName=world.repo.tables.instance_table_name,
                          Key={"container_inst_id": {"S": NODE}},
                          UpdateExpression="SET quarantine_reason = :r",
                          ExpressionAttributeValues={":r": {"S": "DCGM: replace (row remap failure)"}})
    return loop, _EcsClient("DRAINING")


def test_a_returned_quarantined_node_is_checked_by_the_sweep_and_its_pass_returns_it(world) -> None:
    """Given a repaired QUARANTINED node (DRAINING in ECS), When the operator returns it, Then
    one write opens its check (SUSPECT, the operator's return its origin, due now), ECS sets it
    ACTIVE after, and no task is started by the command; the recovery sweep starts the check,
    whose pass makes the node AVAILABLE; the command run again writes nothing."""
    loop, ecs = _quarantined(world)
    assert _return_node(world, ecs, "--reason", "GPU 3 reseated, field diag passed") == 0
    node = world.node_item(NODE)
    assert node["instance_state"] == "SUSPECT" and node["suspect_origin"] == "operator_return"
    assert node["validation"]["repair"] == "operator" and "task_arn" not in node["validation"]
    assert node[DEADLINE_SK] == world.clock()  # due at once: the sweep starts it
    assert "quarantine_reason" not in node and "GPU 3 reseated" in node["suspect_reason"]
    assert node["history"][-1]["actor"] == OPERATOR and node["history"][-1]["from"] == "QUARANTINED"
    # Off every scheduler's placement while its check runs: cordoned ``validating`` in the same
    # write, its attribute put by the command before the node left DRAINING (no gap before the sweep).
    assert node["cordon"]["validating"] is True and node["cordon"]["cause"] == "validation:operator"
    activation = [f"put {UNAVAILABLE_ATTRIBUTE}=validating", "put gpu-recovery.cordoned=", "ACTIVE"]
    assert ecs.updates == activation and loop.checks() == []  # the CLI starts no task

    loop.service.sweep()  # the worklist's sync of the intent, then the check
    assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "validating"
    [check] = loop.checks()
    assert world.instance_state(NODE) is InstanceState.SUSPECT
    assert loop.service.on_health_check_stopped(loop.stopped(check, 0)).action == "validation_passed"
    assert world.instance_state(NODE) is InstanceState.AVAILABLE
    node = world.node_item(NODE)
    assert "suspect_origin" not in node and "validation" not in node and "suspect_reason" not in node
    assert "cordon" not in node and UNAVAILABLE_ATTRIBUTE not in loop.ecs.attributes.get(NODE, set())
    assert node["last_validation"]["result"] == "passed" and node["last_validation"]["repair"] == "operator"

    assert _return_node(world, ecs) == 0
    assert world.node_item(NODE) == node and ecs.updates == activation


def test_a_returned_suspect_node_that_fails_its_check_stays_suspect_for_a_person(world) -> None:
    """Given a node SUSPECT for its telemetry, When the operator returns it and the stack's check
    finds a DCGM fault, Then no repair is counted as failed: no node decision, the node stays
    SUSPECT with the check's evidence, its origin saying the operator's return failed its
    check, and one e-mail."""
    loop = RecoveryLoop(world)
    assert world.repo.instances.put_instance_if_absent(Instance(NODE, container_instance_arn=NODE_ARN))
    assert HeartbeatRepository(world.repo).flag_suspect(NODE, world.clock(), "Xid 79")
    ecs = _EcsClient("ACTIVE")
    assert _return_node(world, ecs) == 0
    assert ecs.updates == [] and world.node_item(NODE)["suspect_origin"] == "operator_return"
    assert world.node_item(NODE)["cordon"]["validating"] is True
    sent = len(world.notifier.sent)

    world.clock.advance(60)
    loop.service.sweep()
    assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "validating"
    [check] = loop.checks()
    node = loop.fail_the_check(check, "operator_return_check_failed")
    assert len(world.notifier.sent) == sent + 1
    # The stack's own verdict: known bad, cordoned (not counted by the cordon limit: no window).
    assert "validating" not in node["cordon"] and node["cordon"]["cause"] == "builtin:operator-return"
    assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "cordoned"
