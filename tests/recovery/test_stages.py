"""Stage logic with fakes of the ports: each defect the crash-consistency work fixed,
one test each (the acceptance campaign in tests/crash_consistency covers every call)."""

from __future__ import annotations

import contextlib

import pytest

from gpu_recovery import constants as C
from gpu_recovery.constants import CLAIM_LEASE_SECONDS, InstanceState, JobState, RankState
from gpu_recovery.recovery.node_tasks import FOREIGN_TASK
from gpu_recovery.recovery.reboots import REBOOT_CONFIRM_SECONDS
from tests.recovery.fakes import CountedCalls, LostResponse, World, world
from tests.recovery.remediation_steps import impostor

FAULTY, PEER = "node-b", "node-a"


def fault(w: World, arns: list[str]) -> None:
    """Rank 1's GPU faults (exit 1 on its own)."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))


def test_a_retried_stop_event_finishes_what_a_lost_write_left() -> None:  # defect 1
    """Given the write that records the suspect's stop and the job's PENDING_HEALTHCHECK
    executed but its answer was lost, When the event is retried, Then the health check
    starts (the rank's stop and the job's state were written together, so the retry is
    not taken for a harmless duplicate)."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("rank_events.enter_recovery", "lose")
        with pytest.raises(LostResponse):
            fault(w, arns)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK
        assert w.repo.jobs.get_rank("j", 1).state is RankState.FAILED
        assert w.ecs.health_checks_on(FAULTY) == []
        fault(w, arns)  # Lambda's retry
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        assert arns[0] in w.ecs.stop_calls


def test_a_throttled_stop_write_leaves_nothing_half_written() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("rank_events.enter_recovery", "refuse")
        with pytest.raises(TimeoutError):
            fault(w, arns)
        assert w.repo.jobs.get_job("j").state is JobState.RUNNING
        assert w.repo.jobs.get_rank("j", 1).state is RankState.RUNNING
        fault(w, arns)
        assert len(w.ecs.health_checks_on(FAULTY)) == 1


def test_the_faulty_node_is_a_suspect_when_the_peer_exit_is_processed_first() -> None:  # defect 2
    """Given the healthy peer's NCCL exit (exit 1) is handled first (so the faulty rank is
    marked STOP_REQUESTED), When the faulty rank's own exit 1 arrives
    (EssentialContainerExited), Then its node is a suspect too and is checked."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        assert w.repo.jobs.get_rank("j", 1).state is RankState.STOP_REQUESTED
        fault(w, arns)
        job = w.repo.jobs.get_job("j")
        assert set(w.repo.faults.labels(job)) == {PEER, FAULTY}
        assert len(w.ecs.health_checks_on(FAULTY)) == 1 and len(w.ecs.health_checks_on(PEER)) == 1


def test_a_rank_our_stop_reached_is_not_a_suspect() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault(w, arns)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        assert set(w.repo.faults.labels(w.repo.jobs.get_job("j"))) == {FAULTY}
        assert w.ecs.health_checks_on(PEER) == []


def test_a_rank_our_stop_reached_reads_its_job_once_and_its_rank_not_again() -> None:
    """A gang's stopped rank writes its stop and nothing else: it goes on with the job it
    decided on and the rank it wrote (two GetItems per stopped rank fewer than a re-read of
    each), and still arrives at its attempt's latch."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY, "node-c"])
        fault(w, arns)
        reads = CountedCalls(w.repo.jobs, ("get_job", "get_rank"))
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        assert reads.calls == ["get_job"]
        # The last rank's stop ends the attempt: that reads the job again, to move it on.
        w.service.on_task_state_change(w.task_stopped(
            arns[2], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        assert reads.calls == ["get_job"] * 3
        assert w.repo.jobs.get_rank("j", 0).state is RankState.STOPPED
        assert w.repo.jobs.get_job("j").tally.total == 1  # every rank ended: the suspects counted


def test_a_user_stop_racing_ours_ends_the_job_without_a_wasted_check() -> None:
    """Given rank 1 exits 1 (NCCL, after a user stopped rank 0 whose event is late), When
    the user's stop arrives, Then the job is USER_STOPPED, not an application error."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault(w, arns)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="alice: wrong learning rate"))
        assert w.repo.jobs.get_job("j").state is JobState.USER_STOPPED
        task = w.ecs.health_checks_on(FAULTY)[0]
        w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        assert w.notifier.sent == []  # no "application error" e-mail


def test_a_verdict_is_applied_when_the_task_arn_was_never_recorded() -> None:  # defect 3
    """Given StartTask worked but writing the health-check task ARN failed, When the
    verdict arrives, Then it is matched on the claim's startedBy and applied."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("node_tasks.record", "refuse")
        with pytest.raises(TimeoutError):
            fault(w, arns)
        assert w.repo.instances.get_instance(FAULTY).check.task_arn == ""
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_task_with_the_checks_started_by_but_another_definition_is_no_verdict(
        caplog: pytest.LogCaptureFixture) -> None:
    """Given a task someone else started with the running check's group and startedBy (read
    from ListTasks) but their own task definition, that exits 2 (replace), When its STOPPED
    event comes, Then it is ignored and logged: the node stays HEALTH_CHECKING, nothing is
    drained or replaced, and the stack's own check still gives the verdict."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault(w, arns)
        [check] = w.ecs.health_checks_on(FAULTY)
        with caplog.at_level("WARNING"):
            outcome = w.service.on_health_check_stopped(w.health_check_stopped(impostor(w, check), 2))
        assert outcome.action == FOREIGN_TASK
        assert any("another task definition" in r.message for r in caplog.records)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        assert w.ecs.drained == [] and w.rebooter.calls == []
        w.service.on_health_check_stopped(w.health_check_stopped(check, 0))
        assert w.repo.faults.get_suspect("j", 1, FAULTY).findings["verdict"] == "healthy"


def test_a_lost_claim_answer_is_finished_by_the_next_sweep() -> None:  # defect 4
    """Given the health-check claim was written but its answer lost (no StartTask), Then
    the sweep after the claim's lease starts the check, once, within two minutes."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("health_checks.claim", "lose")
        with pytest.raises(LostResponse):
            fault(w, arns)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        w.advance(60)
        w.service.sweep()
        assert w.ecs.health_checks_on(FAULTY) == []  # the claimer may still be alive
        w.advance(CLAIM_LEASE_SECONDS)
        w.service.sweep()
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        w.advance(60)
        w.service.sweep()
        assert len(w.ecs.health_checks_on(FAULTY)) == 1


def test_a_lost_start_task_answer_never_starts_a_second_check() -> None:  # defect 7
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.ecs.failures["start_task"] = ["lose"]
        with pytest.raises(LostResponse):
            fault(w, arns)
        fault(w, arns)  # retried at once: the claim's lease still holds
        for _ in range(4):
            w.advance(60)
            w.service.sweep()
        [task] = w.ecs.health_checks_on(FAULTY)
        assert w.repo.instances.get_instance(FAULTY).check.task_arn == task.arn  # found by startedBy


def test_a_refused_start_task_is_retried() -> None:
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.ecs.failures["start_task"] = ["refuse"]
        with pytest.raises(Exception, match="Throttling"):
            fault(w, arns)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECK_PENDING
        fault(w, arns)
        assert len(w.ecs.health_checks_on(FAULTY)) == 1


def _to_rebooting(w: World) -> list[str]:
    arns = w.register_job("j", [PEER, FAULTY])
    fault(w, arns)
    w.service.on_task_state_change(w.task_stopped(
        arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
    [task] = w.ecs.health_checks_on(FAULTY)
    # The injected fault, if any: the state it left is what the test looks at.
    with contextlib.suppress(LostResponse, TimeoutError):
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
    return arns


def test_a_lost_reboot_answer_never_reboots_twice() -> None:  # defect 6
    """Given RebootInstances executed but its answer was lost, When the node shows the
    reboot (agent disconnected), Then nobody reboots it again; it comes back and the
    job is restarted."""
    with world() as w:
        w.rebooter.failures = ["lose"]
        _to_rebooting(w)
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        w.ecs.agent_connected[FAULTY] = False
        w.ecs.versions[FAULTY] = 7
        for _ in range(8):
            w.advance(60)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        w.ecs.agent_connected[FAULTY] = True
        w.ecs.versions[FAULTY] = 8
        w.advance(60)
        w.service.sweep()
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").attempt == 2


def test_a_lost_reboot_marker_write_never_reboots_twice() -> None:
    with world() as w:
        w.repo.fail_once("reboots.record_issued", "refuse")
        _to_rebooting(w)
        w.ecs.agent_connected[FAULTY] = False
        for _ in range(8):
            w.advance(60)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_reboot_that_provably_never_happened_is_issued_again() -> None:
    """Given the reboot call's answer was lost and, five minutes later, the node still
    shows no sign of it (agent connected, no disconnect, same boot), Then it is issued
    again, once."""
    with world() as w:
        w.rebooter.failures = ["lose"]
        _to_rebooting(w)
        w.rebooter.calls.clear()  # pretend the lost call did nothing
        for _ in range(7):
            w.advance(60)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_refused_reboot_is_issued_by_the_next_try() -> None:
    """The verdict is committed, its reboot refused: the verdict's delivery does not fail
    (a retry would find the verdict applied), the sweep issues the reboot."""
    with world() as w:
        w.rebooter.failures = ["refuse"]
        _to_rebooting_raising(w)
        assert w.rebooter.calls == []
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        w.advance(60)
        w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def _to_rebooting_raising(w: World) -> None:  # its reboot call fails
    arns = w.register_job("j", [PEER, FAULTY])
    fault(w, arns)
    [task] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1))


def test_a_stale_connected_event_after_the_disconnect_is_not_back() -> None:  # defect 5
    """Given the agent disconnect (version 11) after the reboot was recorded, When the
    "connected" event of version 10 (from before the reboot) is redelivered, Then the
    node is not back; the reconnect of version 12 brings it back."""
    with world() as w:
        _to_rebooting(w)
        t = w.now[0]
        gone = w.instance_event(FAULTY, connected=False, version=11, at=t + 20)
        w.service.on_container_instance_change(gone)
        stale = w.instance_event(FAULTY, connected=True, version=10, at=t - 5)
        assert w.service.on_container_instance_change(stale).action == "ignored"
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
        back = w.instance_event(FAULTY, connected=True, version=12, at=t + 200)
        assert w.service.on_container_instance_change(back).action == "instance_available"


def test_every_node_is_checked_when_configured() -> None:
    with world(check_all_nodes_on_fault=True) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault(w, arns)
        # Each node becomes a suspect with its rank's stop (its GPUs are free only then).
        assert set(w.repo.faults.labels(w.repo.jobs.get_job("j"))) == {FAULTY}
        assert w.ecs.health_checks_on(PEER) == []  # its rank still holds the GPUs
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        assert set(w.repo.faults.labels(w.repo.jobs.get_job("j"))) == {PEER, FAULTY}
        assert len(w.ecs.health_checks_on(PEER)) == 1
        # The restart waits for both verdicts.
        [task] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
        w.ecs.agent_connected[FAULTY] = False
        w.advance(60)
        w.service.sweep()
        w.ecs.agent_connected[FAULTY] = True
        w.ecs.versions[FAULTY] = 5
        w.advance(60)
        w.service.sweep()
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.AVAILABLE
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART  # node-a's verdict pending
        [task] = w.ecs.health_checks_on(PEER)
        w.service.on_health_check_stopped(w.health_check_stopped(task, 0))
        assert w.repo.jobs.get_job("j").attempt == 2


def test_a_verdict_that_leaves_the_node_alone_looks_up_no_ec2_instance_id() -> None:
    """Registration leaves the node's EC2 id out: a reboot verdict describes the node once
    (the action depends on it), a healthy one (a cascade's peers, hundreds at once) not."""
    with world(check_all_nodes_on_fault=True) as w:
        arns = w.register_job("j", [PEER, FAULTY])
        fault(w, arns)
        w.service.on_task_state_change(w.task_stopped(
            arns[0], exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        for node in (PEER, FAULTY):
            w.repo.tables.db.table("instances").update_item(Key={C.INSTANCE_PK: node},
                                                            UpdateExpression="REMOVE ec2_instance_id")
        described = len(w.ecs.described)
        [healthy] = w.ecs.health_checks_on(PEER)
        w.service.on_health_check_stopped(w.health_check_stopped(healthy, 0))
        assert w.repo.instances.get_instance(PEER).state is InstanceState.AVAILABLE
        assert PEER not in w.ecs.described[described:]
        [sick] = w.ecs.health_checks_on(FAULTY)
        w.service.on_health_check_stopped(w.health_check_stopped(sick, 1))
        assert w.ecs.described[described:] == [FAULTY]
        assert w.repo.instances.get_instance(FAULTY).ec2_instance_id == f"i-{FAULTY}"
        assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_a_check_whose_turn_at_the_ecs_budget_is_far_off_waits_pending_for_the_sweep() -> None:
    """Given the stack's ECS budget has no turn for the DCGM StartTask within the event's
    patience, Then the rank's exit is handled without an error (no Lambda retry), the check
    is not claimed (no slot held) and stays pending, due when its token is; the sweep then
    starts it, once."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.ecs.failures["prepay_in_turn"] = ["rate_limited"]
        fault(w, arns)
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.HEALTH_CHECK_PENDING and not instance.check.started_by
        assert instance.deadline_at == pytest.approx(w.now[0] + 7.0, abs=1.0)
        assert w.ecs.health_checks_on(FAULTY) == [] and w.repo.slots.running() == 0
        w.advance(8)
        w.service.sweep()
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        w.advance(60)
        w.service.sweep()
        assert len(w.ecs.health_checks_on(FAULTY)) == 1


def test_a_hung_ranks_node_is_counted_when_its_report_dies_after_entering_recovery() -> None:
    """Given the heartbeat's hung rank handed to the recovery loop, When the write that puts
    the job in recovery executed but its answer was lost (nothing calls again: the heartbeat
    moved the rank in its own write), Then that write named the node a suspect at the latch:
    the sweep stops the ranks and starts its check, and once every rank ended the job waits
    for the check's verdict (one suspect), not concluded on none."""
    with world() as w:
        arns = w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("rank_events.enter_recovery", "lose")
        with pytest.raises(LostResponse):
            w.service.report_suspected_fault("j", 1, FAULTY, "rank 1 hung at step 7", 1)
        w.advance(60)
        w.service.sweep()  # the stop intent sent (the suspect's check waits for its GPUs)
        assert set(arns) <= set(w.ecs.stop_calls)
        for arn in arns:  # our stops, as ECS reports them
            w.service.on_task_state_change(w.task_stopped(
                arn, exit_code=143, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.PENDING_HEALTHCHECK and job.tally.total == 1
        w.advance(60)
        w.service.sweep()  # the suspect's check asked again: its node is free
        assert len(w.ecs.health_checks_on(FAULTY)) == 1
        assert w.repo.jobs.get_job("j").state is JobState.PENDING_HEALTHCHECK


def test_a_fault_armed_that_no_call_reaches_fails_its_test() -> None:
    """An injected fault that never fires (its intent renamed or moved to another aggregate)
    fails the test that armed it, instead of letting it pass on a failure that never happened."""
    with pytest.raises(AssertionError, match=r"never fired.*rank_events\.enter_recovery"), world() as w:
        w.register_job("j", [PEER, FAULTY])
        w.repo.fail_once("rank_events.enter_recovery", "refuse")


@pytest.mark.parametrize("claim", ["reboots.claim", "reboots.take_over_claim"])
def test_a_reboot_claim_whose_answer_was_lost_is_issued_by_the_same_try(claim: str) -> None:
    """Given the reboot's claim written but its answer lost (a first claim, or the take-over of
    one that was never confirmed), Then the same try claims again with its own token and
    reboots the node, once: it does not wait out the claim's five-minute lease."""
    with world() as w:
        if claim == "reboots.take_over_claim":
            w.rebooter.failures = ["lose"]
            _to_rebooting(w)
            w.rebooter.calls.clear()  # the lost call did nothing: after the lease, taken over
            w.advance(REBOOT_CONFIRM_SECONDS)
        w.repo.fail_once(claim, "lose")
        if claim == "reboots.claim":
            _to_rebooting(w)
        else:
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]
        for _ in range(3):
            w.advance(60)
            w.service.sweep()
        assert w.rebooter.calls == [f"i-{FAULTY}"]
