"""A deadline pushed or cleared (``repository.deadlines``, ``repo.deadlines``) on the emulator's
DynamoDB: only on the state (and attempt) the item was read in, so a stage that looks again
later never pushes the deadline of a job or node that moved on, and the sweep never clears a
newer one."""

from __future__ import annotations

from dataclasses import replace

from gpu_recovery.domain.states import InstanceState, JobState
from tests.recovery.fakes import world
from tests.repository.items import instance_item, job_item, set_instance_fields

JOB, NODE = "job-a", "node-a"


def test_a_jobs_deadline_is_pushed_only_on_the_state_and_attempt_it_was_read_in() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        deadlines, now = w.repo.deadlines, w.now[0]
        job = w.repo.jobs.get_job(JOB)
        assert job is not None
        assert deadlines.rearm_job(job, now + 60)
        assert job_item(JOB)["deadline_at"] == now + 60
        assert [i["job_id"] for i in deadlines.due_job_items(now + 60)] == [JOB]
        assert not deadlines.rearm_job(replace(job, attempt=2), now + 120)  # another attempt's
        assert not deadlines.rearm_job(replace(job, state=JobState.PENDING_RESTART), now + 120)
        assert job_item(JOB)["deadline_at"] == now + 60


def test_the_sweep_clears_only_the_deadline_it_read() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        deadlines, now = w.repo.deadlines, w.now[0]
        job = w.repo.jobs.get_job(JOB)
        assert job is not None and deadlines.rearm_job(job, now + 60)
        assert deadlines.rearm_job(job, now + 120)  # a stage pushed it after the sweep's read
        assert not deadlines.clear_job(JOB, JobState.RUNNING, now + 60)
        assert deadlines.clear_job(JOB, JobState.RUNNING, now + 120)
        assert "deadline_at" not in job_item(JOB) and deadlines.due_job_items(now + 3600) == []


def test_a_nodes_deadline_is_pushed_and_cleared_only_in_its_state() -> None:
    with world() as w:
        w.register_job(JOB, [NODE])
        deadlines, now = w.repo.deadlines, w.now[0]
        set_instance_fields(NODE, instance_state=InstanceState.HEALTH_CHECK_PENDING.value)
        assert not deadlines.rearm_instance(NODE, InstanceState.REBOOTING, now + 60)  # moved on
        assert deadlines.rearm_instance(NODE, InstanceState.HEALTH_CHECK_PENDING, now + 60)
        assert [i.container_inst_id for i in deadlines.due_instances(now + 60)] == [NODE]
        assert not deadlines.clear_instance(NODE, InstanceState.AVAILABLE)
        assert deadlines.clear_instance(NODE, InstanceState.HEALTH_CHECK_PENDING)
        assert "deadline_at" not in instance_item(NODE) and deadlines.due_instances(now + 3600) == []
