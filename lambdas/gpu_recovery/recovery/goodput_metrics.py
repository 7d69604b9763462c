"""A finished job's goodput ledger as CloudWatch metrics (EMF through Powertools): the
GPU-hours it lost per cause (one metric, a ``Cause`` dimension: cause names only, never a
job or a node, so the series stay few) and its ETTR, for the dashboard and alarms
(docs/goodput.md). Emitted once per job end: only by the write that won the job's terminal
transition, after its commit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain.goodput_report import job_end_figures
from gpu_recovery.metric_names import DIMENSION_CAUSE, METRIC_GPU_HOURS_LOST, METRIC_JOB_ETTR
from gpu_recovery.recovery.ports import MetricsPort, after_commit


class JobItems(Protocol):
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


def ended(metrics: MetricsPort, jobs: JobItems, job_id: str, won: bool) -> bool:
    """``won``: the job's terminal transition committed by this call (a redelivered event
    loses its conditional write, and emits nothing). Returns ``won``."""
    if won:
        after_commit("goodput metrics", emit_job_end, metrics, partial(jobs.get_job_item, job_id))
    return won


def job_failed(metrics: MetricsPort, jobs: JobItems, job_id: str) -> None:
    """A job's FAILED transition committed by this call: the Failures count and its goodput."""
    metrics.add_metric("Failures", "Count", 1)
    ended(metrics, jobs, job_id, True)


def emit_job_end(metrics: MetricsPort, read_item: Callable[[], Mapping[str, Any] | None]) -> None:
    """``read_item``: the ended job's item, read after its terminal write."""
    item = read_item()
    if item is None:
        return
    lost, ettr = job_end_figures(item, clock.now())
    by_cause = getattr(metrics, "add_dimensioned_metric", None)
    if by_cause is not None:  # the plain test doubles have no dimensions: the per-cause figures need them
        for cause, gpu_hours in sorted(lost.items()):
            by_cause(METRIC_GPU_HOURS_LOST, "None", gpu_hours, {DIMENSION_CAUSE: cause})
    if ettr is not None:
        metrics.add_metric(METRIC_JOB_ETTR, "Percent", ettr)
