"""What the control API answers a go_suspend(): 200 only for a job being suspended (the
training client then waits for its ranks to be stopped), a 409 otherwise, whatever the
recovery service's outcome says."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery.domain.states import JobState
from gpu_recovery.queue.control import ControlError, JobControlService
from gpu_recovery.recovery.ports import Outcome


class Items:
    """The job item as the control API reads it, in the state ``go_suspend`` left it."""

    def __init__(self, state: JobState) -> None:
        self.item: dict[str, Any] = {"job_id": "j", "job_state": state.value, "attempt": 1}

    def get_job_item(self, job_id: str) -> dict[str, Any] | None:
        return dict(self.item)

    def record_checkpoint(self, job_id: str, attempt: int, step: int, now: float) -> bool:
        return False


def control_after(state: JobState, outcome: Outcome) -> JobControlService:
    items = Items(JobState.SUSPENDING)

    def go_suspend(job_id: str, rank: int, attempt: int | None) -> Outcome:
        items.item["job_state"] = state.value
        return outcome

    return JobControlService(items, go_suspend, secrets=lambda job_id: "")


SUSPENDING = Outcome("suspending", "j", {"stopping_ranks": [], "state": JobState.SUSPENDING.value})


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.PENDING_HEALTHCHECK])
def test_a_job_no_longer_being_suspended_is_a_409_even_when_the_outcome_said_suspending(
        state: JobState) -> None:
    with pytest.raises(ControlError) as refused:
        control_after(state, SUSPENDING).go_suspend("j", 0, 1)
    assert refused.value.status == 409 and refused.value.code == "not_running"
    assert state.value in refused.value.message


@pytest.mark.parametrize("state", [JobState.SUSPENDING, JobState.SUSPENDED])
def test_a_job_being_suspended_or_suspended_is_a_200(state: JobState) -> None:
    answer = control_after(state, SUSPENDING).go_suspend("j", 0, 1)
    assert answer["state"] == state.value and answer["stopping_ranks"] == []
