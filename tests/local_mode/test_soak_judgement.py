"""The soak's judgement of a job still running at its end (local_mode/soak.py): a job the
cluster started too late to finish its first training by then runs on; any other is stuck."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpu_recovery.constants import JobState
from local_mode.soak import SoakJob, _still_training

END = 100_000.0


def _planned(started_at: float | None, train_seconds: float = 3_600) -> SoakJob:
    return SoakJob(job_id="soak-001", ranks=2, train_seconds=train_seconds, relocatable=False,
                   app_restarts=0, fault=None, fault_after=0.0, started_at=started_at)


def _job(state: JobState, attempt: int = 1) -> Any:
    return SimpleNamespace(state=state, attempt=attempt)


@pytest.mark.parametrize(("started_at", "job", "running_on"), [
    (END - 600, _job(JobState.RUNNING), True),  # its hour of training not over at the end
    (END - 7_200, _job(JobState.RUNNING), False),  # had its hour: stuck
    (END - 600, _job(JobState.RUNNING, attempt=2), False),  # restarted: not its first training
    (END - 600, _job(JobState.PENDING_RESTART), False),  # in recovery at the end
    (None, None, False),  # never started
])
def test_a_job_running_at_the_end_runs_on_only_within_its_first_training(
        started_at: float | None, job: Any, running_on: bool) -> None:
    assert _still_training(_planned(started_at), job, END) is running_on
