"""``RecoveryService``: the façade the handlers (and the heartbeat and queue services)
call. It builds the stages over shared ports and delegates; it holds no logic."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsActionFailed
from gpu_recovery.constants import GPU_RESET_GROUP, GPU_VALIDATION_GROUP
from gpu_recovery.domain.fault_catalog import FaultCatalog, default_catalog
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, JobState
from gpu_recovery.domain.time_sharing import SuspendKind
from gpu_recovery.events.ecs import EcsContainerInstanceDetail, EcsTaskDetail
from gpu_recovery.recovery.aws_notices import AwsNotices, CapacityPort
from gpu_recovery.recovery.breaker.gate import NodeActionGate
from gpu_recovery.recovery.breaker.held_jobs import HeldJobs
from gpu_recovery.recovery.breaker.operations import BreakerOperations
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.fault_suspects import FaultSuspects
from gpu_recovery.recovery.gang import BatchResult, GangBatch, GangOps, GangQueuePort
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.gpu_resets import GpuResets
from gpu_recovery.recovery.health_checks import HealthChecks
from gpu_recovery.recovery.launch_templates import LaunchTemplates
from gpu_recovery.recovery.lost_node_checks import LostNodeChecks
from gpu_recovery.recovery.lost_stop_events import handle_stopped
from gpu_recovery.recovery.node_tasks import NodeTasks
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.placement import PlacementHolds
from gpu_recovery.recovery.ports import (
    EcsPort,
    Invocation,
    MetricsPort,
    MetricsRelay,
    NoReplacer,
    NotifierPort,
    Outcome,
    RebootPort,
    RedeliveryPort,
    ReplacePort,
    VerdictReaderPort,
)
from gpu_recovery.recovery.preflight.handover import PreflightHandover
from gpu_recovery.recovery.preflight.rounds import Preflights
from gpu_recovery.recovery.queue_launches import QueueLaunches, is_launch
from gpu_recovery.recovery.ranks import RankOperations, RankRegistration
from gpu_recovery.recovery.reactions import (
    AgentChanged,
    CoupledToCheck,
    FaultSeen,
    Handler,
    HoldsDue,
    JobLeftNode,
    NodeBack,
    RankNotPlaced,
    RanksStarted,
    Reactions,
    ReservationsReleased,
    RestartDue,
    StoppedEventLost,
    TaskStopped,
    on,
)
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.job_settlement import JobSettlement
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.remediation.node_unreachable import NodeUnreachable
from gpu_recovery.recovery.remediation.notices import RemediationNotices
from gpu_recovery.recovery.remediation.tenant_evidence import TenantEvidence
from gpu_recovery.recovery.restart_nodes import RestartNodes
from gpu_recovery.recovery.suspension import Suspensions
from gpu_recovery.recovery.sweep import Sweep
from gpu_recovery.recovery.taken_targets import TakenTargets
from gpu_recovery.recovery.task_events import TaskEvents
from gpu_recovery.recovery.validations import Validations
from gpu_recovery.recovery.warnings import GpuWarnings
from gpu_recovery.repository import Repository
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.scheduling import SchedulingRepository
from gpu_recovery.repository.time_sharing import SuspensionRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)


class RecoveryService:
    def __init__(self, repo: Repository, ecs: EcsPort, rebooter: RebootPort, notifier: NotifierPort,
                 verdicts: VerdictReaderPort, settings: Settings, metrics: MetricsPort | None = None, *,
                 catalog: FaultCatalog | None = None, replacer: ReplacePort | None = None,
                 gang_queue: GangQueuePort | None = None, tag_lookups: GangQueuePort | None = None,
                 capacity: CapacityPort | None = None, redeliveries: RedeliveryPort | None = None) -> None:
        policy = settings.remediation.policy(catalog or default_catalog(), settings.suspect_exit_codes)
        self._metrics = MetricsRelay(metrics)
        # The ports, kept for callers that share them (queue scheduler, tests).
        self.repo, self.ecs, self.settings, self.policy, self.verdicts = repo, ecs, settings, policy, verdicts
        replacer = replacer or NoReplacer()
        self.redeliveries = redeliveries
        # The e-mails, owed with the decisions they report (the outbox), for every stage.
        notices = Notices(repo.notices, repo.faults, notifier)
        # What one stage tells the others: every stage built with it, the table declared once
        # below (``_reactions``), when every stage exists.
        self.reactions = reactions = Reactions()
        self.ranks = RankOperations(repo, repo.registrations, ecs, notices, metrics=self._metrics,
                                    settings=settings, tag_lookups=tag_lookups, reactions=reactions)
        scheduling = SchedulingRepository(repo.jobs)
        # A queue launch's ranks: the job's spec and its launch plan (the start fan-out's other source).
        launch_templates = LaunchTemplates(repo.jobs, scheduling, repo.fanouts, repo.instances,
                                           repo.registrations, repo.latches)
        self.gang = GangOps(repo.jobs, repo.fanouts, ecs, self.ranks, FaultRepository(repo.tables),
                            gang_queue, policy=policy, metrics=self._metrics, settings=settings,
                            reactions=reactions, launches=launch_templates)
        suspension_items = SuspensionRepository(repo.jobs)
        self.suspensions = Suspensions(repo.jobs, suspension_items, notices, self.gang, ecs,
                                       metrics=self._metrics, reactions=reactions)
        # A waiting relocation takes back the spares lent to queue jobs (their suspension).
        holds = HeldJobs(repo, repo.breaker, notices, metrics=self._metrics, settings=settings)
        restart_nodes = RestartNodes(repo, scheduling, ecs)
        self.restarts = GangRestart(repo, repo.restarts, ecs, notices, self.gang, holds, restart_nodes,
                                    suspension_items, policy=policy, metrics=self._metrics, settings=settings,
                                    request_suspend=self.suspensions.request, reactions=reactions)
        # A restart's rank refused on a relocation's target another task took: moved again.
        self.taken_targets = TakenTargets(repo, restart_nodes, self.restarts, self.gang, reactions)
        self.launches = QueueLaunches(repo.jobs, scheduling, repo.latches, repo.deadlines, self.gang,
                                      self.restarts, notices)
        # The breaker every node action asks, and the node attributes kept in its cordons' sync.
        gate = NodeActionGate(repo.breaker, ecs, notices, metrics=self._metrics, settings=settings)
        cordons = Cordons(repo.instances, ecs, notices, gate, metrics=self._metrics, reactions=reactions)
        self.reboots = Reboots(repo, repo.reboots, ecs, self.ranks, self.gang, gate, cordons, notices,
                               rebooter=rebooter, replacer=replacer, policy=policy, metrics=self._metrics,
                               settings=settings, reactions=reactions)
        # Every kind of task the stack runs on a node starts through this one (recovery.node_tasks).
        self.node_tasks = tasks = NodeTasks(ecs, repo.jobs, repo.node_tasks, self._metrics, settings)
        # The node decision and the stages it hands over to.
        owed = RemediationNotices(notices, gate, cordons)
        settlement = JobSettlement(repo.jobs, notices, owed, policy=policy, metrics=self._metrics,
                                   held_job_deadline_seconds=settings.held_job_deadline_seconds,
                                   reactions=reactions)
        self.resets = resets = GpuResets(repo.instances, repo.gpu_resets, ecs, tasks, self.reboots, notices,
                                         metrics=self._metrics, settings=settings,
                                         escalation=policy.escalation)
        tenant_evidence = TenantEvidence(repo.jobs, notices, limit=settings.preflight.tenant_limit,
                                         sources=policy.catalog.evidence_sources, metrics=self._metrics)
        self.remediation = NodeRemediation(repo, self.ranks, self.reboots, gate, cordons, notices, owed,
                                           settlement, resets, tenant_evidence, policy=policy,
                                           metrics=self._metrics, reactions=reactions)
        self.unreachable = NodeUnreachable(repo, self.remediation, self.gang, policy=policy,
                                           metrics=self._metrics)
        self.validations = Validations(repo, repo.validations, ecs, tasks, self.reboots, self.remediation,
                                       cordons, gate, notices, verdicts=verdicts, replacer=replacer,
                                       metrics=self._metrics, settings=settings, reactions=reactions)
        self.lost_nodes = LostNodeChecks(repo.instances, repo.validations, ecs, self.validations,
                                         metrics=self._metrics, settings=settings)
        self.health = HealthChecks(repo, repo.health_checks, ecs, tasks, self.reboots, self.remediation,
                                   settlement, owed, notices, verdicts=verdicts, leases=repo.verdict_leases,
                                   policy=policy, metrics=self._metrics, settings=settings,
                                   reactions=reactions)
        self.warnings = GpuWarnings(repo, repo.warnings, self.remediation, gate, cordons, notices,
                                    policy=policy, metrics=self._metrics, settings=settings)
        self.placement = PlacementHolds(repo, ecs, cordons, self.restarts, restart_nodes, settings=settings)
        # Which exits of a fault name a suspect, and their checks (issue 50).
        self.suspects = FaultSuspects(repo.faults, repo.latches, self.health, self.remediation,
                                      check_all_nodes=settings.check_all_nodes_on_fault)
        self.faults = TaskEvents(repo, self.ranks, self.suspects, self.restarts, self.remediation,
                                 self.suspensions, self.gang, notices, settlement, policy=policy,
                                 metrics=self._metrics, settings=settings, reactions=reactions)
        self.breaker = BreakerOperations(repo, repo.breaker, self.remediation, gate, notices, policy=policy,
                                         metrics=self._metrics, settings=settings)
        handover = PreflightHandover(repo, self.remediation, self.gang, metrics=self._metrics,
                                     reactions=reactions)
        self.preflights = Preflights(repo, handover, notices, tenant_evidence, metrics=self._metrics,
                                     settings=settings)
        # AWS's notices that capacity goes away (docs/aws-notices.md).
        self.aws_notices = AwsNotices(repo, repo.aws_notices, ecs, cordons, notices, capacity, policy=policy,
                                      metrics=self._metrics, settings=settings, stop_gang=self.gang.stop,
                                      reactions=reactions)
        self.sweeper = Sweep(repo, self.faults, self.health, self.reboots, self.restarts, self.breaker,
                             self.suspensions, self.gang, self.preflights, self.warnings,
                             validations=self.validations, lost_nodes=self.lost_nodes,
                             aws_notices=self.aws_notices,
                             suspects=self.suspects, settlement=settlement, resets=resets, cordons=cordons,
                             holds=holds, notices=notices, metrics=self._metrics, settings=settings,
                             launches=self.launches, live_after_lost_stops=self.live_after_lost_stops,
                             ecs=ecs)
        reactions.declare(self._reactions())

    def _reactions(self) -> list[tuple[type, Handler]]:
        """The reactions table: each event a stage emits (``recovery.reactions``) and the one
        stage that reacts to it."""
        return [
            # A fault's nodes reserved for its job at once (before its other ranks free them).
            on(FaultSeen, lambda e: self.placement.on_fault(e.job, e.node, joining=e.joining)),
            # A stopped task's node may be free: a restart waiting for it, a short spare pool.
            on(TaskStopped, lambda e: self.placement.on_task_stopped(e.container_instance_arn, e.job_id)),
            # A rank found STOPPED whose STOPPED event was lost: handled as that event.
            on(StoppedEventLost, lambda e: self._lost_stopped_event(e.task, e.rank)),
            # A job left a warned node at its checkpoint: the node may be repaired now.
            on(JobLeftNode, lambda e: self.warnings.after_move(e.node)),
            # The cordon sweep starts: the spare and reserved holds first.
            on(HoldsDue, lambda e: self.placement.refresh(e.worklist, e.job_deadlines)),
            # A restart placed (or the job ended): its reservations go.
            on(ReservationsReleased, lambda e: self.placement.after_restart(e.job_id)),
            # The start fan-out reports back to the queue launch or the restart that asked it.
            on(RanksStarted, lambda e: self._starter(e.job).on_started(e.job)),
            on(RankNotPlaced, lambda e: self.launches.start_failed(e.job, e.rank, e.why, e.error_code)
               if is_launch(e.job) else self.taken_targets.not_placed(e.job, e.rank, e.why)),
            # A verdict settled a fault, a node came back, a job must leave a node: its restart.
            on(RestartDue, lambda e: self.restarts.try_restart(e.job_id)),
            # A fault's first checks found nothing: the nodes whose exits followed are checked.
            on(CoupledToCheck, lambda e: self.suspects.check_coupled(e.job, e.nodes)),
            # Every repaired node's return goes through its validation under load.
            on(NodeBack, lambda e: self.validations.node_back(e.instance, e.repair, e.why,
                                                              reset_result=e.reset_result)),
            # A lost node flagged SUSPECT: its ECS agent's reconnect starts the stack's own check.
            on(AgentChanged, lambda e: self.lost_nodes.on_change(e.instance, e.detail)),
        ]

    def _starter(self, job: Job) -> QueueLaunches | GangRestart:
        """Whose start intent the job's is: a queue launch's, or a gang restart's."""
        return self.launches if is_launch(job) else self.restarts

    @property
    def metrics(self) -> MetricsPort:
        return self._metrics.target

    @metrics.setter
    def metrics(self, metrics: MetricsPort) -> None:
        """The invocation's metrics, for every stage at once (they hold the relay)."""
        self._metrics.target = metrics

    @property
    def metrics_relay(self) -> MetricsRelay:
        """The port every stage holds: whatever this invocation's metrics are, and the next's."""
        return self._metrics

    # Handlers.
    def on_task_state_change(self, detail: EcsTaskDetail) -> Outcome:
        return self.faults.on_task_state_change(detail)

    def on_tag_lookups(self, details: Sequence[EcsTaskDetail]) -> list[Outcome | Exception]:
        """The tag lookup worker's batch: the tasks described together (one DescribeTasks per
        100, under the stack's Describe budget: an exception fails the whole batch, SQS
        delivers it again), then each event handled with its rank (an exception, or its task's
        own lookup failing: that event's, delivered again)."""
        ranks = self.ranks.look_up_tags(d.taskArn for d in details)
        outcomes: list[Outcome | Exception] = []
        for detail in details:
            if detail.taskArn not in ranks:  # answered MISSING: delivered again
                outcomes.append(EcsActionFailed.missing("DescribeTasks", [detail.taskArn]))
                continue
            rank = ranks[detail.taskArn]
            if isinstance(rank, Exception):
                outcomes.append(rank)
                continue
            if rank is None:
                outcomes.append(Outcome("ignored", detail={"why": "not a protected job"}))
                continue
            try:
                fresh = self.repo.jobs.get_rank(rank.job_id, rank.rank) or rank  # an earlier event moved it
                outcomes.append(self.faults.on_task_state_change(detail, known=fresh))
            except Exception as error:
                outcomes.append(error)
        return outcomes

    def redeliver_soon(self, records: Sequence[Mapping[str, Any]]) -> int:
        """A worker's failed messages (the records of its SQS event): on their first receive,
        visible again once any claim they made has ended its lease, not after the queue's
        visibility timeout (``adapters.queue.Redeliveries``); how many were."""
        return self.redeliveries.bring_forward(records) if self.redeliveries is not None and records else 0

    def _lost_stopped_event(self, task: dict[str, Any], rank: Rank | None) -> Outcome:
        """A task found STOPPED by DescribeTasks whose STOPPED event never arrived (or was
        dead-lettered): the event's own handling (DescribeTasks returns the event's detail), its
        rank the one the round read (not looked up again)."""
        return self.faults.on_task_state_change(EcsTaskDetail.model_validate(task), rank)

    def on_health_check_stopped(self, detail: EcsTaskDetail, invocation: Invocation | None = None) -> Outcome:
        """``invocation``: the Lambda invocation delivering the event (its verdict lease's
        holder); None (a test, no Lambda context): the verdict is worked without the lease."""
        if detail.group.startswith(GPU_RESET_GROUP):  # same rule, its own task
            return self.resets.on_stopped(detail)
        if detail.group.startswith(GPU_VALIDATION_GROUP):  # a repaired node's validation
            return self.validations.on_stopped(detail, invocation)
        ends = (lambda: invocation.deadline - clock.now()) if invocation is not None else None
        with clock.invocation_ends(ends):
            return self.health.on_stopped(detail, invocation)

    def on_container_instance_change(self, detail: EcsContainerInstanceDetail,
                                     event_time: datetime | None = None) -> Outcome:
        """A rebooting node's state change, or a lost node's whose ECS agent may be back (the
        rule matches no other node's: a node that frees reaches the waiting relocations and the
        spare pool through the sweep's minute refresh, ``recovery.placement``)."""
        return self.reboots.on_container_instance_change(detail, event_time)

    def on_aws_notice(self, event: dict[str, Any]) -> Outcome:
        """An EC2 or AWS Health notice that instances go away (``recovery.aws_notices``)."""
        return self.aws_notices.on_event(event)

    def sweep(self, time_left: Callable[[], float] | None = None) -> Outcome:
        with clock.invocation_ends(time_left):
            return self.sweeper.run(time_left)

    def on_gang_batch(self, body: Mapping[str, Any], *, receive_count: int = 1,
                      time_left: Callable[[], float] | None = None) -> BatchResult:
        """One batch of a gang fan-out (the queue's worker); ValueError for a malformed body."""
        with clock.invocation_ends(time_left):
            return self.gang.run(GangBatch.from_body(body), receive_count=receive_count, time_left=time_left)

    def start_ranks(self, job_id: str) -> bool:
        """Send (or run) the start intent of a claimed queue launch (the scheduler's tick)."""
        job = self.repo.jobs.get_job(job_id)
        return job is None or bool(self.gang.start(job))

    def fail_unstarted(self, job_id: str, attempt: int, why: str) -> bool:
        """A claimed queue launch whose task definition is unusable: FAILED, e-mailed (the tick's)."""
        return self.launches.fail_unstarted(job_id, attempt, why)

    def stop_gang(self, job_id: str) -> bool:
        """Send the job's stop intent (the jobs API's cancel commits it)."""
        job = self.repo.jobs.get_job(job_id)
        return job is None or bool(self.gang.stop(job))

    # Other services.
    def register_rank(self, reg: RankRegistration) -> Rank:
        return self.ranks.register_rank(reg)

    def report_suspected_fault(self, job_id: str, attempt: int, inst_id: str, reason: str,
                               failing_rank: int | None = None,
                               from_states: Iterable[JobState] = ACTIVE_JOB_STATES) -> Outcome:
        return self.faults.report_suspected_fault(job_id, attempt, inst_id, reason, failing_rank,
                                                  from_states)

    def on_boot_reported(self, inst_id: str, boot_time: float) -> Outcome:
        return self.reboots.on_boot_reported(inst_id, boot_time)

    def live_after_lost_stops(self, ranks: list[Rank]) -> list[Rank]:
        """The heartbeat sweep's lost ranks (before their node is checked): those whose task ECS
        describes STOPPED handled as their lost STOPPED events; returns the others."""
        return handle_stopped(self.ecs, self.reactions, ranks, [])[0]

    def gpu_warning(self, inst_id: str) -> str:
        """The heartbeat service recorded a driver warning on the node: cordon it and ask its
        jobs to move now; the sweep repairs it (recovery.warnings)."""
        return self.warnings.at_report(inst_id)

    def node_unreachable(self, job_id: str, attempt: int, inst_id: str, lost: list[Rank], lost_since: float,
                         why: str, host_reporting: bool = False) -> str:
        """The heartbeat service's node lost with its ECS agent disconnected: a node decision
        (``host_reporting``: its node agent still reports: the job fails, the node is a suspect)."""
        return self.unreachable.decide(job_id, attempt, inst_id, lost, lost_since, why,
                                       host_reporting=host_reporting)

    def request_suspend(self, job_id: str, attempt: int, *, kind: SuspendKind, reason: str,
                        grace_seconds: int, actor: str, hold: bool = False, by_job: str = "",
                        by_user: str = "", by_priority: int | None = None) -> bool:
        return self.suspensions.request(job_id, attempt, kind=kind, reason=reason,
                                        grace_seconds=grace_seconds, actor=actor, hold=hold,
                                        by_job=by_job, by_user=by_user, by_priority=by_priority)

    def go_suspend(self, job_id: str, rank: int, attempt: int | None = None) -> Outcome:
        return self.suspensions.go_suspend(job_id, rank, attempt)
