"""Stage 5: the scheduled sweep (every minute). Reads only items whose deadline passed.

Every intermediate state that needs a follow-up carries a short deadline, and the
sweep runs the same converge step as the event path: whatever call a delivery died
at, the next sweep (at most about two minutes later) finishes its work.

The sweep works within a time budget and fairly: due items are taken oldest deadline
first, a page at a time (instances and job items in turn, more pages while the budget
lasts); each item's step is bounded (a fan-out is *sent*, never run
here for a large gang) and re-armed a minute later, so it goes to the back of the line;
what the budget leaves keeps its deadline for the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass
from functools import partial
from typing import Any, Protocol, TypeVar

from gpu_recovery import clock
from gpu_recovery.constants import DEADLINE_SK, JOB_PK, RETRY_INTERVAL_SECONDS, SWEEP_DUE_LEAD_SECONDS
from gpu_recovery.domain.heartbeat_policy import (
    BACKSTOP_MARGIN_SECONDS,
    BACKSTOP_RECHECK_SECONDS,
    backstop_deadline,
)
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Instance, Job, Rank
from gpu_recovery.domain.overdue import OverdueTally
from gpu_recovery.domain.states import (
    HEALTH_CHECK_STATES,
    QUEUE_OWNED_JOB_STATES,
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
)
from gpu_recovery.metric_names import METRIC_OLDEST_DUE_JOB_SECONDS, METRIC_OVERDUE_JOBS
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.aws_notices import AwsNotices
from gpu_recovery.recovery.breaker.held_jobs import HeldJobs
from gpu_recovery.recovery.breaker.operations import BreakerOperations
from gpu_recovery.recovery.cordons import UNCHANGED_HOLDS, Cordons
from gpu_recovery.recovery.fault_suspects import FaultSuspects
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.gpu_resets import GpuResets
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.lost_node_checks import LostNodeChecks
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, Outcome, ReadsEcsAgent
from gpu_recovery.recovery.preflight.rounds import Preflights
from gpu_recovery.recovery.queue_launches import QueueLaunches, is_launch
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.job_settlement import JobSettlement
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsInstances, ReadsJob, ReadsNode
from gpu_recovery.recovery.suspension import Suspensions
from gpu_recovery.recovery.task_events import TaskEvents
from gpu_recovery.recovery.validations import Validations
from gpu_recovery.recovery.warnings import GpuWarnings
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.faults import FaultRepository, suspect_from_item
from gpu_recovery.repository.health_check_slots import REAP_EVERY_SECONDS, HealthCheckSlots
from gpu_recovery.repository.heartbeat import hung_attr, lost_attr
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.notices import NOTICE_ITEM_TYPE
from gpu_recovery.repository.preflight import PREFLIGHT_ITEM_TYPE
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A job whose gang restart has not happened this long after its fault (health check,
# reboot and a margin) fails instead of waiting forever.
RESTART_GIVE_UP_MARGIN_SECONDS = 600
# Due items read per page; the sweep stops taking new ones when less than this is left.
DUE_PAGE = 100
# Pages of each kind one sweep reads at most (the time budget usually ends it first).
MAX_DUE_PAGES = 20
TIME_MARGIN_SECONDS = 12.0
# The attribute syncs go first but leave the due steps this much of the sweep's time.
STEPS_SHARE_SECONDS = 20.0

# Pages of due items' steps: each a call and what its log names.
DueSteps = Iterator[list[tuple[Callable[[], str], dict[str, Any]]]]

T = TypeVar("T")


def not_seen(page: list[T], key: Callable[[T], str], seen: set[str]) -> list[T]:
    """Each item once a pass (``seen``: the pass's keys): one a step rearmed within the lead (to
    its own deadline, a few seconds on) comes again in a later page of the same Query, and
    waits for the next sweep. A filter of each page, not a wrapper of the pages: the Query's
    pages are pulled by the step list itself (each Query its own call site in the campaigns)."""
    fresh = [item for item in page if key(item) not in seen]
    seen.update(key(item) for item in fresh)
    return fresh


def any_due(deadline_items: Iterable[Mapping[str, Any]], now: float) -> bool:
    """Whether the due items' Query at ``now`` would find any of these (the index as read)."""
    return any(float(item[DEADLINE_SK]) <= now for item in deadline_items)


class SweepJobs(ReadsJob, Protocol):
    """A due job (read, or mapped from its index item) and its ranks."""

    def job_from_item(self, item: dict[str, Any]) -> Job: ...
    def get_rank(self, job_id: str, rank: int) -> Rank | None: ...


class SweepNodes(ReadsInstances, ReadsNode, Protocol):
    """A due node, and the nodes of a page of due items."""


class SweepData(HasJobs[SweepJobs], HasInstances[SweepNodes], Protocol):
    """The due items' pages (the deadline index), and what each kind's follow-up reads first."""

    faults: FaultRepository
    latches: LatchRepository
    deadlines: DeadlineIndex  # what is due, and every job item carrying a deadline
    slots: HealthCheckSlots


@dataclass(eq=False, repr=False)
class Sweep:
    data: SweepData
    faults: TaskEvents
    health: HealthChecks
    reboots: Reboots
    restarts: GangRestart
    breaker: BreakerOperations
    suspensions: Suspensions
    gang: GangOps
    preflights: Preflights
    warnings: GpuWarnings | None = None
    _: KW_ONLY
    validations: Validations | None = None
    lost_nodes: LostNodeChecks | None = None
    aws_notices: AwsNotices | None = None
    suspects: FaultSuspects
    settlement: JobSettlement
    resets: GpuResets
    cordons: Cordons
    holds: HeldJobs
    notices: Notices  # the outbox: an e-mail whose sender died
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    launches: QueueLaunches | None = None  # the queue launches' start intents
    # Of lost ranks, those whose task ECS describes STOPPED handled as their lost STOPPED
    # events; returns the others (``RecoveryService.live_after_lost_stops``).
    live_after_lost_stops: Callable[[list[Rank]], list[Rank]]
    ecs: ReadsEcsAgent | None = None

    def run(self, time_left: Callable[[], float] | None = None) -> Outcome:
        now = clock.now()
        handled: dict[str, int] = {}
        deferred = 0
        # A page of due instances, then a page of due job items, in turn, while the budget
        # lasts: a burst of due items (hundreds of health checks of one large job whose
        # verdicts lost their races) is worked through in one sweep, not a page a minute,
        # and neither kind starves the other.
        # First the ECS attributes not confirmed yet (a cordon whose put failed after its
        # decision committed: keeping a bad node off every scheduler comes before anything
        # else), with the placement holds brought up to date. Their worklist and the
        # breaker's item are read together (one BatchGetItem); the breaker's is used at the
        # end only if nothing was written meanwhile (a sync may admit a held cordon, a due
        # step act on a node: each through the breaker), else it is read again. The job
        # table's deadline index is read whole once (the holds need the jobs holding nodes);
        # when it shows no job item due and nothing was written since, the due job items'
        # Query is not made (an idle minute: three reads, not four).
        breaker, unread, job_deadlines = None, True, None
        try:
            # Tried again at once: a node freed unmarked waits a minute more for its attribute,
            # which another scheduler can beat (soak seeds 7062 and 7063 at 6 %).
            read, breaker = twice(self.breaker.worklist_and_state)
            job_deadlines = self._job_deadlines()
            done = self.cordons.sweep(read, job_deadlines=job_deadlines, short_of_time=partial(
                self._short_of_time, time_left, TIME_MARGIN_SECONDS + STEPS_SHARE_SECONDS))
            unread = not set(done) <= UNCHANGED_HOLDS
            for action, count in done.items():
                handled[action] = handled.get(action, 0) + count
        except Exception:
            logger.exception("cordon sweep failed")
            handled["error"] = handled.get("error", 0) + 1
        overdue = OverdueTally(now)  # counted from the due job items read anyway
        # What falls due within the lead is taken now (each step still judges its own times
        # against ``now``): the next sweep may start a little less than a minute after this one.
        due_by = now + SWEEP_DUE_LEAD_SECONDS
        kinds = [self._instance_steps(now, due_by), self._job_item_steps(
            now, due_by, overdue, none_due=lambda: (
                not unread and job_deadlines is not None and not any_due(job_deadlines, due_by)))]
        for _ in range(MAX_DUE_PAGES):
            for kind in list(kinds):
                try:
                    page = next(kind, None) if not self._short_of_time(time_left) else None
                except Exception:
                    # A throttled due-items Query leaves the other kind's steps to run this minute.
                    logger.exception("due items not read; read again at the next sweep")
                    handled["error"] = handled.get("error", 0) + 1
                    page = None
                if page is None:
                    kinds.remove(kind)
                    continue
                for step, context in page:
                    if self._short_of_time(time_left):
                        deferred += 1
                        continue
                    unread = True
                    self._count(handled, step, context)
            if not kinds or self._short_of_time(time_left):
                break
        if overdue.read:
            self.metrics.add_metric(METRIC_OVERDUE_JOBS, "Count", overdue.overdue)
            self.metrics.add_metric(METRIC_OLDEST_DUE_JOB_SECONDS, "Seconds", overdue.oldest_due_seconds)
        try:
            for action, count in self.breaker.sweep(now, breaker, read=unread).items():
                handled[action] = handled.get(action, 0) + count
        except Exception:
            logger.exception("breaker sweep failed")
            handled["error"] = handled.get("error", 0) + 1
        if int(now // 60) % (REAP_EVERY_SECONDS // 60) == 0:
            try:  # health-check slots a claim or a release that died half-way left taken
                reaped = self.data.slots.reap(now)
                if reaped:
                    handled["slot_reaped"] = reaped
            except Exception:
                logger.exception("health-check slot reaper failed")
                handled["error"] = handled.get("error", 0) + 1
        if deferred:
            handled["deferred_to_next_sweep"] = deferred
        return Outcome("swept", detail={"handled": handled})

    def _instance_steps(self, now: float, due_by: float) -> DueSteps:
        seen: set[str] = set()
        for page in self.data.deadlines.due_instance_pages(due_by, DUE_PAGE):
            page = not_seen(page, lambda i: i.container_inst_id, seen)
            yield [(partial(self._instance, i, now), {"instance": i.container_inst_id}) for i in page]

    def _job_item_steps(self, now: float, due_by: float, overdue: OverdueTally, *,
                        none_due: Callable[[], bool]) -> DueSteps:
        """``none_due()``, asked when the first page is: the sweep's read of the index,
        nothing written since, says no job item is due (the page the Query would give)."""
        seen: set[str] = set()
        pages = iter([[]]) if none_due() else self.data.deadlines.due_job_item_pages(due_by, DUE_PAGE)
        for page in pages:
            page = not_seen(page, lambda item: str(item.get(JOB_PK)), seen)
            overdue.add_page(item[DEADLINE_SK] for item in page if item.get("item_type") == "JOB")
            yield [(partial(self._job_item, item, now), {"key": item.get(JOB_PK)}) for item in page]

    def _job_deadlines(self) -> list[dict[str, Any]] | None:
        """The job table's deadline index, whole; None if it could not be read (the holds then
        read it themselves and the due job items are queried: the minute goes on as it did
        before the read was shared)."""
        try:
            return self.data.deadlines.job_items()
        except Exception:
            logger.exception("job deadline index read failed")
            return None

    @staticmethod
    def _short_of_time(time_left: Callable[[], float] | None, margin: float = TIME_MARGIN_SECONDS) -> bool:
        return time_left is not None and time_left() < margin

    @staticmethod
    def _count(handled: dict[str, int], step: Callable[[], str], context: dict[str, Any]) -> None:
        try:
            action = step()
        except Exception:
            # One item's AWS error must not stop the others; the item keeps its deadline
            # and the next sweep tries it again.
            logger.exception("sweep step failed", extra=context)
            action = "error"
        handled[action] = handled.get(action, 0) + 1

    def _instance(self, instance: Instance, now: float) -> str:
        if instance.state in HEALTH_CHECK_STATES:
            return self.health.sweep(instance, now)
        if instance.validating and self.validations is not None:
            return self.validations.sweep(instance, now)  # back from its repair, proving itself
        if instance.state is InstanceState.REBOOTING and instance.reset_pending:
            return self.resets.sweep(instance, now)  # a GPU reset first
        if instance.state is InstanceState.REBOOTING:
            return self.reboots.sweep(instance, now)
        if instance.state is InstanceState.QUARANTINED and (instance.drain_pending
                                                             or instance.terminate_pending):
            return self.reboots.finish_quarantine(instance)
        if instance.state is InstanceState.QUARANTINED and instance.replacement_watch \
                and self.validations is not None:
            return self.validations.watch_replacement(instance, now)  # its replacement, to validate
        if instance.state is InstanceState.AVAILABLE and instance.waiting_jobs:
            self.reboots.release_waiting(instance)  # back after its reboot; a delivery died after
            return "released_waiting_jobs"
        if instance.notice and self.aws_notices is not None:
            return self.aws_notices.sweep(instance.container_inst_id, now)  # AWS takes the node away
        if instance.warning and self.warnings is not None \
                and instance.state in (InstanceState.AVAILABLE, InstanceState.SUSPECT):
            return self.warnings.sweep(instance, now)  # a driver warning: repair, or move its jobs
        if instance.lost_node_suspect and self.lost_nodes is not None:
            return self.lost_nodes.sweep(instance, now)  # flagged on a missing answer: its agent back?
        self.data.deadlines.clear_instance(instance.container_inst_id, instance.state)
        return "cleared"

    def _job_item(self, item: dict[str, Any], now: float) -> str:
        kind = item.get("item_type")
        if kind == "SUSPECT":
            return self._suspect(item, now)
        if kind == NOTICE_ITEM_TYPE:  # an e-mail whose sender died after its decision
            return self.notices.sweep(item, now)
        if kind == PREFLIGHT_ITEM_TYPE:  # a preflight round past its bound, a pin to hand over
            return self.preflights.sweep(item, now)
        if kind != "JOB":
            return "ignored"
        return self._job(self.data.jobs.job_from_item(item), item, now)

    def _suspect(self, item: dict[str, Any], now: float) -> str:
        """A suspect whose health check was never asked for (its delivery died): ask."""
        suspect = suspect_from_item(item)
        job = self.data.jobs.get_job(suspect.job_id)
        if job is None or job.attempt != suspect.attempt or job.state not in RECOVERING_JOB_STATES \
                or not suspect.pending:
            instance = self.data.instances.get_instance(suspect.node) if job is not None else None
            if job is not None and instance is not None and instance.fenced \
                    and instance.state is InstanceState.AVAILABLE:
                # The job moved on before its node was checked: the check runs for the node
                # alone (its fence keeps it out of placement until then).
                self.health.request(job, suspect.node)
            self.data.faults.health_check_requested(suspect)
            return "suspect_settled"
        result = self.suspects.request_check(job, suspect.node)
        if result in ("waiting_for_gpus",) or result.startswith("instance_"):
            self.data.faults.rearm_suspect(suspect, now + RETRY_INTERVAL_SECONDS)
        return "suspect_check_requested"

    def _job(self, job: Job, item: dict[str, Any], now: float) -> str:
        repo = self.data
        if job.state is JobState.PENDING_RESTART:
            settings = self.settings
            give_up_at = ((job.fault_started_at or now) + settings.health_check_timeout_seconds
                          + settings.reboot_timeout_seconds + RESTART_GIVE_UP_MARGIN_SECONDS)
            why = "the gang restart did not happen in time (instances or old ranks never became ready)"
            for wait in (job.relocation_wait, job.restart_wait):
                if wait is not None:
                    # Waiting for a free node to relocate onto, or for its own nodes to be
                    # free: the wait's own deadline (try_restart fails it then, with its
                    # reason; a check and a repair may have spent the fault's time before it
                    # began); this is the backstop.
                    give_up_at = max(give_up_at, wait.until + RESTART_GIVE_UP_MARGIN_SECONDS)
                    why = wait.timeout_reason()
            hold = job.breaker_hold
            if hold is not None:
                # Held by the breaker first: the restart's time counts from when it went on.
                give_up_at = max(give_up_at, (hold.resumed_at or hold.until) + settings.reboot_timeout_seconds
                                 + RESTART_GIVE_UP_MARGIN_SECONDS)
            if now >= give_up_at and self._still_in_repair(job):
                # A node it waits for is still being repaired (a repair that did not hold,
                # validated again): the node's own deadlines bound that, not this backstop.
                repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
                return "restart_waiting_for_repair"
            if now >= give_up_at:
                self.restarts.fail_pending_restart(job, why)
                return "restart_timed_out"
            if job.stop_fanout:
                self.gang.stop_due(job, now)
            self._kick_checks(job)
            # A found verdict moves the job on before every rank ended: the event that
            # completed the latch may have died since, before counting the suspects.
            action = self._suspects_counted_late(job)
            if action is None:
                if job.in_fault:
                    self._counted_after_repair(job)  # the restart's gate adds the shards
                action = self.restarts.try_restart(job.job_id).action
            if action == "waiting":
                repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            return f"restart_{action}"
        if job.state is JobState.HELD:
            # Waiting for the breaker's reset (domain.breaker.hold): go on, fail, or wait.
            return self.holds.sweep(job, now, self.restarts.try_restart)
        if job.state is JobState.PENDING_HEALTHCHECK:
            give_up_at = (job.fault_started_at or now) + 2 * self.settings.health_check_timeout_seconds \
                + RESTART_GIVE_UP_MARGIN_SECONDS
            if now >= give_up_at:
                # Every check has its own timeout (the node's): this is the backstop behind them.
                self.restarts.fail_waiting(job, "the fault's health checks did not conclude in time "
                                                f"({int(give_up_at - (job.fault_started_at or now))} s)")
                return "health_check_timed_out"
            # Visited: due again in a minute, committed first (a step that fails at some call
            # is tried again then, the job not left overdue; a transition sets its own deadline).
            repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            # The stop intent sent, the stops asked again at a paced interval; a fault whose
            # verdicts are all in once every rank ended goes on (its event may have died).
            self.faults.converge_fault(job)
            self._kick_checks(job)
            fresh = repo.jobs.get_job(job.job_id) or job
            if fresh.state is JobState.PENDING_HEALTHCHECK and fresh.in_fault:
                self._settle_fault(fresh)
            return "health_check_waiting"
        if job.state is JobState.STARTING and job.restarted_attempt == job.attempt:
            return self.restarts.resume(job)
        if job.state is JobState.STARTING and self.launches is not None and is_launch(job):
            # A queue launch: its intent sent again if its tick died; confirmed once every rank
            # is registered (their RUNNING events lost).
            return self.launches.resume(job)
        if job.state is JobState.STARTING:
            # A launch claimed before start intents (no intent): its ranks' RUNNING events confirm
            # it. Those events lost, every rank registered: confirm it here.
            if self.restarts.confirm_running(job, "every rank registered (confirmed by the sweep)"):
                return "launch_confirmed"
            repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            return "launch_waiting"
        if job.state in (JobState.NODE_LOST, JobState.HUNG):
            return self._heartbeat_backstop(job, item, now)
        if job.state is JobState.SUSPENDING:
            # The grace is over (stop by force), or stops are still to be confirmed.
            return self.suspensions.sweep(job, now)
        if job.stop_fanout:
            # An ended job whose ranks are still being stopped (or a cancel).
            action = self.gang.stop_due(job, now)
            if action == "stopped" and job.state is JobState.CANCELING:
                self.faults.on_attempt_ended(repo.jobs.get_job(job.job_id) or job, job.attempt)
            latest = repo.jobs.get_job(job.job_id)
            if latest is not None and latest.stop_fanout:
                repo.deadlines.rearm_job(latest, now + RETRY_INTERVAL_SECONDS)
            return action
        if job.state is JobState.RUNNING or job.state.is_terminal or job.state in QUEUE_OWNED_JOB_STATES:
            repo.deadlines.clear_job(job.job_id, job.state, item.get("deadline_at"))
            return "cleared"
        # Every other state has a step above: one without is a bug, never a reason to drop
        # the job from the index (it would be forgotten). Look again, loudly.
        logger.error("job due with no step for its state", extra={"job_id": job.job_id,
                                                                  "state": job.state.value})
        repo.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
        return "no_step"

    def _still_in_repair(self, job: Job) -> bool:
        """A node the job waits for is REBOOTING with a deadline of its own (its reboot, its
        GPU reset, its validation after repair): read only once the backstop is due."""
        if not job.in_fault or job.tally.rebooting <= 0:
            return False
        waiting = [s.node for s in self.data.faults.suspects(job.job_id, job.attempt) if s.rebooting]
        instances = self.data.instances.get_instances(waiting) if waiting else {}
        return any(i.state is InstanceState.REBOOTING and i.deadline_at is not None
                   and job.job_id in i.waiting_jobs for i in instances.values())

    def _heartbeat_backstop(self, job: Job, item: dict[str, Any], now: float) -> str:
        """A job the heartbeats moved out of RUNNING (NODE_LOST, HUNG): the heartbeat sweep
        hands it to the recovery loop when its time comes (``heartbeat_escalate_at``). If that
        never happened, do it here; otherwise look again later (a hung job that is only
        reported keeps running, e-mailed)."""
        escalate_at = item.get("heartbeat_escalate_at")
        if escalate_at is None or now < float(escalate_at) + BACKSTOP_MARGIN_SECONDS:
            self.data.deadlines.rearm_job(job, backstop_deadline(now, None if escalate_at is None
                                                            else float(escalate_at)))
            return "heartbeat_waiting"
        attr = lost_attr(job.attempt) if job.state is JobState.NODE_LOST else hung_attr(job.attempt)
        ranks = sorted(int(r) for r in item.get(attr) or () if str(r).isdigit())
        rank = self.data.jobs.get_rank(job.job_id, ranks[0]) if ranks else None
        if rank is None or rank.attempt != job.attempt:
            self.data.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)
            return "heartbeat_waiting"
        if rank.task_arn:
            # Its task may have ended, its STOPPED event's deliveries spent (the rank then no
            # longer read live by the heartbeat sweep, whose own look at ECS never came):
            # ECS's record settles it, handled as that event, before the job is handed over.
            # Handed over only if that left the job where it was.
            self.data.deadlines.rearm_job(job, now + RETRY_INTERVAL_SECONDS)  # due again first
            self.live_after_lost_stops([rank])
            fresh = self.data.jobs.get_job(job.job_id)
            if fresh is None or (fresh.state, fresh.attempt) != (job.state, job.attempt):
                return "heartbeat_backstop_ended"
        if job.state is JobState.NODE_LOST and now < float(escalate_at) + BACKSTOP_RECHECK_SECONDS \
                and self._agent_disconnected(rank):
            # A DCGM check cannot run where ECS cannot reach, so the hand-over would end
            # undiagnosed and leave a dead node AVAILABLE: the heartbeat sweep's two readings
            # decide this node (unreachable, or its ECS agent alone). Only a heartbeat sweep
            # failing for an hour more has the check tried anyway.
            self.data.deadlines.rearm_job(job, now + BACKSTOP_MARGIN_SECONDS)
            return "heartbeat_waiting_agent_disconnected"
        reason = (f"rank {rank.rank} {job.state.value} on {rank.container_inst_id} past the time the "
                  "heartbeat sweep hands it to the recovery loop")
        outcome = self.faults.report_suspected_fault(job.job_id, job.attempt, rank.container_inst_id, reason,
                                                     rank.rank, from_states=[job.state])
        return f"heartbeat_backstop_{outcome.action}"

    def _agent_disconnected(self, rank: Rank) -> bool:
        """ECS reads the rank's node's agent disconnected (a node ECS does not know: False, the
        hand-over as before; a failed call, or no Describe token, is raised: looked at again)."""
        if self.ecs is None:
            return False
        return self.ecs.is_agent_connected(rank.container_instance_arn or rank.container_inst_id) is False

    def _kick_checks(self, job: Job) -> None:
        """The job's health checks waiting for a slot (one may have been given back while
        its kick was lost, or the cluster's limit let go of one)."""
        if job.in_fault and not job.tally.all_decided:
            self.health.start_all_waiting(job.job_id)

    def _counted_after_repair(self, job: Job) -> Job:
        """The job's tally with its shards added; short of verdicts, with the healthy ones
        whose writer died before counting them counted now (FaultRepository.recount)."""
        faults = self.data.faults
        counted = faults.counted(job)
        if counted.tally.ranks_ended and not counted.tally.all_decided and faults.recount(job):
            counted = faults.counted(job)
        return counted

    def _suspects_counted_late(self, job: Job) -> str | None:
        """Every rank ended but the event that completed the latch died before counting the
        suspects (its deliveries dead-lettered): count them (once) and go on as that event
        would have (``on_attempt_ended``'s action). None: nothing to count."""
        if not job.in_fault or job.tally.total is not None \
                or Latch.ENDED not in self.data.latches.complete(job.job_id, job.attempt, job.world_size):
            return None
        return self.faults.on_attempt_ended(job, job.attempt)

    def _settle_fault(self, job: Job) -> None:
        """The suspects counted late (above); then the fault concluded if every verdict is in
        (or, verdicts pending, a relocatable job moved to a spare)."""
        if self._suspects_counted_late(job) is not None:
            return
        if self._counted_after_repair(job).tally.all_decided:
            self.settlement.conclude(job)
        elif job.tally.ranks_ended:
            self.restarts.spare_first(job)  # a spare may have freed up, or a delivery died
