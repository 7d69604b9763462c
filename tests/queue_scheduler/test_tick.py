"""The scheduler tick against moto with simulated GPU accounting (SimulatedEcs)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.models import Instance
from gpu_recovery.queue import launcher as launcher_mod
from gpu_recovery.queue.scheduler import LEASE_KEY
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE
from tests.fixtures.queue_cluster import make_queue_cluster


def env_of(task: Any) -> dict[str, str]:
    [override] = task.overrides["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def steal_gpus(qc: Any, node: str) -> str:
    """Another tenant takes every free GPU of a node (an untagged task: not a job)."""
    td = qc.sim.register_training_task_definition("thief", gpus=len(qc.sim.node(node).free_gpu_ids))
    resp = aws.client("ecs").start_task(cluster=qc.local.cluster_name, taskDefinition=td,
                                        containerInstances=[qc.sim.node(node).container_instance_arn])
    return resp["tasks"][0]["taskArn"]


def throttled(operation: str) -> ClientError:
    """AWS's throttle of ``operation``, past botocore's retries."""
    return ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, operation)


def tick_that_dies_registering(qc: Any, monkeypatch: Any, rank: int) -> None:
    """A scheduler tick whose Lambda dies as its launch registers ``rank`` (that rank started,
    the ranks before it registered)."""
    register = qc.recovery.register_rank

    def dies_at_rank(reg: Any) -> Any:
        if reg.rank == rank:
            raise RuntimeError("died")
        return register(reg)

    monkeypatch.setattr(qc.recovery, "register_rank", dies_at_rank)
    with pytest.raises(RuntimeError):
        qc.scheduler().tick()
    monkeypatch.undo()


def test_launches_a_gang_with_rendezvous_env_tags_and_started_by(qc):
    """Given four free 8-GPU nodes and a queued 2x8 job
    When the scheduler ticks
    Then both ranks start on distinct nodes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/JOB_ID/
    ATTEMPT, recovery tags and deterministic startedBy, are registered, and the job runs."""
    job = qc.submit(nnodes=2, gpus=8)
    result = qc.scheduler().tick()
    assert result.admitted == [job]
    item = qc.item(job)
    assert item["job_state"] == "STARTING" and item["attempt"] == 1
    assert C.QUEUE_PK not in item and C.QUEUE_SK not in item
    tasks = sorted(qc.live_tasks(job), key=lambda t: int(t.tags[C.TAG_RANK]))
    assert len(tasks) == 2 and tasks[0].node != tasks[1].node
    master_ip = qc.local.client("ec2").describe_instances(
        InstanceIds=[qc.node_of(tasks[0]).instance_id])["Reservations"][0]["Instances"][0]["PrivateIpAddress"]
    for rank, task in enumerate(tasks):
        env = env_of(task)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["JOB_ID"] == job
        assert env["MASTER_ADDR"] == master_ip and env["MASTER_PORT"] == "29500"
        assert env["ATTEMPT"] == "1" and env["LR"] == "0.1"
        assert task.tags == {C.TAG_JOB_ID: job, C.TAG_RANK: str(rank), C.TAG_WORLD_SIZE: "2",
                             C.TAG_ATTEMPT: "1"}
        assert task.started_by == launcher_mod.started_by(job, 1, rank)
        assert len(task.started_by) <= 36 and task.overrides["containerOverrides"][0]["name"] == "trainer"
        rank_item = qc.repo.jobs.get_rank(job, rank)
        assert rank_item.task_arn == task.arn and rank_item.attempt == 1
    qc.sim.run_for(30)
    assert qc.state(job) is JobState.RUNNING
    assert qc.item(job)["attempts"][-1]["outcome"] == "STARTED"


def test_higher_priority_first_then_fifo(qc):
    """Given a full-cluster low-priority job submitted first and a high-priority one later
    When the scheduler ticks
    Then the high-priority job starts and the earlier low-priority job waits."""
    low = qc.submit(nnodes=4, gpus=8, priority=0)
    high = qc.submit(nnodes=3, gpus=8, priority=50)
    result = qc.scheduler().tick()
    assert result.admitted == [high]
    assert qc.state(low) is JobState.QUEUED


def test_per_node_gang_in_a_real_tick():
    """Given four nodes each with 4 of 8 GPUs taken (16 free as 4+4+4+4)
    When a 2x8 job is queued and the scheduler ticks
    Then the job is not started (no StartTask at all) and stays queued."""
    gen = make_queue_cluster(nodes=[8, 8, 8, 8])
    qc = next(gen)
    try:
        half = qc.sim.register_training_task_definition("half", gpus=4)
        for i in range(4):
            aws.client("ecs").start_task(cluster=qc.local.cluster_name, taskDefinition=half,
                                         containerInstances=[qc.sim.node(f"node-{i}").container_instance_arn])
        job = qc.submit(nnodes=2, gpus=8)
        started = qc.sim.counters["tasks_started"]
        result = qc.scheduler().tick()
        assert result.admitted == [] and result.blocked == [job]
        assert qc.sim.counters["tasks_started"] == started
        assert qc.state(job) is JobState.QUEUED
    finally:
        gen.close()


def test_skips_nodes_the_recovery_loop_owns_or_ecs_cannot_use(qc):
    """Given node-0 REBOOTING, node-1 QUARANTINED, node-2 with its agent disconnected
    When a 2x8 job and a 1x8 job are queued
    Then the 2x8 job cannot start and the 1x8 job starts on node-3."""
    for name, state in (("node-0", InstanceState.REBOOTING), ("node-1", InstanceState.QUARANTINED)):
        node = qc.sim.node(name)
        qc.repo.instances.put_instance_if_absent(Instance(node.container_instance_id, state,
                                                          node.container_instance_arn, node.instance_id))
    qc.sim.node("node-2").agent_connected = False
    two = qc.submit(nnodes=2, gpus=8)
    one = qc.submit(nnodes=1, gpus=8)
    result = qc.scheduler().tick()
    assert result.admitted == [one]
    assert qc.state(two) is JobState.QUEUED
    [task] = qc.live_tasks(one)
    assert task.node == "node-3"


def test_skips_a_cordoned_node_whatever_its_state_says(qc):
    """Given node-0..2 AVAILABLE but cordoned (known bad; observe mode or the breaker left
    them so), When a 1x8 job is queued, Then it starts on node-3; When node-3 is taken too,
    Then a second 1x8 job waits (no cordoned node takes it)."""
    from gpu_recovery.domain.cordon import ECS_APPLIED, cordon_record

    for name in ("node-0", "node-1", "node-2"):
        node = qc.sim.node(name)
        qc.repo.instances.put_instance_if_absent(Instance(node.container_instance_id, InstanceState.AVAILABLE,
                                                          node.container_instance_arn, node.instance_id))
        assert qc.repo.cordons.cordon(node.container_instance_id, cordon_record(
            cause="xid-79", reason="test", now=1.0, ecs=ECS_APPLIED), 1.0)
    one = qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == [one]
    [task] = qc.live_tasks(one)
    assert task.node == "node-3"
    two = qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == []
    assert qc.state(two) is JobState.QUEUED


def test_race_on_start_task_requeues_with_backoff_60_then_120():
    """Given one 8-GPU node whose GPUs another tenant takes between snapshot and StartTask
    When the scheduler ticks twice (the second time after the backoff)
    Then each time the job returns to PENDING_RESOURCES, keeps its queue place, backs off
    60 s then 120 s, and records an INSUFFICIENT_RESOURCES attempt."""
    gen = make_queue_cluster(nodes=[8])
    qc = next(gen)
    try:
        job = qc.submit(nnodes=1, gpus=8, priority=20)
        order = qc.item(job)[C.QUEUE_SK]
        scheduler = qc.scheduler()
        real_snapshot = scheduler.snapshot
        thieves: list[str] = []

        def racing_snapshot():
            nodes = real_snapshot()
            thieves.append(steal_gpus(qc, "node-0"))
            return nodes

        scheduler.snapshot = racing_snapshot  # type: ignore[method-assign]
        for expected_backoff, attempt in ((60, 1), (120, 2)):
            now = qc.sim.now()
            result = scheduler.tick()
            assert result.admitted == [] and result.launch_failures == 1
            item = qc.item(job)
            assert item["job_state"] == "PENDING_RESOURCES" and item["attempt"] == attempt
            assert item[C.QUEUE_SK] == order and item[C.QUEUE_PK] == C.QUEUE_BUCKET
            assert item["not_before"] == pytest.approx(now + expected_backoff)
            assert item["attempts"][-1]["failure_kind"] == "INSUFFICIENT_RESOURCES"
            assert qc.live_tasks(job) == []
            # The thief leaves; still backing off: a tick before not_before leaves the job alone.
            aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thieves[-1])
            qc.sim.run_for(30)
            assert scheduler.tick().launches == []
            assert qc.state(job) is JobState.PENDING_RESOURCES
            qc.sim.run_for(expected_backoff - 30 + 1)
        scheduler.snapshot = real_snapshot  # type: ignore[method-assign]
        qc.sim.run_for(120)
        assert scheduler.tick().admitted == [job]
        assert qc.item(job)["attempt"] == 3 and qc.item(job)["resource_failures"] == 0
    finally:
        gen.close()


def test_a_relocated_job_whose_launch_fails_keeps_its_place_ahead_of_its_priority(qc):
    """Given a job the recovery loop relocated (queued ahead of every job of its priority)
    When its launch is not placed (its node's GPUs taken between snapshot and StartTask)
    Then it is requeued ahead of its priority again, still relocated (it was requeued at the
    plain order: behind its peers, and no longer allowed a hot spare)."""
    job = qc.submit(nnodes=1, gpus=8, priority=20)
    item = qc.item(job)
    ahead = C.relocated_queue_order(20, float(item["submitted_at"]), job)
    qc.table().update_item(Key={C.JOB_PK: item[C.JOB_PK]}, UpdateExpression="SET #k = :k",
                           ExpressionAttributeNames={"#k": C.QUEUE_SK},
                           ExpressionAttributeValues={":k": ahead})
    scheduler = qc.scheduler()
    real_snapshot = scheduler.snapshot

    def racing_snapshot():
        nodes = real_snapshot()
        for node in nodes:  # every node's GPUs taken: wherever the job was planned
            steal_gpus(qc, node)
        return nodes

    scheduler.snapshot = racing_snapshot  # type: ignore[method-assign]
    assert scheduler.tick().launch_failures == 1
    item = qc.item(job)
    assert item["job_state"] == "PENDING_RESOURCES" and item[C.QUEUE_SK] == ahead


def _launch_that_fails_on_node_1(qc: Any) -> tuple[str, Any, list[str]]:
    """A 2-node job on a 2-node cluster whose node-1 another tenant takes between the tick's
    snapshot and its StartTask (once): rank 0 starts, rank 1 is not placed."""
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()
    real_snapshot = scheduler.snapshot
    thieves: list[str] = []

    def racing_snapshot():
        nodes = real_snapshot()
        if not thieves:
            thieves.append(steal_gpus(qc, "node-1"))
        return nodes

    scheduler.snapshot = racing_snapshot  # type: ignore[method-assign]
    return job, scheduler, thieves


def test_a_failed_launch_whose_stop_is_refused_stops_its_rank_on_the_next_tick(monkeypatch):
    """Given a 2-node launch that fails on rank 1 (RESOURCE:GPU) after starting rank 0, and
    ECS throttling the StopTask of rank 0
    When the scheduler ticks again a minute later
    Then the job was requeued, its launch kept in the ledger, and the next tick stops rank 0
    before anything else: no task of the failed launch is left running, and the job is not
    launched again in that tick."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, scheduler, thieves = _launch_that_fails_on_node_1(qc)
        ecs = scheduler.launcher.ecs
        stop_task = ecs.stop_task

        def refused(task_arn: str, reason: str) -> None:
            raise throttled("StopTask")

        monkeypatch.setattr(ecs, "stop_task", refused)
        result = scheduler.tick()
        monkeypatch.setattr(ecs, "stop_task", stop_task)
        assert [launch["action"] for launch in result.launches] == ["requeued"]
        assert qc.state(job) is JobState.PENDING_RESOURCES and len(qc.live_tasks(job)) == 1
        assert job in scheduler.store.ledger_entries()
        aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thieves[0])  # node-1 free again
        qc.sim.run_for(61)
        result = scheduler.tick()
        assert [r["action"] for r in result.resumed] == ["abandoned"] and result.launches == []
        qc.sim.run_for(30)
        assert qc.live_tasks(job) == []
        assert job not in scheduler.store.ledger_entries()
        assert qc.item(job)["attempt"] == 1
    finally:
        gen.close()


def test_a_tick_that_dies_after_requeueing_a_failed_launch_leaves_no_rank_running(monkeypatch):
    """Given a 2-node launch that fails on rank 1 after starting rank 0, and a tick that dies
    after the job was requeued, before any stop
    When ticks run after the job's backoff (two other nodes free), then after the launch's
    staleness delay
    Then the job is not launched again while its launch is in the ledger, and the stale
    launch's resume stops rank 0."""
    gen = make_queue_cluster(nodes=[8, 8, 8, 8])
    qc = next(gen)
    try:
        job, scheduler, thieves = _launch_that_fails_on_node_1(qc)

        def dies(*_: Any) -> bool:
            raise RuntimeError("died")

        monkeypatch.setattr(launcher_mod.Launcher, "_stop", dies)
        with pytest.raises(RuntimeError):
            scheduler.tick()
        monkeypatch.undo()
        assert qc.state(job) is JobState.PENDING_RESOURCES and len(qc.live_tasks(job)) == 1
        aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thieves[0])
        qc.sim.run_for(61)  # past the backoff, within the launch's staleness delay
        result = qc.scheduler().tick()
        assert result.resumed == [] and result.launches == []
        assert len(qc.live_tasks(job)) == 1
        qc.sim.run_for(60)
        result = qc.scheduler().tick()
        assert [r["action"] for r in result.resumed] == ["abandoned"]
        qc.sim.run_for(30)
        assert qc.live_tasks(job) == []
    finally:
        gen.close()


@pytest.mark.parametrize("broken", ["missing", "inactive"])
def test_user_error_fails_the_job_without_retry(qc, broken):
    """Given a queued job whose task definition does not exist (or is INACTIVE)
    When the scheduler ticks (twice)
    Then the job is FAILED with a USER_ERROR attempt, nothing runs, and it is never retried."""
    td = "does-not-exist:7"
    if broken == "inactive":
        td = qc.sim.register_training_task_definition("retired", gpus=8)
        qc.local.client("ecs").deregister_task_definition(taskDefinition=td)
    job = qc.submit(nnodes=2, gpus=8, task_definition=td)
    result = qc.scheduler().tick()
    assert result.launch_failures == 1
    item = qc.item(job)
    assert item["job_state"] == "FAILED" and item["failure_kind"] == "USER_ERROR"
    assert item["attempts"][-1]["failure_kind"] == "USER_ERROR"
    assert C.QUEUE_PK not in item
    assert qc.live_tasks() == []
    qc.sim.run_for(3600)
    assert qc.scheduler().tick().launches == []
    assert qc.state(job) is JobState.FAILED


def test_crash_between_start_task_and_its_write_never_duplicates_a_rank(qc, monkeypatch):
    """Given a tick that dies right after StartTask of rank 1 of a 2x8 job (before registering)
    When later ticks run (before and after the 2-minute staleness)
    Then rank 1's task is found by startedBy and registered, nothing is started twice, and
    the job runs with exactly one task per rank."""
    job = qc.submit(nnodes=2, gpus=8)
    service = qc.recovery
    real_register = service.register_rank
    calls = {"n": 0}

    def crash_on_rank_1(reg):
        calls["n"] += 1
        if reg.rank == 1 and calls["n"] == 2:
            raise RuntimeError("Lambda died")
        return real_register(reg)

    monkeypatch.setattr(service, "register_rank", crash_on_rank_1)
    with pytest.raises(RuntimeError):
        qc.scheduler().tick()
    monkeypatch.setattr(service, "register_rank", real_register)
    assert len(qc.live_tasks(job)) == 2
    started = qc.sim.counters["tasks_started"]
    qc.sim.run_for(30)  # both ranks RUNNING; the job RUNNING (recovery loop saw rank 0)
    result = qc.scheduler().tick()
    assert result.resumed == [] and result.launches == []  # not stale yet, not in the queue
    qc.sim.run_for(120)
    result = qc.scheduler().tick()
    assert [r["action"] for r in result.resumed] == ["resumed"]
    assert qc.sim.counters["tasks_started"] == started
    assert len(qc.live_tasks(job)) == 2
    assert {qc.repo.jobs.get_rank(job, r).task_arn for r in (0, 1)} == {t.arn for t in qc.live_tasks(job)}
    assert qc.item(job)["launched_at"] is not None
    assert qc.scheduler().tick().resumed == []  # the ledger entry is gone


def test_crash_before_start_task_starts_the_missing_rank_once(qc, monkeypatch):
    """Given a tick that dies before StartTask of rank 1 (rank 0 started and registered)
    When a tick runs after the staleness delay
    Then rank 1 is started once on its planned node, and rank 0 is not started again."""
    job = qc.submit(nnodes=2, gpus=8)
    sched = qc.scheduler()
    real_start = sched.launcher._start_one
    calls = {"n": 0}

    def crash_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("Lambda died")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(sched.launcher, "_start_one", crash_second)
    with pytest.raises(RuntimeError):
        sched.tick()
    assert len(qc.live_tasks(job)) == 1
    plan = qc.item(job)["launch"]
    from gpu_recovery.repository.scheduling import SchedulingRepository

    nodes, _ = SchedulingRepository(qc.repo.jobs).plan_nodes(job, plan["attempt"], plan["world_size"])
    qc.sim.run_for(150)
    result = qc.scheduler().tick()
    assert [r["action"] for r in result.resumed] == ["resumed"]
    tasks = sorted(qc.live_tasks(job), key=lambda t: int(t.tags[C.TAG_RANK]))
    assert len(tasks) == 2
    assert tasks[1].node == qc.sim.node(nodes[1]).name
    assert env_of(tasks[1])["MASTER_ADDR"] == plan["master_addr"]


def test_canceled_while_half_launched_stops_the_orphan(qc, monkeypatch):
    """Given a tick that died after starting (not registering) rank 0, and the job canceled
    When a tick runs after the staleness delay
    Then the orphan task is found by startedBy and stopped, and nothing new starts."""
    job = qc.submit(nnodes=2, gpus=8)
    service = qc.recovery
    monkeypatch.setattr(service, "register_rank", lambda reg: (_ for _ in ()).throw(RuntimeError("died")))
    with pytest.raises(RuntimeError):
        qc.scheduler().tick()
    monkeypatch.undo()
    qc.repo.tables.db.apply(qc.repo.jobs.job_transition(job, JobState.CANCELED,
                                                        from_states=[JobState.STARTING], attempt=None,
                                                        reason="user cancel", actor="api"))
    qc.sim.run_for(150)
    result = qc.scheduler().tick()
    assert [r["action"] for r in result.resumed] == ["abandoned"]
    qc.sim.run_for(30)
    assert qc.live_tasks(job) == []


def test_an_abandoned_launch_looks_up_only_its_first_rank_not_registered(qc, monkeypatch):
    """Given a 4-node launch whose tick died after starting rank 2, before registering it,
    and the job canceled
    When a tick runs after the staleness delay
    Then one ListTasks is made, of the first rank not registered (rank 2 registered from its
    own RUNNING event meanwhile, so rank 3: ranks start in order, each registered as it
    starts, so no later rank can have a task), and every task of the launch is stopped."""
    job = qc.submit(nnodes=4, gpus=8)
    tick_that_dies_registering(qc, monkeypatch, 2)
    assert len(qc.live_tasks(job)) == 3
    qc.repo.tables.db.apply(qc.repo.jobs.job_transition(job, JobState.CANCELED,
                                                        from_states=[JobState.STARTING], attempt=None,
                                                        reason="user cancel", actor="api"))
    qc.sim.run_for(150)
    sched = qc.scheduler()
    lookups: list[str] = []
    list_tasks = sched.launcher.ecs.tasks_started_by
    monkeypatch.setattr(sched.launcher.ecs, "tasks_started_by",
                        lambda started_by: lookups.append(started_by) or list_tasks(started_by))
    result = sched.tick()
    assert [r["action"] for r in result.resumed] == ["abandoned"]
    assert lookups == [launcher_mod.started_by(job, 1, 3)]
    qc.sim.run_for(30)
    assert qc.live_tasks(job) == []


def test_a_resume_that_fails_holds_its_nodes_and_the_tick_admits_the_others(qc, monkeypatch):
    """Given a 2-node launch a dead tick left half-done (stale), whose resume fails (throttled
    past its retries), and another 2-node job queued
    When the scheduler ticks
    Then the other job is launched on the two nodes the stuck launch did not plan, the stuck
    launch stays in the ledger, and the next tick resumes it."""
    stuck = qc.submit(nnodes=2, gpus=8)
    tick_that_dies_registering(qc, monkeypatch, 1)
    planned = {qc.node_of(t).name for t in qc.live_tasks(stuck)}
    other = qc.submit(nnodes=2, gpus=8)
    qc.sim.run_for(150)
    sched = qc.scheduler()

    def resume_throttled(*_: Any, **__: Any) -> Any:
        raise throttled("GetItem")

    monkeypatch.setattr(sched.launcher, "resume", resume_throttled)
    result = sched.tick()
    assert result.resumed == [{"job_id": stuck, "action": "resume_failed"}]
    assert [launch["job_id"] for launch in result.launches] == [other]
    assert {qc.node_of(t).name for t in qc.live_tasks(other)}.isdisjoint(planned)
    assert stuck in sched.store.ledger_entries()
    monkeypatch.undo()
    assert [r["action"] for r in qc.scheduler().tick().resumed] == ["resumed"]
    assert qc.item(stuck)["launched_at"] is not None


def _tick_calls(qc: Any, scheduler: Any) -> tuple[Any, list[tuple[str, str]]]:
    """One tick of ``scheduler`` and its AWS calls, (operation, site) in order."""
    qc.local.call_faults.arm(None, record_sites=True)
    try:
        result = scheduler.tick()
        calls = [(c.operation, c.site) for c in qc.local.call_faults.calls]
    finally:
        qc.local.call_faults.disarm()
    return result, calls


def test_an_idle_tick_reads_the_launch_ledger_with_its_lease(qc):
    """Given nothing queued, nothing charged and no launch in flight
    When the scheduler ticks
    Then it makes four calls: the lease taken (its UpdateItem answers the ledger on it: no
    GetItem), the holding index and the queue index read, the lease released."""
    result, calls = _tick_calls(qc, qc.scheduler())
    assert result.action == "ticked" and result.resumed == [] and result.admitted == []
    assert calls == [("UpdateItem", "queue/scheduler.py:acquire"),
                     ("Query", "queue/time_sharing.py:housekeeping"),
                     ("Query", "queue/scheduler.py:_admit"),
                     ("UpdateItem", "queue/scheduler.py:release")]


def test_a_stale_launch_read_with_the_lease_is_resumed(qc, monkeypatch):
    """Given a 2-node launch a dead tick left half-done (rank 1 never started)
    When a tick runs once it is stale
    Then the ledger that tick resumes from is the one its lease's UpdateItem answered (no
    GetItem of the lease item), the launch is resumed and completed, and it leaves the
    ledger."""
    stuck = qc.submit(nnodes=2, gpus=8)
    tick_that_dies_registering(qc, monkeypatch, 1)
    scheduler = qc.scheduler()
    assert stuck in scheduler.store.ledger_entries()
    qc.sim.run_for(150)
    result, calls = _tick_calls(qc, scheduler)
    assert [(r["job_id"], r["action"]) for r in result.resumed] == [(stuck, "resumed")]
    assert calls[0] == ("UpdateItem", "queue/scheduler.py:acquire")
    assert not [c for c in calls if c[1].endswith(":_resume_stuck")], calls
    assert qc.item(stuck)["launched_at"] is not None and len(qc.live_tasks(stuck)) == 2
    assert stuck not in scheduler.store.ledger_entries()


@pytest.mark.parametrize("mode", [THROTTLE, LOST_RESPONSE])
def test_a_broken_lease_update_keeps_the_ledger_for_a_tick_that_holds_the_lease(qc, monkeypatch, mode):
    """Given a launch a dead tick left half-done
    When the next tick's lease UpdateItem (which answers the ledger) is throttled, or its
    answer lost
    Then throttled (nothing written), the write is tried again and the tick resumes the
    launch from the ledger that answer carries; lost, the tick fails before reading or
    changing anything, the lease it took keeps other ticks out until it expires, and the
    tick after resumes the launch."""
    stuck = qc.submit(nnodes=2, gpus=8)
    tick_that_dies_registering(qc, monkeypatch, 1)
    qc.sim.run_for(150)
    qc.local.call_faults.arm(1, mode, record_sites=True)
    try:
        if mode == THROTTLE:
            result = qc.scheduler().tick()
        else:
            with pytest.raises(ReadTimeoutError):
                qc.scheduler().tick()
        calls = list(qc.local.call_faults.calls)
        assert qc.local.call_faults.fired is not None
    finally:
        qc.local.call_faults.disarm()
    assert (calls[0].operation, calls[0].site) == ("UpdateItem", "queue/scheduler.py:acquire")
    if mode == LOST_RESPONSE:
        assert len(calls) == 1 and stuck in qc.scheduler().store.ledger_entries()
        assert qc.scheduler().tick().action == "busy"
        qc.sim.run_for(121)
        result = qc.scheduler().tick()
    assert [(r["job_id"], r["action"]) for r in result.resumed] == [(stuck, "resumed")]
    assert stuck not in qc.scheduler().store.ledger_entries()


def test_lease_excludes_a_concurrent_tick(qc):
    """Given one tick holding the lease
    When another scheduler ticks meanwhile
    Then it exits at once as busy; after the lease is released or expired, ticks run."""
    first, second = qc.scheduler(owner="first"), qc.scheduler(owner="second")
    assert first.lease.acquire() is not None
    qc.submit(nnodes=1, gpus=8)
    assert second.tick().action == "busy"
    first.lease.release()
    assert second.tick().action == "ticked"
    # A dead holder: its lease expires after lease_seconds.
    assert first.lease.acquire() is not None
    assert second.tick().action == "busy"
    qc.sim.run_for(121)
    assert second.tick().action == "ticked"
    lease = qc.table().get_item(Key={C.JOB_PK: LEASE_KEY})["Item"]
    assert lease["owner"] == "second" and lease["inflight"] == {}


def test_claim_fails_when_the_lease_was_lost(qc):
    """Given a tick whose lease was taken over by another scheduler (it expired)
    When the first tick tries to claim a job
    Then the claim transaction fails: no job is launched by a tick without the lease."""
    job = qc.submit(nnodes=1, gpus=8)
    old, new = qc.scheduler(owner="old"), qc.scheduler(owner="new")
    assert old.lease.acquire() is not None
    qc.sim.run_for(121)
    assert new.lease.acquire() is not None
    infos = old.snapshot()
    node = next(iter(infos.values())).placed
    outcome = old.launcher.launch(qc.item(job), [node])
    assert outcome.action == "raced"
    assert qc.state(job) is JobState.QUEUED


def test_reads_follow_placeable_jobs_not_queue_length(qc):
    """Given a full cluster and 300 queued jobs
    When the scheduler ticks
    Then it reads only the first page (the scan stops: no free GPU anywhere)."""
    filler = qc.submit(nnodes=4, gpus=8, priority=50)
    assert qc.scheduler().tick().admitted == [filler]
    for _ in range(300):
        qc.submit(nnodes=1, gpus=8)
    result = qc.scheduler(page_size=25).tick()
    assert result.queue_items_read == 1
    assert result.stop_reason == "no free GPUs left on unreserved nodes"


def test_many_unplaceable_jobs_stop_the_scan(qc):
    """Given one free node and 100 queued jobs too large for the cluster
    When the scheduler ticks with max_unplaced=10
    Then it reads at most 10 items (plus nothing else) and stops."""
    for _ in range(100):
        qc.submit(nnodes=8, gpus=8)
    result = qc.scheduler(max_unplaced=10, page_size=5).tick()
    assert result.queue_items_read == 10
    assert result.stop_reason == "10 jobs could not be placed"


def test_job_in_backoff_is_skipped(qc):
    """Given a queued job whose not_before is in the future
    When the scheduler ticks
    Then it is not started; a job behind it is."""
    waiting = qc.submit(nnodes=1, gpus=8, priority=50)
    qc.table().update_item(Key={C.JOB_PK: C.job_item_key(waiting)}, UpdateExpression="SET not_before = :t",
                           ExpressionAttributeValues={":t": int(qc.sim.now() + 300)})
    other = qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == [other]
    assert qc.state(waiting) is JobState.QUEUED


def test_handler_runs_a_tick_and_emits_metrics(qc, monkeypatch):
    """Given the Lambda handler and a queued job
    When it is invoked like the schedule would
    Then it returns the tick outcome with the job admitted."""
    from handlers import queue_scheduler

    job = qc.submit(nnodes=1, gpus=8)
    context = SimpleNamespace(function_name="queue-scheduler", memory_limit_in_mb=256,
                              invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:qs",
                              aws_request_id="req-1", get_remaining_time_in_millis=lambda: 90_000)
    out = queue_scheduler.lambda_handler({"id": "evt-1", "detail-type": "Scheduled Event"}, context)
    assert out["admitted"] == [job] and out["queue_items_read"] == 1


def test_canceled_before_any_rank_started_reaches_canceled(qc, monkeypatch):
    """Given a tick that claimed a job and died before any StartTask, and a user cancel
    that moved the job to CANCELING meanwhile
    When a tick resumes the launch
    Then nothing is started and the job is CANCELED (no STOPPED event will ever come)."""
    job = qc.submit(nnodes=2, gpus=8)
    sched = qc.scheduler()
    monkeypatch.setattr(sched.launcher, "_start_one",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("Lambda died")))
    with pytest.raises(RuntimeError):
        sched.tick()
    monkeypatch.undo()
    assert qc.live_tasks(job) == []
    qc.repo.tables.db.apply(qc.repo.jobs.job_transition(job, JobState.CANCELING,
                                                        from_states=[JobState.STARTING], attempt=None,
                                                        reason="user cancel", actor="api"))
    qc.sim.run_for(150)
    result = qc.scheduler().tick()
    assert [r["action"] for r in result.resumed] == ["abandoned"]
    assert qc.item(job)["job_state"] == JobState.CANCELED.value
    assert qc.live_tasks(job) == []


def test_nodes_of_a_job_in_recovery_are_held_for_its_gang_restart(qc):
    """Given a 2x8 job whose rank 1 exits with a suspect code (PENDING_HEALTHCHECK: rank 0
    is stopped, its node's GPUs are free)
    When a 1x8 job is queued and a tick runs
    Then the freed node is not given away: the 1x8 job starts on a node outside the
    recovering job, and after the reboot the gang restarts on its own nodes."""
    job = qc.submit(nnodes=2, gpus=8)
    qc.scheduler().tick()
    qc.sim.run_for(60)
    ranks = sorted(qc.live_tasks(job), key=lambda t: int(t.tags[C.TAG_RANK]))
    own_nodes = {t.node for t in ranks}
    qc.sim.inject_gpu_fault(ranks[1].node, after=1, health="reboot_fixable")
    qc.sim.run_for(30)
    assert qc.state(job) is JobState.PENDING_HEALTHCHECK
    other = qc.submit(nnodes=1, gpus=8)
    qc.scheduler().tick()
    [task] = qc.live_tasks(other)
    assert task.node not in own_nodes
    qc.sim.run_for(15 * 60)
    assert int(qc.item(job)["attempt"]) == 2
    assert {t.node for t in qc.live_tasks(job)} == own_nodes


def test_cancel_during_a_launch_that_fails_to_place_reaches_canceled(qc):
    """Given a cancel that lands while the scheduler is starting rank 0 (job CANCELING,
    no rank yet), When that StartTask fails for lack of GPUs, Then the job is CANCELED:
    no rank exists, so no STOPPED event would ever finish the cancel."""
    from gpu_recovery.queue.admission import FailureKind
    from gpu_recovery.queue.launcher import LaunchError

    job = qc.submit(nnodes=2, gpus=8)
    sched = qc.scheduler()
    service = qc.jobs_service()

    def cancel_then_fail(*args, **kwargs):
        service.cancel(job, "bob")
        raise LaunchError(FailureKind.INSUFFICIENT_RESOURCES, "StartTask failed: RESOURCE:GPU")

    sched.launcher._start_one = cancel_then_fail
    sched.tick()
    assert qc.state(job) is JobState.CANCELED
    assert qc.live_tasks(job) == []


def test_a_node_that_frees_is_reserved_for_a_relocatable_job_waiting_for_one(qc):
    """Given three nodes taken and a relocatable job waiting for one healthy 8-GPU node to
    relocate a rank onto (issue 19: PENDING_RESTART with a relocation wait)
    When a 1x8 job is queued and a tick runs
    Then the free node is not given to it (the snapshot says it is reserved); once the
    wait is gone, the next tick places the queued job there."""
    from gpu_recovery.domain.models import Job
    from gpu_recovery.domain.relocation import RelocationWait
    from gpu_recovery.repository import to_ddb

    nodes = sorted(qc.sim.nodes)
    for node in nodes[:3]:
        steal_gpus(qc, node)
    now = qc.sim.now()
    wait = RelocationWait.start("waiting-job", 1, now, 1800, ["gone-node"], [8], "node(s) unusable")
    item = {**qc.repo.jobs.job_to_item(Job("waiting-job", JobState.PENDING_RESTART, world_size=2)),
            "relocation_wait": wait.to_item(), **qc.repo.jobs.job_deadline_fields(now + 60)}
    qc.table().put_item(Item=to_ddb(item))
    queued = qc.submit(nnodes=1, gpus=8)
    scheduler = qc.scheduler()
    infos = scheduler.snapshot()
    free = qc.sim.node(nodes[3]).container_instance_id
    assert infos[free].node.why_ineligible == "reserved for the relocation of waiting-job"
    assert scheduler.tick().admitted == []
    assert qc.live_tasks(queued) == []
    qc.table().update_item(Key={C.JOB_PK: C.job_item_key("waiting-job")},
                           UpdateExpression="REMOVE relocation_wait")
    assert qc.scheduler().tick().admitted == [queued]


def test_a_launch_yields_at_the_tick_s_time_budget_and_the_next_tick_finishes_it(qc, monkeypatch):
    """Given a 3x8 job whose StartTasks take 30 s each and a tick of a 45 s budget
    When the scheduler ticks
    Then the launch stops short of the budget (10 s margin) with two ranks started and
    registered, and the next tick resumes it at once (not after the 2-minute staleness),
    starting the third rank only: each rank started once."""
    from gpu_recovery.queue import scheduler as scheduler_mod

    job = qc.submit(nnodes=3, gpus=8)
    elapsed = [0.0]
    monkeypatch.setattr(scheduler_mod, "time", SimpleNamespace(monotonic=lambda: elapsed[0]))
    sched = qc.scheduler()
    real_start = sched.launcher._start_one

    def slow_start(*args: Any, **kwargs: Any) -> str:
        elapsed[0] += 30.0
        return real_start(*args, **kwargs)

    monkeypatch.setattr(sched.launcher, "_start_one", slow_start)
    started = qc.sim.counters["tasks_started"]
    first = sched.tick(time_budget_seconds=45)
    [launch] = first.launches
    assert launch["action"] == "interrupted" and launch["reason"] == "time budget: 2 of 3 ranks started"
    assert qc.sim.counters["tasks_started"] == started + 2 and qc.item(job).get("launched_at") is None
    assert {qc.repo.jobs.get_rank(job, r).attempt for r in (0, 1)} == {1}
    elapsed[0] = 0.0
    second = sched.tick(time_budget_seconds=45)
    assert [r["action"] for r in second.resumed] == ["resumed"]
    assert qc.sim.counters["tasks_started"] == started + 3 and len(qc.live_tasks(job)) == 3
    assert qc.item(job)["launched_at"] is not None
