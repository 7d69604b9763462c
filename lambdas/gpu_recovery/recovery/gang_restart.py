"""Stage 4: restart every rank of a job as a gang once every node it needs is back, or
on healthy nodes when one of its nodes is unusable (relocation).

The restart waits, by the fault's tally on the job item (``domain.fault_tally``), until
every old rank has ended (its GPUs are the restart's), every suspect's verdict is in and
no node it waits for is still rebooting. The job is then claimed once (PENDING_RESTART ->
STARTING, attempt + 1, with the intent to start every rank) and its ranks are started in
batches by ``recovery.gang``: each under a lease on its rank item with a deterministic
``startedBy``, so no rank ever runs twice. Whoever registers the last rank confirms the
job RUNNING and tells operators; the sweep resumes a restart left half-way.

Relocation (a node quarantined or replaced, or rebooting with ``relocate_instead_of_wait``)
waits likewise; then

* a **queue job** goes back through the scheduler at the head of its priority (it keeps
  its original queue position; the scheduler picks healthy nodes and a new MASTER_ADDR);
* a **tag-registered job** whose tasks carry ``gpu-recovery:relocatable=true`` keeps its
  ranks on healthy nodes and moves those of each unusable node to a healthy free node:
  the moves (node -> node) are a placement item written in the claim's transaction, so a
  resumed launch starts every rank where the claim said. Other tag-registered jobs fail
  (their environment may pin addresses). With no healthy free node the job *waits*
  (``domain.relocation.RelocationWait``, still PENDING_RESTART, its budget not charged
  again): the sweep tries again every minute, the nodes that free up are reserved for it
  (the queue scheduler and later relocations skip them), and after
  ``relocation_wait_seconds`` it fails with that reason.

Spare first (:meth:`GangRestart.spare_first`): with a spare pool, a relocatable
tag-registered job does not wait for its suspects' verdicts: once every old rank ended it
leaves them for healthy free nodes; their checks go on for the nodes alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS, NotificationKind, relocated_queue_order
from gpu_recovery.domain import goodput, placement
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Job, Suspect
from gpu_recovery.domain.rank_template import RankTemplate
from gpu_recovery.domain.relocation import RelocationWait, SpareNode, relocation_reason, spare_first
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.restart_wait import is_placement_race
from gpu_recovery.domain.states import (
    FATAL_SUSPECT_VERDICTS,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.domain.time_sharing import DEFAULT_SUSPEND_GRACE_SECONDS, SuspendKind
from gpu_recovery.recovery.breaker.held_jobs import HeldJobs
from gpu_recovery.recovery.fanout_send import resend_due
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.lost_stop_events import DescribesTasks, handle_stopped
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort, Outcome, after_commit
from gpu_recovery.recovery.reactions import FaultSeen, Reactions, ReservationsReleased
from gpu_recovery.recovery.restart_nodes import RestartNodes
from gpu_recovery.recovery.restart_notices import fault_lines, restart_summary
from gpu_recovery.recovery.restart_waits import NodesAndTheirTasks, RestartWaits
from gpu_recovery.recovery.stage_data import RestartData
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.restarts import RestartRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# The goodput ledger: a STARTING -> RUNNING written this soon after the restart's claim
# is on time (its own time is when the gang ran); later, rank 0's registration says when.
PROMPT_CONFIRMATION_SECONDS = 5.0
_SPARE_FIRST_ROUNDS = 3  # a verdict landing meanwhile: decide again on fresh counts
_NO_SPARE_ACTION = ("Add GPU capacity (or keep spare nodes free), look after the faulty node, and "
                    "resubmit the job.")


class RestartEcs(NodesAndTheirTasks, DescribesTasks, Protocol):
    """A node's free GPUs and tasks (the waits); a task's status (a stop not handled yet)."""


class GangRestart:
    """``records``: the restart's own intents (its claim, its waits, its requeue); ``holds``:
    the jobs the breaker holds; ``nodes``: what recoveries hold, free nodes for a relocation;
    ``suspension_items``: a lent spare's queue job read."""

    def __init__(self, data: RestartData, records: RestartRepository, ecs: RestartEcs,
                 notices: Notices, gang: GangOps, holds: HeldJobs, nodes: RestartNodes,
                 suspension_items: SuspensionRepository, *,
                 policy: RemediationPolicy, metrics: MetricsPort, settings: Settings,
                 request_suspend: Callable[..., bool] | None = None,
                 reactions: Reactions | None = None) -> None:
        self.data = data
        self.records = records
        self.policy = policy
        self.metrics = metrics  # the service's relay: the invocation's metrics
        self.settings = settings
        self.notices = notices
        self.gang = gang
        self.holds = holds
        self.nodes = nodes
        self.suspension_items = suspension_items
        self.ecs = ecs
        # A restart whose nodes cannot take it now waits for them (domain.restart_wait).
        self.waits = RestartWaits(data.jobs, records, ecs,
                                  lambda job, reason, action: self.fail_waiting(job, reason, action),
                                  wait_seconds=settings.relocation_wait_seconds, metrics=metrics)
        # Told: a job's restart placed every rank, or the job ended (its reservations go; the
        # sweep's refresh does it if this fails).
        self.reactions = reactions or Reactions()
        # Suspends a queue job a spare is lent to (``Suspensions.request``) when a waiting
        # relocation needs the spare back.
        self.request_suspend = request_suspend

    def try_restart(self, job_id: str) -> Outcome:
        """Restart every rank of a job once every instance it needs is available, or
        relocate it off the instances it can no longer use."""
        repo = self.data
        job = repo.jobs.get_job(job_id)
        if job is None or job.state is not JobState.PENDING_RESTART:
            return Outcome("ignored", job_id, {"why": "not pending restart"})
        job = repo.faults.counted(job)  # healthy verdicts counted on the tally's shards
        tally = job.tally
        if not job.in_fault:
            self.fail_pending_restart(job, f"the fault of attempt {job.attempt} has no record: "
                                           "cannot restart")
            return Outcome("restart_failed", job_id, {"why": "no fault record"})
        if not tally.ranks_ended or not tally.all_decided:
            # Every old rank stopped (its GPUs are the restart's, or free for others when
            # the job moves), every verdict of the fault in.
            return Outcome("waiting", job_id, {"ranks_ended": tally.ranks_ended,
                                               "pending_verdicts": tally.pending})
        # Nodes of the job another fault made unusable meanwhile, and those another job's
        # recovery held first (read once per restart: the job's nodes from its latch shards,
        # then their instance items with their holds).
        elsewhere, reserved = self.nodes.unusable_and_reserved(job)
        relocatable = job.relocatable
        if not relocatable:
            # A node's reboot held back by the breaker: the job waits (HELD), not fails.
            held = self.holds.hold(job, elsewhere)
            if held is not None:
                return held
        unusable = bool(tally.fatal - (0 if relocatable else tally.held)) or job.relocate or bool(elsewhere)
        if unusable and not relocatable:
            named = f"instance(s) {', '.join(elsewhere[:10])} " if elsewhere else "node(s) "
            self.fail_pending_restart(job, f"{named}the job needs were quarantined or marked suspect "
                                           "meanwhile")
            return Outcome("restart_failed", job_id, {"unusable": elsewhere or tally.fatal})
        wait_reboot = tally.rebooting > 0
        if relocatable and (unusable or (wait_reboot and self._moves_off_reboots())):
            moved = self._relocate(job, unusable, elsewhere, reserved=reserved)
            if moved is not None:
                return moved
        if wait_reboot:
            return Outcome("waiting", job_id, {"rebooting_nodes": tally.rebooting})
        # Its nodes, looked at before the claim: one it cannot use now (busy, its agent away,
        # gone) is left for a free one if the job may move, else waited for; never a failure.
        # While a wait lasts, the nodes it names are looked at first, alone: one still blocked
        # keeps the job waiting without a read of every rank and node each minute.
        blocked = {} if relocatable else self.waits.named_still_blocked(job, clock.now())
        gpus: dict[str, int] = {}
        if not blocked:
            blocked, gpus = self.waits.look(job)
        blocked = {**reserved, **blocked}  # not the stack's to start a rank on either
        if blocked:
            if relocatable:
                moved = self._relocate(job, True, sorted(set(elsewhere) | set(blocked)), blocked)
                if moved is not None:
                    return moved
            return self.waits.wait(job, blocked, gpus)
        now = clock.now()
        if not self.records.claim(job, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS):
            return Outcome("duplicate", job_id)
        started = repo.jobs.get_job(job_id) or job
        return self._launch(started)

    def _launch(self, job: Job) -> Outcome:
        try:
            sent = self.gang.start(job)
        except Exception:
            # The claim holds a deadline: the sweep resumes the launch. A relocation's targets,
            # free when chosen, are reserved now (not at the sweep's refresh a minute on, after
            # another scheduler took one: soak seed 7010 at 6 %).
            logger.warning("gang restart not sent; the sweep resumes it", exc_info=True,
                           extra={"job_id": job.job_id})
            if job.relocated:
                after_commit("reserve the relocation's targets", self.reactions.emit, FaultSeen(job))
            return Outcome("restarted_partly", job.job_id, {"attempt": job.attempt})
        fresh = self.data.jobs.get_job(job.job_id) or job
        if fresh.state is JobState.RUNNING and fresh.attempt == job.attempt:
            return Outcome("restarted", job.job_id, {"attempt": job.attempt})
        if fresh.state is JobState.FAILED:
            return Outcome("restart_failed", job.job_id)
        return Outcome("restarting" if sent else "restarted_partly", job.job_id, {"attempt": job.attempt})

    # --------------------------------------------------------------- relocation
    def _relocate(self, job: Job, unusable: bool, elsewhere: list[str] | None = None,
                  blocked: Mapping[str, str] | None = None, *,
                  reserved: Mapping[str, str] | None = None) -> Outcome | None:
        """Move the job off its unusable (and, with relocate_instead_of_wait, rebooting)
        nodes, and off those it cannot use now (``blocked``: busy, agent away, gone; a node
        it keeps ``reserved`` for another job's recovery is left too). None: nothing to move
        now (wait for the reboot as usual)."""
        suspects = self.data.faults.suspects(job.job_id, job.attempt)
        blocked = dict(blocked or {})
        fatal = sorted({s.node for s in suspects if s.verdict in FATAL_SUSPECT_VERDICTS}
                       | set(elsewhere or ()))
        rebooting = sorted(s.node for s in suspects if s.rebooting)
        moving_off_reboots = self._moves_off_reboots()
        leaving = sorted(set(fatal) | (set(rebooting) if moving_off_reboots else set()))
        why = self._relocation_reason(suspects, [n for n in fatal if n not in blocked], rebooting, blocked)
        if job.is_queue_job and unusable:
            return self._requeue(job, leaving, why)
        if not leaving:
            return None
        try:
            found = self.nodes.free_for(job, leaving)
            # The nodes it keeps must take their ranks now too: a busy one is left as well.
            kept = self.waits.blocked(job, leaving=leaving) if found.targets is not None else {}
            if found.targets is not None:
                kept.update({n: why for n, why in (reserved or {}).items() if n not in leaving})
            if kept:
                blocked.update(kept)
                leaving = sorted(set(leaving) | set(kept))
                why = self._relocation_reason(suspects, [n for n in fatal if n not in blocked], rebooting,
                                              blocked)
                found = self.nodes.free_for(job, leaving)
            targets, gpus, healthy = found.targets, found.gpus, found.healthy
        except (ClientError, BotoCoreError) as error:
            # No cluster access from this function (or throttled): the sweep tries again.
            logger.warning("relocation snapshot failed", extra={"job_id": job.job_id, "error": str(error)})
            self.data.deadlines.rearm_job(job, clock.now())
            return Outcome("waiting", job.job_id, {"why": "cluster snapshot failed"})
        if job.is_queue_job:
            # relocate_instead_of_wait: only when healthy free nodes exist now; otherwise the
            # reboot is the faster way back.
            return self._requeue(job, leaving, why) if targets is not None else None
        if targets is None:
            if not unusable:
                return None
            waiting = self._wait_for_spare(job, leaving, gpus, why)
            if waiting.action == "waiting":
                # The wait is committed first; asked again on every retry (idempotent).
                self._take_back_lent_spares(job, gpus, healthy)
                if found.unhandled:
                    # A rank whose task ECS shows stopped and whose STOPPED event was never
                    # handled (dead-lettered) holds its node from every placement: handled as
                    # that event (idempotent, as a redelivery's), the node free at the next try.
                    after_commit("stops not handled yet", handle_stopped, self.ecs, self.reactions,
                                 found.unhandled, [])
            return waiting
        return self._claim_moves(job, targets, why)

    def _take_back_lent_spares(self, job: Job, gpus: list[int], healthy: dict[str, SpareNode]) -> list[str]:
        """No free node for a waiting relocation: the spares lent to LOW queue jobs that
        would take it (``domain.placement.lent_to_reclaim``) are taken back, their jobs
        asked to suspend (RUNNING -> SUSPENDING, with their grace to checkpoint; queued
        again once stopped). The relocation claims the nodes as they free, like any wait."""
        if self.request_suspend is None:
            return []
        holds = self.data.cordons.worklist().holds
        lent = placement.lent_of(holds)
        if not lent:
            return []
        free = [s for n, s in healthy.items() if s.free_gpus > 0 and n not in lent]
        nodes = placement.lent_to_reclaim(gpus, free, [healthy[n] for n in sorted(lent) if n in healthy])
        asked: list[str] = []
        for lent_job in sorted({lent[n] for n in nodes}):
            borrower = self.data.jobs.get_job(lent_job)
            if borrower is None or borrower.state is not JobState.RUNNING or not borrower.is_queue_job:
                continue  # already suspending, ended, or a stale lend: the node frees by itself
            item = self.suspension_items.job_item(lent_job) or {}
            grace = int(item.get("suspend_grace_seconds") or DEFAULT_SUSPEND_GRACE_SECONDS)
            taken = ", ".join(n for n in nodes if lent[n] == lent_job)
            if self.request_suspend(
                    lent_job, borrower.attempt, kind=SuspendKind.PREEMPTED,
                    reason=f"spare node {taken} lent to it is needed by the relocation of job {job.job_id}",
                    grace_seconds=grace, actor="recovery", by_job=job.job_id, by_user="gpu-recovery"):
                asked.append(lent_job)
                self.metrics.add_metric("LentSparesTakenBack", "Count", 1)
                logger.info("lent spare taken back", extra={"job_id": job.job_id, "lent_job": lent_job,
                                                            "nodes": taken})
        return asked

    def _moves_off_reboots(self) -> bool:
        """A relocatable job leaves a rebooting node for a healthy free one (if any) instead
        of waiting for the reboot: ``relocate_instead_of_wait``, or a spare pool to take it."""
        settings = self.settings
        return settings.relocate_instead_of_wait or settings.spare_nodes.configured

    def _claim_moves(self, job: Job, targets: dict[str, SpareNode], why: str) -> Outcome:
        """The relocation's claim (its placement in the same transaction), then its launch."""
        moves = {node: {"node": t.node_id, "arn": t.container_instance_arn, "ec2": t.ec2_instance_id,
                        "why": why[:200]} for node, t in targets.items()}
        now = clock.now()
        described = ", ".join(f"{a} -> {m['node']}" for a, m in sorted(moves.items()))
        waited = job.relocation_wait
        after = f" (after waiting {round(now - waited.since)} s for a free node)" if waited else ""
        reason = f"relocated: {described}; {why}{after}"
        placement = self.data.faults.placement_update(job.job_id, job.attempt + 1, moves, reason)
        if not self.records.claim(job, now=now, deadline_at=now + RETRY_INTERVAL_SECONDS,
                                  placement=placement, moves=moves, reason=reason):
            return Outcome("duplicate", job.job_id)
        self.metrics.add_metric("Relocations", "Count", 1)
        started = self.data.jobs.get_job(job.job_id) or job
        # Its targets stay reserved for it until every rank is placed (on_started releases
        # them): a node is never without its attribute between its hold and its rank.
        launched = self._launch(started)
        return launched

    def decide_on_fault(self, job: Job) -> list[str]:
        """Spare first, decided in the invocation that sees the fault: the healthy free nodes
        (spares first) its suspect nodes' ranks will take, chosen now, so that the caller
        reserves them for the job before another relocation or scheduler can take them. The
        move itself still waits for every old rank to stop (:meth:`spare_first` then takes
        these nodes first). [] when spare first does not apply or nothing is free."""
        if job.state is not JobState.PENDING_HEALTHCHECK or not job.in_fault:
            return []
        decision = spare_first(
            pool=self.settings.spare_nodes, relocatable=job.relocatable,
            queue_job=job.is_queue_job, ranks_ended=True, pending_verdicts=max(1, job.tally.pending or 0),
            infra_recoveries_left=job.max_recovery_attempts - job.recoveries_used,
            restarts_enforced=self.policy.modes.executes(Effect.RESTART_JOB))
        pending = sorted(s.node for s in self.data.faults.suspects(job.job_id, job.attempt) if s.pending)
        if not decision.go or not pending:
            return []
        targets = self.nodes.free_for(job, pending).targets
        return sorted(t.node_id for t in targets.values()) if targets else []

    def spare_first(self, job: Job) -> Outcome:
        """Spare first: a relocatable job in PENDING_HEALTHCHECK whose old ranks all ended
        leaves its suspect nodes (and any already unusable or rebooting) for healthy free
        nodes now, without waiting for the DCGM verdicts (``domain.relocation.spare_first``).
        The nodes' checks go on without it: their verdicts remediate the nodes only. No
        healthy free node for every node it leaves (the spare was taken by another
        relocation, say): nothing is written and the job waits for the verdicts as before.
        Called when the last old rank ends, and by the sweep while the job waits."""
        repo = self.data
        for _ in range(_SPARE_FIRST_ROUNDS):
            if job.state is not JobState.PENDING_HEALTHCHECK or not job.in_fault:
                return Outcome("ignored", job.job_id, {"why": "not waiting for verdicts"})
            tally = job.tally
            decision = spare_first(
                pool=self.settings.spare_nodes, relocatable=job.relocatable,
                queue_job=job.is_queue_job, ranks_ended=tally.ranks_ended,
                pending_verdicts=tally.pending or 0,
                infra_recoveries_left=job.max_recovery_attempts - job.recoveries_used,
                restarts_enforced=self.policy.modes.executes(Effect.RESTART_JOB))
            if not decision.go:
                return Outcome("waiting", job.job_id, {"why": decision.why})
            suspects = repo.faults.suspects(job.job_id, job.attempt)
            pending = sorted(s.node for s in suspects if s.pending)
            if not pending:
                return Outcome("waiting", job.job_id, {"why": "no verdict pending"})
            decided = sorted(s.node for s in suspects if s.verdict in FATAL_SUSPECT_VERDICTS or s.rebooting)
            unusable, reserved = self.nodes.unusable_and_reserved(job)
            leaving = sorted(set(pending) | set(decided) | set(unusable) | set(reserved))
            try:
                targets = self.nodes.free_for(job, leaving).targets
            except (ClientError, BotoCoreError) as error:
                logger.warning("spare-first snapshot failed",
                               extra={"job_id": job.job_id, "error": str(error)})
                return Outcome("waiting", job.job_id, {"why": "cluster snapshot failed"})
            if targets is None:
                return Outcome("waiting", job.job_id,
                               {"why": "no healthy free node: waiting for the verdicts"})
            why = (f"node(s) suspect: {', '.join(pending[:10])} left before the DCGM verdict (checked and "
                   f"remediated in the background)")
            if self.records.leave_suspects_before_verdict(job, pending, reason=f"spare first: {why}",
                                                          deadline_at=clock.now() + RETRY_INTERVAL_SECONDS):
                self.metrics.add_metric("SpareFirstMoves", "Count", 1)
                left = repo.jobs.get_job(job.job_id)
                if left is None or left.state is not JobState.PENDING_RESTART or left.attempt != job.attempt:
                    return Outcome("duplicate", job.job_id)
                return self._claim_moves(left, targets, why)
            # A verdict (or another delivery) landed meanwhile: decide again on fresh counts.
            fresh = repo.jobs.get_job(job.job_id)
            if fresh is None or fresh.attempt != job.attempt:
                return Outcome("duplicate", job.job_id)
            job = fresh
        return Outcome("raced", job.job_id)

    def _wait_for_spare(self, job: Job, leaving: list[str], gpus: list[int], why: str) -> Outcome:
        """No healthy free node for a tag-registered job: wait for one (the sweep tries
        again every minute) until the wait's deadline, then fail with that reason. The wait
        is written once per fault; a duplicate delivery finds it and only reports it."""
        repo, now = self.data, clock.now()
        wait = job.relocation_wait
        if wait is None:
            seconds = self.settings.relocation_wait_seconds
            if seconds <= 0:
                self.fail_pending_restart(job, f"no healthy free node to relocate the ranks on "
                                               f"{', '.join(leaving)} ({why})",
                                          operator_action=_NO_SPARE_ACTION)
                return Outcome("restart_failed", job.job_id, {"why": "no spare node"})
            wait = RelocationWait.start(job.job_id, job.attempt, now, seconds, leaving, gpus, why)
            if self.records.wait_for_relocation(job, wait, now + RETRY_INTERVAL_SECONDS):
                self.metrics.add_metric("RelocationWaits", "Count", 1)
                return Outcome("waiting", job.job_id, {"why": "no healthy free node", "until": wait.until})
            fresh = repo.jobs.get_job(job.job_id)
            if fresh is None or fresh.state is not JobState.PENDING_RESTART or fresh.attempt != job.attempt \
                    or fresh.relocation_wait is None:
                return Outcome("duplicate", job.job_id)
            wait = fresh.relocation_wait  # another delivery started the wait: its deadline holds
        if wait.expired(now):
            self.fail_pending_restart(job, wait.timeout_reason(), operator_action=_NO_SPARE_ACTION)
            return Outcome("restart_failed", job.job_id, {"why": "no healthy node freed in time"})
        return Outcome("waiting", job.job_id, {"why": "no healthy free node", "until": wait.until})

    @staticmethod
    def _relocation_reason(suspects: list[Suspect], fatal: list[str], rebooting: list[str],
                           blocked: Mapping[str, str] | None = None) -> str:
        return relocation_reason(fatal, rebooting, blocked=blocked, labels={
            s.node: s.verdict.value.lower() for s in suspects},
            left=sorted(s.node for s in suspects if s.verdict is SuspectVerdict.LEFT))

    def _requeue(self, job: Job, leaving: list[str], why: str) -> Outcome:
        item = self.data.jobs.get_job_item(job.job_id) or {}
        order = relocated_queue_order(int(item.get("priority") or 0),
                                      float(item.get("submitted_at") or job.created_at), job.job_id)
        now = clock.now()
        relocation = {"at": now, "attempt": job.attempt, "reason": why[:500], "from_nodes": leaving[:64]}
        notice = self.notices.for_job(
            replace(job, state=JobState.PENDING_RESOURCES), None, NotificationKind.RELOCATED,
            "Job relocated to healthy nodes",
            what_happened=why,
            what_was_done=("Job back in the queue ahead of every job of its priority (original queue "
                           "position kept); the scheduler starts every rank again on healthy nodes "
                           "(MASTER_ADDR: rank 0's node)"),
            operator_action="Nothing for the job; look after the faulty node.",
            # Still the fault's attempt: the scheduler starts the next one.
            details=fault_lines(self.data.faults, job, job.attempt))
        if not self.records.requeue_for_relocation(
                job, queue_order=order, relocation=relocation,
                reason=f"relocation: back in the queue at the head of its priority ({why})",
                also=self.notices.owe([notice], now)):
            return Outcome("duplicate", job.job_id)
        self.notices.send([notice])
        self.metrics.add_metric("Relocations", "Count", 1)
        return Outcome("relocated", job.job_id, {"via": "queue", "from": leaving})

    def released(self, job_id: str) -> None:
        """The job's restart is placed, or it ended: its reservations go (best effort: the
        sweep's refresh lets them go within a minute)."""
        after_commit("reservations released", self.reactions.emit, ReservationsReleased(job_id))

    # ------------------------------------------------------------- completion
    def on_started(self, job: Job) -> bool:
        """Every rank of the restarted attempt is registered: RUNNING (once), and operators
        are told by whoever made it so."""
        if job.state is not JobState.STARTING or job.restarted_attempt != job.attempt:
            return False
        notice, reason, ledger, owed = self.confirmation(job, JobState.RUNNING)
        if not self.records.confirm_running(job.job_id, job.attempt, reason, actor="recovery",
                                            also=owed, ledger=ledger):
            return False
        self.recovered(job, notice)
        return True

    def confirmation(self, job: Job, to: JobState) -> tuple[Owed, str, dict[str, Any], list[Update]]:
        """What confirms a gang restart leaving STARTING for ``to`` (RUNNING; COMPLETE if its ranks
        finished first): the e-mail, the history's reason, the ledger's marks, the outbox item."""
        done, validations, validated = restart_summary(self.data.faults, job)
        notice = self.notices.for_job(
            replace(job, state=to), None, NotificationKind.RECOVERED,
            "Job recovered and restarted",
            what_happened=job.last_error or "suspected GPU fault",
            what_was_done=f"{done}; all {job.world_size} ranks restarted as attempt {job.attempt}",
            operator_action="Nothing; watch the job. Repeated faults on the same node escalate it to "
                            "replacement automatically.",
            details=fault_lines(self.data.faults, job, job.attempt - 1),
        )
        # The history says how the repaired nodes proved themselves (validation after repair).
        reason = "; ".join(["every rank restarted", *validations])
        ledger = {**self._running_marks(job), **goodput.validation_marks(validated)}
        return notice, reason, ledger, self.notices.owe([notice])

    def recovered(self, job: Job, notice: Owed) -> None:
        """After the confirmation committed (its e-mail owed with it): the nodes held for the
        restart are released, the e-mail sent, the recovery counted."""
        self.released(job.job_id)
        self.notices.send([notice])
        self.metrics.add_metric("Recoveries", "Count", 1)
        if job.fault_started_at:
            self.metrics.add_metric("TimeToRestartSeconds", "Seconds",
                                         clock.now() - job.fault_started_at)

    def resume(self, job: Job) -> str:
        """The sweep: a gang restart is confirmed once every rank is registered (its RUNNING
        events may be lost), or its batches are sent again if they were never sent or have
        not finished after a while."""
        if Latch.REGISTERED in self.data.latches.complete(job.job_id, job.attempt, job.world_size):
            return "restart_confirmed" if self.on_started(job) else "restart_raced"
        now = clock.now()
        action = "restart_waiting"
        wait = job.restart_wait
        if wait is not None and wait.expired(now):
            # Ranks a placement race left unplaced, and their nodes still not free: it ends.
            self.fail_waiting(job, wait.timeout_reason(), "Free the node(s) named, then resubmit the job.")
            return "restart_timed_out"
        if wait is not None or resend_due(job.start_fanout, now):
            action = "restart_resuming"
            self._launch(job)
        fresh = self.data.jobs.get_job(job.job_id)
        if fresh is not None and fresh.state is JobState.STARTING and fresh.attempt == job.attempt:
            self.data.deadlines.rearm_job(fresh, now + RETRY_INTERVAL_SECONDS)
        return action

    def confirm_running(self, job: Job, reason: str, actor: str = "recovery") -> bool:
        """STARTING -> RUNNING only once every rank of the attempt is registered."""
        if Latch.REGISTERED not in self.data.latches.complete(job.job_id, job.attempt, job.world_size):
            return False
        return self.records.confirm_running(job.job_id, job.attempt, reason, actor,
                                            ledger=self._running_marks(job))

    def _running_marks(self, job: Job) -> dict[str, float]:
        """When the attempt's gang was running: rank 0 seen running (its task's RUNNING, else
        its registration), or the last rank's registration if that came later (a batch a broken
        call held back: the gang waits for it). The goodput ledger's restart ends there, even
        when this confirmation comes later. A confirmation within seconds of the restart's
        claim is its own time (no read)."""
        if clock.now() - job.updated_at <= PROMPT_CONFIRMATION_SECONDS:
            return {}
        rank0 = self.data.jobs.get_rank(job.job_id, 0)
        if rank0 is None or rank0.attempt != job.attempt or not rank0.registered_at:
            return {}
        # Its task's RUNNING when that event came first (else rank 0's RUNNING event marks it later).
        running = rank0.running_at or rank0.registered_at
        last = self.data.latches.last_registered_at(job.job_id, job.attempt, job.world_size)
        return goodput.running_marks(max(running, last or 0.0))

    # ------------------------------------------------------------------ failing
    def start_failed(self, job: Job, rank: RankTemplate, why: str) -> None:
        """A rank of a claimed restart could not be placed. A placement race (``RESOURCE:*``,
        ``AGENT``, ``MISSING``: the node was taken, or away, between the look and StartTask)
        waits, STARTING, its lease released for the next try (the sweep's, or the node
        freeing); the job fails only once its wait is over. Another refusal fails it."""
        if not is_placement_race(why):
            self._fail_restart(job, rank, why)
            return
        fresh = self.data.jobs.get_job(job.job_id) or job
        if fresh.state is not JobState.STARTING or fresh.attempt != job.attempt:
            return
        # The rank's node is where it was to start (a relocation's move included).
        ref = rank.container_instance_arn or rank.node
        detail = f"{why}, held by {self.waits.holder(ref)}" if why.upper().startswith("RESOURCE") else why
        outcome = self.waits.wait(fresh, {rank.node: f"{detail} (StartTask)"})
        if outcome.action in ("waiting", "duplicate"):
            self.gang.release_launch(rank, fresh.attempt)

    def _fail_restart(self, job: Job, rank: RankTemplate, why: str) -> None:
        reason = (f"could not start rank {rank.rank} on {rank.node} for attempt {job.attempt}: "
                  f"{why}")
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason), None, NotificationKind.FAILED,
            "Job failed: restart failed", what_happened=reason,
            what_was_done="Job marked FAILED; started ranks stopped",
            operator_action="Check the cluster's capacity and the instance, then resubmit the job.")
        if ended(self.metrics, self.data.jobs, job.job_id, self.data.jobs.finish_job(
                job.job_id, None, JobState.FAILED, reason, fields={"last_error": reason},
                stop_ranks_of=job.attempt, stop_why="restart failed", also=self.notices.owe([notice]))):
            self.released(job.job_id)
            self.notices.send([notice])
            self.metrics.add_metric("Failures", "Count", 1)
            fresh = self.data.jobs.get_job(job.job_id) or job
            with contextlib.suppress(Exception):  # the sweep sends an unsent stop intent
                self.gang.stop(fresh)

    def fail_pending_restart(self, job: Job, reason: str, operator_action: str = "") -> None:
        self.fail_waiting(job, reason, operator_action, from_state=JobState.PENDING_RESTART)

    def fail_waiting(self, job: Job, reason: str, operator_action: str = "",
                     from_state: JobState | None = None) -> bool:
        """A job the loop cannot take further (its restart or its checks never happened in
        time): FAILED, its live ranks stopped, e-mailed; once."""
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason), None, NotificationKind.FAILED,
            "Job failed: cannot be restarted", what_happened=reason, what_was_done="Job marked FAILED",
            operator_action=operator_action or (
                "Repair or replace the node, set it ACTIVE again, and resubmit the job."))
        if not ended(self.metrics, self.data.jobs, job.job_id, self.data.jobs.finish_job(
                job.job_id, job.attempt, JobState.FAILED, reason, fields={"last_error": reason},
                from_states=[from_state or job.state], stop_ranks_of=job.attempt, stop_why="job failed",
                also=self.notices.owe([notice]))):
            return False
        self.released(job.job_id)
        self.notices.send([notice])
        self.metrics.add_metric("Failures", "Count", 1)
        return True


__all__ = ["GangRestart", "SuspectVerdict"]
