"""A queue job whose launches never complete, on the simulated GPU cluster: the recovery sweep
gives each up and requeues the job (the back-off of a placement failure), but the
LAUNCH_GIVE_UP_LIMIT-th give-up in a row fails it, told why and e-mailed (it was requeued every
few minutes for good, and nobody was told); a launch that completes starts the count again, and
placement failures (retried silently) and give-ups are counted apart."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from gpu_recovery.constants import JobState
from gpu_recovery.recovery.queue_launches import LAUNCH_GIVE_UP_LIMIT, MAX_LAUNCH_RESENDS
from gpu_recovery.repository.scheduling import SchedulingRepository
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE
from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster
from tests.notifications.truth import command_mentions_problems
from tests.queue_scheduler._cluster_moves import steal_gpus, throttled


@pytest.fixture
def two_nodes() -> Iterator[QueueCluster]:
    """Two EC2 nodes with 8 GPUs each: a 2-node job takes both."""
    yield from make_queue_cluster(nodes=[8, 8])


class Node1Refuses:
    """While ``on``: every StartTask on node-1 throttled (past botocore's retries), so a 2-node
    launch starts its rank on node-0 and never the other: it never completes."""

    def __init__(self, qc: QueueCluster, monkeypatch: Any) -> None:
        self.on = True
        ecs = qc.recovery.gang.ecs
        real, node1 = ecs.start_task, qc.sim.node("node-1").container_instance_arn

        def start_task(**kwargs: Any) -> Any:
            arns = {kwargs.get("container_instance_arn"), *kwargs.get("container_instance_arns", ())}
            if self.on and node1 in arns:
                raise throttled("StartTask")
            return real(**kwargs)

        monkeypatch.setattr(ecs, "start_task", start_task)


def _admitted(qc: QueueCluster, scheduler: Any, job: str) -> None:
    """Ticks (the sweep every minute between them) until the job is launched again (its back-off
    and its last launch's stop over): a new attempt claimed."""
    attempt = int(qc.item(job)["attempt"])
    for _ in range(40):
        scheduler.tick()
        if int(qc.item(job)["attempt"]) > attempt:
            return
        qc.sim.run_for(60)
        qc.recovery.sweep()
    raise AssertionError(f"{job} not admitted again: {qc.item(job)}")


def _launch_ends(qc: QueueCluster, scheduler: Any, job: str) -> tuple[Any, dict[str, Any]]:
    """The job admitted again and its launch left to the sweep (every minute) until it ends:
    the job as the last sweep read it while STARTING (a redelivery's read), and its item."""
    _admitted(qc, scheduler, job)
    read = qc.repo.jobs.get_job(job)
    for _ in range(20):
        if qc.state(job) is not JobState.STARTING:
            break
        read = qc.repo.jobs.get_job(job)
        qc.sim.run_for(60)
        qc.recovery.sweep()
    return read, qc.item(job)


def _placement_fails(qc: QueueCluster, scheduler: Any, job: str) -> dict[str, Any]:
    """The job's next launch not placed: another tenant takes node-1's GPUs between the tick's
    snapshot and its StartTask (RESOURCE:GPU, INSUFFICIENT_RESOURCES); the tenant then leaves.
    The job's item after the abort."""
    real_snapshot, thieves = scheduler.snapshot, []

    def racing_snapshot() -> Any:
        nodes = real_snapshot()
        if not thieves:
            thieves.append(steal_gpus(qc, "node-1"))
        return nodes

    scheduler.snapshot = racing_snapshot
    try:
        _admitted(qc, scheduler, job)
    finally:
        scheduler.snapshot = real_snapshot
    item = qc.item(job)
    for thief in thieves:
        aws.client("ecs").stop_task(cluster=qc.local.cluster_name, task=thief)
    return item


def _failed_emails(qc: QueueCluster, job: str) -> list[dict[str, Any]]:
    return [n for n in qc.local.notifications()
            if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "failed"
            and n["attributes"].get("job_id") == job]


def _requeued_given_up(item: dict[str, Any], give_ups: int, resource_failures: int) -> None:
    assert item["job_state"] == "PENDING_RESOURCES", item["last_error"]
    assert item[C.QUEUE_PK] == C.QUEUE_BUCKET
    assert "did not complete" in item["last_error"]
    assert item["launch_give_ups"] == give_ups and item["resource_failures"] == resource_failures


def test_the_third_launch_given_up_in_a_row_fails_the_job_told_why(two_nodes, monkeypatch):
    """Given a 2-node job whose rank on node-1 never starts (every StartTask there throttled)
    When the sweep gives its launch up, the job is admitted again, and again
    Then the first and second give-ups requeue it with the back-off of a placement failure; the
    third fails it (it was requeued every ~10 minutes for good, nobody told): the reason says
    what happened and what to look at, one `failed` e-mail (naming only commands that exist),
    every given-up attempt in its history, the rank it started stopped (the stop intent in the
    failure's write); a redelivered sweep that read the job STARTING does nothing more."""
    qc = two_nodes
    assert LAUNCH_GIVE_UP_LIMIT == 3
    Node1Refuses(qc, monkeypatch)
    stops: list[tuple[JobState, dict[str, Any]]] = []
    gang, real_stop = qc.recovery.gang, qc.recovery.gang.stop

    def stop(job: Any, *args: Any, **kwargs: Any) -> Any:
        stops.append((job.state, dict(job.stop_fanout or {})))
        return real_stop(job, *args, **kwargs)

    monkeypatch.setattr(gang, "stop", stop)
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()

    _, first = _launch_ends(qc, scheduler, job)
    _requeued_given_up(first, give_ups=1, resource_failures=1)
    assert "retry in 60 s" in first["last_error"]
    _, second = _launch_ends(qc, scheduler, job)
    _requeued_given_up(second, give_ups=2, resource_failures=2)
    assert "retry in 120 s" in second["last_error"]
    assert _failed_emails(qc, job) == []

    read, third = _launch_ends(qc, scheduler, job)
    assert third["job_state"] == "FAILED" and third["attempt"] == 3
    assert third["last_error"].startswith("launch did not complete 3 times in a row: ")
    assert "StartTask" in third["last_error"] and C.QUEUE_PK not in third
    assert third["failure_kind"] == "UNKNOWN" and third["launch_give_ups"] == 3
    assert [(a["attempt"], a["outcome"], a["failure_kind"]) for a in third["attempts"]] == [
        (n, "START_FAILED", "UNKNOWN") for n in (1, 2, 3)]
    assert all("did not complete after" in a["reason"] for a in third["attempts"])
    [mail] = _failed_emails(qc, job)
    body = mail["message"]
    assert "Job failed: its launch never completed" in body and third["last_error"] in body
    what_to_do = body.split("What to do:", 1)[1]
    assert "logs" in what_to_do and command_mentions_problems(what_to_do) == []
    failed_stops = [intent for state, intent in stops if state is JobState.FAILED]
    assert failed_stops and failed_stops[0]["attempt"] == 3 and failed_stops[0]["aborted_launch"]

    # A redelivered sweep (it read the job STARTING): the failure's write is lost, nothing owed.
    assert read.state is JobState.STARTING and read.attempt == 3
    assert qc.recovery.launches.resume(read) == "launch_moved_on"
    assert qc.item(job)["job_state"] == "FAILED" and qc.item(job)["launch_give_ups"] == 3
    assert len(_failed_emails(qc, job)) == 1
    for _ in range(5):
        qc.sim.run_for(60)
        qc.recovery.sweep()
    assert qc.live_tasks(job) == [] and "stop_fanout" not in qc.item(job)


def test_a_launch_is_sent_again_every_two_minutes_though_its_sends_are_slow(two_nodes, monkeypatch):
    """Given a 2-node job whose rank 1 is never started (its launch lease always held elsewhere,
    as a dead holder's is for a while), each refused claim taking 5 s, so each send of the
    launch is recorded seconds into its minute
    When the sweep (at the start of every minute) looks after the launch until it is given up
    Then after the launch's first look, rank 1's start is tried by the sweep every two minutes
    (MAX_LAUNCH_RESENDS times in all): a resend that waited for two full minutes after the send
    skipped to the sweep after (three minutes), and a launch was given up after two resends
    (driver_warning s430 at 8 %)."""
    qc = two_nodes
    tries: list[float] = []
    gang = qc.recovery.gang
    real_claim = gang.fanouts.claim_rank_launch

    def claim(rank: Any, *args: Any, **kwargs: Any) -> bool:
        if rank.rank != 1:
            return real_claim(rank, *args, **kwargs)
        tries.append(qc.sim.now())
        qc.sim.clock.advance(5)
        return False

    monkeypatch.setattr(gang.fanouts, "claim_rank_launch", claim)
    job = qc.submit(nnodes=2, gpus=8)
    qc.scheduler().tick()
    assert qc.state(job) is JobState.STARTING and len(tries) == 1
    while qc.state(job) is JobState.STARTING:
        qc.sim.run_until((qc.sim.now() // 60 + 1) * 60)  # the sweeps keep their own second
        qc.recovery.sweep()
    assert "did not complete" in qc.item(job)["last_error"]
    resends = [later - earlier for earlier, later in itertools.pairwise(tries[1:])]
    assert len(tries) == 1 + MAX_LAUNCH_RESENDS and all(gap == 120 for gap in resends), tries
    # Given up by the sweep nearest eight minutes after the claim (a second into its tick), not
    # by the one a minute later (which resent the launch once more first).
    assert qc.sim.now() - tries[0] == 8 * 60 - 1, qc.sim.now() - tries[0]


def test_a_launch_that_completes_starts_the_count_again(two_nodes, monkeypatch):
    """Given a job whose launch was given up twice in a row
    When its next launch completes, and a later launch (the job suspended by its owner, then
    resumed) is given up
    Then the completed launch set the count back to 0 (as the placement failures'), and that
    give-up is the first again: requeued, not failed."""
    qc = two_nodes
    refusing = Node1Refuses(qc, monkeypatch)
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()
    for give_ups in (1, 2):
        _, item = _launch_ends(qc, scheduler, job)
        _requeued_given_up(item, give_ups=give_ups, resource_failures=give_ups)

    refusing.on = False
    _admitted(qc, scheduler, job)
    qc.sim.run_for(30)
    item = qc.item(job)
    assert item["job_state"] == "RUNNING" and item["launched_at"] is not None
    assert item["launch_give_ups"] == 0 and item["resource_failures"] == 0

    service = qc.jobs_service()
    assert service.suspend(job, "alice")["state"] == "SUSPENDING"
    for _ in range(60):
        if qc.state(job) is JobState.SUSPENDED:
            break
        qc.sim.run_for(60)
        qc.recovery.sweep()
    assert qc.state(job) is JobState.SUSPENDED
    service.resume(job, "alice")
    refusing.on = True
    _, item = _launch_ends(qc, scheduler, job)
    _requeued_given_up(item, give_ups=1, resource_failures=1)
    assert _failed_emails(qc, job) == []


def test_placement_failures_and_give_ups_are_counted_apart(two_nodes, monkeypatch):
    """Given a 2-node job
    When its launches end: two placement failures (another tenant takes node-1's GPUs before
    its StartTask), two give-ups, a placement failure, a give-up
    Then placement failures never count as give-ups (the give-up after two of them is the
    first: requeued) nor start the give-ups' count again (the give-up after the third placement
    failure is the third in a row: FAILED); every launch before it requeued the job."""
    qc = two_nodes
    refusing = Node1Refuses(qc, monkeypatch)
    refusing.on = False
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()
    for failures in (1, 2):
        item = _placement_fails(qc, scheduler, job)
        assert item["job_state"] == "PENDING_RESOURCES" and "INSUFFICIENT_RESOURCES" in item["last_error"]
        assert item["resource_failures"] == failures and item.get("launch_give_ups", 0) == 0

    refusing.on = True
    for give_ups in (1, 2):
        _, item = _launch_ends(qc, scheduler, job)
        _requeued_given_up(item, give_ups=give_ups, resource_failures=2 + give_ups)

    refusing.on = False
    item = _placement_fails(qc, scheduler, job)
    assert item["job_state"] == "PENDING_RESOURCES" and "INSUFFICIENT_RESOURCES" in item["last_error"]
    assert item["launch_give_ups"] == 2 and item["resource_failures"] == 5

    refusing.on = True
    _, item = _launch_ends(qc, scheduler, job)
    assert item["job_state"] == "FAILED" and item["launch_give_ups"] == 3
    assert item["last_error"].startswith("launch did not complete 3 times in a row")
    assert len(_failed_emails(qc, job)) == 1


def test_the_give_ups_failure_ends_only_a_starting_launch_not_complete(qc):
    """Given a job RUNNING (rank 0's RUNNING event came) whose launch is not recorded complete,
    and one whose launch is complete
    When a give-up's failure is written for each (a sweep that read them STARTING)
    Then neither applies (the launch may complete, or did: it runs on, nothing owed); a failed
    launch's write of another kind still fails the first (a user error from RUNNING too)."""
    running, launched = qc.submit(nnodes=2, gpus=8), qc.submit(nnodes=2, gpus=8)
    qc.scheduler().tick()
    qc.sim.run_for(30)
    assert qc.state(running) is JobState.RUNNING and qc.state(launched) is JobState.RUNNING
    item = qc.item(running)
    qc.table().update_item(Key={C.JOB_PK: item[C.JOB_PK]}, UpdateExpression="REMOVE launched_at")
    store = SchedulingRepository(qc.repo.jobs)

    def fail(job: str, give_ups: int | None) -> bool:
        return store.fail_launch(job, 1, reason="launch did not complete 3 times in a row",
                                 failure_kind="UNKNOWN", attempts=[], stop_why="given up", give_ups=give_ups)

    assert not fail(running, 3) and not fail(launched, 3)
    assert qc.state(running) is JobState.RUNNING and qc.state(launched) is JobState.RUNNING
    assert "launch_give_ups" not in qc.item(running) or qc.item(running)["launch_give_ups"] == 0
    assert fail(running, None)
    assert qc.state(running) is JobState.FAILED


#: the calls of the failing give-up and its aftermath (the write with its e-mail, the e-mail's
#: publish and its outbox update, the stop of the ranks it started)
GIVE_UP_SITES = ("recovery/queue_launches.py", "recovery/notices.py", "recovery/gang.py", "recovery/ranks.py")


def _third_give_up_due(qc: QueueCluster, monkeypatch: Any) -> str:
    """A 2-node job whose rank on node-1 never starts, given up twice, launched a third time and
    past its give-up (no sweep since): the next sweep fails it."""
    Node1Refuses(qc, monkeypatch)
    job = qc.submit(nnodes=2, gpus=8)
    scheduler = qc.scheduler()
    for give_ups in (1, 2):
        _, item = _launch_ends(qc, scheduler, job)
        _requeued_given_up(item, give_ups=give_ups, resource_failures=give_ups)
    _admitted(qc, scheduler, job)
    qc.sim.run_for(600)
    return job


@pytest.mark.slow
def test_the_failing_give_up_with_each_of_its_calls_broken_still_fails_the_job_once(monkeypatch):
    """Given a job whose third launch in a row is due to be given up
    When the sweep's give-up has one of its calls (the failure's transaction with its e-mail, the
    e-mail's publish and its outbox update, the rank's stop) throttled or its answer lost, and
    the sweep runs every minute after
    Then the job ends FAILED at that attempt with its count, its e-mail sent (twice at worst: a
    publish whose outbox update was lost), its started rank stopped, nothing else relaunched."""
    gen = make_queue_cluster(nodes=[8, 8])
    qc = next(gen)
    try:
        job = _third_give_up_due(qc, monkeypatch)
        with qc.local.call_faults.recording() as calls:
            qc.recovery.sweep()
        assert qc.state(job) is JobState.FAILED
    finally:
        gen.close()
    first = next(c.index for c in calls if c.site.startswith("recovery/queue_launches.py"))
    window = [c for c in calls if c.index >= first and c.site.startswith(GIVE_UP_SITES)]
    assert any(c.operation == "TransactWriteItems" for c in window), window
    assert any(c.operation == "Publish" for c in window), window
    wrong = []
    for call in window:
        for mode in (THROTTLE, LOST_RESPONSE):
            gen = make_queue_cluster(nodes=[8, 8])
            qc = next(gen)
            try:
                job = _third_give_up_due(qc, monkeypatch)
                qc.local.call_faults.arm(call.index, mode, record_sites=True)
                try:
                    with contextlib.suppress(Exception):  # the invocation fails: the sweep comes again
                        qc.recovery.sweep()
                    fired = qc.local.call_faults.fired
                finally:
                    qc.local.call_faults.disarm()
                assert fired is not None and (fired.operation, fired.site) == (call.operation, call.site)
                for _ in range(15):
                    qc.sim.run_for(60)
                    qc.recovery.sweep()
                item, mails = qc.item(job), len(_failed_emails(qc, job))
                outcome = (item["job_state"], item["attempt"], item.get("launch_give_ups"),
                           len(item["attempts"]), "stop_fanout" in item, len(qc.live_tasks(job)))
                if outcome != ("FAILED", 3, 3, 3, False, 0) or not 1 <= mails <= 2:
                    wrong.append(f"{call.operation} {call.site} {mode}: {outcome}, {mails} e-mail(s)")
            finally:
                gen.close()
    assert wrong == []
