"""What the campaigns expect of a job a suspension moved (told, checkpointed, stopped and
started again elsewhere), and of a launch a broken StartTask left unplaced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .runner import CampaignResult


def unplaced_launch(result: CampaignResult) -> bool:
    """Whether the broken call was a StartTask that ECS answered with a failure (placed nothing,
    in its 200): the launch is aborted and made again as the next attempt, so the job ends one
    attempt further and the aborted attempt started short of its ranks."""
    return result.fired is not None and result.fault is not None and result.fault[1] == "ecs_failures" \
        and result.fired.operation == "StartTask"


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
