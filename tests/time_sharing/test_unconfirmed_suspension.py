"""A suspension whose ranks cannot all be confirmed stopped (a rank's node lost in the grace:
StopTask goes to a disconnected agent and ECS never reports the task STOPPED) must not hold
the job, or its quota charge, forever: once the stop fan-out's paced rounds are spent with a
rank still not stopped, the job fails (it cannot be resumed elsewhere: a rank still running
could write its checkpoint), its owner is e-mailed and the scheduler's tick releases its
charge. Every rank stopped: SUSPENDED, as before (the recovery's fakes on moto's DynamoDB)."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError

from gpu_recovery import constants as C
from gpu_recovery.domain.time_sharing import SuspendKind
from gpu_recovery.queue.time_sharing import TimeSharing
from gpu_recovery.recovery.gang import MAX_STOP_ROUNDS
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.time_sharing import HoldingRepository, QuotaCharge, QuotaRepository
from gpu_recovery.settings import TimeSharingSettings
from tests.recovery.fakes import REGION, World, world

JobState = C.JobState
NotificationKind = C.NotificationKind


def charged(w: World) -> HoldingRepository:
    """The job holds its two nodes against alice's quota (as the scheduler's launch claim wrote)."""
    ddb = boto3.resource("dynamodb", region_name=REGION)
    ddb.create_table(TableName="quota", BillingMode="PAY_PER_REQUEST", **C.table_definitions()["quota"])
    holding = HoldingRepository(w.repo.jobs, QuotaRepository(ddb, "quota"))
    charge = QuotaCharge("alice", 10, 2)
    assert w.repo.tables.db.transact([
        Update(table="jobs", key={C.JOB_PK: C.job_item_key("j")},
               set_fields=holding.charge_fields(charge, w.now[0])),
        holding.quotas.charge_update(charge, limit_read=None, default_limit=None)])
    return holding


def preempted(w: World) -> list[str]:
    """A running 2-rank queue job preempted, rank 0 calling go_suspend(): both ranks asked to stop."""
    arns = w.register_queue_job("j", ["node-a", "node-b"])
    assert w.service.request_suspend("j", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                     grace_seconds=60, actor="scheduler", by_job="h")
    assert w.service.go_suspend("j", 0, 1).action == "suspending"
    assert sorted(w.ecs.stop_calls) == sorted(arns)
    return arns


def sweep_until_it_leaves_suspending(w: World, minutes: int) -> int:
    """The recovery sweep every minute; the minutes it took the job to leave SUSPENDING."""
    for minute in range(1, minutes + 1):
        w.advance(60)
        w.service.sweep()
        if w.repo.jobs.get_job("j").state is not JobState.SUSPENDING:
            return minute
    return minutes + 1


def test_a_suspension_whose_rank_is_never_confirmed_stopped_fails_the_job_once_its_stops_are_spent() -> None:
    """Given a preempted job whose rank 1's node lost its ECS agent as it was being stopped (rank 0
    stopped, rank 1's StopTask never confirmed), When the recovery sweep runs for hours, Then the job
    does not stay SUSPENDING: once the stop rounds are spent (rank 1 asked 1 + MAX_STOP_ROUNDS times)
    it is FAILED, the reason naming rank 1, its node and the suspension not completed; one FAILED
    e-mail; the spent stop intent is ended and the job leaves the deadline index; the scheduler's
    tick releases its quota charge."""
    with world() as w:
        arns = preempted(w)
        holding = charged(w)
        w.stopped_by_the_stack(arns[:1])  # rank 0 stopped; node-b's agent never answers
        took = sweep_until_it_leaves_suspending(w, minutes=4 * 60)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED, f"still {job.state.value} after {took} minutes"
        assert w.ecs.stop_calls.count(arns[1]) == 1 + MAX_STOP_ROUNDS
        assert w.ecs.stop_calls.count(arns[0]) == 1
        error = job.last_error
        assert "suspension could not be completed" in error and "rank 1" in error and "node-b" in error
        [mail] = w.notifier.sent
        assert mail.kind is NotificationKind.FAILED and "node-b" in mail.body
        for _ in range(3):
            w.advance(60)
            w.service.sweep()
        item = w.repo.jobs.get_job_item("j")
        assert "stop_fanout" not in item and C.DEADLINE_SK not in item
        assert w.ecs.stop_calls.count(arns[1]) == 1 + MAX_STOP_ROUNDS  # nothing asked again
        sharing = TimeSharing(w.repo.latches, holding, None, TimeSharingSettings())  # type: ignore[arg-type]
        assert sharing.housekeeping(w.now[0])["released"] == ["j"]
        assert int(holding.quotas.get("alice", 10)["used_nodes"]) == 0


def test_a_suspension_whose_last_rank_stops_late_is_suspended_not_failed() -> None:
    """Given the same suspension, When rank 1's agent reconnects during the paced rounds and ECS
    reports its task STOPPED, Then the job is SUSPENDED (queued again), never failed."""
    with world() as w:
        arns = preempted(w)
        w.stopped_by_the_stack(arns[:1])
        assert sweep_until_it_leaves_suspending(w, minutes=30) == 31
        w.stopped_by_the_stack(arns[1:])
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.SUSPENDED
        assert w.notifier.sent == []


def test_a_suspension_finished_by_the_sweep_ends_its_stop_intent(monkeypatch) -> None:
    """Given a preempted job whose last rank's STOPPED event dies right after it counted the rank
    ended (before the suspension went on), When the recovery sweep finishes the suspension
    (every rank ended), Then the job is SUSPENDED and queued without the stop intent (it stayed
    on the queued item, nothing left to stop)."""
    with world() as w:
        arns = preempted(w)
        w.stopped_by_the_stack(arns[:1])

        def dies(*_: object) -> str:
            raise RuntimeError("invocation died")

        monkeypatch.setattr(w.service.faults, "on_attempt_ended", dies)
        with pytest.raises(RuntimeError):
            w.stopped_by_the_stack(arns[1:])
        monkeypatch.undo()
        assert w.repo.jobs.get_job("j").state is JobState.SUSPENDING
        w.advance(60)
        w.service.sweep()
        item = w.repo.jobs.get_job_item("j")
        assert item["job_state"] == JobState.SUSPENDED.value and C.QUEUE_PK in item
        assert "stop_fanout" not in item


def test_a_large_suspension_failed_names_a_few_unstopped_ranks_and_reads_only_those(monkeypatch) -> None:
    """Given a preempted 12-rank job of which only ranks 0 and 1 are confirmed stopped (the other
    ten ranks' nodes lost their agents), When the stop rounds are spent, Then the job is FAILED,
    its reason naming eight of the ten ranks with their nodes and "2 more", the e-mail's action
    saying the other ranks' nodes need a look too; and the failure read the rank items of the
    eight it named, never every rank of the job (the latch's shards say which are unstopped)."""
    with world() as w:
        nodes = [f"node-{i:02d}" for i in range(12)]
        arns = w.register_queue_job("j", nodes)
        assert w.service.request_suspend("j", 1, kind=SuspendKind.PREEMPTED, reason="preempted by job h",
                                         grace_seconds=60, actor="scheduler", by_job="h")
        assert w.service.go_suspend("j", 0, 1).action == "suspending"
        w.stopped_by_the_stack(arns[:2])
        suspensions = w.service.suspensions
        failing = [False]
        read: list[list[int]] = []
        fail_unstopped, numbered = suspensions.fail_unstopped, suspensions.data.get_ranks_numbered
        every_rank = w.repo.jobs.get_ranks

        def spied_fail(job):  # type: ignore[no-untyped-def]
            failing[0] = True
            try:
                return fail_unstopped(job)
            finally:
                failing[0] = False

        def spied_numbered(job_id, numbers):  # type: ignore[no-untyped-def]
            numbers = list(numbers)
            if failing[0]:
                read.append(numbers)
            return numbered(job_id, numbers)

        def spied_every_rank(job):  # type: ignore[no-untyped-def]
            assert not failing[0], "the failure read every rank of the job"
            return every_rank(job)

        monkeypatch.setattr(suspensions, "fail_unstopped", spied_fail)
        monkeypatch.setattr(suspensions.data, "get_ranks_numbered", spied_numbered)
        monkeypatch.setattr(w.repo.jobs, "get_ranks", spied_every_rank)
        sweep_until_it_leaves_suspending(w, minutes=4 * 60)
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED
        assert read == [list(range(2, 10))]
        error = job.last_error
        assert "rank 2 on node-02" in error and "rank 9 on node-09" in error and " and 2 more " in error
        assert "rank 10 " not in error and "rank 1 " not in error
        [mail] = w.notifier.sent
        assert "node-02" in mail.body and "the nodes of the 2 other ranks not confirmed stopped" in mail.body


def test_a_suspension_failure_whose_read_of_the_named_ranks_is_throttled_is_finished_by_the_next_sweep(
        monkeypatch) -> None:
    """Given the 2-rank suspension whose rank 1 is never confirmed stopped, When the failure's read
    of the ranks it names is throttled once (after the latch's read, before its write), Then that
    sweep leaves the job SUSPENDING and a later sweep fails it: FAILED once, one e-mail."""
    with world() as w:
        arns = preempted(w)
        w.stopped_by_the_stack(arns[:1])
        numbered = w.repo.jobs.get_ranks_numbered
        throttled: list[int] = []

        def once_throttled(job_id, numbers):  # type: ignore[no-untyped-def]
            if not throttled:
                throttled.append(1)
                raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                                  "BatchGetItem")
            throttled.append(2)
            assert w.repo.jobs.get_job("j").state is JobState.SUSPENDING  # the throttled sweep wrote nothing
            return numbered(job_id, numbers)

        monkeypatch.setattr(w.repo.jobs, "get_ranks_numbered", once_throttled)
        sweep_until_it_leaves_suspending(w, minutes=4 * 60)
        assert throttled == [1, 2]
        job = w.repo.jobs.get_job("j")
        assert job.state is JobState.FAILED and "rank 1 on node-b" in job.last_error
        [mail] = w.notifier.sent
        assert mail.kind is NotificationKind.FAILED
