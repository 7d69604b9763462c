"""Operators see a stuck job: the sweep counts the jobs long past their due time.

A job the sweep keeps moving on (its deadline re-armed every minute) is never overdue; a
job whose step fails at every sweep keeps its deadline and becomes overdue 15 minutes
after it, until a sweep moves it on again.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_recovery.constants import JobState
from gpu_recovery.domain.overdue import OVERDUE_AFTER_SECONDS, OverdueTally, is_overdue
from gpu_recovery.metric_names import METRIC_OLDEST_DUE_JOB_SECONDS, METRIC_OVERDUE_JOBS
from tests.recovery.fakes import World, world


class Metrics:
    def __init__(self) -> None:
        self.values: list[tuple[str, str, float]] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.values.append((name, unit, value))

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.values.append((name, unit, value))

    def of(self, name: str) -> list[tuple[str, float]]:
        return [(unit, value) for n, unit, value in self.values if n == name]


def _faulted(w: World, job_id: str, nodes: list[str]) -> float:
    """Rank 1 of a 2-rank job exits 1: the job waits for its health check (PENDING_HEALTHCHECK,
    a deadline a minute away). Returns that deadline."""
    arns = w.register_job(job_id, nodes)
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    item = w.repo.jobs.get_job_item(job_id)
    assert item is not None and item["job_state"] == JobState.PENDING_HEALTHCHECK.value
    return float(item["deadline_at"])


def test_a_job_whose_step_fails_at_every_sweep_is_overdue_after_15_minutes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given two jobs waiting for their health checks, one of them with a sweep step that is
    throttled at every sweep (its deadline never moves), When the sweep runs every minute,
    Then OverdueJobs is 0 until that job's deadline is 15 minutes old, then 1 (the job kept
    moving on never counts), OldestDueJobSeconds says how late it is; once its step passes
    again the sweep re-arms it and the count is back to 0."""
    with world() as w:
        metrics = Metrics()
        w.service.metrics = metrics
        stuck_deadline = _faulted(w, "stuck", ["node-a", "node-b"])
        _faulted(w, "moving", ["node-c", "node-d"])
        deadlines = w.repo._repo.deadlines  # the real repository's, under the Flaky wrapper
        rearm = deadlines.rearm_job

        def throttled(job: Any, deadline_at: float) -> bool:
            if job.job_id == "stuck":
                raise TimeoutError("UpdateItem: ThrottlingException (retries exhausted)")
            return bool(rearm(job, deadline_at))

        monkeypatch.setattr(deadlines, "rearm_job", throttled)
        counts = []
        while w.now[0] < stuck_deadline + OVERDUE_AFTER_SECONDS + 120:
            w.advance(60)
            w.service.sweep()
            (count,) = metrics.of(METRIC_OVERDUE_JOBS)[-1:]
            (oldest,) = metrics.of(METRIC_OLDEST_DUE_JOB_SECONDS)[-1:]
            assert count[0] == "Count" and oldest[0] == "Seconds"
            late = w.now[0] - stuck_deadline
            assert oldest[1] == pytest.approx(late)  # the stuck job is the oldest due one
            assert count[1] == (1 if late >= OVERDUE_AFTER_SECONDS else 0), late
            counts.append(count[1])
        assert counts[-3:] == [1, 1, 1] and counts[0] == 0
        assert w.repo.jobs.get_job("stuck").state is JobState.PENDING_HEALTHCHECK  # still stuck
        moving = w.repo.jobs.get_job_item("moving")
        assert moving is not None and float(moving["deadline_at"]) > w.now[0]  # re-armed each time

        monkeypatch.setattr(deadlines, "rearm_job", rearm)  # the throttling is over
        w.advance(60)
        w.service.sweep()  # reads it overdue one last time, then re-arms it
        assert metrics.of(METRIC_OVERDUE_JOBS)[-1] == ("Count", 1)
        w.advance(60)
        w.service.sweep()
        assert metrics.of(METRIC_OVERDUE_JOBS)[-1] == ("Count", 0)
        assert metrics.of(METRIC_OLDEST_DUE_JOB_SECONDS)[-1][1] <= 60


def test_nothing_due_is_counted_as_none_overdue_and_a_sweep_out_of_time_says_nothing() -> None:
    """A sweep that read its due job items (none due) reports 0 overdue, 0 s late; a sweep
    with no time left reads nothing and reports nothing (no data: not a false 0)."""
    with world() as w:
        metrics = Metrics()
        w.service.metrics = metrics
        w.service.sweep()
        assert metrics.of(METRIC_OVERDUE_JOBS) == [("Count", 0)]
        assert metrics.of(METRIC_OLDEST_DUE_JOB_SECONDS) == [("Seconds", 0)]
        w.service.sweep(lambda: 0.0)
        assert len(metrics.of(METRIC_OVERDUE_JOBS)) == 1


def test_the_overdue_rule() -> None:
    now = 10_000.0
    assert is_overdue(now - OVERDUE_AFTER_SECONDS, now)
    assert not is_overdue(now - OVERDUE_AFTER_SECONDS + 1, now)
    assert not is_overdue(now + 60, now)  # not even due
    tally = OverdueTally(now)
    assert not tally.read
    tally.add_page([now - 3600, now - 900, now - 899, now - 1])
    tally.add_page([])
    assert (tally.read, tally.pages, tally.overdue, tally.oldest_due_seconds) == (True, 2, 2, 3600)
