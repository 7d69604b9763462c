"""Suspend and resume by the job's owner: a running job gracefully (rank 0 is told and
checkpoints first), a waiting one at once; held until resumed at its original position."""

from __future__ import annotations

from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import JobState, queue_order
from gpu_recovery.domain.states import RECOVERY_OWNED_JOB_STATES, WAITING_JOB_STATES
from gpu_recovery.domain.time_sharing import SuspendKind, suspend_record
from gpu_recovery.queue.access import quota_subject
from gpu_recovery.queue.jobs_api.context import RACE_RETRIES, SOURCE_QUEUE, JobsApiContext
from gpu_recovery.queue.jobs_api.errors import Conflict


def suspend_job(context: JobsApiContext, job_id: str, user: str) -> dict[str, Any]:
    """The owner suspends a job: a running one gracefully (rank 0 is told, has the
    job's grace to checkpoint and call go_suspend(), then its ranks are stopped); a
    waiting one at once. Either way it is held until resumed."""
    for _ in range(RACE_RETRIES):
        item = _suspendable(context, job_id, user, "suspend")
        current = JobState(item["job_state"])
        result = {"job_id": job_id, "previous_state": current.value, "held": True}
        if current is JobState.RUNNING:
            grace = int(item.get("suspend_grace_seconds") or context.suspend_grace_seconds)
            now = clock.now()
            record = suspend_record(SuspendKind.USER, f"suspended by {user}", grace_seconds=grace,
                                    now=now, hold=True, by_user=quota_subject(user))
            if context.suspensions.request(job_id, int(item.get("attempt") or 0), suspend=record,
                                        deadline_at=now + grace, actor=user,
                                        reason=f"suspend requested by {user}; grace {grace} s"):
                return {**result, "state": JobState.SUSPENDING.value, "changed": True,
                        "deadline_at": now + grace}
            continue
        if current in WAITING_JOB_STATES or (
                current is JobState.SUSPENDED and not item.get("held")):
            record = suspend_record(SuspendKind.USER, f"suspended by {user}", grace_seconds=0,
                                    now=clock.now(), hold=True, by_user=quota_subject(user))
            if context.suspensions.hold_waiting(job_id, current, suspend=record, actor=user,
                                             reason=f"suspended by {user} while waiting: held "
                                                    "until resumed"):
                return {**result, "state": JobState.SUSPENDED.value, "changed": True}
            continue
        if current is JobState.SUSPENDING:
            held = bool((item.get("suspend") or {}).get("hold"))
            if held or context.suspensions.set_hold(job_id, True, actor=user,
                                                 reason=f"suspend by {user}: held once stopped"):
                return {**result, "state": current.value, "changed": not held}
            continue
        if current is JobState.SUSPENDED:
            return {**result, "state": current.value, "changed": False}
        raise Conflict(_not_now(job_id, current, "suspended"))
    raise Conflict(f"job {job_id} changed state repeatedly while suspending, retry")


def resume_job(context: JobsApiContext, job_id: str, user: str) -> dict[str, Any]:
    """A held job back into the queue at its original position (a suspending one once
    its ranks stopped)."""
    for _ in range(RACE_RETRIES):
        item = _suspendable(context, job_id, user, "resume")
        current = JobState(item["job_state"])
        result = {"job_id": job_id, "previous_state": current.value, "held": False}
        if current is JobState.SUSPENDED:
            if not item.get("held"):
                return {**result, "state": current.value, "changed": False}
            order = queue_order(int(item.get("priority", 0)), float(item.get("submitted_at") or 0),
                                job_id)
            if context.suspensions.resume_held(job_id, queue_order=order, actor=user,
                                            reason=f"resumed by {user}: queued again at its original "
                                                   "position"):
                context.trigger("resumed", job_id)
                return {**result, "state": current.value, "changed": True}
            continue
        if current is JobState.SUSPENDING:
            held = bool((item.get("suspend") or {}).get("hold"))
            if not held or context.suspensions.set_hold(job_id, False, actor=user,
                                                     reason=f"resumed by {user}: queued again once "
                                                            "stopped"):
                return {**result, "state": current.value, "changed": held}
            continue
        raise Conflict(_not_now(job_id, current, "resumed"))
    raise Conflict(f"job {job_id} changed state repeatedly while resuming, retry")


def _suspendable(context: JobsApiContext, job_id: str, user: str, action: str) -> dict[str, Any]:
    item = context.readable(job_id, user if context.access is not None else None, action)
    if item.get("source", SOURCE_QUEUE) != SOURCE_QUEUE:
        raise Conflict(f"job {job_id} was started on ECS directly (registered from its task tags): "
                       f"only queue jobs can be {action}ed, since only the queue can start them again")
    return item


def _not_now(job_id: str, state: JobState, action: str) -> str:
    if state.is_terminal:
        return f"job {job_id} is {state.value}: it can no longer be {action}"
    if state in RECOVERY_OWNED_JOB_STATES:
        return (f"job {job_id} is {state.value}: the recovery loop owns it; it can be {action} once it "
                "is RUNNING again")
    if action == "resumed":
        return f"job {job_id} is {state.value}: only a suspended job can be resumed"
    return f"job {job_id} is {state.value}: it can be {action} once RUNNING (or while it waits)"
