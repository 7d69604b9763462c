"""A lost node flagged SUSPECT while its host still reported (its ECS agent disconnected at two
readings) is never held on that missing answer alone: once its ECS agent reconnects, the stack
runs its own check on it (the validation task, recovery.lost_node_checks), a pass returns it to
AVAILABLE, a failure keeps it SUSPECT for a person with the check's evidence (no repair failed,
nothing escalated); a redelivered reconnect starts nothing more, and a SUSPECT node of another
origin keeps its own path."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from gpu_recovery.constants import (
    DEADLINE_SK,
    LOST_NODE_ATTRIBUTE,
    InstanceState,
    JobState,
)
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.events.ecs import EcsContainerInstanceDetail
from gpu_recovery.repository.heartbeat import HeartbeatRepository
from tests.heartbeat.world import CLUSTER_ARN, NODE, NODE_ARN, RecoveryLoop, rank_stopped, task_arn
from tests.recovery.fakes import EVENTS


def _flagged_while_reporting(world: Any) -> RecoveryLoop:
    """The host keeps reporting with no task (its ECS introspection fails) past the limit, the
    ECS agent read disconnected twice: the job fails, the node is flagged SUSPECT."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    svc = loop.heartbeat
    world.report(svc, NODE, task_arn("j1", 0))
    for _ in range(18):
        world.clock.advance(60)
        world.report(svc, NODE)
        svc.sweep()
    assert world.job_state("j1") is JobState.FAILED
    assert world.instance_state(NODE) is InstanceState.SUSPECT
    # The failed job's lost task stopped once ECS reached the node (its GPUs free).
    loop.service.on_task_state_change(rank_stopped("j1", 0, NODE))
    return loop


def _instance_event(*, connected: bool, marked: bool = True, version: int = 7,
                    status: str = "ACTIVE") -> EcsContainerInstanceDetail:
    detail = json.loads((EVENTS / "aws_doc_ecs_container_instance_state_change.json").read_text())["detail"]
    attributes = [a for a in detail.get("attributes") or [] if a.get("name") != LOST_NODE_ATTRIBUTE]
    if marked:
        attributes.append({"name": LOST_NODE_ATTRIBUTE, "value": "1"})
    detail.update(containerInstanceArn=NODE_ARN, clusterArn=CLUSTER_ARN, agentConnected=connected,
                  status=status, version=version, attributes=attributes)
    return EcsContainerInstanceDetail.model_validate(detail)


def test_a_lost_nodes_reconnect_starts_the_stacks_check_whose_pass_returns_it(world) -> None:
    """Given a node flagged SUSPECT by the lost-node escalation (its host still reporting), Then
    the flag says why and the node carries the mark its events are matched by; When its ECS agent
    reconnects, Then the stack's own check starts on it (the node stays SUSPECT meanwhile), a
    redelivered or repeated reconnect starts nothing more, and the check's pass makes it AVAILABLE."""
    loop = _flagged_while_reporting(world)
    node = world.node_item(NODE)
    assert node["suspect_origin"] == "lost_node"
    assert LOST_NODE_ATTRIBUTE in loop.ecs.attributes.get(NODE, set())
    # Still away: nothing starts.
    assert loop.service.on_container_instance_change(_instance_event(connected=False)).action == "ignored"
    assert loop.checks() == []

    assert "cordon" not in node  # a missing answer holds no node: not cordoned on the flag
    loop.ecs.agent_connected[NODE] = True
    outcome = loop.service.on_container_instance_change(_instance_event(connected=True))
    assert outcome.action == "reconnect_check_opened"
    [check] = loop.checks()
    assert world.instance_state(NODE) is InstanceState.SUSPECT
    node = world.node_item(NODE)
    assert node["validation"]["repair"] == "reconnect"
    # Off every scheduler's placement while its check runs: cordoned ``validating`` in the write
    # that opened it, the attribute put after it (the worklist's), before the check started.
    assert node["cordon"]["validating"] is True and node["cordon"]["cause"] == "validation:reconnect"
    assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "validating"
    assert LOST_NODE_ATTRIBUTE not in loop.ecs.attributes.get(NODE, set())  # its events no longer needed

    # The same event again, and a later one (out of order): no second check.
    assert loop.service.on_container_instance_change(_instance_event(connected=True)).action == "duplicate"
    assert loop.service.on_container_instance_change(_instance_event(connected=True, version=9)).action \
        == "duplicate"
    world.clock.advance(60)
    loop.service.sweep()
    assert loop.checks() == [check]

    assert loop.service.on_health_check_stopped(loop.stopped(check, 0)).action == "validation_passed"
    assert world.instance_state(NODE) is InstanceState.AVAILABLE
    node = world.node_item(NODE)
    assert "suspect_origin" not in node and "validation" not in node and "cordon" not in node
    assert node["last_validation"]["result"] == "passed"
    assert UNAVAILABLE_ATTRIBUTE not in loop.ecs.attributes.get(NODE, set())  # its cordon cleared
    # Redelivered after the pass: nothing more (the stale mark it names is deleted).
    assert loop.service.on_container_instance_change(_instance_event(connected=True)).action == "unmarked"
    assert loop.checks() == [check]


def test_a_failed_check_of_a_lost_node_keeps_it_suspect_for_a_person_never_a_failed_repair(world) -> None:
    """When the stack's check of a reconnected lost node finds a fault, Then no repair is counted as
    failed: no node decision (no reboot, drain or history), the node stays SUSPECT for a person
    with the check's evidence and one e-mail; a later reconnect starts no second check."""
    loop = _flagged_while_reporting(world)
    loop.ecs.agent_connected[NODE] = True
    loop.service.on_container_instance_change(_instance_event(connected=True))
    [check] = loop.checks()
    node = loop.fail_the_check(check, "reconnect_check_failed")
    # The stack's own verdict: known bad, its check's cordon a ``cordoned`` one in the same write.
    assert "validating" not in node["cordon"] and node["cordon"]["cause"] == "builtin:ecs-agent-disconnected"
    assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "cordoned"
    assert loop.service.on_container_instance_change(_instance_event(connected=True)).action == "unmarked"
    assert loop.checks() == [check]


def test_a_check_that_gives_no_answer_lifts_its_cordon_and_goes_on(world) -> None:
    """When the reconnected lost node's check ends with no verdict at every attempt (stalled),
    Then no repair failed and the node is no known-bad one: it stays SUSPECT with its check open
    (tried again), but its cordon goes (a missing answer holds no node by itself), the
    attribute with it; a later pass makes it AVAILABLE."""
    loop = _flagged_while_reporting(world)
    loop.ecs.agent_connected[NODE] = True
    loop.service.on_container_instance_change(_instance_event(connected=True))
    outcomes = []
    for _ in range(3):  # START_RETRIES: each ends inconclusive (exit 5)
        outcomes.append(loop.service.on_health_check_stopped(loop.stopped(loop.checks()[-1], 5)).action)
        if len(outcomes) < 3:  # a no-verdict attempt is tried again under the check's cordon
            assert world.node_item(NODE)["cordon"]["validating"] is True
            assert loop.ecs.attribute_values[NODE][UNAVAILABLE_ATTRIBUTE] == "validating"
    assert outcomes == ["validation_retried", "validation_retried", "validation_stalled"]
    node = world.node_item(NODE)
    assert world.instance_state(NODE) is InstanceState.SUSPECT and node["validation"]["stalled_at"]
    assert "cordon" not in node and UNAVAILABLE_ATTRIBUTE not in loop.ecs.attributes.get(NODE, set())
    world.clock.advance(60)
    loop.service.sweep()
    assert loop.service.on_health_check_stopped(loop.stopped(loop.checks()[-1], 0)).action \
        == "validation_passed"
    assert world.instance_state(NODE) is InstanceState.AVAILABLE


def test_a_reconnect_whose_event_never_came_is_found_by_the_sweep(world) -> None:
    """Given the mark's put failed (or the agent reconnected before it), When the recovery sweep
    looks at the lost node and ECS says its agent is connected, Then its check starts."""
    loop = _flagged_while_reporting(world)
    loop.ecs.attributes.get(NODE, set()).discard(LOST_NODE_ATTRIBUTE)
    world.clock.advance(301)
    loop.service.sweep()
    assert LOST_NODE_ATTRIBUTE in loop.ecs.attributes.get(NODE, set())  # put again, still away
    assert loop.checks() == []
    _back_at_the_sweeps_next_look(world, loop)


def test_a_missing_answer_at_the_sweeps_look_keeps_the_look(world) -> None:
    """Given a lost node whose reconnect event is lost, When ECS answers it MISSING at the sweep's
    look (ECS is eventually consistent), Then the sweep looks again 5 minutes later, finds its
    agent back and starts its check (the look was dropped on the missing answer: found by the
    node_wedged crash campaign, DescribeContainerInstances in its failure shape)."""
    loop = _flagged_while_reporting(world)
    loop.ecs.missing_nodes.add(NODE)
    world.clock.advance(301)
    loop.service.sweep()
    assert loop.checks() == [] and world.node_item(NODE).get(DEADLINE_SK) is not None
    loop.ecs.missing_nodes.discard(NODE)
    _back_at_the_sweeps_next_look(world, loop)


def test_a_lost_node_deregistered_is_no_longer_looked_at(world) -> None:
    """Given a lost node whose host was terminated while its ECS agent was away (ECS does not
    deregister it then), When a person deregisters it and the sweep's look reads it INACTIVE,
    Then the look ends (before: every 5 minutes for good) and the node stays SUSPECT, its record
    for a person, with when it left; a later sweep asks ECS nothing more of it."""
    loop = _flagged_while_reporting(world)
    world.clock.advance(301)
    loop.service.sweep()
    assert world.node_item(NODE).get(DEADLINE_SK) is not None  # still away: looked at again
    looked_at = world.repo.instances.get_instance(NODE)  # as a sweep racing the end read it
    loop.ecs.deregistered_nodes.add(NODE)
    world.clock.advance(301)
    loop.service.sweep()
    assert not world.repo.validations.rearm_lost_node(looked_at, world.clock() + 300)  # the race's rearm
    node = world.node_item(NODE)
    assert node.get(DEADLINE_SK) is None and node["deregistered_at"] == world.clock()
    assert world.instance_state(NODE) is InstanceState.SUSPECT and node["suspect_origin"] == "lost_node"
    asked = len(loop.ecs.described)
    world.clock.advance(3600)
    loop.service.sweep()
    assert len(loop.ecs.described) == asked and loop.checks() == []


def test_a_lost_nodes_deregistration_event_ends_its_look_once(world) -> None:
    """Given a lost node, When the container-instance event of its deregistration arrives (status
    INACTIVE, the mark still among its attributes), Then its look ends; a redelivery writes nothing."""
    loop = _flagged_while_reporting(world)
    event = _instance_event(connected=False, status="INACTIVE")
    assert loop.service.on_container_instance_change(event).action == "lost_node_deregistered"
    assert world.node_item(NODE).get(DEADLINE_SK) is None
    assert loop.service.on_container_instance_change(event).action == "duplicate"
    assert world.instance_state(NODE) is InstanceState.SUSPECT and loop.checks() == []


@pytest.mark.parametrize("how", ["refuse", "lose"])
def test_a_lost_nodes_look_ends_though_its_write_fails_once(world, how: str) -> None:
    """Given a deregistered lost node, When the write that ends its look is throttled (or its
    response lost), Then the next sweep ends it (or finds nothing more to do): the look ends."""
    loop = _flagged_while_reporting(world)
    loop.ecs.deregistered_nodes.add(NODE)
    loop.repo.fail_once("validations.end_lost_node_look", how)
    world.clock.advance(301)
    with contextlib.suppress(Exception):
        loop.service.sweep()
    assert loop.repo.armed() == []
    world.clock.advance(60)
    loop.service.sweep()
    world.clock.advance(300)
    loop.service.sweep()
    node = world.node_item(NODE)
    assert node.get(DEADLINE_SK) is None and "deregistered_at" in node
    asked = len(loop.ecs.described)
    world.clock.advance(600)
    loop.service.sweep()
    assert len(loop.ecs.described) == asked


def _back_at_the_sweeps_next_look(world: Any, loop: RecoveryLoop) -> None:
    """Its ECS agent back, its reconnect event lost: the sweep's next look starts its check,
    whose pass makes the node AVAILABLE."""
    loop.ecs.agent_connected[NODE] = True
    world.clock.advance(301)
    loop.service.sweep()
    [check] = loop.checks()
    assert loop.service.on_health_check_stopped(loop.stopped(check, 0)).action == "validation_passed"
    assert world.instance_state(NODE) is InstanceState.AVAILABLE


def test_a_suspect_node_of_another_origin_is_untouched_by_a_reconnect(world) -> None:
    """Given a node SUSPECT for its telemetry, When a container-instance event of it arrives (a
    stale mark on it, or none), Then no check starts and it stays SUSPECT (its own path: a job's
    passing health check, or a person)."""
    loop = RecoveryLoop(world)
    world.seed_job("j1", world_size=1)
    assert HeartbeatRepository(world.repo).flag_suspect(NODE, world.clock(), "Xid 79")
    loop.ecs.agent_connected[NODE] = True
    assert loop.service.on_container_instance_change(_instance_event(connected=True, marked=False)).action \
        == "ignored"
    assert loop.service.on_container_instance_change(_instance_event(connected=True)).action == "unmarked"
    world.clock.advance(301)
    loop.service.sweep()
    assert loop.checks() == [] and world.instance_state(NODE) is InstanceState.SUSPECT
    assert world.node_item(NODE)["suspect_origin"] == "telemetry"
