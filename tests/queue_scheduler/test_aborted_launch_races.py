"""A queue launch aborted while another of its starts runs (the gang worker's batches run in
parallel, on the simulated GPU cluster): the start reads the job again after winning its leases
and after registering, and the abort's stop ends only once no lease of the launch is open (a
lease whose holder died after its StartTask runs out, then its task is found by the startedBy the
lease recorded and stopped). No task of an aborted launch is left running unknown; and the abort's
stop scans no cluster's tasks."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.queue.admission import FailureKind
from tests.fixtures.queue_cluster import make_queue_cluster
from tests.queue_scheduler._cluster_moves import at_start_task, launch_dies_registering, steal_gpus, throttled
from tests.queue_scheduler._launches import launch_that_fails_on_node_1


def _abort(qc: Any, job: str) -> None:
    """Another batch of the launch had a rank not placed: the launch is aborted (requeued)."""
    fresh = qc.repo.jobs.get_job(job)
    assert fresh is not None and fresh.state is JobState.STARTING
    qc.recovery.launches.abort(fresh, FailureKind.INSUFFICIENT_RESOURCES, "another batch's rank not placed")


def _aborted_while_starting(qc: Any, monkeypatch: Any, job: str, call: int) -> None:
    """The launch is aborted while its ``call``-th StartTask is in flight (after the start read
    the job again), once."""
    at_start_task(qc, monkeypatch, call, lambda: _abort(qc, job))


def _aborted_at_claim_of(qc: Any, monkeypatch: Any, job: str, rank: int) -> None:
    """The launch is aborted as a start claims ``rank``'s lease (after it read the job STARTING),
    once."""
    fanouts = qc.recovery.gang.fanouts
    claim = fanouts.claim_rank_launch

    def aborted_first(template: Any, *args: Any, **kwargs: Any) -> Any:
        if template.rank == rank:
            monkeypatch.setattr(fanouts, "claim_rank_launch", claim)
            _abort(qc, job)
        return claim(template, *args, **kwargs)

    monkeypatch.setattr(fanouts, "claim_rank_launch", aborted_first)


def _swept_until_stopped(qc: Any, job: str, sweeps: int = 6) -> None:
    for _ in range(sweeps):
        qc.sim.run_for(60)
        qc.recovery.sweep()
        if "stop_fanout" not in qc.item(job):
            break


def test_a_rank_started_after_the_abort_by_a_start_that_died_unregistered_is_stopped(qc, monkeypatch):
    """Given a 2-node launch aborted while the StartTask of rank 1 is in flight, whose start
    then dies before registering rank 1 (its task runs, known to no item)
    When the recovery sweep runs every minute
    Then the abort's stop does not end while rank 1's lease is open; once it ran out, rank 1's
    task is found by its lease's startedBy and stopped, and only then does the stop intent end."""
    job = qc.submit(nnodes=2, gpus=8)
    _aborted_while_starting(qc, monkeypatch, job, 2)
    launch_dies_registering(qc, monkeypatch, 1)
    qc.scheduler().tick()
    monkeypatch.undo()
    assert qc.state(job) is JobState.PENDING_RESOURCES and qc.repo.jobs.get_rank(job, 1) is None
    assert 1 in [int(t.tags[C.TAG_RANK]) for t in qc.live_tasks(job)]
    assert qc.item(job)["stop_fanout"]["attempt"] == 1  # rank 1's lease is open: not ended
    _swept_until_stopped(qc, job)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_a_rank_registered_after_the_abort_is_stopped_by_its_start(qc, monkeypatch):
    """Given a 2-node launch aborted while the StartTask of rank 1 is in flight (the abort's stop
    read rank 1 before it was registered)
    When that start registers rank 1
    Then it reads the job again and stops rank 1 itself; the stop intent ends once it stopped."""
    job = qc.submit(nnodes=2, gpus=8)
    _aborted_while_starting(qc, monkeypatch, job, 2)
    qc.scheduler().tick()
    monkeypatch.undo()
    rank1 = qc.repo.jobs.get_rank(job, 1)
    assert rank1 is not None and rank1.attempt == 1 and rank1.state.value == "STOP_REQUESTED"
    _swept_until_stopped(qc, job)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_a_start_whose_lease_is_won_after_the_abort_starts_nothing(qc, monkeypatch):
    """Given a 2-node launch aborted between a start's read of the job (STARTING) and its claim
    of rank 1's lease
    When that start wins the lease
    Then it reads the job again and gives the lease back, starting nothing; the abort's stop
    ends at once (rank 0 stopped), and no task of the launch runs once it stopped."""
    job = qc.submit(nnodes=2, gpus=8)
    _aborted_at_claim_of(qc, monkeypatch, job, 1)
    started = qc.sim.counters["tasks_started"]
    qc.scheduler().tick()
    monkeypatch.undo()
    assert qc.sim.counters["tasks_started"] == started + 1  # rank 0 only
    _swept_until_stopped(qc, job, sweeps=1)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_an_aborted_launchs_stop_scans_no_tasks_and_its_start_intent_is_not_confirmed(qc, monkeypatch):
    """Given a 2-node launch whose rank 1 is not placed (RESOURCE:GPU: another tenant took its node)
    When the tick aborts it
    Then its stop looks up no task by tag (no ListTasks of the cluster's tasks) and its start
    intent, gone with the abort, is not confirmed (a conditional write that could only fail);
    rank 0 is stopped, and the stop intent ends."""
    job = qc.submit(nnodes=2, gpus=8)
    ecs = qc.recovery.gang.ecs
    start_task = ecs.start_task
    calls = [0]

    def node_taken(**kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            for arn in kwargs.get("container_instance_arns") or ():
                steal_gpus(qc, next(n.name for n in qc.sim.nodes.values() if n.container_instance_arn == arn))
        return start_task(**kwargs)

    scans: list[str] = []
    confirmed: list[str] = []
    record_sent = qc.recovery.gang.fanouts.record_sent
    monkeypatch.setattr(ecs, "start_task", node_taken)
    monkeypatch.setattr(ecs, "tasks_tagged", lambda key, value: scans.append(value) or [])
    monkeypatch.setattr(qc.recovery.gang.fanouts, "record_sent", lambda job_, kind, *a: confirmed.append(
        kind) or record_sent(job_, kind, *a))
    [launch] = qc.scheduler().tick().launches
    assert launch["action"] == "requeued"
    assert scans == [] and "start_fanout" not in confirmed
    qc.sim.run_for(60)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_a_launch_lease_outlasts_the_scheduler_tick_that_takes_it(qc, monkeypatch):
    """A tick runs up to its timeout: a rank lease it takes must not run out before the tick can
    no longer start the rank (a start taking the lease over, or the abort's stop looking its task
    up, would come while the tick may still start it)."""
    qc.submit(nnodes=2, gpus=8)
    fanouts = qc.recovery.gang.fanouts
    claim = fanouts.claim_rank_launch
    leases: list[float] = []

    def spy(rank: Any, attempt: int, lease_until: float, now: float, *args: Any) -> Any:
        leases.append(lease_until - now)
        return claim(rank, attempt, lease_until, now, *args)

    monkeypatch.setattr(fanouts, "claim_rank_launch", spy)
    qc.scheduler().tick()
    assert len(leases) == 2 and min(leases) > C.QUEUE_SCHEDULER_TIMEOUT_SECONDS


def test_a_lease_taken_over_after_its_holder_died_is_looked_up_even_if_the_launch_moved_on(qc, monkeypatch):
    """Given a 2-node launch whose start died after rank 1's StartTask (its task runs, known to no
    item), its lease run out, and the launch aborted between a resend's read of the job and its
    claim of rank 1's lease
    When that resend wins the lease (taken over) and reads the job again
    Then it leaves the lease to run out rather than giving it back: the abort's stop looks up the
    dead holder's task by the lease's startedBy and stops it before it ends."""
    job = qc.submit(nnodes=2, gpus=8)
    launch_dies_registering(qc, monkeypatch, 1)
    monkeypatch.setattr(qc.bus, "put_events", lambda event: [])  # its RUNNING event lost too
    qc.scheduler().tick()
    qc.sim.run_for(C.LAUNCH_LEASE_SECONDS + 1)
    monkeypatch.undo()
    assert qc.state(job) is JobState.STARTING and qc.repo.jobs.get_rank(job, 1) is None
    _aborted_at_claim_of(qc, monkeypatch, job, 1)
    resent = qc.repo.jobs.get_job(job)
    assert resent is not None and qc.repo.jobs.get_rank(job, 1) is None
    qc.recovery.gang.start(resent)
    monkeypatch.undo()
    _swept_until_stopped(qc, job)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_an_abort_leaves_to_the_sweep_a_rank_another_invocation_marked_and_never_asked_ecs_to_stop(
        monkeypatch):
    """Given a 2-node launch whose rank 1 is not placed, its rank 0 marked STOP_REQUESTED by another
    invocation (a stop of the launch that died before its StopTask) before the abort's stop reads it
    When the abort runs its stops inline (it asks ECS to stop nothing: rank 0 is marked already)
    Then its stop intent does not end at once (rank 0's task still runs: the job would be admitted
    again beside it); the sweep asks rank 0 to stop and ends the intent once it stopped."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job, scheduler, _ = launch_that_fails_on_node_1(qc)
        gang = qc.recovery.gang
        stop = gang.stop

        def marked_by_a_dead_stop(fresh: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(gang, "stop", stop)
            rank0 = qc.repo.jobs.get_rank(job, 0)
            assert rank0 is not None
            assert qc.repo.jobs.request_rank_stop(rank0, "a stop that died", clock.now())
            return stop(fresh, **kwargs)

        monkeypatch.setattr(gang, "stop", marked_by_a_dead_stop)
        [launch] = scheduler.tick().launches
        monkeypatch.undo()
        assert launch["action"] == "requeued"
        assert qc.item(job)["stop_fanout"]["attempt"] == 1 and len(qc.live_tasks(job)) == 1
        _swept_until_stopped(qc, job)
        assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)
    finally:
        gen.close()


def test_a_rank_whose_registration_was_throttled_after_its_start_keeps_its_lease_and_is_stopped(
        qc, monkeypatch):
    """Given a 2-node launch whose rank 1 was placed by StartTask and whose registration is then
    throttled (DynamoDB's throttle past botocore's retries), once
    When the launch is aborted and the recovery sweep runs every minute
    Then the throttle is not taken for ECS refusing the start: rank 1's lease stays open, and the
    abort's stop ends only once rank 1's task, found by the lease's startedBy, is stopped."""
    job = qc.submit(nnodes=2, gpus=8)
    launches = qc.recovery.gang.launches
    register = launches.register

    def throttled_at_rank_1(job_: Any, template: Any, *args: Any, **kwargs: Any) -> Any:
        if template.rank == 1:
            monkeypatch.setattr(launches, "register", register)
            raise throttled("PutItem")
        return register(job_, template, *args, **kwargs)

    monkeypatch.setattr(launches, "register", throttled_at_rank_1)
    qc.scheduler().tick()
    monkeypatch.undo()
    assert qc.repo.jobs.get_rank(job, 1) is None
    assert 1 in [int(t.tags[C.TAG_RANK]) for t in qc.live_tasks(job)]
    _abort(qc, job)
    _swept_until_stopped(qc, job, sweeps=int(C.LAUNCH_LEASE_SECONDS // 60) + 4)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_a_start_task_that_failed_server_side_after_placing_its_task_keeps_its_lease_and_is_stopped(
        qc, monkeypatch):
    """Given a 2-node launch whose first StartTask placed its task and then answered 500 (ECS's
    ServerException: the call may have acted; botocore does not send it again, adapters.aws)
    When the launch is aborted and the recovery sweep runs every minute
    Then the error is not taken for ECS refusing the start: the leases stay open, and the abort's
    stop ends only once every task, found by its lease's startedBy, is stopped."""
    job = qc.submit(nnodes=2, gpus=8)
    ecs = qc.recovery.gang.ecs
    start_task = ecs.start_task

    def placed_then_server_error(**kwargs: Any) -> Any:
        monkeypatch.setattr(ecs, "start_task", start_task)
        start_task(**kwargs)
        raise ClientError({"Error": {"Code": "ServerException", "Message": "internal error"},
                           "ResponseMetadata": {"HTTPStatusCode": 500}}, "StartTask")

    monkeypatch.setattr(ecs, "start_task", placed_then_server_error)
    qc.scheduler().tick()
    monkeypatch.undo()
    started = qc.live_tasks(job)
    # The call that answered 500: its task placed, its rank not registered (the batch's other
    # call, made before the batch failed, registered its rank).
    unregistered = [t for t in started if C.TAG_RANK in t.tags
                    and qc.repo.jobs.get_rank(job, int(t.tags[C.TAG_RANK])) is None]
    assert len(unregistered) == 1, started
    _abort(qc, job)
    _swept_until_stopped(qc, job, sweeps=int(C.LAUNCH_LEASE_SECONDS // 60) + 4)
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)
