"""A job's gang restart records (``repository.restarts``, ``repo.restarts``) on the emulator's
DynamoDB: claimed once per fault with its start intent, confirmed running once, a wait
written once per attempt (a duplicate neither extends nor restarts it), a queue job requeued
once to be placed elsewhere."""

from __future__ import annotations

from gpu_recovery.constants import QUEUE_PK
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.relocation import RelocationWait
from gpu_recovery.domain.restart_wait import RestartWait
from gpu_recovery.domain.states import JobState
from tests.recovery.fakes import World, world
from tests.repository.items import job_item, set_job_fields

JOB = "job-a"


def job_in(w: World, state: JobState) -> Job:
    """JOB of attempt 1 on two nodes, in ``state`` (as the stage before wrote it)."""
    w.register_job(JOB, ["node-a", "node-b"])
    set_job_fields(JOB, job_state=state.value)
    job = w.repo.jobs.get_job(JOB)
    assert job is not None and job.state is state
    return job


def test_a_restart_is_claimed_once_per_fault_with_its_start_intent() -> None:
    with world() as w:
        restarts, job = w.repo.restarts, job_in(w, JobState.PENDING_RESTART)
        now = w.now[0]
        assert restarts.claim(job, now=now, deadline_at=now + 300)
        item = job_item(JOB)
        assert (item["job_state"], item["attempt"]) == ("STARTING", 2)
        assert item["start_fanout"] == {"attempt": 2, "at": now}
        # A redelivery holds the job as it read it before the claim: it finds it claimed.
        assert not restarts.claim(job, now=now + 1, deadline_at=now + 301)
        assert job_item(JOB)["attempt"] == 2


def test_a_restart_is_confirmed_running_once_and_only_for_its_attempt() -> None:
    with world() as w:
        restarts, job = w.repo.restarts, job_in(w, JobState.PENDING_RESTART)
        now = w.now[0]
        assert restarts.claim(job, now=now, deadline_at=now + 300)
        assert not restarts.confirm_running(JOB, 1, "every rank running")  # the attempt before
        assert restarts.confirm_running(JOB, 2, "every rank running")
        item = job_item(JOB)
        assert item["job_state"] == "RUNNING" and "start_fanout" not in item
        assert not restarts.confirm_running(JOB, 2, "every rank running")  # a duplicate


def test_a_placement_wait_is_written_once_per_attempt() -> None:
    with world() as w:
        restarts, job = w.repo.restarts, job_in(w, JobState.PENDING_RESTART)
        now = w.now[0]
        wait = RestartWait.start(1, now, 600, {"node-b": "RESOURCE:GPU"})
        assert restarts.wait_for_placement(job, wait, now + 60)
        # A duplicate (or a later not-placed rank) neither extends nor restarts the wait.
        later = RestartWait.start(1, now + 30, 600, {"node-b": "RESOURCE:GPU"})
        assert not restarts.wait_for_placement(job, later, now + 90)
        assert job_item(JOB)["restart_wait"]["since"] == now


def test_a_relocation_wait_is_written_once_per_fault() -> None:
    with world() as w:
        restarts, job = w.repo.restarts, job_in(w, JobState.PENDING_RESTART)
        now = w.now[0]
        wait = RelocationWait.start(JOB, 1, now, 900, ["node-b"], [8], "no healthy free node")
        assert restarts.wait_for_relocation(job, wait, now + 60)
        again = RelocationWait.start(JOB, 1, now + 30, 900, ["node-b"], [8], "no healthy free node")
        assert not restarts.wait_for_relocation(job, again, now + 90)
        assert job_item(JOB)["relocation_wait"]["until"] == now + 900


def test_a_queue_job_is_requeued_once_to_be_placed_elsewhere() -> None:
    with world() as w:
        restarts, job = w.repo.restarts, job_in(w, JobState.PENDING_RESTART)
        relocation = {"from_nodes": ["node-b"], "reason": "node-b quarantined"}
        assert restarts.requeue_for_relocation(job, queue_order="0#1", relocation=relocation,
                                               reason="relocating off node-b")
        item = job_item(JOB)
        assert item["job_state"] == "PENDING_RESOURCES" and item[QUEUE_PK] == "QUEUE"
        assert item["relocation"] == relocation
        assert not restarts.requeue_for_relocation(job, queue_order="0#1", relocation=relocation,
                                                   reason="relocating off node-b")


def test_a_queue_job_requeued_to_be_placed_elsewhere_leaves_its_stop_intent_behind() -> None:
    """Every rank of the fault's attempt ended (the restart's precondition): nothing is left to
    stop, so the fault's stop intent does not stay on the queued job."""
    with world() as w:
        restarts = w.repo.restarts
        job_in(w, JobState.PENDING_RESTART)
        set_job_fields(JOB, stop_fanout={"attempt": 1, "why": "rank 0 exited", "at": int(w.now[0]),
                                         "rounds": 6})
        assert restarts.requeue_for_relocation(w.repo.jobs.get_job(JOB), queue_order="0#1",
                                               relocation={"from_nodes": ["node-b"]}, reason="relocating")
        assert "stop_fanout" not in job_item(JOB)
