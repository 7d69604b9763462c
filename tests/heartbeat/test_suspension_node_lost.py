"""A node lost just before its job's suspension stops it: the stop fan-out marks the lost rank
STOP_REQUESTED before the heartbeat sweep's lost-node escalation decided. The rank stays
watched (a suspension's stop keeps its ranks in the heartbeat index until ECS reports them
STOPPED), so the sweep's silence and the escalation's two readings of the ECS agent decide the
job within the lost-node decision's time (FAILED, its quota released), not the suspension's
two-hour backstop; a rank stopping normally (its ECS agent connected) is never escalated into
anything, and leaves the index with its STOPPED event (the real recovery loop on the heartbeat
world's tables: ``RecoveryLoop``)."""

from __future__ import annotations

import contextlib

import pytest

from gpu_recovery.constants import HB_PK, InstanceState, JobState, NotificationKind, RankState
from gpu_recovery.domain.time_sharing import SuspendKind
from gpu_recovery.repository.time_sharing import HoldingRepository
from tests.heartbeat.world import (
    NODE,
    NODE_B,
    RecoveryLoop,
    charge_quota,
    charge_released,
    rank_stopped,
    task_arn,
)

#: stale 180 s + node_lost_fail_seconds 600 s + the two readings' 180 s, and the sweeps' minutes:
#: a RUNNING job's node lost the same way is decided as soon (the suspension's backstop: 2 h 07)
DECIDED_WITHIN_MINUTES = 20


def _preempted_as_its_node_is_lost(world, *, connected: bool) -> tuple[RecoveryLoop, HoldingRepository]:
    """A 2-rank queue job (rank 0 on NODE_B, rank 1 on NODE) heartbeating, holding alice's quota,
    preempted; NODE falls silent after its first report (``connected``: its ECS agent still
    answers) and, a minute later, rank 0 calls go_suspend() before the heartbeat sweep marked
    rank 1 lost: both ranks asked to stop, rank 0's STOPPED event delivered (its node is healthy)."""
    world.seed_job("j1", world_size=2, nodes=(NODE_B, NODE))
    loop = RecoveryLoop(world)
    loop.ecs.agent_connected[NODE] = connected
    world.ecs.connected = connected
    svc = loop.heartbeat
    holding = charge_quota(world, "j1", nodes=2)
    world.report(svc, NODE_B, task_arn("j1", 0))
    world.report(svc, NODE, task_arn("j1", 1))
    assert loop.service.request_suspend("j1", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                        grace_seconds=600, actor="scheduler", by_job="h")
    world.clock.advance(60)
    world.report(svc, NODE_B, task_arn("j1", 0))  # NODE is silent from now on
    assert svc.sweep().marked_lost == []
    assert loop.service.go_suspend("j1", 0, 1).action == "suspending"
    assert sorted(loop.ecs.stop_calls) == [task_arn("j1", 0), task_arn("j1", 1)]
    assert world.rank_state("j1", 1) is RankState.STOP_REQUESTED
    loop.service.on_task_state_change(rank_stopped("j1", 0, NODE_B, reason="gpu-recovery: suspended"))
    assert world.rank_state("j1", 0) is RankState.STOPPED
    assert HB_PK not in world.item("j1#0")  # STOPPED: out of the heartbeat index
    return loop, holding


def _minutes_until_it_leaves_suspending(world, loop: RecoveryLoop, minutes: int) -> int:
    """Both sweeps every minute (NODE_B's agent reporting, no task); the minutes it took."""
    for minute in range(1, minutes + 1):
        world.clock.advance(60)
        world.report(loop.heartbeat, NODE_B)
        loop.heartbeat.sweep()
        loop.service.sweep()
        if world.job_state("j1") is not JobState.SUSPENDING:
            return minute
    return minutes + 1


def test_a_node_lost_as_the_suspension_stops_its_rank_fails_the_job_within_the_lost_node_decisions_time(
        world) -> None:
    """Given a preempted job whose rank 1's node was lost (both agents silent) just before
    go_suspend() asked every rank to stop, When the sweeps run, Then the job does not wait for the
    suspension's two-hour backstop: within the lost-node decision's time it is FAILED by that
    decision (its reason naming the suspension and the node), the lost node quarantined (its ECS
    agent read disconnected twice, its node agent silent), the healthy node left AVAILABLE, one
    e-mail; the rank leaves the heartbeat index and the scheduler's tick releases the charge."""
    loop, holding = _preempted_as_its_node_is_lost(world, connected=False)
    took = _minutes_until_it_leaves_suspending(world, loop, DECIDED_WITHIN_MINUTES)
    assert world.job_state("j1") is JobState.FAILED, f"still SUSPENDING after {took} minutes"
    error = world.item("j1#JOB")["last_error"]
    assert NODE in error and "suspension could not be completed" in error
    assert world.instance_state(NODE) is InstanceState.QUARANTINED
    assert world.instance_state(NODE_B) is InstanceState.AVAILABLE
    [mail] = world.notifier.sent
    assert mail.kind is NotificationKind.NODE_LOST
    for _ in range(2):
        world.clock.advance(60)
        loop.heartbeat.sweep()
        loop.service.sweep()
    assert HB_PK not in world.item("j1#1")
    assert world.notifier.sent == [mail]
    charge_released(world, holding, "j1")


@pytest.mark.parametrize("stops_after_minutes", [2, 25], ids=["stops_soon", "stops_late"])
def test_a_suspension_whose_rank_stops_normally_is_suspended_and_nothing_is_escalated(
        world, stops_after_minutes: int) -> None:
    """Given the same suspension but the silent node's ECS agent connected (its task is being
    stopped: a slow stop, or a task that ran no node agent), When its STOPPED event comes
    ``stops_after_minutes`` later (past the lost-node limit too), Then the escalation only reads
    the agent connected: no node decision, no suspect, no e-mail, both nodes AVAILABLE; the job is
    SUSPENDED once the rank stopped, and the rank leaves the heartbeat index."""
    loop, _ = _preempted_as_its_node_is_lost(world, connected=True)
    assert HB_PK in world.item("j1#1")  # asked to stop by a suspension: still watched
    assert _minutes_until_it_leaves_suspending(world, loop, stops_after_minutes) == stops_after_minutes + 1
    loop.service.on_task_state_change(rank_stopped("j1", 1, NODE, reason="gpu-recovery: suspended"))
    assert world.job_state("j1") is JobState.SUSPENDED
    assert HB_PK not in world.item("j1#1")
    assert world.instance_state(NODE) is InstanceState.AVAILABLE
    assert world.instance_state(NODE_B) is InstanceState.AVAILABLE
    assert world.notifier.sent == []
    assert world.recovery.unreachable == [] and world.recovery.calls == []
    if stops_after_minutes > 15:
        assert world.ecs.described  # the escalation looked, and found ECS reaching the node


def test_the_stop_of_a_failed_job_still_takes_its_ranks_out_of_the_heartbeat_index(world) -> None:
    """Given a RUNNING job failed with the intent to stop its ranks (not a suspension), When its
    stop fan-out runs, Then its ranks are STOP_REQUESTED and out of the heartbeat index, as before
    (only a suspension's stop keeps them watched)."""
    world.seed_job("j1", world_size=2, nodes=(NODE_B, NODE))
    loop = RecoveryLoop(world)
    world.report(loop.heartbeat, NODE_B, task_arn("j1", 0))
    world.report(loop.heartbeat, NODE, task_arn("j1", 1))
    assert world.repo.jobs.finish_job("j1", 1, JobState.FAILED, "failed by a test", stop_ranks_of=1)
    job = world.repo.jobs.get_job("j1")
    assert job is not None and loop.service.gang.stop(job)
    for rank in (0, 1):
        assert world.rank_state("j1", rank) is RankState.STOP_REQUESTED
        assert HB_PK not in world.item(f"j1#{rank}")


@pytest.mark.parametrize(("intent", "how"), [(None, ""), ("jobs.request_rank_stop", "lose"),
                                             ("jobs.request_rank_stop", "refuse"),
                                             ("decisions.record", "lose"), ("decisions.record", "refuse")])
def test_a_node_lost_as_the_grace_ends_is_decided_as_soon_whatever_call_breaks(
        world, intent: str | None, how: str) -> None:
    """Given a 1-rank job preempted with a 2-minute grace whose node is lost as the grace starts,
    When the recovery sweep stops the rank by force at the grace's end (before the heartbeat sweep
    marked it lost) and ``intent`` of the recovery loop breaks once (its write lost after it
    applied, or refused), Then the job is still FAILED by the lost-node decision within its time,
    the node quarantined, one e-mail (sent by the sweep if the decision's response was lost), the
    charge released."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    holding = charge_quota(world, "j1")
    world.report(loop.heartbeat, NODE, task_arn("j1", 0))  # NODE is silent from now on
    assert loop.service.request_suspend("j1", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                        grace_seconds=120, actor="scheduler", by_job="h")
    if intent is not None:
        loop.repo.fail_once(intent, how)
    for _ in range(DECIDED_WITHIN_MINUTES):
        world.clock.advance(60)
        for sweep in (loop.service.sweep, loop.heartbeat.sweep):
            with contextlib.suppress(Exception):  # the broken call: the next minute's sweeps carry on
                sweep()
        if world.job_state("j1") is not JobState.SUSPENDING:
            break
    assert loop.repo.armed() == []
    assert world.job_state("j1") is JobState.FAILED
    for _ in range(3):  # an e-mail owed by a decision whose response was lost: the sweep sends it
        world.clock.advance(60)
        loop.service.sweep()
        loop.heartbeat.sweep()
    assert "suspension could not be completed" in world.item("j1#JOB")["last_error"]
    assert world.instance_state(NODE) is InstanceState.QUARANTINED
    assert [m.kind for m in world.notifier.sent] == [NotificationKind.NODE_LOST]
    charge_released(world, holding, "j1")
