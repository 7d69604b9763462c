"""Stage 6: suspending a queue job (time sharing), crash-consistent like the others.

RUNNING -> SUSPENDING (the scheduler preempts it, its owner suspends it, or one of its
ranks calls ``go_suspend()``): rank 0 learns it from the control API and has the job's
grace to checkpoint. Then every rank is stopped: at once when a rank calls
``go_suspend()``, by force when the grace is over (the sweep). The intent to stop is
committed first (``suspend.stop_requested_at``), each rank is marked STOP_REQUESTED
before its StopTask, and StopTask is idempotent: a delivery that dies anywhere leaves a
deadline the sweep finishes. Once every rank of the attempt is STOPPED: SUSPENDED,
queued again at its original position (or held, for a user's suspend). A suspension
spends no recovery and no retry.

A **move** off a node with a driver warning (kind ``moved``, asked by ``recovery.warnings``)
is the same suspend with two differences: once every rank stopped the job goes back to the
queue at the **head of its priority** (as a relocation: the scheduler restarts it on healthy
nodes or a spare, from its checkpoint), with the move on its item (``moves``) and an e-mail
saying what it avoided; and when its bound passes without go_suspend() it is **not** stopped
by force: it keeps running (SUSPENDING -> RUNNING), its node cordoned and repaired once it
leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.constants import (
    NOTICE_RETRY_SECONDS,
    RETRY_INTERVAL_SECONDS,
    NotificationKind,
    queue_order,
    relocated_queue_order,
)
from gpu_recovery.domain.gpu_warnings import MAX_MOVES_KEPT, avoided, move_record
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import JobState
from gpu_recovery.domain.time_sharing import SuspendKind, priority_name, suspend_record
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.deadline_calls import TaskStopper, stop_first
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.goodput_metrics import job_failed
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, Outcome, after_commit
from gpu_recovery.recovery.reactions import JobLeftNode, Reactions
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository

logger = logging.getLogger(__name__)

# A go_suspend() whose stop lost to the move's decline (the job RUNNING again) asks once more.
GO_SUSPEND_ROUNDS = 2
# A finish that lost to the owner's suspend or resume (the hold changed) is read and made again.
FINISH_ROUNDS = 3
# A suspension failed with ranks not confirmed stopped names this many of them (and their nodes).
NAMED_UNSTOPPED_RANKS = 8


def _retry_after(job: Job) -> int:
    return NOTICE_RETRY_SECONDS if (job.suspend.get("avoid") or {}).get("notice") else RETRY_INTERVAL_SECONDS


class SuspensionReads(Protocol):
    """Besides its own intents (``SuspensionRepository``): the job, its ranks and their latch
    (and the job's item, for its goodput metrics once it ended)."""

    latches: LatchRepository

    def get_job(self, job_id: str) -> Job | None: ...
    def get_ranks_numbered(self, job_id: str, numbers: Iterable[int]) -> list[Rank]: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...
    def live_ranks_on_instance(self, container_inst_id: str) -> list[Rank]: ...
    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool: ...


@dataclass(eq=False, repr=False)
class Suspensions:
    data: SuspensionReads
    store: SuspensionRepository
    notices: Notices
    gang: GangOps
    ecs: TaskStopper  # a move off a node AWS takes: its rank there asked first
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    # Told: a job moved off a node (a warned node may be repaired now).
    reactions: Reactions = field(default_factory=Reactions)

    # ----------------------------------------------------------------- request
    def request(self, job_id: str, attempt: int, *, kind: SuspendKind, reason: str, grace_seconds: int,
                actor: str, hold: bool = False, by_job: str = "", by_user: str = "",
                by_priority: int | None = None) -> bool:
        """RUNNING -> SUSPENDING; rank 0 has ``grace_seconds`` to checkpoint and call
        ``go_suspend()`` before the ranks are stopped by force."""
        now = clock.now()
        suspend = suspend_record(kind, reason, grace_seconds=grace_seconds, now=now, hold=hold,
                                 by_job=by_job, by_user=by_user, by_priority=by_priority)
        history = f"suspend requested ({kind.value}): {reason}; grace {grace_seconds} s"
        done = self.store.request(job_id, attempt, suspend=suspend, deadline_at=now + grace_seconds,
                                  reason=history, actor=actor)
        if done:
            self.metrics.add_metric("SuspendsRequested", "Count", 1)
            logger.info("suspend requested", extra={"job_id": job_id, "kind": kind.value, "why": reason})
        return done

    def go_suspend(self, job_id: str, rank: int, attempt: int | None = None) -> Outcome:
        """A rank called ``go_suspend()``: suspend the job at once (seed: any rank may).
        "suspending" only once the stop of this attempt's ranks is committed (the caller then
        waits to be stopped): a move declined under the call (SUSPENDING -> RUNNING, the stop's
        write refused) is suspended as the job's own, like a RUNNING job's go_suspend()."""
        job = self.data.get_job(job_id)
        if job is None:
            return Outcome("ignored", job_id, {"why": "job not found"})
        if attempt is not None and job.attempt != attempt:
            return Outcome("ignored", job_id, {"why": "older attempt", "state": job.state.value})
        why = f"rank {rank} called go_suspend()"
        ours = job.attempt
        for _ in range(GO_SUSPEND_ROUNDS):
            if job.state is JobState.RUNNING:
                self.request(job.job_id, job.attempt, kind=SuspendKind.SELF, reason=why, grace_seconds=0,
                             actor=f"rank {rank}")
                job = self.data.get_job(job_id) or job
            if job.state is not JobState.SUSPENDING or job.attempt != ours:
                break
            stopping, job = self._stop(job, why=why, actor=f"rank {rank}")
            if job.state is not JobState.RUNNING or job.attempt != ours:
                return Outcome("suspending", job_id, {"stopping_ranks": stopping, "state": job.state.value})
        return Outcome("ignored", job_id, {"why": f"job is {job.state.value}", "state": job.state.value})

    # -------------------------------------------------------------------- stop
    def stop(self, job: Job, *, why: str, actor: str, forced: bool = False) -> list[int]:
        """Commit the intent to stop every rank (once), then send its fan-out (idempotent;
        the sweep sends it if this delivery dies)."""
        return self._stop(job, why=why, actor=actor, forced=forced)[0]

    def _stop(self, job: Job, *, why: str, actor: str, forced: bool = False) -> tuple[list[int], Job]:
        """``stop``, with the job as read after the intent (not SUSPENDING: nothing sent)."""
        now = clock.now()
        if not job.suspend_stopping:
            if self.store.record_stop(job.job_id, job.attempt, now=now, why=why,
                                      deadline_at=now + _retry_after(job), actor=actor) and forced:
                self.metrics.add_metric("SuspendsForced", "Count", 1)
            job = self.data.get_job(job.job_id) or job
            if job.state is not JobState.SUSPENDING:
                return [], job
        if job.stop_fanout.get("sent_at"):
            return [], job
        self._stop_on_announced_node(job, why)
        return self.gang.stop(job).stopped, job

    def _stop_on_announced_node(self, job: Job, why: str) -> None:
        """A move off a node AWS takes (``recovery.aws_notices``): the job's ranks there are asked
        before the gang's others (the deadline is theirs; a large gang's stop is paced). One Query
        of the node's ranks; a failure leaves them to the gang's stop."""
        avoid = job.suspend.get("avoid") or {}
        if not avoid.get("notice") or not avoid.get("node"):
            return
        try:
            ranks = twice(partial(self.data.live_ranks_on_instance, str(avoid["node"])))
        except (ClientError, BotoCoreError) as error:
            logger.warning("the ranks on the announced node not read: the gang's stop asks them",
                           extra={"job_id": job.job_id, "error": str(error)})
            return
        ours = [r for r in ranks if r.job_id == job.job_id and r.attempt == job.attempt]
        stop_first(ours, str(job.stop_fanout.get("why") or why), self.data, self.ecs, watched=True)

    # ---------------------------------------------------------------- converge
    def converge(self, job: Job, *, reissue: bool) -> str:
        """What a SUSPENDING job still needs: SUSPENDED once every rank stopped; the stops
        asked again; or, the grace being over, the ranks stopped by force."""
        if job.state is not JobState.SUSPENDING:
            return "not_suspending"
        if Latch.ENDED in self.data.latches.complete(job.job_id, job.attempt, job.world_size):
            return "suspended" if self.finish(job) else "raced"
        now = clock.now()
        if job.suspend_stopping:
            if reissue and self.gang.stop_due(job, now) == "stop_given_up":
                # The stop rounds are spent and a rank is still not confirmed stopped (its node
                # lost: ECS never reports its task STOPPED): it cannot be resumed elsewhere.
                return "failed" if self.fail_unstopped(job) else "raced"
            if not reissue and not job.stop_fanout.get("sent_at"):
                self.gang.stop(job)
            return "stopping"
        deadline = float(job.suspend.get("deadline_at") or 0)
        if now >= deadline and _declinable(job):
            if self.decline(job):
                return "move_declined"
            fresh = self.data.get_job(job.job_id)  # held meanwhile? then stopped like one
            if fresh is None or fresh.state is not JobState.SUSPENDING or fresh.attempt != job.attempt \
                    or fresh.suspend_stopping or _declinable(fresh):
                return "raced"
            job = fresh
        # A move off a node AWS takes away (``recovery.aws_notices``) is not declined: its ranks
        # are stopped before AWS takes the node (the job requeued at the head of its priority).
        # Nor is a move its owner holds (``gpujobs suspend``): stopped like the owner's suspend.
        if now >= deadline:
            grace = int(job.suspend.get("grace_seconds") or 0)
            self.stop(job, why=f"grace of {grace} s over without go_suspend(): stopped by force",
                      actor="recovery", forced=True)
            return "forced"
        return "grace"

    def fail_unstopped(self, job: Job) -> bool:
        """The stop fan-out's rounds are spent and a rank of the attempt is still not confirmed
        stopped (its node lost: StopTask went to a disconnected agent). The job cannot be resumed
        elsewhere (a rank still running could write its checkpoint), so it fails as a RUNNING job
        whose rank cannot be confirmed stopped does: FAILED (no longer holding nodes: the
        scheduler's tick releases its quota charge), its owner e-mailed. The spent stop intent
        stays for the sweep to end (a deadline now). Conditional on the job still SUSPENDING
        on this attempt with its rounds spent: a last STOPPED event that finished it first wins."""
        attempt = job.attempt
        # The latch's shards say which ranks are not confirmed stopped; only the few named are
        # read (every rank's item would be world_size reads in one sweep).
        unstopped = sorted(self.data.latches.registered_not_ended(job.job_id, attempt, job.world_size))
        named = [r for r in self.data.get_ranks_numbered(job.job_id, unstopped[:NAMED_UNSTOPPED_RANKS])
                 if r.attempt == attempt]
        more = len(unstopped) - len(named)
        names = ", ".join(f"rank {r.rank} on {r.container_inst_id or '?'}" for r in named) \
            + (f" and {more} more" if named and more > 0 else "")
        rounds = int(job.stop_fanout.get("rounds") or 0)
        nodes = sorted({r.container_inst_id for r in named if r.container_inst_id})
        check = ", ".join(nodes) or "the node"
        if named and more > 0:
            check += f" (and the nodes of the {more} other ranks not confirmed stopped)"
        reason = (f"suspension could not be completed ({_cause(job.suspend)}): {names or 'a rank'} not "
                  f"confirmed stopped after {1 + rounds} StopTask rounds (its node lost: ECS never "
                  "reported the task STOPPED); the job cannot be resumed elsewhere (a rank still "
                  "running could write its checkpoint)")
        now = clock.now()
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason), None, NotificationKind.FAILED,
            "Job failed: its suspension could not be completed", what_happened=reason,
            what_was_done="Job marked FAILED",
            operator_action=(f"Check {check} (network, ECS agent, power): ECS "
                             "stops the task once its agent reconnects. Resubmit the job (from its last "
                             "checkpoint)."))
        if not self.store.fail_unstopped(job.job_id, attempt, reason=reason, rounds=rounds, now=now,
                                         also=self.notices.owe([notice], now)):
            return False
        self.notices.send([notice])
        job_failed(self.metrics, self.data, job.job_id)
        logger.warning("suspension not completed: job failed", extra={
            "job_id": job.job_id, "unstopped": unstopped[:20], "nodes": nodes})
        return True

    def sweep(self, job: Job, now: float) -> str:
        """The deadline of a SUSPENDING job passed: converge, then look again in a minute."""
        action = self.converge(job, reissue=True)
        if action in ("grace", "stopping", "forced"):
            fresh = self.data.get_job(job.job_id)
            if fresh is not None and fresh.state is JobState.SUSPENDING:
                deadline = float(fresh.suspend.get("deadline_at") or 0)
                in_grace = not fresh.suspend_stopping and deadline > now
                self.store.rearm(job.job_id, fresh.attempt,
                                 deadline if in_grace else now + _retry_after(fresh))
        return f"suspend_{action}"

    def finish(self, job: Job) -> bool:
        """SUSPENDED, every rank stopped: queued again or held, as the owner's hold stands when
        it commits (a ``gpujobs suspend`` or ``resume`` that lands after the read: read again)."""
        for _ in range(FINISH_ROUNDS):
            if self._finish(job):
                return True
            fresh = self.data.get_job(job.job_id)
            if fresh is None or fresh.state is not JobState.SUSPENDING or fresh.attempt != job.attempt \
                    or _held(fresh) == _held(job):
                return False
            job = fresh
        return False

    def _finish(self, job: Job) -> bool:
        if job.suspend.get("kind") == SuspendKind.MOVED.value:
            return self._moved(job)
        item = self.store.job_item(job.job_id) or {}
        hold = _held(job)
        order = queue_order(int(item.get("priority", 0)), float(item.get("submitted_at") or 0.0), job.job_id)
        kind = str(job.suspend.get("kind") or "")
        cause = _cause(job.suspend)
        where = "held until resumed (gpujobs resume)" if hold else \
            "queued again at its original position"
        done = self.store.finish(job.job_id, job.attempt, queue_order=order, hold=hold,
                                 reason=f"suspended ({cause}): every rank stopped, GPUs free; {where}")
        if done:
            self.metrics.add_metric("JobsSuspended", "Count", 1)
            logger.info("job suspended", extra={"job_id": job.job_id, "kind": kind, "hold": hold})
        return done


    # ------------------------------------------------------- moves off warned nodes
    def _moved(self, job: Job) -> bool:
        """Every rank stopped at the job's checkpoint: back in the queue at the head of its
        priority (restarted on healthy nodes or a spare, from that checkpoint), the move on
        its item, its e-mail owed; then the node may be repaired. A move its owner holds
        (``gpujobs suspend``) is held instead, until resumed; stopped by force at its bound
        when rank 0 did not call go_suspend()."""
        avoid = dict(job.suspend.get("avoid") or {})
        if avoid.get("notice"):
            return self._moved_off_notice(job, avoid)
        item = self.store.job_item(job.job_id) or {}
        node = str(avoid.get("node") or "")
        now = clock.now()
        took = now - float(job.suspend.get("requested_at") or now)
        hold = _held(job)
        forced = "stopped by force" in str(job.suspend.get("stop_reason") or "")  # not by go_suspend()
        outcome = "stopped_at_deadline" if forced else "moved"
        entry = move_record(node=node, warning=avoid, at=now, outcome=outcome,
                            detail="held by its owner until resumed" if hold else "",
                            checkpoint_seconds=None if forced else took)
        moves = [*(item.get("moves") or []), entry][-MAX_MOVES_KEPT:]
        order = relocated_queue_order(int(item.get("priority", 0)), float(item.get("submitted_at") or 0.0),
                                      job.job_id)
        words = _MoveWords(node, took, hold=hold, forced=forced)
        notice = self.notices.for_job(
            replace(job, state=JobState.SUSPENDED), None, NotificationKind.GPU_WARNING, words.subject,
            what_happened=(f"Node {node} reported a driver warning: {avoid.get('reason') or '?'} "
                           f"({avoid.get('confidence') or '?'})"),
            what_was_done=(f"{words.stopped}; {words.done}; {node} takes no new work and is repaired "
                           f"({avoid.get('action') or 'as the catalog says'}). Avoided: {avoided(avoid)}"),
            operator_action=words.action)
        reason = f"{words.how}: {avoid.get('reason') or 'driver warning'}; {words.then}"
        if not self.store.finish(job.job_id, job.attempt, queue_order=order, hold=hold, reason=reason,
                                 moves=moves, also=self.notices.owe([notice], now)):
            return False
        self.notices.send([notice])
        self.metrics.add_metric("JobsSuspended" if forced else "JobsMovedAtCheckpoint", "Count", 1)
        logger.warning("job moved off a warned node", extra={
            "job_id": job.job_id, "instance": node, "held": hold, "forced": forced,
            "checkpoint_seconds": None if forced else round(took, 1)})
        if node:
            after_commit("repair the node the job left", self.reactions.emit, JobLeftNode(node))
        return True

    def _moved_off_notice(self, job: Job, avoid: dict[str, Any]) -> bool:
        """Every rank of a job on a node AWS takes away stopped: at its checkpoint (go_suspend())
        or, not in time, by the stop before the deadline. Back in the queue at the head of its
        priority, its reason the notice's (a job that cannot be placed elsewhere waits with it)."""
        item = self.store.job_item(job.job_id) or {}
        node = str(avoid.get("node") or "")
        now = clock.now()
        took = now - float(job.suspend.get("requested_at") or now)
        forced = "stopped by force" in str(job.suspend.get("stop_reason") or "")  # not by go_suspend()
        outcome = "stopped_at_deadline" if forced else "moved"
        entry = move_record(node=node, warning=avoid, at=now, outcome=outcome,
                            checkpoint_seconds=None if forced else took)
        moves = [*(item.get("moves") or []), entry][-MAX_MOVES_KEPT:]
        order = relocated_queue_order(int(item.get("priority", 0)), float(item.get("submitted_at") or 0.0),
                                      job.job_id)
        why = str(avoid.get("reason") or "AWS notice")
        how = ("stopped before AWS takes the node (no go_suspend() in time: it resumes from its last "
               "checkpoint)" if forced else f"moved at its checkpoint ({int(took)} s after it was asked)")
        hold = _held(job)
        reason = (f"{how} off {node} ({why}); held by its owner until resumed (gpujobs resume)" if hold else
                  f"waiting for capacity: {why}; {how} off {node}; queued at the head of its priority")
        notice = self.notices.for_job(
            replace(job, state=JobState.SUSPENDED), None, NotificationKind.CAPACITY_NOTICE,
            ("Job stopped before AWS took its node" if forced else
             "Job moved off a node AWS takes away, at its checkpoint"),
            what_happened=f"AWS announced for node {node}: {why}",
            what_was_done=(f"The job was {how}; " + (
                "it is held by its owner until resumed (gpujobs resume)" if hold else
                "it is back in the queue ahead of every job of its priority and restarts on other nodes "
                "when capacity exists") + f"; {node} takes no new work"),
            operator_action=(("Its owner resumes it (gpujobs resume). " if hold else
                              "None: the job resumes by itself (RESUME_COUNT + 1). ") + (
                "Make its training loop call receive_suspend_command() every step to lose no work next time."
                if forced else "")).strip())
        if not self.store.finish(job.job_id, job.attempt, queue_order=order, hold=hold, reason=reason,
                                 moves=moves, also=self.notices.owe([notice], now)):
            return False
        self.notices.send([notice])
        deadline = avoid.get("deadline")
        in_time = not forced and (deadline is None or now < float(deadline))
        self.metrics.add_metric("NoticeJobsMovedBeforeDeadline" if in_time
                                     else "NoticeJobsStoppedUnsaved",
                                     "Count", 1)
        logger.warning("job left a node AWS takes away", extra={
            "job_id": job.job_id, "instance": node, "outcome": outcome, "seconds": round(took, 1)})
        return True

    def decline(self, job: Job) -> bool:
        """The move's bound passed without go_suspend(): the job keeps running (never stopped
        by force for a warning); its node stays cordoned and is repaired once it leaves."""
        item = self.store.job_item(job.job_id) or {}
        avoid = dict(job.suspend.get("avoid") or {})
        node = str(avoid.get("node") or "")
        now = clock.now()
        bound = int(job.suspend.get("grace_seconds") or 0)
        detail = f"no go_suspend() within {bound} s"
        entry = move_record(node=node, warning=avoid, at=now, outcome="declined", detail=detail)
        moves = [*(item.get("moves") or []), entry][-MAX_MOVES_KEPT:]
        reason = (f"move declined: {detail} after a driver warning on {node}; the job keeps running there "
                  "(the node takes no new work and is repaired once the job leaves)")
        notice = self.notices.for_job(
            replace(job, state=JobState.RUNNING), None, NotificationKind.GPU_WARNING,
            "Job did not checkpoint in time: it keeps running on a GPU node with a driver warning",
            what_happened=(f"Node {node} reported a driver warning ({avoid.get('reason') or '?'}); the job "
                           f"was asked to checkpoint and stop within {bound} s and did not call "
                           "go_suspend()"),
            what_was_done=(f"Nothing stopped: the job keeps running; {node} takes no new work and is "
                           f"repaired ({avoid.get('action') or 'as the catalog says'}) once the job leaves "
                           "it. If the GPU fails first, the ordinary recovery restarts the job from its last "
                           "checkpoint"),
            operator_action=("Check that the training loop calls receive_suspend_command() every step and "
                             "go_suspend() after saving (training_client/README.md); or stop the job at a "
                             "checkpoint of yours and resubmit it."))
        if not self.store.decline_move(job.job_id, job.attempt, reason=reason, moves=moves,
                                       also=self.notices.owe([notice], now)):
            return False
        self.notices.send([notice])
        self.metrics.add_metric("WarningMovesDeclined", "Count", 1)
        logger.warning("move off a warned node declined", extra={"job_id": job.job_id, "instance": node})
        return True


@dataclass(frozen=True)
class _MoveWords:
    """What the history and the e-mail say of a move off a warned node, every rank stopped."""

    node: str
    took: float
    _: KW_ONLY
    hold: bool  # its owner holds it (gpujobs suspend)
    forced: bool  # stopped at the bound without go_suspend() (its owner suspended it)

    @property
    def how(self) -> str:
        if self.forced:
            return (f"stopped off {self.node} at the end of its move's bound (its owner suspended it; "
                    "no go_suspend())")
        return f"moved off {self.node} at its checkpoint ({int(self.took)} s after it was asked)"

    @property
    def then(self) -> str:
        if self.hold:
            return "held by its owner until resumed (gpujobs resume)"
        return ("back in the queue at the head of its priority, it restarts on healthy nodes from "
                + ("its last checkpoint" if self.forced else "that checkpoint"))

    @property
    def done(self) -> str:
        """``then`` as the e-mail says it (each of its claims is checked: tests/notifications)."""
        if self.hold:
            return "the job is held by its owner until resumed (gpujobs resume)"
        return ("the job is back in the queue ahead of every job of its priority and restarts on healthy "
                "nodes from " + ("its last checkpoint" if self.forced else "that checkpoint"))

    @property
    def subject(self) -> str:
        if self.forced:
            return "Job stopped off a GPU node with a driver warning, as its owner asked"
        return "Job moved off a GPU node at its checkpoint, before the GPU failed"

    @property
    def stopped(self) -> str:
        if self.forced:
            return ("The job was stopped at the end of its move's bound (its owner suspended it and rank 0 "
                    "did not call go_suspend(): it resumes from its last checkpoint)")
        return f"Rank 0 saved a checkpoint and stopped the job {int(self.took)} s after it was asked"

    @property
    def action(self) -> str:
        if self.hold:
            return "Its owner resumes it (gpujobs resume); the node returns once repaired."
        return "None: the job resumes by itself (RESUME_COUNT + 1) and the node returns once repaired."


def _held(job: Job) -> bool:
    """Its owner holds the job once stopped (``gpujobs suspend``; a move too)."""
    return bool(job.suspend.get("hold"))


def _declinable(job: Job) -> bool:
    """A move off a warned node that keeps running when its bound passes: not a move off a
    node AWS takes away, not one its owner holds."""
    return job.suspend.get("kind") == SuspendKind.MOVED.value and not _held(job) \
        and not (job.suspend.get("avoid") or {}).get("force")


def _cause(suspend: dict[str, Any]) -> str:
    kind = str(suspend.get("kind") or "")
    if kind == SuspendKind.PREEMPTED.value:
        by_priority = suspend.get("by_priority")
        level = f"{priority_name(int(by_priority))}, " if by_priority is not None else ""
        return f"preempted by job {suspend.get('by_job', '?')} ({level}{suspend.get('by_user', '?')})"
    if kind == SuspendKind.USER.value:
        return f"suspended by {suspend.get('by_user', 'its owner')}"
    return str(suspend.get("reason") or "suspended")
