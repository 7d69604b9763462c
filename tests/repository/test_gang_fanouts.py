"""A gang's fan-out records (``repository.gang_fanouts``, ``repo.fanouts``) on the emulator's
DynamoDB: a send is claimed by one caller until it is confirmed or its claim goes stale, the
paced stop rounds only go forward, a stop ends once, and a rank's launch lease has one holder
until it runs out or is given back."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import JobState, RankState
from tests.recovery.fakes import World, world
from tests.repository.items import job_item, set_job_fields

JOB = "job-a"


def job_with_stop(w: World) -> Job:
    """JOB running attempt 1 on two nodes, its stop intent committed and not sent."""
    w.register_job(JOB, ["node-a", "node-b"])
    set_job_fields(JOB, stop_fanout={"attempt": 1, "why": "rank 0 exited", "at": w.now[0]})
    job = w.repo.jobs.get_job(JOB)
    assert job is not None
    return job


def rank_zero(w: World) -> Rank:
    rank = w.repo.jobs.get_rank(JOB, 0)
    assert rank is not None
    return rank


def test_a_send_is_claimed_by_one_caller_until_it_is_confirmed_or_its_claim_goes_stale() -> None:
    with world() as w:
        fanouts, job = w.repo.fanouts, job_with_stop(w)
        now = w.now[0]
        assert fanouts.claim_send(job, "stop_fanout", 1, now, lease_seconds=60)
        assert not fanouts.claim_send(job, "stop_fanout", 1, now + 59, lease_seconds=60)  # held
        # Its holder died before sending: the claim is stale, the next caller takes it.
        assert fanouts.claim_send(job, "stop_fanout", 1, now + 61, lease_seconds=60)
        assert fanouts.record_sent(job, "stop_fanout", 1, now + 62)
        assert job_item(JOB)["stop_fanout"]["sent_at"] == now + 62
        # Sent: no one sends it again, however late.
        assert not fanouts.claim_send(job, "stop_fanout", 1, now + 3600, lease_seconds=60)


def test_another_attempts_send_is_neither_claimed_nor_confirmed() -> None:
    with world() as w:
        fanouts, job = w.repo.fanouts, job_with_stop(w)
        assert not fanouts.claim_send(job, "stop_fanout", 2, w.now[0], lease_seconds=60)
        assert not fanouts.record_sent(job, "stop_fanout", 2, w.now[0])
        assert not fanouts.claim_send(job, "start_fanout", 1, w.now[0], lease_seconds=60)  # none
        assert "sent_at" not in job_item(JOB)["stop_fanout"]


def test_the_paced_stop_rounds_only_go_forward() -> None:
    with world() as w:
        fanouts, job = w.repo.fanouts, job_with_stop(w)
        now = w.now[0]
        assert fanouts.record_stop_round(job, 1, 2, now)
        assert not fanouts.record_stop_round(job, 1, 2, now + 1)  # a duplicate
        assert not fanouts.record_stop_round(job, 1, 1, now + 2)  # a late, older round
        assert job_item(JOB)["stop_fanout"]["sent_at"] == now
        assert fanouts.record_stop_round(job, 1, 3, now + 3)
        assert job_item(JOB)["stop_fanout"]["rounds"] == 3


def test_a_stop_ends_once_and_only_on_the_state_it_was_read_in() -> None:
    with world() as w:
        fanouts, job = w.repo.fanouts, job_with_stop(w)
        moved = replace(job, state=JobState.PENDING_HEALTHCHECK)
        assert not fanouts.end_stop(moved, 1)  # the job moved on since it was read
        assert not fanouts.end_stop(job, 2)  # another attempt's
        assert fanouts.end_stop(job, 1)
        item = job_item(JOB)
        assert "stop_fanout" not in item and item["stopped"]["attempt"] == 1
        assert not fanouts.end_stop(job, 1)  # a redelivery finds nothing to end


def test_a_ranks_launch_lease_has_one_holder_until_it_runs_out_or_is_given_back() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a", "node-b"])
        fanouts, rank = w.repo.fanouts, rank_zero(w)
        now = w.now[0]
        assert fanouts.claim_rank_launch(rank, 2, now + 75, now)
        assert not fanouts.claim_rank_launch(rank, 2, now + 80, now + 5)  # held
        assert fanouts.claim_rank_launch(rank, 2, now + 150, now + 76)  # its holder died: ran out
        assert fanouts.release_rank_launch(rank, 2)  # not placed: the next try may start it
        assert fanouts.claim_rank_launch(rank, 2, now + 160, now + 77)
        # Only the attempt after the rank's: a lease for any other is refused, and so is its
        # release.
        assert not fanouts.claim_rank_launch(rank, 3, now + 160, now + 77)
        assert not fanouts.release_rank_launch(rank, 3)
        item: dict[str, Any] = job_item(JOB, rank=0)
        assert item["launch_attempt"] == 2 and item["launch_lease_until"] == now + 160


def test_a_rank_never_started_takes_its_lease_on_an_item_of_its_own_that_readers_skip() -> None:
    """A first attempt's rank (a queue launch) has no earlier item: its lease creates one that
    holds only the lease; no reader sees a rank there until the rank is registered over it."""
    with world() as w:
        w.register_job(JOB, ["node-a"])  # rank 0 only: rank 1 was never started
        fanouts, now = w.repo.fanouts, w.now[0]
        never = replace(rank_zero(w), rank=1, attempt=0)
        assert fanouts.claim_rank_launch(never, 1, now + 75, now)
        assert not fanouts.claim_rank_launch(never, 1, now + 80, now + 5)  # held
        item: dict[str, Any] = job_item(JOB, rank=1)
        assert item["launch_attempt"] == 1 and item["item_type"] == "RANK_LEASE"
        assert w.repo.jobs.get_rank(JOB, 1) is None
        assert [r.rank for r in w.repo.jobs.get_rank_range(JOB, 0, 2)] == [0]
        job = w.repo.jobs.get_job(JOB)
        assert job is not None
        assert [r.rank for r in w.repo.jobs.get_ranks(replace(job, world_size=2))] == [0]
        assert fanouts.release_rank_launch(never, 1)  # not placed: the next try may take it
        assert fanouts.claim_rank_launch(never, 1, now + 90, now + 6)
        # Registered over its lease: a rank like any other, its lease gone with the item.
        registered = replace(rank_zero(w), rank=1, attempt=1, task_arn="arn:aws:ecs:task/t1")
        assert w.repo.registrations.put_rank_registration(registered)
        stored = w.repo.jobs.get_rank(JOB, 1)
        assert stored is not None and stored.task_arn == "arn:aws:ecs:task/t1"
        assert "launch_attempt" not in job_item(JOB, rank=1)
        # Its next attempt's lease goes on the registered item.
        assert fanouts.claim_rank_launch(stored, 2, now + 95, now + 7)


def test_an_aborted_launchs_open_leases_are_those_no_rank_was_registered_over_nor_given_back() -> None:
    """The end of an aborted launch's stop reads the ranks once: the attempt's ranks registered and
    not ended, and its leases still open with the startedBy each claim recorded (a holder that
    died after its StartTask left its task to be looked up by it)."""
    with world() as w:
        w.register_job(JOB, ["node-a"])  # rank 0 of attempt 1, live
        fanouts, now = w.repo.fanouts, w.now[0]
        never = replace(rank_zero(w), rank=1, attempt=0)
        released = replace(never, rank=2)
        assert fanouts.claim_rank_launch(never, 1, now + 105, now, "launch-job-a-1-r1")
        assert fanouts.claim_rank_launch(released, 1, now + 105, now, "launch-job-a-1-r2")
        assert fanouts.release_rank_launch(released, 1)  # not placed: nothing was started
        live, leases = fanouts.open_launch_leases(JOB, 1, 4)
        assert live == {0: RankState.RUNNING}
        assert [(lease.rank, lease.until, lease.started_by) for lease in leases] == [
            (1, now + 105, "launch-job-a-1-r1")]
        assert fanouts.open_launch_leases(JOB, 2, 4) == ({}, [])  # another attempt's


def test_a_launchs_reads_again_ask_only_for_the_attributes_they_use() -> None:
    """Given a job of two ranks, one registered
    When a launch's start reads the job again (``_launch_moved_on``, twice per StartTask call)
    and the end of an aborted launch's stop reads its rank items (``open_launch_leases``)
    Then the GetItem asks for the job's attempt and state only, the BatchGetItem for the rank
    items' key, state, attempt and launch lease only (each through an expression attribute
    name), not the whole items (overrides, tags, history); one call each, as before."""
    with world() as w:
        w.register_job(JOB, ["node-a", "node-b"])
        job = w.repo.jobs.get_job(JOB)
        assert job is not None
        requests: list[tuple[str, dict[str, Any]]] = []
        events = w.repo.fanouts.db.table("jobs").meta.client.meta.events
        events.register("before-parameter-build.dynamodb",
                        lambda params, model, **_: requests.append((model.name, params)))
        assert not w.service.gang._launch_moved_on(job)
        w.repo.fanouts.open_launch_leases(JOB, 1, 2)
        assert [name for name, _ in requests] == ["GetItem", "BatchGetItem"]
        (_, get), (_, batch) = requests
        [read] = batch["RequestItems"].values()

        def projected(request: dict[str, Any]) -> list[str]:
            names = request["ExpressionAttributeNames"]
            return sorted(names[token.strip()] for token in request["ProjectionExpression"].split(","))

        assert projected(get) == ["attempt", "job_state"]
        assert projected(read) == sorted([C.JOB_PK, "attempt", "launch_attempt", "launch_lease_until",
                                          "launch_started_by", "rank_state"])
