"""``recovery.fanout_send``: a large gang's stop fan-out is claimed, sent and confirmed once,
and only for the attempt its intent names (on the repository's own conditions)."""

from __future__ import annotations

from gpu_recovery.domain.gang_batches import STOP, batches
from gpu_recovery.recovery.fanout_send import SEND_CLAIM_SECONDS, send_once
from tests.recovery.fakes import world

WORLD = 40  # > the inline gang size: its stops go through the queue


def test_a_fan_out_is_sent_once_its_dead_claim_goes_stale_and_another_attempt_cannot_claim_it() -> None:
    with world(gang_queue=True, health_check_timeout_seconds=20_000) as w:
        arns = w.register_job("big", [f"node-{i:02d}" for i in range(WORLD)])
        w.queue.fail_next = 1  # the fault's stop: its claim written, its send refused
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        job = w.repo.jobs.get_job("big")
        assert job is not None and job.stop_fanout.get("claimed_at") and not job.stop_fanout.get("sent_at")
        work = batches(STOP, job.job_id, job.attempt, job.world_size, why="test")
        # While the claim may still be sending, nobody else sends:
        assert not send_once(w.repo.fanouts, w.queue, job, "stop_fanout", job.attempt, work)
        w.advance(SEND_CLAIM_SECONDS + 1)
        # Once it is stale: not a sender of another attempt's intent, but one of this one's.
        assert not send_once(w.repo.fanouts, w.queue, job, "stop_fanout", job.attempt + 1, work)
        assert w.queue.sends == 0
        assert send_once(w.repo.fanouts, w.queue, job, "stop_fanout", job.attempt, work)
        assert w.queue.sends == 1 and (w.repo.jobs.get_job("big") or job).stop_fanout.get("sent_at")
        w.advance(SEND_CLAIM_SECONDS + 1)
        assert not send_once(w.repo.fanouts, w.queue, job, "stop_fanout", job.attempt, work)  # sent: once
        assert w.queue.sends == 1
