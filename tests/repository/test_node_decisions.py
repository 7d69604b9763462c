"""Node decisions (``repository.node_decisions``, ``repo.decisions``) on the emulator's
DynamoDB: one transaction over the node and what it settles, holding only for the check it
names and the state the node was read in, so a late or repeated delivery writes nothing."""

from __future__ import annotations

from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.repository.node_decisions import NodeDecision
from tests.recovery.fakes import World, world
from tests.repository.items import instance_item, job_item, set_instance_fields, set_job_fields

JOB, NODE = "job-a", "node-a"


def node_in(w: World, state: InstanceState, **fields: object) -> Instance:
    set_instance_fields(NODE, instance_state=state.value, **fields)
    instance = w.repo.instances.get_instance(NODE)
    assert instance is not None and instance.state is state
    return instance


def lost_job(w: World) -> Job:
    set_job_fields(JOB, job_state=JobState.NODE_LOST.value)
    job = w.repo.jobs.get_job(JOB)
    assert job is not None
    return job


def reboot(check: str, now: float) -> NodeDecision:
    """A SUSPECT node's verdict of check ``check``: reboot it (the sweep finishes a reboot not
    asked by a minute after)."""
    return NodeDecision(from_states=(InstanceState.SUSPECT,), to=InstanceState.REBOOTING,
                        reboot_reason="XID 79", hc_started_by=check, follow_up_at=now + 60)


def test_a_decision_holds_only_for_the_check_it_names_and_the_state_it_was_read_in() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        decisions, now = w.repo.decisions, w.now[0]
        suspect = node_in(w, InstanceState.SUSPECT, hc_started_by="hc-2")
        assert not decisions.record(suspect, reboot("hc-1", now), [], now)  # an older check's verdict
        assert instance_item(NODE)["instance_state"] == "SUSPECT"
        assert decisions.record(suspect, reboot("hc-2", now), [], now)
        item = instance_item(NODE)
        assert item["instance_state"] == "REBOOTING" and item["reboot_requested_at"] == now
        assert item["reboot_reason"] == "XID 79" and item["deadline_at"] == now + 60
        # A redelivery read the node SUSPECT: it is REBOOTING now, and the decision is not
        # made again (no second reboot asked).
        assert not decisions.record(suspect, reboot("hc-2", now), [], now + 5)
        assert instance_item(NODE)["reboot_requested_at"] == now


def test_a_lost_job_fails_once_with_the_intent_to_stop_its_ranks() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        decisions, job = w.repo.decisions, lost_job(w)
        assert decisions.fail_lost_job(job, "node-a unreachable for 10 minutes", {"kind": "node_lost"})
        item = job_item(JOB)
        assert item["job_state"] == "FAILED" and item["stop_fanout"]["attempt"] == 1
        assert item["last_fault"] == {"kind": "node_lost"}
        assert not decisions.fail_lost_job(job, "node-a unreachable for 10 minutes")


def test_the_node_and_the_job_it_fails_are_decided_together_or_not_at_all() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        decisions, job, now = w.repo.decisions, lost_job(w), w.now[0]
        moved_on = node_in(w, InstanceState.SUSPECT, hc_started_by="hc-2")
        set_instance_fields(NODE, instance_state=InstanceState.AVAILABLE.value)  # meanwhile
        failure = decisions.lost_job_failure(job, "node-a unreachable")
        quarantine = NodeDecision(from_states=(InstanceState.SUSPECT,), to=InstanceState.QUARANTINED,
                                  quarantine_reason="unreachable")
        assert not decisions.record(moved_on, quarantine, [], now, also=[failure])
        assert job_item(JOB)["job_state"] == "NODE_LOST"  # the job's half was not written either
        available = node_in(w, InstanceState.AVAILABLE)
        quarantine = NodeDecision(from_states=(InstanceState.AVAILABLE,), to=InstanceState.QUARANTINED,
                                  quarantine_reason="unreachable")
        assert decisions.record(available, quarantine, [], now, also=[failure])
        assert instance_item(NODE)["instance_state"] == "QUARANTINED"
        assert job_item(JOB)["job_state"] == "FAILED"


def test_a_node_out_of_time_leaves_recovery_once() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        decisions, now = w.repo.decisions, w.now[0]
        rebooting = node_in(w, InstanceState.REBOOTING, reboot_requested_at=now - 900)
        assert decisions.time_out_instance(rebooting, quarantine=True, what="reboot timed out", failures=[])
        item = instance_item(NODE)
        assert item["instance_state"] == "QUARANTINED" and item["drain_pending"] is True
        assert item["quarantine_reason"] == "reboot timed out"
        assert not decisions.time_out_instance(rebooting, quarantine=True, what="reboot timed out",
                                               failures=[])
