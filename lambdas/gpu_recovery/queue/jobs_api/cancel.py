"""Cancel: a queued job at once; a running one CANCELING, its ranks stopped (in batches
for a large gang), CANCELED once none is left; a terminal one unchanged."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import JobState, RankState, system_stop_reason
from gpu_recovery.domain.gang_batches import STOP, batches
from gpu_recovery.domain.state_machine import can_transition, check_transition
from gpu_recovery.domain.states import LIVE_RANK_STATES, QUEUED_JOB_STATES
from gpu_recovery.queue.jobs_api.context import RACE_RETRIES, JobsApiContext
from gpu_recovery.queue.jobs_api.errors import Conflict

QUEUED_STATES = QUEUED_JOB_STATES


def cancel_job(context: JobsApiContext, job_id: str, user: str) -> dict[str, Any]:
    """Queued -> CANCELED now; running -> CANCELING + StopTask; terminal: unchanged."""
    for _ in range(RACE_RETRIES):
        item = context.readable(job_id, user if context.access is not None else None, "cancel")
        current = JobState(item["job_state"])
        result: dict[str, Any] = {"job_id": job_id, "previous_state": current.value, "stopping_ranks": []}
        if current.is_terminal:
            return {**result, "state": current.value, "changed": False}
        reason = f"canceled by {user}"
        if current in QUEUED_STATES:
            if context.repo.move_job(job_id, current, JobState.CANCELED, reason=reason, actor=user,
                                  leave_queue=True):
                context.trigger("canceled", job_id)
                return {**result, "state": JobState.CANCELED.value, "changed": True, "ended": True}
            continue
        if current is JobState.CANCELING:
            stopping, state, won = _stop_and_finish(context, job_id, user, was_starting=False)
            return {**result, "state": state.value, "changed": False, "stopping_ranks": stopping,
                    "ended": won}
        target = JobState.CANCELING if can_transition(current, JobState.CANCELING) else JobState.CANCELED
        check_transition(current, target)
        attempt = int(item.get("attempt") or 0)
        stop_of = attempt if target is JobState.CANCELING and attempt else None
        if not context.repo.move_job(job_id, current, target, reason=reason, actor=user,
                                  leave_queue=True, clear_deadline=True, stop_ranks_of=stop_of):
            continue
        stopping, state, won = _stop_and_finish(context, job_id, user,
                                                was_starting=current is JobState.STARTING)
        if state.is_terminal:
            context.trigger("canceled", job_id)
        return {**result, "state": state.value, "changed": True, "stopping_ranks": stopping,
                "ended": won or target is JobState.CANCELED}
    raise Conflict(f"job {job_id} changed state repeatedly while canceling, retry")


def _stop_and_finish(context: JobsApiContext, job_id: str, user: str, *,
                     was_starting: bool) -> tuple[list[int], JobState, bool]:
    """StopTask every live rank of the current attempt; CANCELED once none is left (the
    last: whether this call's write made it CANCELED, for the job's goodput metrics).

    The job is CANCELING *before* the ranks are read, so a rank that stops after
    this read is finished by the task handler (``_maybe_canceled``).
    """
    item = context.item(job_id)
    job = context.repo.job_from_item(item)
    if job.world_size > context.gang_inline_max_ranks:
        # A large gang: its ranks are stopped in batches (the committed intent); the task
        # handler finishes the cancel once every rank ended.
        if context.gang_queue is not None and job.stop_fanout and not job.stop_fanout.get("sent_at"):
            why = str(job.stop_fanout.get("why") or f"canceled by {user}")
            # Sent once, as the recovery sends it (the sweep may read the intent unsent too);
            # imported here: only a large gang's cancel needs it (the API's cold start).
            from gpu_recovery.recovery.fanout_send import send_once

            send_once(context.repo.fanouts, context.gang_queue, job, "stop_fanout", job.attempt, batches(
                STOP, job.job_id, job.attempt, job.world_size, why=why, remediation=False))
        return [], job.state, False
    ranks = [r for r in context.repo.get_ranks(job) if r.attempt == job.attempt]
    why = system_stop_reason(f"canceled by {user}")
    stopping: list[int] = []
    for rank in ranks:
        if rank.state in LIVE_RANK_STATES:
            if not context.repo.request_rank_stop(rank, LIVE_RANK_STATES, f"canceled by {user}"):
                fresh = context.repo.get_rank(job_id, rank.rank)
                if fresh is None or fresh.state is not RankState.STOP_REQUESTED:
                    continue
        elif rank.state is not RankState.STOP_REQUESTED:
            continue
        context.ecs.stop_task_if_known(rank.task_arn, why)  # False: ECS no longer knows the task
        stopping.append(rank.rank)
    if job.state is not JobState.CANCELING:
        return stopping, job.state, False
    complete = not was_starting or len(ranks) >= job.world_size
    fresh_ranks = [r for r in context.repo.get_ranks(job) if r.attempt == job.attempt]
    if complete and all(r.state.is_terminal for r in fresh_ranks):
        won = context.repo.move_job(job_id, JobState.CANCELING, JobState.CANCELED,
                                 reason="every rank stopped", actor=user, leave_queue=False)
        return stopping, JobState(context.item(job_id)["job_state"]), bool(won)
    return stopping, JobState.CANCELING, False
