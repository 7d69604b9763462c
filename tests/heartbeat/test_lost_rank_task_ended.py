"""A rank missing from its node's reports whose task ended, its STOPPED event lost (every
delivery failed, dead-lettered): before the node-lost escalation asks for the node's check, ECS's
own record of the task settles it, handled as that event. The job completes (its ranks exited 0)
instead of being checked and restarted on a healthy node.

Found by an 8 %-of-calls-failing run (``preempt_node_lost``, seed 37): bob's rank 1 exited 0, its
four deliveries failed, its node reported without it; NODE_LOST, its node checked (HEALTHY), and
the completed job restarted at the cost of an infrastructure recovery.
"""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JobState, RankState
from tests.heartbeat.world import NODE, RecoveryLoop, task_arn
from tests.recovery.fakes import FakeTask

MIN = 60


def _rank_lost_with_its_task(world: Any, *, status: str, exit_code: int | None) -> RecoveryLoop:
    """j1's one rank reported once, then its node reports without it for 18 minutes (past the
    stale and the node-lost limits), its ECS agent connected; its task as ECS describes it."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    world.ecs.connected = True
    loop.ecs.agent_connected[NODE] = True
    loop.ecs.tasks[task_arn("j1", 0)] = FakeTask(
        task_arn("j1", 0), NODE, "", "", last_status=status, exit_code=exit_code,
        stop_code="EssentialContainerExited" if status == "STOPPED" else "",
        stopped_reason="Essential container in task exited" if status == "STOPPED" else "",
        stopped_at=world.clock() + 30 if status == "STOPPED" else None,
        task_definition="arn:aws:ecs:us-east-1:123456789012:task-definition/train:1",
        created_at=world.clock(), started_at=world.clock())
    svc = loop.heartbeat
    world.report(svc, NODE, task_arn("j1", 0))
    for _ in range(18):
        world.clock.advance(MIN)
        world.report(svc, NODE)
        svc.sweep()
    return loop


def test_a_lost_rank_whose_task_exited_0_completes_its_job_without_a_check(world) -> None:
    """Given a rank missing from its node's reports whose task ECS describes STOPPED (exit 0), When
    the node-lost escalation comes, Then the task's end is handled as its STOPPED event: the job
    COMPLETE, no check started on the node, no recovery spent."""
    loop = _rank_lost_with_its_task(world, status="STOPPED", exit_code=0)
    assert world.job_state("j1") is JobState.COMPLETE, world.item("j1#JOB")["history"]
    assert world.rank_state("j1", 0) is RankState.DONE
    assert loop.ecs.start_calls == []  # no DCGM check of the node
    assert int(world.item("j1#JOB").get("recoveries_used") or 0) == 0


def test_a_lost_rank_whose_task_still_runs_gets_its_nodes_check(world) -> None:
    """Given a rank missing from its node's reports whose task ECS still describes RUNNING, When
    the node-lost escalation comes, Then the job goes to its node's check (as before), its task
    asked to stop first."""
    loop = _rank_lost_with_its_task(world, status="RUNNING", exit_code=None)
    assert world.job_state("j1") is JobState.PENDING_HEALTHCHECK, world.item("j1#JOB")["history"]
    assert loop.ecs.stop_calls == [task_arn("j1", 0)]


def test_a_lost_rank_whose_task_cannot_be_described_is_escalated_at_a_later_sweep(world) -> None:
    """Given DescribeTasks throttled at the escalation's first sweep, Then nothing is decided then,
    and the next sweep describes the task (still running) and asks for the node's check."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    world.ecs.connected = True
    loop.ecs.agent_connected[NODE] = True
    loop.ecs.tasks[task_arn("j1", 0)] = FakeTask(task_arn("j1", 0), NODE, "", "",
                                                  created_at=world.clock(), started_at=world.clock())
    svc = loop.heartbeat
    world.report(svc, NODE, task_arn("j1", 0))
    loop.ecs.failures["describe_task"] = ["refuse"]  # the escalation's first DescribeTasks
    escalated: list[list[str]] = []
    for _ in range(18):
        world.clock.advance(MIN)
        world.report(svc, NODE)
        escalated.append(svc.sweep().escalated)
        if escalated[-1]:
            break
    assert loop.ecs.failures["describe_task"] == [], "the premise: the escalation described the task"
    assert escalated[-2:] == [[], ["j1"]], escalated
    assert world.job_state("j1") is JobState.PENDING_HEALTHCHECK


def _backstop_after_lost(world: Any, *, status: str, exit_code: int | None) -> RecoveryLoop:
    """j1's one rank NODE_LOST (missing from its node's reports), its task as ECS describes it,
    and no heartbeat sweep after that (none hands it over); then the recovery sweep's backstop,
    past the hand-over's time and its margin."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    world.ecs.connected = True
    loop.ecs.agent_connected[NODE] = True
    stopped = status == "STOPPED"
    loop.ecs.tasks[task_arn("j1", 0)] = FakeTask(
        task_arn("j1", 0), NODE, "", "", last_status=status, exit_code=exit_code,
        stop_code="EssentialContainerExited" if stopped else "",
        stopped_reason="Essential container in task exited" if stopped else "",
        stopped_at=world.clock() + 30 if stopped else None, created_at=world.clock(),
        started_at=world.clock())
    svc = loop.heartbeat
    world.report(svc, NODE, task_arn("j1", 0))
    while world.job_state("j1") is not JobState.NODE_LOST:
        world.clock.advance(MIN)
        world.report(svc, NODE)
        svc.sweep()
    world.clock.advance(30 * MIN)
    loop.service.sweep()
    return loop


def test_a_lost_rank_whose_task_exited_0_is_settled_by_the_recovery_sweeps_backstop(world) -> None:
    """Given a rank NODE_LOST whose task ECS describes STOPPED (exit 0), and no heartbeat sweep
    handing it over (its STOPPED event's deliveries recorded the stop and died, so the heartbeat
    sweep no longer reads the rank live: ``preempt_node_lost`` at 8 %, seed 135)
    When the recovery sweep's backstop comes for the job
    Then ECS's record of the task is handled as its STOPPED event first: the job COMPLETE, no
    check of the node, no recovery spent (it was handed over, checked and restarted)."""
    loop = _backstop_after_lost(world, status="STOPPED", exit_code=0)
    assert world.job_state("j1") is JobState.COMPLETE, world.item("j1#JOB")["history"]
    assert loop.ecs.start_calls == []
    assert int(world.item("j1#JOB").get("recoveries_used") or 0) == 0


def test_a_lost_rank_whose_task_still_runs_is_handed_over_by_the_backstop(world) -> None:
    """Given the same, its task still RUNNING, Then the backstop hands the job over as before: its
    node's check, the task asked to stop first."""
    loop = _backstop_after_lost(world, status="RUNNING", exit_code=None)
    assert world.job_state("j1") is JobState.PENDING_HEALTHCHECK, world.item("j1#JOB")["history"]
    assert loop.ecs.stop_calls == [task_arn("j1", 0)]
