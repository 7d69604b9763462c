"""What a rank's task event writes on its job (``repository.rank_events``, ``repo.rank_events``)
on the emulator's DynamoDB: the rank's stop and the job's transition in one transaction (a
retry never finds one written without the other), the fault entered once, a budget charged
once, the ledger's running mark once per attempt and cause."""

from __future__ import annotations

from dataclasses import replace

from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.states import JobState, RankState
from gpu_recovery.repository.jobs_and_ranks import RankStop
from tests.recovery.fakes import World, world
from tests.repository.items import instance_item, job_item, set_rank_fields

JOB = "job-a"
ACTIVE = [JobState.STARTING, JobState.RUNNING]


def rank(w: World, number: int) -> Rank:
    found = w.repo.jobs.get_rank(JOB, number)
    assert found is not None
    return found


def stop_of(w: World, number: int, *, fence: bool = False) -> RankStop:
    return RankStop(rank(w, number), RankState.STOPPED, {"exit_code": 1},
                    fence={"job_id": JOB, "attempt": 1} if fence else None)


def test_a_fault_is_entered_once_with_the_ranks_stop_and_its_nodes_fence() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a", "node-b"])
        events, now = w.repo.rank_events, w.now[0]
        assert events.enter_recovery(JOB, 1, from_states=ACTIVE, reason="rank 0 exited 1", now=now,
                                     deadline_at=now + 60, rank_stop=stop_of(w, 0, fence=True))
        job = job_item(JOB)
        assert job["job_state"] == "PENDING_HEALTHCHECK" and job["stop_fanout"]["attempt"] == 1
        assert job_item(JOB, rank=0)["rank_state"] == "STOPPED"
        assert instance_item("node-a")["suspect_fence"] == {"job_id": JOB, "attempt": 1}
        # The next rank's stop (or a redelivery) finds the fault entered: nothing is written,
        # its own stop included (it is recorded alone: record_stop).
        assert not events.enter_recovery(JOB, 1, from_states=ACTIVE, reason="rank 1 exited 1",
                                         now=now + 1, deadline_at=now + 61, rank_stop=stop_of(w, 1))
        assert job_item(JOB, rank=1)["rank_state"] == "RUNNING"
        assert events.record_stop(stop_of(w, 1))
        assert job_item(JOB, rank=1)["rank_state"] == "STOPPED"


def test_a_rank_already_stopped_keeps_the_job_from_entering_the_fault_twice() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a", "node-b"])
        events, now = w.repo.rank_events, w.now[0]
        stop = stop_of(w, 0)
        assert events.record_stop(stop)
        # The same stop again, now with the job's transition: the rank's half fails, so the
        # whole transaction does, and the job stays as it was.
        assert not events.enter_recovery(JOB, 1, from_states=ACTIVE, reason="rank 0 exited 1",
                                         now=now, deadline_at=now + 60, rank_stop=stop)
        assert job_item(JOB)["job_state"] == "RUNNING"


def test_a_restart_in_place_charges_its_budget_once() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a", "node-b"])
        events, now = w.repo.rank_events, w.now[0]
        job = w.repo.jobs.get_job(JOB)
        assert job is not None
        written = [events.restart_in_place(  # the event, then its redelivery
            job, from_states=ACTIVE, reason="rank 0 exited 1", now=now, deadline_at=now + 60,
            spend="application", restart_reason="application error", rank_stop=stop_of(w, 0))
            for _ in range(2)]
        assert written == [True, False]
        item = job_item(JOB)
        assert item["job_state"] == "PENDING_RESTART" and item["app_restarts_used"] == 1


def test_a_rank_is_marked_running_once_and_only_for_its_task() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a"])
        events = w.repo.rank_events
        starting = replace(rank(w, 0), state=RankState.STARTING)
        set_rank_fields(JOB, 0, rank_state="STARTING")
        assert not events.mark_running(replace(starting, task_arn="arn:another-attempts-task"))
        assert events.mark_running(starting, at=w.now[0])
        assert job_item(JOB, rank=0)["running_at"] == w.now[0]
        assert not events.mark_running(starting, at=w.now[0] + 5)  # a duplicate RUNNING event


def test_the_running_mark_is_written_once_per_attempt_and_cause() -> None:
    with world() as w:
        w.register_job(JOB, ["node-a"])
        events, now = w.repo.rank_events, w.now[0]
        assert events.mark_running_interval(JOB, 1, cause="preflight", until=now, reason="preflight passed")
        assert not events.mark_running_interval(JOB, 1, cause="preflight", until=now + 5,
                                                reason="preflight passed")
        assert not events.mark_running_interval(JOB, 2, cause="preflight", until=now,
                                                reason="another attempt's")
        assert job_item(JOB)["gp_preflight_attempt"] == 1
