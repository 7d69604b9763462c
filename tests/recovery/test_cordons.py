"""Cordons with fakes of the ports: a node known to be bad takes no new work, whatever the
breaker or observe mode says, until it is healthy again; its ECS attribute is an intent
committed first, put idempotently, confirmed after; the cordon limit trips loudly. Each
test fails without the behaviour it names."""

from __future__ import annotations

import argparse

import pytest

from cli.admin import uncordon_command
from gpu_recovery import constants as C
from gpu_recovery.domain import cordon
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.cordon import CORDON_ATTRIBUTE, CordonPolicy
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.domain.remediation_mode import parse_remediation_mode
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.queue.admission import node_ineligibility
from gpu_recovery.recovery.breaker.operations import reset_breaker
from gpu_recovery.repository import Update
from tests.recovery.fakes import LostResponse, World, world
from tests.recovery.remediation_steps import (
    fault_with_reboot_verdict,
    rebooting,
    report_xid,
    trip_with_backlog,
)

FAULTY, PEER = "node-b", "node-a"


def _has_attribute(w: World, node: str) -> bool:
    """The one attribute says cordoned, and the deprecated one is there too (for a release)."""
    values = w.ecs.attribute_values.get(node, {})
    return values.get(UNAVAILABLE_ATTRIBUTE) == "cordoned" and CORDON_ATTRIBUTE in values


PUT = [("put", FAULTY, UNAVAILABLE_ATTRIBUTE), ("put", FAULTY, CORDON_ATTRIBUTE)]
DELETE = [("delete", FAULTY, UNAVAILABLE_ATTRIBUTE), ("delete", FAULTY, CORDON_ATTRIBUTE)]
#: the cordon goes while the job still holds the node for its restart (issue 41: reserved)
TO_RESERVED = [("put", FAULTY, UNAVAILABLE_ATTRIBUTE), ("delete", FAULTY, CORDON_ATTRIBUTE)]


def _uncordoned(w: World, node: str) -> bool:
    """Neither attribute says cordoned (the node may still be reserved for its job)."""
    values = w.ecs.attribute_values.get(node, {})
    return values.get(UNAVAILABLE_ATTRIBUTE) != "cordoned" and CORDON_ATTRIBUTE not in values


def _eligible(w: World, node: str) -> bool:
    inst = w.repo.instances.get_instance(node)
    return not node_ineligibility(ecs_status="ACTIVE", agent_connected=True, instance_state=inst.state,
                                  cordoned=inst.cordoned)


def _held_and_cordoned(w: World, put_attributes: str | None = None) -> None:
    """The job on PEER and FAULTY; the breaker tripped with a backlog, so FAULTY's reboot
    verdict is held and the node cordoned (``put_attributes``: how ECS answers the cordon's
    PutAttributes, "refuse" or "lose"; None: as it should)."""
    arns = w.register_job("j", [PEER, FAULTY])
    trip_with_backlog(w, ["x-2"], window=("x-1",))
    if put_attributes is not None:
        w.ecs.failures["put_attributes"] = [put_attributes]
    fault_with_reboot_verdict(w, arns)


def test_a_node_held_by_the_breaker_is_cordoned_in_ecs_and_skipped_by_the_scheduler() -> None:
    """Given the breaker tripped, When a diag says reboot, Then the node (SUSPECT, reboot
    held) is cordoned: intent on its item, the ECS attribute put once and confirmed, the
    worklist empty, and the queue's admission skips it."""
    with world() as w:
        _held_and_cordoned(w)
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and w.rebooter.calls == []
        assert inst.cordoned and inst.cordon["ecs"] == cordon.ECS_APPLIED
        assert w.ecs.attribute_calls == PUT  # one PutAttributes with both
        assert w.repo.cordons.pending() == {}
        assert not _eligible(w, FAULTY) and "cordoned" in node_ineligibility(
            ecs_status="ACTIVE", agent_connected=True, instance_state="AVAILABLE", cordoned=True)


def test_observe_mode_leaves_a_definitive_fault_available_but_cordoned() -> None:
    """Given observe mode, When XID 79 (definitive) kills a rank, Then nothing is done to
    the node (no reboot, state untouched) but it takes no new work: cordoned in the table
    (the scheduler skips it) and in ECS."""
    observe = RemediationSettings(modes=parse_remediation_mode("observe"))
    with world(remediation=observe) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 79)
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.rebooter.calls == [] and w.ecs.drained == []
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.AVAILABLE and inst.cordoned
        assert not _eligible(w, FAULTY) and _has_attribute(w, FAULTY)


def test_observe_mode_cordons_a_definitive_fault_in_the_write_that_fails_its_job() -> None:
    """Given observe mode, When XID 79 kills a rank and its delivery dies right after the job's
    FAILED write (its answer lost), Then that write held the node's cordon and its observed
    fault: Lambda's retry finds a duplicate, the sweep puts the ECS attribute from the
    worklist, and the node's history keeps the fault (escalation reads it)."""
    observe = RemediationSettings(modes=parse_remediation_mode("observe"))
    with world(remediation=observe) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        report_xid(w, FAULTY, 79)
        w.repo.fail_once("jobs.finish_job", "lose")
        with pytest.raises(LostResponse):
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        assert w.repo.jobs.get_job("j").state is C.JobState.FAILED
        assert w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1)).action == "duplicate"
        w.advance(60)
        w.service.sweep()
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.AVAILABLE and inst.cordoned
        assert not _eligible(w, FAULTY) and _has_attribute(w, FAULTY) and w.repo.cordons.pending() == {}
        item = w.repo.instances.get_instance_item(FAULTY)
        assert item["last_fault"]["jobs"] == ["j"] and len(item["fault_history"]) == 1
        assert w.rebooter.calls == [] and w.ecs.stop_calls == []


def test_a_rebooting_node_is_cordoned_until_it_is_back() -> None:
    """Given a diag that says reboot, Then the node is cordoned while it reboots; When it is
    back (agent reconnected after the reboot), Then the cordon and the ECS attribute go."""
    with world() as w:
        rebooting(w, "j", [PEER, FAULTY])
        assert w.repo.instances.get_instance(FAULTY).cordoned and _has_attribute(w, FAULTY)
        t = w.now[0]
        w.service.on_container_instance_change(w.instance_event(FAULTY, connected=False, version=11,
                                                                at=t + 20))
        back = w.instance_event(FAULTY, connected=True, version=12, at=t + 200)
        assert w.service.on_container_instance_change(back).action == "instance_available"
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.AVAILABLE and not inst.cordoned
        assert _uncordoned(w, FAULTY) and w.ecs.attribute_calls[-2:] == TO_RESERVED
        assert w.ecs.attribute_values[FAULTY][UNAVAILABLE_ATTRIBUTE] == "reserved"  # its job's restart
        assert w.repo.cordons.pending() == {} and _eligible(w, FAULTY)


def test_a_refused_put_attributes_is_finished_by_the_sweep() -> None:
    """Given PutAttributes throttled right after the decision committed, Then the cordon is
    already in the table (no new work) and in the worklist; the next sweep puts the
    attribute and confirms it."""
    with world() as w:
        _held_and_cordoned(w, put_attributes="refuse")
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.cordoned and inst.cordon["ecs"] == cordon.ECS_PENDING and not _has_attribute(w, FAULTY)
        assert list(w.repo.cordons.pending()) == [FAULTY]
        w.advance(60)
        w.service.sweep()
        assert _has_attribute(w, FAULTY) and w.repo.cordons.pending() == {}
        assert w.repo.instances.get_instance(FAULTY).cordon["ecs"] == cordon.ECS_APPLIED


def test_a_node_with_no_room_for_the_attribute_is_told_once_and_tried_every_sweep() -> None:
    """ECS takes 10 custom attributes a container instance (issue 40): a node carrying 10 of
    its users' refuses the cordon's PutAttributes (AttributeLimitExceededException). The
    cordon stands in the table (the stack keeps off the node), the operator is told once
    what to remove, each sweep tries again, and once there is room the attribute is put
    and confirmed."""
    with world() as w:
        _held_and_cordoned(w, put_attributes="no_room")
        assert w.repo.instances.get_instance(FAULTY).cordoned and not _has_attribute(w, FAULTY)
        assert not _eligible(w, FAULTY)
        [told] = [n for n in w.notifier.sent if n.kind is C.NotificationKind.OPERATOR_ACTION]
        assert FAULTY in told.subject + told.body and "10 custom attributes" in told.body
        assert list(w.repo.cordons.pending()) == [FAULTY]
        w.ecs.failures["put_attributes"] = ["no_room"]
        w.advance(60)
        w.service.sweep()
        assert not _has_attribute(w, FAULTY) and list(w.repo.cordons.pending()) == [FAULTY]
        assert len([n for n in w.notifier.sent if n.kind is C.NotificationKind.OPERATOR_ACTION]) == 1
        w.advance(60)
        w.service.sweep()  # room again: put and confirmed, the report forgotten with it
        assert _has_attribute(w, FAULTY) and w.repo.cordons.pending() == {}
        assert w.repo.instances.get_instance(FAULTY).cordon["ecs"] == cordon.ECS_APPLIED
        assert w.repo.cordons.worklist().refused == frozenset()


def test_a_lost_put_answer_is_put_again_idempotently_and_confirmed() -> None:
    with world() as w:
        _held_and_cordoned(w, put_attributes="lose")
        assert _has_attribute(w, FAULTY) and list(w.repo.cordons.pending()) == [FAULTY]
        w.service.sweep()
        assert w.ecs.attribute_calls == PUT + PUT and w.repo.cordons.pending() == {}


def test_a_newer_intent_committed_during_a_sync_is_not_confirmed_by_it() -> None:
    """Given a cordon's sync that read version v, When an uncordon (v2) lands before its
    confirmation, Then the confirmation of v leaves v2 in the worklist: the sweep deletes
    the attribute."""
    with world() as w:
        _held_and_cordoned(w, put_attributes="refuse")
        inst = w.repo.instances.get_instance(FAULTY)
        [members] = w.repo.cordons.pending().values()
        w.advance(1)
        assert w.repo.cordons.uncordon(FAULTY, w.now[0])
        w.repo.cordons.confirm_synced(FAULTY, inst.cordon_version, members, applied=True)
        assert list(w.repo.cordons.pending()) == [FAULTY]
        assert not w.repo.instances.get_instance(FAULTY).cordoned  # not re-marked applied by the stale sync
        w.service.sweep()
        assert w.ecs.attribute_calls == TO_RESERVED and _uncordoned(w, FAULTY)
        assert w.repo.cordons.pending() == {}


def test_a_reboot_timeout_held_by_the_breaker_cordons_the_node() -> None:
    with world() as w:
        rebooting(w, "j", [PEER, FAULTY])
        w.advance(31 * 60)
        w.ecs.agent_connected[FAULTY] = False  # it never came back (issue 49: one that answers is asked)
        trip_with_backlog(w, ["x-2"], window=("x-1",))
        w.service.sweep()
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.SUSPECT and w.ecs.drained == []
        assert inst.cordoned and inst.cordon["cause"] == "builtin:reboot-timeout"
        assert _has_attribute(w, FAULTY)


def test_a_drained_node_loses_its_cordon_once_draining_is_confirmed() -> None:
    """Given a reboot timeout that drains (breaker closed), Then DRAINING keeps placements
    off and the node's earlier cordon (from its reboot) is cleared with the drain's
    confirmation: an operator who sets it ACTIVE again finds it placeable."""
    with world() as w:
        rebooting(w, "j", [PEER, FAULTY])
        assert _has_attribute(w, FAULTY)
        w.advance(31 * 60)
        w.ecs.agent_connected[FAULTY] = False  # it never came back (issue 49: one that answers is asked)
        w.service.sweep()
        inst = w.repo.instances.get_instance(FAULTY)
        assert inst.state is C.InstanceState.QUARANTINED and w.ecs.drained and not inst.cordoned
        assert not _has_attribute(w, FAULTY) and w.repo.cordons.pending() == {}


def test_the_cordon_limit_trips_loudly_holds_the_attribute_and_a_reset_puts_it() -> None:
    """Given 7 GPU nodes and a cordon limit of 30 % per 5 minutes (2 nodes), When a 3rd node
    is found bad within the window, Then it is cordoned in the table (the scheduler skips
    it) but its ECS attribute is held, and one loud e-mail says so; When the operator
    resets the breaker, Then the sweep puts the held attribute."""
    settings = RemediationSettings(cordon=CordonPolicy(max_share=0.3, window_seconds=300))
    with world(remediation=settings) as w:
        w.ecs.spare_nodes = ["n-3"]
        trip_with_backlog(w, ["x-2"], window=("x-1",))  # every node action held: each node is cordoned
        jobs = [w.register_job(f"j{i}", [f"p-{i}", f"n-{i}"]) for i in range(3)]
        for i, node in enumerate(["n-0", "n-1", "n-2"]):
            arns = jobs[i]
            w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
            [task] = w.ecs.health_checks_on(node)
            w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
            w.advance(30)
        assert _has_attribute(w, "n-0") and _has_attribute(w, "n-1") and not _has_attribute(w, "n-2")
        held = w.repo.instances.get_instance("n-2")
        assert held.cordoned and held.cordon["ecs"] == cordon.ECS_HELD and not _eligible(w, "n-2")
        loud = [n for n in w.notifier.sent if n.kind is C.NotificationKind.CORDON_LIMIT_TRIPPED]
        assert len(loud) == 1 and "n-2" in loud[0].body and "reset" in loud[0].body
        w.service.sweep()
        assert not _has_attribute(w, "n-2")  # still held: the limit never closes by itself
        assert reset_breaker(w.repo.breaker, now=w.now[0], resume_backlog=False, by="oncall").done
        w.service.sweep()
        assert _has_attribute(w, "n-2")
        assert w.repo.instances.get_instance("n-2").cordon["ecs"] == cordon.ECS_APPLIED
        assert w.repo.cordons.pending() == {}


def test_an_operator_uncordons_a_node_repaired_by_hand() -> None:
    with world() as w:
        _held_and_cordoned(w)
        args = argparse.Namespace(node_id=FAULTY)
        assert uncordon_command(args, w.repo, w.now[0]) == 0
        assert uncordon_command(args, w.repo, w.now[0]) == 1  # not cordoned any more
        assert not w.repo.instances.get_instance(FAULTY).cordoned
        w.service.sweep()
        assert not _has_attribute(w, FAULTY) and w.repo.cordons.pending() == {}


def test_a_healthy_verdict_on_a_cordoned_node_clears_its_cordon() -> None:
    """Given a cordoned node whose diag then passes, Then it is healthy again: uncordoned."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: FAULTY}, set_fields={
            "ec2_instance_id": f"i-{FAULTY}", "cordon_version": w.now[0] - 5,
            "cordon": cordon.cordon_record(cause="xid-79", reason="test", now=w.now[0] - 5,
                                           ecs=cordon.ECS_APPLIED)}))
        w.ecs.attributes[FAULTY] = {UNAVAILABLE_ATTRIBUTE, CORDON_ATTRIBUTE}
        w.ecs.attribute_values[FAULTY] = {UNAVAILABLE_ATTRIBUTE: "cordoned", CORDON_ATTRIBUTE: ""}
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        assert not w.repo.instances.get_instance(FAULTY).cordoned and not _has_attribute(w, FAULTY)


def test_the_trip_email_lists_the_held_node_its_jobs_and_what_a_reset_does() -> None:
    """Given one node already acted on in a 2-node window, When a diag says reboot on
    another, Then the breaker trips: its one e-mail names the held node, the jobs on it and
    what --resume-backlog / --drop-backlog will do; the node is cordoned."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        state = breaker.record_action(None, node="x-1", action="reboot", now=w.now[0] - 60,
                                      cluster_gpu_nodes=2).state
        assert w.repo.breaker.save(state, None)
        fault_with_reboot_verdict(w, arns)
        [mail] = [n for n in w.notifier.sent if n.kind is C.NotificationKind.BREAKER_TRIPPED]
        assert f"Held: {FAULTY} needs reboot (jobs on it: j (waits HELD until the breaker closes" in mail.body
        assert "--resume-backlog reboots it" in mail.body and "cordoned" in mail.body
        assert w.repo.instances.get_instance(FAULTY).cordoned and _has_attribute(w, FAULTY)
