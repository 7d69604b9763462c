"""The launches an older release's launcher left in flight, ended once after the upgrade.

Before the queue's launches went through the recovery's start fan-out, the scheduler's own
launcher started a job's ranks, with a ledger of its launches in flight on the scheduler's lease
item (``inflight.<job_id>``: the attempt) for the next tick to resume. Nothing resumes them any
more: a job caught mid-launch by the upgrade stays STARTING, with no start intent (and a stored
plan the start fan-out cannot start from). The tick reads the ledger with its lease (no extra
read) and, while it is not empty, ends each of its launches here:

* the job moved on (another attempt, the launch complete): the entry goes;
* STARTING (or RUNNING: rank 0 ran) with every rank registered: the launch is completed
  (``QueueLaunches.on_started``);
* STARTING with ranks missing: the launch is aborted as a launch the start fan-out could not
  place (``QueueLaunches.abort``: requeued at its queue order after a back-off, with the intent to
  stop its started ranks, which the stop fan-out and the recovery sweep drive; the rank it may
  have started and not registered is found by its old ``startedBy`` and stopped first);
* ended, requeued or failed by the old launcher's own abort with a stop ECS refused (no stop
  intent of the attempt): its tasks are stopped again as the old launcher's resume did (every
  registered one for an ended or requeued job; the one it may have started without registering
  it, found by its old ``startedBy``), a cancel with no live rank finished.

Each step is idempotent and the entry goes last (a conditional REMOVE): a tick dying mid-drain
leaves the entry, and the next tick finishes it. The drain keeps to the time it is given (the tick's
budget less admission's share): it takes the first entry whatever is left and each further one only
while ``ENTRY_MARGIN_SECONDS`` are left (the entry's own calls), and an entry not reached
(``deferred``) is the next tick's. An entry this tick did not drain (a step
failed: ``drain_failed``; a stop ECS refused: ``stops_pending``; not reached: ``deferred``, as
behind an entry whose calls hang tick after tick) keeps its job out of admission until it is:
each counts in ``UpgradeLaunchesNotDrained`` (a metric that stays above 0 tick after tick is a
launch someone has to look at).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import system_stop_reason
from gpu_recovery.domain import started_by
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import ENDING_JOB_STATES, LIVE_RANK_STATES, STARTED_JOB_STATES, JobState
from gpu_recovery.queue.admission import FailureKind
from gpu_recovery.recovery.ports import MetricsPort, NullMetrics
from gpu_recovery.repository.records import job_from_item
from gpu_recovery.repository.scheduling import SchedulingRepository

logger = logging.getLogger(__name__)

UPGRADE_REASON = "launch in flight when the stack was upgraded (its launcher replaced): started again"
# The entries a tick did not drain (tried and failed, or not reached in its time): each keeps its
# job out of admission meanwhile.
NOT_DRAINED = ("drain_failed", "stops_pending", "deferred")
# An entry is taken only with this much of the tick's budget left: its own calls (the job's item, its
# ranks, a ListTasks, its StopTasks, the abort's or the completion's writes) within the budget, not
# in the handler's safety margin.
ENTRY_MARGIN_SECONDS = 10.0


def old_started_by(job_id: str, attempt: int, rank: int) -> str:
    """The ``startedBy`` the older release's launcher gave a rank (``domain.started_by``)."""
    return started_by.rank_launch(started_by.QUEUE_LAUNCH, job_id, attempt, f"r{rank}", digest=12)


class StopsOrphans(Protocol):
    """``adapters.ecs.EcsAdapter``: a task looked up by its startedBy, a task stopped."""

    def tasks_started_by(self, started_by: str) -> list[str]: ...
    def stop_task(self, task_arn: str, reason: str) -> None: ...


class DrainRanks(Protocol):
    """A launch's ranks in the recovery loop's records (``repository.JobsAndRanks``)."""

    def get_ranks(self, job: Job) -> list[Rank]: ...
    def request_rank_stop(self, rank: Rank, why: str, now: float) -> bool: ...


class EndsLaunches(Protocol):
    """A queue launch's end (``recovery.queue_launches.QueueLaunches``)."""

    def on_started(self, job: Job) -> bool: ...
    def abort(self, job: Job, kind: FailureKind, reason: str) -> str: ...


@dataclass(eq=False, repr=False)
class LedgerDrain:
    store: SchedulingRepository  # the job item, the ledger entry's removal, a cancel finished
    ranks: DrainRanks
    ecs: StopsOrphans
    launches: EndsLaunches
    metrics: MetricsPort = field(default_factory=NullMetrics)  # the service's relay: the invocation's

    def run(self, ledger: Mapping[str, Mapping[str, Any]],
            time_left: Callable[[], float] = lambda: float("inf")) -> list[dict[str, str]]:
        """End every launch of ``ledger`` (job id -> entry, as read with the lease) while the
        tick's budget (``time_left``, seconds) leaves an entry's margin: the rest is deferred to
        the next tick."""
        outcomes: list[dict[str, str]] = []
        for job_id, entry in sorted(ledger.items()):
            # The first entry whatever is left (a small budget still drains, one entry a tick).
            if outcomes and time_left() < ENTRY_MARGIN_SECONDS:
                outcomes.append({"job_id": job_id, "action": "deferred"})
                continue
            try:
                action = self._drain(job_id, int(entry.get("attempt") or 0))
            except Exception:  # one launch's failure does not stop the tick: the next one retries
                logger.warning("launch of an older release not drained; the next tick tries again",
                               exc_info=True, extra={"job_id": job_id})
                action = "drain_failed"
            outcomes.append({"job_id": job_id, "action": action})
        not_drained = sum(1 for outcome in outcomes if outcome["action"] in NOT_DRAINED)
        if not_drained:
            self.metrics.add_metric("UpgradeLaunchesNotDrained", "Count", not_drained)
        return outcomes

    def _drain(self, job_id: str, attempt: int) -> str:
        item = self.store.job_item(job_id)
        if item is None or int(item.get("attempt") or 0) != attempt or item.get("launched_at") is not None:
            return self._done(job_id, attempt, "cleared")
        job = job_from_item(item)
        registered = {r.rank: r for r in self.ranks.get_ranks(job) if r.attempt == attempt}
        if job.state in STARTED_JOB_STATES and len(registered) >= job.world_size:
            self.launches.on_started(job)
            return self._done(job_id, attempt, "completed")
        if job.state in STARTED_JOB_STATES:
            # The stop fan-out stops the ranks it registered; the one it may have started without
            # registering it has no launch lease of this release's: looked up by its old startedBy.
            self._stop_orphan(job, attempt, registered)
            self.launches.abort(job, FailureKind.INSUFFICIENT_RESOURCES, UPGRADE_REASON)
            return self._done(job_id, attempt, "aborted")
        self._stop_orphan(job, attempt, registered)
        every_rank = job.state in ENDING_JOB_STATES or job.state is JobState.PENDING_RESOURCES
        all_stopped = self._stop(registered.values(), f"launch of attempt {attempt} abandoned") \
            if every_rank else True
        if job.state is JobState.CANCELING and not any(r.is_live for r in registered.values()):
            self.store.cancel_unlaunched(job_id, "canceled before any rank of the launch was running")
        if not all_stopped:
            return "stops_pending"  # the entry stays: the next tick asks again
        return self._done(job_id, attempt, "abandoned")

    def _stop_orphan(self, job: Job, attempt: int, registered: Mapping[int, Rank]) -> None:
        """The first rank not registered: the one whose task the old launcher may have started
        without registering it (one ListTasks, whatever the job's size)."""
        rank = next((r for r in range(job.world_size) if r not in registered), None)
        if rank is None:
            return
        known = {r.task_arn for r in registered.values()}
        for arn in self.ecs.tasks_started_by(old_started_by(job.job_id, attempt, rank)):
            if arn not in known:
                self.ecs.stop_task(arn, system_stop_reason(f"launch of attempt {attempt} abandoned"))

    def _stop(self, ranks: Iterable[Rank], why: str) -> bool:
        """Whether ECS took every stop (a refused one is asked again by the next tick)."""
        all_stopped = True
        for rank in ranks:
            if rank.state.is_terminal:
                continue  # its task ended: nothing to stop
            if rank.state in LIVE_RANK_STATES:
                self.ranks.request_rank_stop(rank, why, clock.now())
            try:
                self.ecs.stop_task(rank.task_arn, system_stop_reason(why))
            except Exception:
                logger.warning("could not stop a rank", exc_info=True, extra={"task": rank.task_arn})
                all_stopped = False
        return all_stopped

    def _done(self, job_id: str, attempt: int, action: str) -> str:
        self.store.drop_ledger_entry(job_id)
        logger.warning("launch of an older release drained", extra={"job_id": job_id, "attempt": attempt,
                                                                    "action": action})
        return action
