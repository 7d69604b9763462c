"""A queue launch cut short, on the simulated GPU cluster: its ranks start through the recovery's
start fan-out (the one launcher), so a launch a dead tick left half-done, one whose stops ECS
refused, and one canceled meanwhile are driven to their end by the recovery sweep, never by a
later tick. No rank is started twice, none is left running, and a job whose aborted launch still
has a rank running is not admitted again."""

from __future__ import annotations

from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState
from gpu_recovery.repository.scheduling import SchedulingRepository
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._cluster_moves import (
    env_of,
    launch_dies_registering,
    launch_dies_starting,
    steal_gpus,
    throttled,
)
from tests.queue_scheduler._launches import launch_that_fails_on_node_1


def sweep(qc: Any) -> Any:
    """One run of the recovery sweep (every minute when deployed)."""
    return qc.recovery.sweep()


def _stopped_by_the_sweep_then_admitted(qc: Any, job: str, scheduler: Any, thief: str) -> None:
    """The failed launch's rank 0 still runs: the job is not admitted again (its back-off over,
    node-1 free) until the sweep stopped it (minutes: a stop ECS refused is asked again at the
    stop fan-out's paced rounds); then it is, as attempt 2."""
    assert qc.state(job) is JobState.PENDING_RESOURCES and len(qc.live_tasks(job)) == 1
    assert qc.item(job)["stop_fanout"]["attempt"] == 1
    aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thief)  # node-1 free again
    for _ in range(10):
        qc.sim.run_for(60)
        if "stop_fanout" not in qc.item(job):
            break
        # Held back, its back-off over: a rank of its failed launch may still run.
        assert scheduler.tick().launches == []
        sweep(qc)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)
    assert scheduler.tick().admitted == [job]
    assert qc.item(job)["attempt"] == 2 and len(qc.live_tasks(job)) == 2


def test_a_failed_launch_whose_stop_is_refused_is_stopped_before_the_job_runs_again(monkeypatch):
    """Given a 2-node launch that fails on rank 1 (RESOURCE:GPU) after starting rank 0, and
    ECS throttling the StopTask of rank 0
    When the scheduler ticks again after the back-off, and the recovery sweep runs
    Then the job was requeued with the intent to stop its launch's ranks; it is not launched
    again until the sweep stopped rank 0, and then it is."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, scheduler, thieves = launch_that_fails_on_node_1(qc)
        ecs = qc.recovery.gang.ecs
        stop_task = ecs.stop_task

        def refused(task_arn: str, reason: str) -> None:
            raise throttled("StopTask")

        monkeypatch.setattr(ecs, "stop_task", refused)
        result = scheduler.tick()
        monkeypatch.setattr(ecs, "stop_task", stop_task)
        assert [launch["action"] for launch in result.launches] == ["requeued"]
        _stopped_by_the_sweep_then_admitted(qc, job, scheduler, thieves[0])
    finally:
        gen.close()


def test_a_failed_launch_whose_stops_were_never_sent_is_stopped_before_the_job_runs_again(monkeypatch):
    """Given a 2-node launch that fails on rank 1 after starting rank 0, whose stop fan-out is
    never sent (the invocation fails right after the job was requeued)
    When ticks run after the job's back-off, and the recovery sweep runs
    Then the job is not launched again while rank 0 runs; the sweep sends the stop intent the
    requeue committed, and the job is launched once rank 0 is stopped."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, scheduler, thieves = launch_that_fails_on_node_1(qc)

        def dies(*_: Any, **__: Any) -> Any:
            raise RuntimeError("died")

        monkeypatch.setattr(qc.recovery.gang, "stop", dies)
        scheduler.tick()
        monkeypatch.undo()
        assert not qc.item(job)["stop_fanout"].get("sent_at")
        _stopped_by_the_sweep_then_admitted(qc, job, scheduler, thieves[0])
    finally:
        gen.close()


def test_a_launch_that_dies_between_start_task_and_registration_never_duplicates_a_rank(qc, monkeypatch):
    """Given a launch whose invocation dies right after StartTask of rank 1 of a 2x8 job (before
    registering it)
    When later ticks run, and the recovery sweep once the launch is due
    Then no tick touches the launch; the sweep sends its start intent again, rank 1's task is
    found by its startedBy and registered, nothing is started twice, and the job runs with
    exactly one task per rank."""
    job = qc.submit(nnodes=2, gpus=8)
    launch_dies_registering(qc, monkeypatch, 1)
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "interrupted"
    assert len(qc.live_tasks(job)) == 2 and qc.repo.jobs.get_rank(job, 1) is None
    started = qc.sim.counters["tasks_started"]
    qc.sim.run_for(30)  # both ranks RUNNING; the job still STARTING (rank 1 not registered)
    assert qc.scheduler().tick().launches == []  # not in the queue
    qc.sim.run_for(120)
    sweep(qc)
    assert qc.sim.counters["tasks_started"] == started
    assert len(qc.live_tasks(job)) == 2
    assert {qc.repo.jobs.get_rank(job, r).task_arn for r in (0, 1)} == {t.arn for t in qc.live_tasks(job)}
    item = qc.item(job)
    assert item["launched_at"] is not None and item["job_state"] == JobState.RUNNING.value


def test_a_launch_that_dies_before_start_task_starts_the_missing_rank_once(qc, monkeypatch):
    """Given a launch whose invocation dies before StartTask of rank 1 (rank 0 started and
    registered)
    When the recovery sweep runs once the launch is due
    Then rank 1 is started once on its planned node with the plan's MASTER_ADDR, and rank 0 is
    not started again."""
    job = qc.submit(nnodes=2, gpus=8)
    launch_dies_starting(qc, monkeypatch, 2)
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "interrupted" and len(qc.live_tasks(job)) == 1
    plan = qc.item(job)["launch"]
    nodes, _ = SchedulingRepository(qc.repo.jobs).plan_nodes(job, plan["attempt"], plan["world_size"])
    qc.sim.run_for(150)
    sweep(qc)
    tasks = sorted(qc.live_tasks(job), key=lambda t: int(t.tags[C.TAG_RANK]))
    assert len(tasks) == 2
    assert tasks[1].node == qc.sim.node(nodes[1]).name
    assert env_of(tasks[1])["MASTER_ADDR"] == plan["master_addr"]
    assert qc.item(job)["launched_at"] is not None


def test_nodes_of_a_launch_left_half_done_are_held_and_the_tick_admits_the_others(qc, monkeypatch):
    """Given a 2-node launch whose invocation died before starting rank 1 (its planned node
    free in ECS), and another 2-node job queued
    When the scheduler ticks
    Then the other job is launched on the two nodes the stuck launch did not plan, and the sweep
    then completes the stuck launch on its own nodes."""
    stuck = qc.submit(nnodes=2, gpus=8)
    launch_dies_starting(qc, monkeypatch, 2)
    qc.scheduler().tick()
    plan = qc.item(stuck)["launch"]
    nodes, _ = SchedulingRepository(qc.repo.jobs).plan_nodes(stuck, plan["attempt"], plan["world_size"])
    planned = {qc.sim.node(n).name for n in nodes}
    other = qc.submit(nnodes=2, gpus=8)
    assert qc.scheduler().tick().admitted == [other]
    assert {qc.node_of(t).name for t in qc.live_tasks(other)}.isdisjoint(planned)
    qc.sim.run_for(150)
    sweep(qc)
    assert {qc.node_of(t).name for t in qc.live_tasks(stuck)} == planned
    assert qc.item(stuck)["launched_at"] is not None


def test_a_launch_canceled_while_half_done_stops_its_orphan_and_is_canceled(qc, monkeypatch):
    """Given a 4-node launch whose invocation died after starting rank 2 and before registering
    it (ranks 0 and 1 registered, rank 3 never started), and the job canceled by its user
    When the recovery sweep runs
    Then rank 2's task is found (by its event's tags, else its lease's startedBy) and stopped,
    rank 3 is never started, and the job is CANCELED (no STOPPED event of rank 3 will ever come)."""
    job = qc.submit(nnodes=4, gpus=8)
    launch_dies_registering(qc, monkeypatch, 2)
    qc.scheduler().tick()
    assert len(qc.live_tasks(job)) == 3
    started = qc.sim.counters["tasks_started"]
    qc.jobs_service().cancel(job, "alice")
    assert qc.state(job) is JobState.CANCELING
    for _ in range(4):
        qc.sim.run_for(60)
        sweep(qc)
    assert qc.live_tasks(job) == []
    assert qc.sim.counters["tasks_started"] == started
    assert qc.state(job) is JobState.CANCELED


def test_a_launch_canceled_before_any_rank_started_reaches_canceled(qc, monkeypatch):
    """Given a launch whose invocation died before its first StartTask, and a user cancel
    When the recovery sweep runs
    Then nothing is started and the job is CANCELED (no STOPPED event will ever come)."""
    job = qc.submit(nnodes=2, gpus=8)
    launch_dies_starting(qc, monkeypatch, 1)
    qc.scheduler().tick()
    assert qc.live_tasks(job) == []
    started = qc.sim.counters["tasks_started"]
    qc.jobs_service().cancel(job, "alice")
    for _ in range(3):
        qc.sim.run_for(60)
        sweep(qc)
    assert qc.item(job)["job_state"] == JobState.CANCELED.value
    assert qc.live_tasks(job) == [] and qc.sim.counters["tasks_started"] == started


def test_cancel_during_a_launch_that_fails_to_place_reaches_canceled(qc, monkeypatch):
    """Given a cancel that lands while the launch starts rank 0 (job CANCELING, no rank yet),
    When that StartTask fails for lack of GPUs, Then the job is CANCELED at once: no rank
    exists, so no STOPPED event would ever finish the cancel."""
    job = qc.submit(nnodes=2, gpus=8)
    ecs = qc.recovery.gang.ecs
    start_task = ecs.start_task

    def cancel_then_not_placed(**kwargs: Any) -> Any:
        monkeypatch.setattr(ecs, "start_task", start_task)
        qc.jobs_service().cancel(job, "alice")
        for arn in kwargs.get("container_instance_arns") or ():
            steal_gpus(qc, next(n.name for n in qc.sim.nodes.values() if n.container_instance_arn == arn))
        return start_task(**kwargs)

    monkeypatch.setattr(ecs, "start_task", cancel_then_not_placed)
    qc.scheduler().tick()
    assert qc.state(job) is JobState.CANCELED
    assert qc.live_tasks(job) == []


def test_a_launch_past_the_inline_size_is_started_by_the_gang_worker_once_per_rank():
    """Given a 17-node job (past ``gang_inline_max_ranks``, 16) on 17 free nodes
    When the scheduler ticks
    Then the tick only sends the launch's start batch to the gang queue; its worker starts every
    rank once, and the job runs."""
    gen = make_queue_cluster(nodes=[8] * 17)
    qc = next(gen)
    try:
        job = qc.submit(nnodes=17, gpus=8)
        started = qc.sim.counters["tasks_started"]
        assert qc.scheduler().tick().admitted == [job]
        qc.sim.run_for(60)
        assert qc.sim.counters["tasks_started"] == started + 17
        assert len({t.node for t in qc.live_tasks(job)}) == 17
        assert qc.state(job) is JobState.RUNNING and qc.item(job)["launched_at"] is not None
    finally:
        gen.close()


def _start_task_refused(qc: Any, monkeypatch: Any, error: Any) -> None:
    def refused(**_: Any) -> Any:
        raise error

    monkeypatch.setattr(qc.recovery.gang.ecs, "start_task", refused)


def test_a_start_task_refused_for_its_overrides_fails_the_launch_without_retry(qc, monkeypatch):
    """Given a launch whose StartTask ECS refuses (InvalidParameterException: an override names
    a container the task definition does not have)
    When the scheduler ticks, and later the sweep runs
    Then the job is FAILED as a USER_ERROR, nothing runs, and it is never started again."""
    from botocore.exceptions import ClientError

    job = qc.submit(nnodes=2, gpus=8)
    _start_task_refused(qc, monkeypatch, ClientError(
        {"Error": {"Code": "InvalidParameterException",
                   "Message": "Override for container named x is not a container in the TaskDefinition."},
         "ResponseMetadata": {"HTTPStatusCode": 400}},
        "StartTask"))
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "failed" and launch["kind"] == "USER_ERROR"
    item = qc.item(job)
    assert item["job_state"] == "FAILED" and item["failure_kind"] == "USER_ERROR"
    monkeypatch.undo()
    qc.sim.run_for(600)
    sweep(qc)
    assert qc.scheduler().tick().launches == [] and qc.live_tasks(job) == []


def test_a_launch_whose_start_task_is_throttled_is_sent_again_by_the_sweep(qc, monkeypatch):
    """Given a launch whose StartTask is throttled (past botocore's retries)
    When the sweep runs once the launch is due
    Then the launch was left STARTING (not requeued, not failed), and the sweep's resend starts
    every rank once."""
    job = qc.submit(nnodes=2, gpus=8)
    _start_task_refused(qc, monkeypatch, throttled("StartTask"))
    qc.scheduler().tick()
    monkeypatch.undo()
    assert qc.state(job) is JobState.STARTING and qc.live_tasks(job) == []
    qc.sim.run_for(150)
    sweep(qc)
    assert len(qc.live_tasks(job)) == 2 and qc.item(job)["launched_at"] is not None
