"""How a queue launch ends, on the simulated GPU cluster: a stop intent left on a queued job
holds it out of admission only while it is its own aborted launch's and live; an aborted
launch's stop whose rounds are spent ends; the sweep's give-up never ends a launch that
completed, and requeues the one it ends; a launch aborted is never marked complete after."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState
from gpu_recovery.recovery.gang import MAX_STOP_ROUNDS
from gpu_recovery.repository.scheduling import SchedulingRepository
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._cluster_moves import throttled
from tests.queue_scheduler._launches import (
    Recorded,
    launch_that_fails_on_node_1,
    requeued_launch_failed_on_node_1,
    set_fields,
)


def _start_task_throttled(qc: Any, monkeypatch: Any) -> None:
    def refused(**_: Any) -> Any:
        raise throttled("StartTask")

    monkeypatch.setattr(qc.recovery.gang.ecs, "start_task", refused)


LEFT_OVER = {
    # A suspension finished by the sweep (its ranks' last STOPPED event lost) kept its intent.
    "a suspension's": {"why": "suspended: preempted by job h", "remediation": False},
    # An aborted launch of the attempt before (the job was admitted again meanwhile).
    "an earlier aborted launch's": {"why": "launch of attempt 0 failed", "aborted_launch": True,
                                    "remediation": False, "attempt_offset": -1},
    # The abort's stops asked 1 + MAX_STOP_ROUNDS times: given up (a person looks at the node).
    "a spent aborted launch's": {"why": "launch of attempt 1 failed", "aborted_launch": True,
                                 "remediation": False, "rounds": MAX_STOP_ROUNDS},
}


@pytest.mark.parametrize("intent", sorted(LEFT_OVER))
def test_a_queued_job_with_a_stop_intent_left_over_is_admitted(qc, intent):
    """Given a queued job (attempt 1 ran before) whose item still carries a stop intent that
    waits for nothing: a suspension's, an earlier attempt's aborted launch's, or its own aborted
    launch's whose stop rounds are spent
    When the scheduler ticks
    Then the job is admitted (it was skipped, and counted unplaced, at every tick for good), and
    the intent goes with its claim."""
    job = qc.submit(nnodes=1, gpus=8)
    fields = dict(LEFT_OVER[intent])
    attempt = 1 + int(fields.pop("attempt_offset", 0))
    now = int(clock.now())
    set_fields(qc, job, attempt=1, stop_fanout={"attempt": attempt, "at": now - 7200, "sent_at": now - 3600,
                                                 "rounds": 0, **fields})
    assert qc.scheduler().tick().admitted == [job]
    assert qc.item(job)["attempt"] == 2
    assert "stop_fanout" not in qc.item(job)  # the claim took it off: not left on the new attempt


def test_a_queued_job_whose_aborted_launch_is_still_being_stopped_is_not_admitted(qc):
    """Given a queued job whose own aborted launch's stop intent is live (rounds left)
    When the scheduler ticks Then the job is not admitted (a rank of that launch may run)."""
    job = qc.submit(nnodes=1, gpus=8)
    now = int(clock.now())
    set_fields(qc, job, attempt=1, stop_fanout={
        "attempt": 1, "at": now - 600, "sent_at": now - 300, "rounds": 2, "why": "launch of attempt 1 failed",
        "aborted_launch": True, "remediation": False})
    assert qc.scheduler().tick().launches == []
    assert qc.state(job) is JobState.QUEUED


def test_an_aborted_launch_whose_stops_are_never_confirmed_ends_its_stop_and_is_admitted_again(monkeypatch):
    """Given a 2-node launch that fails on rank 1 after starting rank 0, and ECS refusing every
    StopTask of rank 0 (its agent gone: the task is never reported stopped)
    When the recovery sweep runs for hours
    Then the stop is asked 1 + MAX_STOP_ROUNDS times, then the abort's stop intent ends (it
    stayed on the queued job for good, the job never admitted again), counted once in
    AbortedLaunchStopsGivenUp (a person looks at the node: it was only logged); the job is
    offered to the scheduler again."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        recorded = Recorded()  # on the relay: the task events' handlers point it at their own metrics
        monkeypatch.setattr(qc.recovery.gang.metrics, "add_metric", recorded.add_metric)
        monkeypatch.setattr(qc.recovery.gang.metrics, "add_metric_now", recorded.add_metric_now)
        job, scheduler, thieves = launch_that_fails_on_node_1(qc)
        ecs = qc.recovery.gang.ecs
        asked: list[str] = []

        def refused(task_arn: str, reason: str) -> None:
            raise throttled("StopTask")

        def never_stopped(task_arn: str, reason: str) -> None:
            asked.append(task_arn)  # ECS took it; the agent gone, the task never stops

        monkeypatch.setattr(ecs, "stop_task", refused)  # the abort's own stop: left to the sweep
        [launch] = scheduler.tick().launches
        assert launch["action"] == "requeued" and qc.item(job)["stop_fanout"]["aborted_launch"]
        monkeypatch.setattr(ecs, "stop_task", never_stopped)
        [rank0] = qc.live_tasks(job)
        for thief in thieves:
            aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thief)
        for _ in range(30):
            qc.sim.run_for(600)
            qc.recovery.sweep()
            if "stop_fanout" not in qc.item(job):
                break
        assert "stop_fanout" not in qc.item(job), qc.item(job)["stop_fanout"]
        assert asked.count(rank0.arn) == 1 + MAX_STOP_ROUNDS
        assert recorded.names.count("AbortedLaunchStopsGivenUp") == 1
        assert recorded.flushed_now == ["AbortedLaunchStopsGivenUp"]
        result = scheduler.tick()
        assert result.admitted == [job] or job in result.blocked
    finally:
        gen.close()


def test_the_sweep_never_gives_up_a_launch_that_completed_meanwhile(qc, monkeypatch):
    """Given a launch whose StartTask was throttled until past its give-up time, read as
    STARTING by a sweep, and completed meanwhile (its intent sent again: every rank registered,
    the job RUNNING)
    When that sweep goes on with what it read
    Then the job runs on (it was FAILED, its running ranks stopped)."""
    job = qc.submit(nnodes=2, gpus=8)
    _start_task_throttled(qc, monkeypatch)
    qc.scheduler().tick()
    qc.sim.run_for(600)  # past the give-up (no sweep ran)
    stale = qc.repo.jobs.get_job(job)
    assert stale.state is JobState.STARTING
    monkeypatch.undo()
    qc.recovery.gang.start(stale)  # the launch's resend, by another invocation
    qc.sim.run_for(30)
    assert qc.state(job) is JobState.RUNNING
    qc.recovery.launches.resume(stale)
    assert qc.state(job) is JobState.RUNNING and len(qc.live_tasks(job)) == 2
    # Nor does the give-up's requeue apply to a launch complete (the write's own condition).
    store = SchedulingRepository(qc.repo.jobs)
    assert not store.requeue_after_failed_launch(
        job, stale.attempt, reason="given up", queue_order="x", not_before=0, resource_failures=1,
        attempts=[], stop_why="given up", given_up=True)
    assert qc.state(job) is JobState.RUNNING


def test_the_give_up_ends_only_a_starting_launch_while_a_rank_not_placed_aborts_a_running_one(qc):
    """Given a job RUNNING (rank 0's RUNNING event came) whose launch is not recorded complete
    When its launch is ended short: by the sweep's give-up, by a rank not placed
    Then the give-up's requeue does not apply (its launch may complete); a rank not placed
    aborts it from RUNNING too (the launch cannot complete without that rank)."""
    job = qc.submit(nnodes=2, gpus=8)
    qc.scheduler().tick()
    qc.sim.run_for(30)
    assert qc.state(job) is JobState.RUNNING
    item = qc.item(job)
    qc.table().update_item(Key={C.JOB_PK: item[C.JOB_PK]}, UpdateExpression="REMOVE launched_at")
    store = SchedulingRepository(qc.repo.jobs)

    def requeue(given_up: bool) -> bool:
        return store.requeue_after_failed_launch(
            job, 1, reason="ended short", queue_order="x", not_before=0, resource_failures=1, attempts=[],
            stop_why="ended short", given_up=given_up)

    assert not requeue(given_up=True)
    assert qc.state(job) is JobState.RUNNING
    assert requeue(given_up=False)
    assert qc.state(job) is JobState.PENDING_RESOURCES


def test_a_launch_that_never_completes_is_requeued_after_its_resends(qc, monkeypatch):
    """Given a launch whose StartTask is throttled every time
    When the sweep runs every minute for ten minutes
    Then the launch is sent again a few times, then given up: requeued with a back-off (not
    FAILED: nothing says the job cannot run), no rank running, counted as an aborted launch."""
    recorded = Recorded()
    monkeypatch.setattr(qc.recovery.gang.metrics, "target", recorded)
    job = qc.submit(nnodes=2, gpus=8)
    _start_task_throttled(qc, monkeypatch)
    qc.scheduler().tick()
    for _ in range(10):
        qc.sim.run_for(60)
        qc.recovery.sweep()
    item = qc.item(job)
    assert item["job_state"] == "PENDING_RESOURCES" and item["attempt"] == 1
    assert "did not complete" in item["last_error"] and "retry in 60 s" in item["last_error"]
    assert item["resource_failures"] == 1 and item[C.QUEUE_PK] == C.QUEUE_BUCKET
    assert item["attempts"][-1]["outcome"] == "START_FAILED" and qc.live_tasks(job) == []
    assert recorded.names.count("LaunchesAborted") == 1
    monkeypatch.undo()
    qc.sim.run_for(660)
    qc.recovery.sweep()  # the abort's stop intent ends (nothing was started)
    assert qc.scheduler().tick().admitted == [job]


def test_an_aborted_launch_is_never_marked_complete_after(monkeypatch):
    """Given a 2-node launch aborted (rank 1 not placed: requeued, same attempt)
    When its completion comes late (a registration's event of that attempt)
    Then the requeued job is not marked launched (it was: the condition excluded only ended
    jobs)."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, _ = requeued_launch_failed_on_node_1(qc)
        store = SchedulingRepository(qc.repo.jobs)
        assert not store.finish_launch(job, 1, [], clock.now())
        item = qc.item(job)
        assert item["job_state"] == "PENDING_RESOURCES" and item.get("launched_at") is None
    finally:
        gen.close()
