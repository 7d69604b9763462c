"""What the campaigns expect of a job a suspension moved (told, checkpointed, stopped and
started again elsewhere), and of a launch aborted and made again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState

from .runner import CampaignResult


def relaunches(result: CampaignResult, job: Mapping[str, Any]) -> int:
    """How many launches of ``job`` the run's failures explain aborting and making again (each
    one attempt more, the aborted one started short of its ranks): one when the broken call was
    a StartTask that ECS answered with a failure (placed nothing, in its 200); with calls failing
    at random, each launch of the job given up (its starts kept failing) or not placed."""
    if result.fired is not None and result.fault is not None and result.fault[1] == "ecs_failures" \
            and result.fired.operation == "StartTask":
        return 1
    if result.failing is None:
        return 0
    return sum(1 for entry in job.get("history") or []
               if entry.get("from") == JobState.STARTING.value
               and entry.get("to") in (JobState.PENDING_RESOURCES.value, JobState.QUEUED.value))


def ran_on(task: Any, job: Mapping[str, Any]) -> bool:
    """Whether ``task`` (an attempt's training task) ran on after its attempt ended, never stopped
    by the stack: a task that exited by itself before then was never the stack's to stop."""
    if task.stop_code == "UserInitiated":
        return False
    if task.stopped_at is None:
        return True
    attempt = task.tags.get(C.TAG_ATTEMPT)
    # Its attempt's launch: an admission, or a suspended job's resume (queue/launcher.py).
    launched = (f"admitted: attempt {attempt} ", "resumed (resume ")
    history = list(job.get("history") or [])
    for index, entry in enumerate(history):
        reason = str(entry.get("reason") or "")
        if reason.startswith(launched[0]) or (reason.startswith(launched[1])
                                              and f", attempt {attempt}) " in reason):
            ended = next((float(later["at"]) for later in history[index + 1:]
                          if later.get("to") not in (JobState.STARTING.value, JobState.RUNNING.value)), None)
            return ended is None or float(task.stopped_at) > ended
    return True


def moved_once(job: Mapping[str, Any], label: str = "job") -> list[str]:
    """The problem of a job a suspension moved (its ranks told, stopped and started again):
    suspended and resumed once each, or not."""
    if int(job.get("suspend_count") or 0) == 1 and int(job.get("resume_count") or 0) == 1:
        return []
    return [f"{label} suspended {job.get('suspend_count')} / resumed {job.get('resume_count')} "
            "time(s) (want 1 / 1)"]


def saved_once(checkpoints: int) -> list[str]:
    """The problem of rank 0's checkpoints once told to suspend: one, not none or several."""
    return [] if checkpoints == 1 else [f"rank 0 saved {checkpoints} checkpoint(s) (want 1)"]


def one_move(job: Mapping[str, Any]) -> list[str]:
    """The problem of a moved job's moves: not one, made at its checkpoint."""
    moves = [m.get("outcome") for m in job.get("moves") or []]
    return [] if moves == ["moved"] else \
        [f"moves {moves} (want ['moved']: at its checkpoint, not stopped at the deadline)"]
