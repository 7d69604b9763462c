"""Stage: a queue launch's outcome, told by the start fan-out that starts its ranks
(``recovery.gang``, intent kind ``launch``: the scheduler's claim committed it).

* every rank registered (``RanksStarted``): the launch is complete (``launched_at``, the
  attempt's entry); the job goes RUNNING when its ranks run (the task events, or here when
  rank 0 ran first);
* a rank not placed (``RankNotPlaced``): the launch is aborted. A placement failure
  (``RESOURCE:GPU``, a node gone ...) is INSUFFICIENT_RESOURCES: the job goes back to
  PENDING_RESOURCES at its original (a relocated job's ahead of its priority) queue order, after
  a back-off (60 s doubling to 10 min); anything else fails it (FAILED and e-mailed, as a job
  whose claim found its task definition unusable: :meth:`QueueLaunches.fail_unstarted`). The
  abort's transition commits the intent to stop the ranks already started (``stop_fanout``): the
  stop fan-out stops them and the sweep drives it to its end; the job is not admitted again
  before.
* the sweep (:meth:`QueueLaunches.resume`): a launch whose ranks are all registered is
  completed (their events lost); one whose intent was never sent (its tick died) or has not
  finished after a while is sent again (batches skip what is done); one still not complete
  after its resends is given up: requeued with the back-off of a placement failure (nothing
  says the job cannot run), only while it is still STARTING and not complete (in the write).
  The job's consecutive give-ups are counted on its item (``launch_give_ups``, in that write;
  0 again once a launch completes, untouched by a placement failure): the
  ``LAUNCH_GIVE_UP_LIMIT``-th in a row fails the job instead (FAILED, its started ranks stopped
  as any failed launch's, the ``failed`` e-mail owed in the same write): something keeps its
  launches from completing, and requeuing it every few minutes would hide that for good.

Every abort applied counts in the recovery's ``LaunchesAborted`` metric, wherever it happens (a
tick's inline launch, the gang worker's batch, the sweep).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import (
    RETRY_INTERVAL_SECONDS,
    NotificationKind,
    queue_order,
    relocated_queue_order,
)
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.rank_template import LAUNCH, RankTemplate, intent_kind
from gpu_recovery.domain.states import JobState, RankState
from gpu_recovery.recovery.fanout_send import RESEND_AFTER_SECONDS, by_the_nearest_sweep, resend_due
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.goodput_metrics import job_failed
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.records import job_from_item
from gpu_recovery.repository.scheduling import LAUNCH_GIVE_UPS, SchedulingRepository

if TYPE_CHECKING:
    from gpu_recovery.queue.admission import FailureKind

logger = logging.getLogger(__name__)

# A launch not complete after this many resends of its intent (and one more per 256 ranks) is
# given up (requeued; the job failed at its LAUNCH_GIVE_UP_LIMIT-th give-up in a row).
MAX_LAUNCH_RESENDS = 3
# A job whose launch is given up this many times in a row (no launch of it completed between) is
# FAILED at that give-up rather than requeued: only lack of resources is retried silently.
LAUNCH_GIVE_UP_LIMIT = 3
# What the failed job's reason and e-mail point at: what keeps a launch from completing.
GIVE_UP_CAUSES = ("its ranks' StartTask calls kept failing as transient (throttled, ECS unavailable) "
                  "or their starts died before registering every rank")
GIVE_UP_ACTION = ("Look at the recovery sweep's and the gang worker's logs for this job (StartTask "
                  "refused or throttled, a start that died) and at ECS's health and StartTask throttling "
                  "in the cluster's region; then resubmit the job (gpujobs submit).")

# A launch failed by its start: what its e-mail says, and what to do (by the failure's kind).
START_FAILED_HEADLINE = "Job failed: its ranks could not start"
USER_ERROR_ACTION = ("The reason names what ECS refused (the task definition, its image, an override, an "
                     "attribute no node offers): fix it in the job's task definition, then resubmit the job "
                     "(gpujobs submit).")
START_REFUSED_ACTION = ("The reason quotes why ECS did not place the rank: look at the node it names and at "
                        "the job's task definition, then resubmit the job (gpujobs submit).")


def _start_failed(item: dict[str, Any], attempt: int, kind: FailureKind, reason: str,
                  now: float) -> list[dict[str, Any]]:
    """The job's attempt records with ``attempt`` ended START_FAILED now (started at its claim)."""
    from gpu_recovery.queue.attempts import with_entry  # as on_started's import

    entry = {"attempt": attempt, "started_at": item.get("launch_claimed_at", now), "ended_at": now,
             "outcome": "START_FAILED", "failure_kind": kind.value, "reason": reason[:500]}
    return with_entry(item.get("attempts"), entry)


class LaunchInterrupted(Exception):
    """A launch's StartTask failed with a transient error: nothing decided, tried again later."""


def is_launch(job: Job) -> bool:
    """The job's start intent is a queue launch's (not a gang restart's)."""
    return bool(job.start_fanout) and intent_kind(job.start_fanout) == LAUNCH


class LaunchData(Protocol):
    """A launch's job and its rank 0."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_rank(self, job_id: str, rank: int) -> Rank | None: ...


class RearmsJob(Protocol):
    def rearm_job(self, job: Job, deadline_at: float) -> bool: ...


@dataclass(eq=False, repr=False)
class QueueLaunches:
    data: LaunchData
    store: SchedulingRepository  # the launch's transitions (finish, requeue, fail)
    latches: LatchRepository
    deadlines: RearmsJob
    gang: GangOps
    restarts: GangRestart  # STARTING -> RUNNING once every rank is registered
    notices: Notices  # a job a launch fails is e-mailed

    # ------------------------------------------------------------- completion
    def on_started(self, job: Job) -> bool:
        """Every rank of the launch registered: the launch is complete (once); RUNNING too if
        rank 0 already runs (its RUNNING event came before the last registration)."""
        # The queue's attempt records: imported here, only a launch's end needs them (every
        # recovery function builds this stage; their cold starts load no queue module).
        from gpu_recovery.queue.attempts import with_entry

        item = self.store.job_item(job.job_id) or {}
        if int(item.get("attempt") or 0) != job.attempt or item.get("launched_at") is not None:
            return False
        now = clock.now()
        entry = {"attempt": job.attempt, "started_at": item.get("launch_claimed_at", now), "ended_at": None,
                 "outcome": "STARTED", "failure_kind": "", "reason": ""}
        attempts = with_entry(item.get("attempts"), entry)
        if not self.store.finish_launch(job.job_id, job.attempt, attempts, now):
            # Canceled (or ended) meanwhile: its stop intent sent again, for the ranks registered
            # after the cancel read them.
            fresh = self.data.get_job(job.job_id)
            if fresh is not None and fresh.stop_fanout:
                self.gang.stop(fresh)
            return False
        logger.info("job launched", extra={"job_id": job.job_id, "attempt": job.attempt})
        rank0 = self.data.get_rank(job.job_id, 0)
        if rank0 is not None and rank0.attempt == job.attempt and rank0.state is RankState.RUNNING:
            self.restarts.confirm_running(job, "every rank registered, rank 0 running")
        return True

    # ---------------------------------------------------------------- abort
    def start_failed(self, job: Job, rank: RankTemplate, why: str, error_code: str = "") -> None:
        """A rank of the launch could not be placed: the launch is aborted (requeued or failed),
        the ranks it started stopped through the stop fan-out. Its StartTask refused with an API
        error (``error_code``): a task definition or override error fails it (USER_ERROR), a
        transient one leaves it to the sweep's resend."""
        from gpu_recovery.queue.admission import FailureKind, classify_failure  # as on_started's import

        # Not started: its lease ended with the start that failed (``recovery.gang``).
        if error_code:
            kind = classify_failure(error_code=error_code, error_message=why)
            if kind is FailureKind.UNKNOWN:
                # Throttled, or ECS unavailable: the start fails (the tick's outcome is
                # "interrupted", a queued batch is delivered again), the sweep sends it again.
                raise LaunchInterrupted(f"launch of {job.job_id} interrupted: {why}")
            self.abort(job, kind, why)
            return
        reasons = [r.strip() for r in why.split(",") if r.strip()] if why != "no placement" else []
        kind = classify_failure(placement_reasons=reasons or ["UNKNOWN"])
        self.abort(job, kind, f"StartTask on {rank.container_instance_arn} failed: {why}")

    def abort(self, job: Job, kind: FailureKind, reason: str, *, given_up: bool = False) -> str:
        """End the launch short: requeued (INSUFFICIENT_RESOURCES, or ``given_up``: the sweep's
        give-up, only while the job is still STARTING) or failed (the ``LAUNCH_GIVE_UP_LIMIT``-th
        give-up in a row too); never once it is complete. Its started ranks stopped (the intent in
        the same write, sent at once)."""
        from gpu_recovery.queue.admission import FailureKind, backoff_seconds  # as on_started's import

        item = self.store.job_item(job.job_id) or {}
        if int(item.get("attempt") or 0) != job.attempt:
            return "raced"
        now = clock.now()
        attempts = _start_failed(item, job.attempt, kind, reason, now)
        stop_why = f"launch of attempt {job.attempt} failed ({kind.value})"
        give_ups = int(item.get(LAUNCH_GIVE_UPS) or 0) + 1 if given_up else None
        if give_ups is not None and give_ups >= LAUNCH_GIVE_UP_LIMIT:
            applied = self._fail_given_up(job, give_ups, kind, reason, attempts, stop_why)
            action = "failed"
        elif kind is FailureKind.INSUFFICIENT_RESOURCES or given_up:
            failures = int(item.get("resource_failures", 0)) + 1
            delay = backoff_seconds(failures)
            ordered = relocated_queue_order if (item.get("launch") or {}).get("relocated") else queue_order
            order = ordered(int(item.get("priority", 0)), float(item.get("submitted_at", 0.0)), job.job_id)
            applied = self.store.requeue_after_failed_launch(
                job.job_id, job.attempt, reason=f"start failed ({kind.value}): {reason}; retry in {delay} s",
                queue_order=order, not_before=now + delay, resource_failures=failures, attempts=attempts,
                stop_why=stop_why, given_up=given_up, give_ups=give_ups)
            action = "requeued"
        else:
            action_text = USER_ERROR_ACTION if kind is FailureKind.USER_ERROR else START_REFUSED_ACTION
            applied = self._fail_told(job, kind, f"start failed ({kind.value}): {reason}", attempts, stop_why,
                                      headline=START_FAILED_HEADLINE, action=action_text)
            action = "failed"
        if applied:
            self.gang.metrics.add_metric("LaunchesAborted", "Count", 1)
            logger.warning("launch failed", extra={"job_id": job.job_id, "attempt": job.attempt,
                                                   "kind": kind.value, "reason": reason, "action": action})
        fresh = self.data.get_job(job.job_id)
        if fresh is None or not fresh.stop_fanout:
            return action if applied else "raced"
        # Typically a cancel that landed during the launch when not applied: its own stop intent,
        # sent again (a rank registered after the cancel read the ranks is stopped too).
        try:
            sent = self.gang.stop(fresh)
        except Exception:  # the sweep sends an unsent stop intent
            logger.warning("stop of an aborted launch not sent; the sweep sends it", exc_info=True,
                           extra={"job_id": job.job_id})
            return action if applied else "raced"
        if sent and self.gang.inline(fresh):
            # Every start of the launch ran in this invocation and ECS took every stop: nothing of
            # it is left to stop (as a failed launch was, before the start fan-out), and the job
            # may be admitted again after its back-off. A cancel's own intent ends with its ranks.
            if applied:  # unless a start in flight holds a lease of it (the sweep ends it then)
                self.gang.end_aborted_launch(fresh, job.attempt, sent.stopped)
            elif fresh.state is JobState.CANCELING and not self._live_ranks(fresh):
                self.store.cancel_unlaunched(job.job_id, "canceled before any rank of the launch was running")
        return action if applied else "raced"

    def _fail_given_up(self, job: Job, give_ups: int, kind: FailureKind, why: str,
                       attempts: list[dict[str, Any]], stop_why: str) -> bool:
        """The job's launches given up ``give_ups`` times in a row: FAILED (only while it is still
        STARTING and not complete, as the give-up's requeue), told (``_fail_told``)."""
        reason = f"launch did not complete {give_ups} times in a row: {GIVE_UP_CAUSES} (this attempt: {why})"
        return self._fail_told(job, kind, reason, attempts, stop_why, give_ups=give_ups,
                               headline="Job failed: its launch never completed", action=GIVE_UP_ACTION)

    def fail_unstarted(self, job_id: str, attempt: int, why: str) -> bool:
        """The scheduler's claim of attempt ``attempt`` found the job's task definition unusable
        (unknown, INACTIVE): FAILED before any rank started (USER_ERROR, never retried), told."""
        from gpu_recovery.queue.admission import FailureKind  # as on_started's import

        item = self.store.job_item(job_id)
        if item is None or int(item.get("attempt") or 0) != attempt:
            return False
        kind = FailureKind.USER_ERROR
        return self._fail_told(job_from_item(item), kind, f"start failed ({kind.value}): {why}",
                               _start_failed(item, attempt, kind, why, clock.now()), "",
                               headline=START_FAILED_HEADLINE, action=USER_ERROR_ACTION)

    def _fail_told(self, job: Job, kind: FailureKind, reason: str, attempts: list[dict[str, Any]],
                   stop_why: str, *, headline: str, action: str, give_ups: int | None = None) -> bool:
        """A launch that fails its job: FAILED, its started ranks' stop intent (``stop_why``) and
        the owner's and operators' e-mail owed in the same write, sent after it (a redelivery that
        loses the write owes nothing), the job's Failures and goodput counted. Every launch that
        fails a job ends here: no job fails silently."""
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason), None, NotificationKind.FAILED,
            headline, what_happened=reason, what_was_done="Job marked FAILED", operator_action=action)
        if not self.store.fail_launch(job.job_id, job.attempt, reason=reason, failure_kind=kind.value,
                                      attempts=attempts, stop_why=stop_why, give_ups=give_ups,
                                      owed=self.notices.owe([notice])):
            return False
        self.notices.send([notice])
        job_failed(self.gang.metrics, self.store.repo, job.job_id)
        return True

    def _live_ranks(self, job: Job) -> bool:
        return any(r.attempt == job.attempt and r.is_live for r in self.gang.data.get_rank_range(
            job.job_id, 0, job.world_size))

    # ---------------------------------------------------------------- sweep
    def resume(self, job: Job) -> str:
        """The sweep: complete a launch whose ranks are all registered, send its intent again if
        it was never sent or has not finished after a while."""
        if Latch.REGISTERED in self.latches.complete(job.job_id, job.attempt, job.world_size):
            # Complete: nothing to send or give up (not confirmed: the job moved on meanwhile).
            self.on_started(job)
            if self.restarts.confirm_running(job, "every rank registered (confirmed by the sweep)"):
                return "launch_confirmed"
            return "launch_moved_on"
        now = clock.now()
        # A launch that never completes (its StartTasks failing over and over) ends: requeued,
        # with a back-off, as a placement failure (the job may run later), or failed once its
        # launches were given up LAUNCH_GIVE_UP_LIMIT times in a row. Only while it is still
        # STARTING and not complete (in the write: a launch completing meanwhile runs on).
        claimed_at = float(job.start_fanout.get("at") or now)
        give_up_at = claimed_at + RESEND_AFTER_SECONDS * (MAX_LAUNCH_RESENDS + 1 + job.world_size // 256)
        # The sweep nearest that time gives up, as ``resend_due`` resends: the claim is recorded
        # seconds into its invocation, and the sweep a second short of it resent once more.
        if is_launch(job) and by_the_nearest_sweep(give_up_at, now):
            from gpu_recovery.queue.admission import FailureKind  # as on_started's import

            why = f"launch did not complete after {int(now - claimed_at)} s"
            action = self.abort(job, FailureKind.UNKNOWN, why, given_up=True)
            return {"requeued": "launch_given_up", "failed": "launch_given_up_failed"}.get(
                action, "launch_moved_on")
        action = "launch_waiting"
        if is_launch(job) and resend_due(job.start_fanout, now):
            action = "launch_resuming"
            try:
                self.gang.start(job)
            except Exception:
                logger.warning("launch not resent; the sweep tries again", exc_info=True,
                               extra={"job_id": job.job_id})
        fresh = self.data.get_job(job.job_id)
        if fresh is not None and fresh.state is JobState.STARTING and fresh.attempt == job.attempt:
            self.deadlines.rearm_job(fresh, now + RETRY_INTERVAL_SECONDS)
        return action


