"""The scheduler tick against moto with simulated GPU accounting (SimulatedEcs)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.models import Instance
from gpu_recovery.queue.scheduler import LEASE_KEY
from gpu_recovery.recovery.ranks import restart_started_by
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._cluster_moves import env_of, steal_gpus


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
        assert task.started_by == restart_started_by(job, 1, rank)  # the start fan-out's one format
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


def _tick_calls(qc: Any, scheduler: Any) -> tuple[Any, list[tuple[str, str]]]:
    """One tick of ``scheduler`` and its AWS calls, (operation, site) in order."""
    with qc.local.call_faults.recording() as calls:
        result = scheduler.tick()
    return result, [(c.operation, c.site) for c in calls]


def test_an_idle_tick_makes_four_calls(qc):
    """Given nothing queued, nothing charged and no launch in flight
    When the scheduler ticks
    Then it makes four calls: the lease taken, the holding index and the queue index read, the
    lease released (a launch a dead tick left half-done is the recovery sweep's, not read
    here)."""
    result, calls = _tick_calls(qc, qc.scheduler())
    assert result.action == "ticked" and result.admitted == []
    assert calls == [("UpdateItem", "queue/scheduler.py:acquire"),
                     ("Query", "queue/time_sharing.py:housekeeping"),
                     ("Query", "queue/scheduler.py:_admit"),
                     ("UpdateItem", "queue/scheduler.py:release")]


@pytest.mark.parametrize("mode", [THROTTLE, LOST_RESPONSE])
def test_a_broken_lease_update_leaves_the_lease_to_one_tick(qc, mode):
    """Given a queued job
    When a tick's lease UpdateItem is throttled, or its answer lost
    Then throttled (nothing written), the write is tried again and the tick launches the job;
    lost, the tick fails before reading or changing anything, the lease it took keeps other
    ticks out until it expires, and the tick after launches the job."""
    job = qc.submit(nnodes=2, gpus=8)
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
        assert len(calls) == 1 and qc.state(job) is JobState.QUEUED
        assert qc.scheduler().tick().action == "busy"
        qc.sim.run_for(121)
        result = qc.scheduler().tick()
    assert result.admitted == [job]


def test_lease_excludes_a_concurrent_tick(qc):
    """Given one tick holding the lease
    When another scheduler ticks meanwhile
    Then it exits at once as busy; after the lease is released or expired, ticks run."""
    first, second = qc.scheduler(owner="first"), qc.scheduler(owner="second")
    assert first.lease.acquire()
    qc.submit(nnodes=1, gpus=8)
    assert second.tick().action == "busy"
    first.lease.release()
    assert second.tick().action == "ticked"
    # A dead holder: its lease expires after lease_seconds.
    assert first.lease.acquire()
    assert second.tick().action == "busy"
    qc.sim.run_for(121)
    assert second.tick().action == "ticked"
    lease = qc.table().get_item(Key={C.JOB_PK: LEASE_KEY})["Item"]
    assert lease["owner"] == "second"


def test_claim_fails_when_the_lease_was_lost(qc):
    """Given a tick whose lease was taken over by another scheduler (it expired)
    When the first tick tries to claim a job
    Then the claim transaction fails: no job is launched by a tick without the lease."""
    job = qc.submit(nnodes=1, gpus=8)
    old, new = qc.scheduler(owner="old"), qc.scheduler(owner="new")
    assert old.lease.acquire()
    qc.sim.run_for(121)
    assert new.lease.acquire()
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


def _waiting(qc, fields: dict) -> str:
    """A 4x8 job queued ahead, not admitted now for ``fields`` (a back-off, an aborted launch's
    stop under way)."""
    job = qc.submit(nnodes=4, gpus=8, priority=50)
    names = {f"#f{i}": name for i, name in enumerate(fields)}
    qc.table().update_item(Key={C.JOB_PK: C.job_item_key(job)},
                           UpdateExpression="SET " + ", ".join(f"#f{i} = :v{i}" for i in range(len(fields))),
                           ExpressionAttributeNames=names,
                           ExpressionAttributeValues={f":v{i}": v for i, v in enumerate(fields.values())})
    return job


@pytest.mark.parametrize("failures, held", [(1, True), (2, False)])
def test_a_job_in_its_first_back_off_keeps_the_nodes_it_needs(qc, failures, held):
    """Given a 4x8 job backing off after ``failures`` failed launches in a row, on four free nodes
    When a 1x8 job behind it is offered
    Then after the first failure the four nodes stay reserved for it (the job behind waits);
    after the second they are not (a job whose launches keep failing does not stall the queue)."""
    _waiting(qc, {"not_before": int(qc.sim.now() + 60), "resource_failures": failures})
    other = qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == ([] if held else [other])


def test_a_job_whose_aborted_launch_is_being_stopped_keeps_the_nodes_it_needs(qc):
    """Given a 4x8 job past its back-off whose aborted launch's ranks are still being stopped
    When a 1x8 job behind it is offered
    Then it waits: the nodes stay reserved for the job ahead, which is not admitted either."""
    # The stop intent as the launch's abort writes it (``SchedulingRepository._stop_fields``).
    stop = qc.repo.jobs.stop_fanout_fields(0, "launch aborted", int(qc.sim.now()))
    stop["stop_fanout"].update(aborted_launch=True, remediation=False)
    waiting = _waiting(qc, {"resource_failures": 1, **stop})
    qc.submit(nnodes=1, gpus=8)
    assert qc.scheduler().tick().admitted == []
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


def test_a_relocations_targets_are_held_from_its_claim_though_their_reservation_failed(qc):
    """Given three nodes taken and a job whose relocation is claimed (STARTING attempt 2, its
    placement item moving its rank to the free node) but whose reservation of that target
    failed after the claim (no hold on the worklist: soak seed 7251 at 10 %)
    When a 1x8 job is queued and a tick runs
    Then the target is held for the restart (the snapshot says so) and the queued job waits;
    once the restart is placed (RUNNING), the next tick places the queued job there."""
    from gpu_recovery.domain.models import Job
    from gpu_recovery.repository import to_ddb

    nodes = sorted(qc.sim.nodes)
    for node in nodes[:3]:
        steal_gpus(qc, node)
    target = qc.sim.node(nodes[3])
    now = qc.sim.now()
    item = {**qc.repo.jobs.job_to_item(Job("moving-job", JobState.STARTING, world_size=1, attempt=2)),
            "restarted_attempt": 2, "relocated_attempt": 2, **qc.repo.jobs.job_deadline_fields(now + 60)}
    qc.table().put_item(Item=to_ddb(item))
    qc.table().put_item(Item=to_ddb({
        C.JOB_PK: C.placement_item_key("moving-job", 2), "item_type": "PLACEMENT", "reason": "relocated",
        "moves": {"gone-node": {"node": target.container_instance_id, "arn": target.container_instance_arn,
                                "ec2": target.instance_id, "why": "node(s) unusable"}}}))
    assert qc.repo.cordons.worklist().holds == {}
    queued = qc.submit(nnodes=1, gpus=8)
    scheduler = qc.scheduler()
    assert scheduler.snapshot()[target.container_instance_id].node.eligible is False
    assert scheduler.tick().admitted == []
    assert qc.live_tasks(queued) == []
    qc.table().update_item(Key={C.JOB_PK: C.job_item_key("moving-job")},
                           UpdateExpression="SET job_state = :r", ExpressionAttributeValues={":r": "RUNNING"})
    assert qc.scheduler().tick().admitted == [queued]


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
