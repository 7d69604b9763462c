"""Stage 2: the DCGM health check of a suspect instance, exactly once per claim.

Open (or join) -> claim -> StartTask -> record the task -> verdict
(``recovery.health_check_verdicts``). The claim, with a deterministic ``startedBy``, is
committed before StartTask; a delivery that died after it leaves a lease that expires, and
whoever takes the claim over looks the task up by ``startedBy`` before starting one. The
verdict is matched on that ``startedBy`` (not on the task ARN, whose write may have been the
one that failed).

A check of a node with no evidence of its own, checked only because every node of its job is
(``health_check_all_nodes``), is *grouped* (``Instance.hc_grouped``): once its node's GPUs are
free it waits in its job's queue, and the event that finds ``GROUP_SIZE`` waiting starts them
in one StartTask (one claim each, under one startedBy the call's nodes share); the job's
attempt end and the sweep's kick start the rest, ten a call. At 1,024 nodes that was 113 StartTasks where
it was 1,024 (the scale bench), each a token of the ECS budget the other ranks' stops need.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    RETRY_INTERVAL_SECONDS,
    system_stop_reason,
)
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.escalation import history_from_item
from gpu_recovery.domain.launch_plan import MAX_INSTANCES_PER_START
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import (
    HEALTH_CHECK_STATES,
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import node_tasks
from gpu_recovery.recovery.goodput_metrics import job_failed
from gpu_recovery.recovery.health_check_verdicts import (
    VERDICT_ROUNDS,
    CheckVerdictData,
    HealthCheckVerdicts,
)
from gpu_recovery.recovery.lost_node_checks import MarksNodes
from gpu_recovery.recovery.node_tasks import NodeTasks
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import (
    Invocation,
    MetricsPort,
    Outcome,
    ReadsEcsAgent,
    StopsAndDescribesTasks,
    VerdictReaderPort,
    after_commit,
)
from gpu_recovery.recovery.reactions import Reactions, RestartDue
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.job_settlement import JobSettlement
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.remediation.notices import RemediationNotices
from gpu_recovery.recovery.stage_data import (
    ReadsJob,
    ReadsNode,
    ReadsNodeItems,
    RecordsNodeDecisions,
    RecordsObservedFaults,
)
from gpu_recovery.recovery.undiagnosed import settle_undiagnosed
from gpu_recovery.repository.deadlines import DeadlineIndex
from gpu_recovery.repository.health_check_slots import Claim, HealthCheckSlots
from gpu_recovery.repository.health_checks import HealthCheckRepository
from gpu_recovery.repository.verdict_leases import VerdictLeaseRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A cascade's suspects ask for their DCGM StartTask at once, past the stack's ECS budget
# (burst 90, 36 a second): each reserves its token and waits its turn, up to this long on
# the rank's exit event (well inside the function's timeout; ~990 tokens' worth), up to
# START_TURN_SECONDS elsewhere (the sweep keeps a margin of 12 s, a verdict's kick may
# follow up to 25 s of verdict rounds), its claim's lease (75 s) keeping a redelivered
# event from reserving a second token. A check whose turn is further off gives its claim
# back: pending, due when its token is, for the sweep (no failed invocation, no retry).
EVENT_START_TURN_SECONDS = 25.0
START_TURN_SECONDS = 5.0
FOLLOW_UP_SECONDS = 60  # the sweep finishes a verdict's reboot or drain after this
GROUP_SIZE = MAX_INSTANCES_PER_START  # grouped checks a StartTask (ECS takes 10 instances a call)
# A job's attempt end, and the sweep's kick each minute, start its grouped checks still
# waiting, this many StartTasks at most.
END_GROUPS = 10


def health_check_started_by(instance: Instance) -> str:
    """Deterministic per check and placement attempt: the same claim finds its task."""
    return task_started_by.node_task(task_started_by.HEALTH_CHECK, instance.container_inst_id,
                                     instance.hc_requested_at, instance.check.attempts)


def group_started_by(instances: Sequence[Instance]) -> str:
    """The startedBy of one StartTask on several nodes' checks: unique per the checks and
    placement attempts it starts (each node's claim stores it, so a take-over finds the call's
    tasks again and tells its own node's by its container instance)."""
    if len(instances) == 1:
        return health_check_started_by(instances[0])
    return task_started_by.node_task(task_started_by.HEALTH_CHECK_GROUP, *sorted(
        f"{i.container_inst_id}:{i.hc_requested_at}:{i.check.attempts}" for i in instances))


class HealthCheckData(CheckVerdictData, RecordsNodeDecisions, Protocol):
    """What the check reads and writes besides its verdict's and its own records: the node,
    the slots it waits for, a busy node's known verdict, its deadline pushed."""

    deadlines: DeadlineIndex
    slots: HealthCheckSlots

    @property
    def jobs(self) -> CheckJobs: ...
    @property
    def instances(self) -> CheckNodes: ...


class CheckJobs(ReadsJob, Protocol):
    """The jobs waiting for a check."""

    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


class CheckNodes(ReadsNodeItems, ReadsNode, RecordsObservedFaults, Protocol):
    """The node checked; a fault observed only."""


class CheckEcs(StopsAndDescribesTasks, MarksNodes, ReadsEcsAgent, Protocol):
    """A check looked at or stopped; the node's agent read, and marked, when none gave a verdict."""


class HealthChecks:
    def __init__(self, data: HealthCheckData, records: HealthCheckRepository, ecs: CheckEcs,
                 tasks: NodeTasks, reboots: Reboots, remediation: NodeRemediation, settlement: JobSettlement,
                 owed_notices: RemediationNotices, notices: Notices, *, verdicts: VerdictReaderPort,
                 leases: VerdictLeaseRepository, policy: RemediationPolicy, metrics: MetricsPort,
                 settings: Settings, reactions: Reactions | None = None) -> None:
        self.data = data
        self.records = records
        self.ecs = ecs
        self.tasks = tasks
        self.policy = policy
        self.metrics = metrics  # the service's relay: the invocation's metrics
        self.settings = settings
        self.remediation = remediation
        self.settlement = settlement
        self.owed_notices = owed_notices
        self.notices = notices  # the outbox
        self.reactions = reactions or Reactions()  # told: a verdict lets a job restart, or move
        self.verdicts = HealthCheckVerdicts(data, records, tasks, leases, verdicts, reboots, remediation,
                                            catalog=policy.catalog, metrics=metrics,
                                            released=self._kick_after_release)

    def on_stopped(self, detail: EcsTaskDetail, invocation: Invocation | None = None, *,
                   decide_now: bool = False) -> Outcome:
        """The check's verdict (``HealthCheckVerdicts.on_stopped``)."""
        return self.verdicts.on_stopped(detail, invocation, decide_now=decide_now)

    # ------------------------------------------------------------ open / join
    def request(self, job: Job, inst_id: str, *, opened: Callable[[], None] | None = None,
                grouped: bool = False) -> str:
        """Open or join the health check of an instance (at most one per instance).
        ``opened``: called once the check is open or joined (its instance's deadline then
        brings the sweep to it), before the start waits for its turn at the ECS budget.
        ``grouped``: a check this opens starts with others of the job (the module's docstring)."""
        if not self.policy.modes.executes(Effect.HEALTH_CHECK):
            return self._diag_observed(job, inst_id)
        repo = self.data
        instance = repo.instances.get_instance(inst_id)
        if instance is not None and instance.state in HEALTH_CHECK_STATES and job.job_id in instance.hc_jobs:
            if opened is not None:  # joined by an earlier delivery
                opened()
            return self._start_read(instance, turn_within=EVENT_START_TURN_SECONDS,
                                    wait_for_group=True) or "waiting_for_gpus"
        now = clock.now()
        if not self.records.open(inst_id, job.job_id, now=now, retry_at=now + RETRY_INTERVAL_SECONDS,
                                 grouped=grouped) \
                and not self.records.join(inst_id, job.job_id):
            return self._instance_busy(job, inst_id)
        if opened is not None:
            opened()
        return self.start_if_ready(inst_id, turn_within=EVENT_START_TURN_SECONDS,
                                   wait_for_group=True) or "waiting_for_gpus"

    def _instance_busy(self, job: Job, inst_id: str) -> str:
        """The instance is already rebooting or quarantined (another job's fault): the
        verdict this job waits for is already known."""
        instance = self.data.instances.get_instance(inst_id)
        if instance is None:
            return "instance_missing"
        if instance.state is InstanceState.REBOOTING:
            label = SuspectVerdict.REBOOT
            findings = {"verdict": "reboot", "source": "instance already rebooting"}
        elif instance.state is InstanceState.QUARANTINED:
            label, findings = SuspectVerdict.QUARANTINED, {"verdict": "quarantined",
                                                           "source": "instance quarantined"}
        else:
            return f"instance_{instance.state.value.lower()}"
        result = "joined_reboot" if label is SuspectVerdict.REBOOT else "instance_quarantined"
        for _ in range(VERDICT_ROUNDS):
            suspect = self.data.faults.get_suspect(job.job_id, job.attempt, inst_id)
            if suspect is not None and not suspect.pending:
                return result  # recorded by an earlier delivery
            history = history_from_item(instance.fault_history)
            now = clock.now()
            job = self.data.faults.counted(job)
            record, outcome = self.settlement.job_verdict(job, inst_id, label, None, None,
                                                                      findings, history, now)
            after = replace(job, state=record.to, last_error=record.last_error or job.last_error)
            notice = self.owed_notices.outcome_notice(after, outcome, instance, None, None, label)
            owed = self.notices.owe([notice], now)
            if self.data.decisions.record_verdict_of_busy_instance(instance, record, record.waits_for_reboot,
                                                                   also=owed):
                self.notices.send([notice])
                if outcome.fails:
                    job_failed(self.metrics, self.data.jobs, job.job_id)
                if outcome.restarts:
                    after_commit("restart", self.reactions.emit, RestartDue(job.job_id))
                return result
            fresh = self.data.jobs.get_job(job.job_id)
            if fresh is None or fresh.attempt != job.attempt or fresh.state not in RECOVERING_JOB_STATES:
                return "moved_on"
            job = fresh
        return "raced"

    def _diag_observed(self, job: Job, inst_id: str) -> str:
        """Observe mode for the diag (``health_check=observe``): a suspect that reached the
        loop without its exit being judged first (the heartbeat service's lost node or
        hung rank) gets no RunTask. Its verdict is BLOCKED: the job relocates (if it may
        and restarts are enforced) or fails in the job table only; the node's last fault
        says what would have been done; one e-mail."""
        repo = self.data
        suspect = repo.faults.get_suspect(job.job_id, job.attempt, inst_id)
        if suspect is not None and not suspect.pending:
            return "observed"
        raw = repo.instances.get_instance_item(inst_id)
        if raw is None:
            return "instance_missing"
        instance = repo.instances.instance_from_item(raw)
        now = clock.now()
        evidence = self.verdicts.evidence(instance, raw, [job])
        plan = self.remediation.plan(evidence, raw, now=now)
        findings = {"verdict": "not run", "source": "observe mode", "rule": plan.decision.rule_id,
                    "reason": plan.decision.reason[:300]}
        record, outcome = self.settlement.job_verdict(
            job, inst_id, SuspectVerdict.BLOCKED, plan, evidence, findings,
            history_from_item(raw.get("fault_history")), now)
        if outcome.fails:
            outcome = JobOutcome.FAIL_OBSERVED
            record = replace(record, to=JobState.FAILED, spend="", deadline_at=None, relocate=False,
                             last_error=(f"observe mode: the DCGM diag of {inst_id} would have run "
                                         f"({plan.decision.reason})"))
        notice = self.owed_notices.outcome_notice(
            replace(job, state=record.to, last_error=record.last_error or job.last_error), outcome, instance,
            plan, evidence, SuspectVerdict.BLOCKED)
        if not repo.decisions.record_verdict_of_busy_instance(instance, record, restart=False,
                                                              also=self.notices.owe([notice], now)):
            return "raced"
        self.notices.send([notice])
        self.metrics.add_metric("ObservedFaults", "Count", 1)
        if outcome.fails:
            job_failed(self.metrics, self.data.jobs, job.job_id)
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job.job_id]}
        after_commit("observed fault", partial(repo.instances.record_observed_fault, inst_id,
                                               fault_history=None, last_fault=last_fault))
        if outcome is JobOutcome.RELOCATE:
            after_commit("relocation", self.reactions.emit, RestartDue(job.job_id))
        return "observed"

    # -------------------------------------------------------------------- start
    def start_if_ready(self, inst_id: str, *, turn_within: float = START_TURN_SECONDS,
                       wait_for_group: bool = False) -> str | None:
        """Start the DCGM task once the instance's GPUs are free; finish a dead claim.
        ``turn_within``: how long it may wait for its turn at the ECS budget.
        ``wait_for_group``: a grouped check starts only with ``GROUP_SIZE`` waiting (a rank's
        stop: more of its job's nodes are coming); else with those waiting now (the sweep)."""
        instance = self.data.instances.get_instance(inst_id)
        return self._start_read(instance, turn_within=turn_within,
                                wait_for_group=wait_for_group) if instance is not None else None

    def _start_read(self, instance: Instance, *, turn_within: float = START_TURN_SECONDS,
                    wait_for_group: bool = False) -> str | None:
        inst_id = instance.container_inst_id
        now = clock.now()
        if instance.state is InstanceState.HEALTH_CHECKING:
            if instance.check.task_arn:
                return None  # running
            return self._take_over(instance, now, turn_within=turn_within)[1]
        if instance.state is not InstanceState.HEALTH_CHECK_PENDING:
            return None
        if instance.check.attempts and not instance.hc_waiting_for_slot \
                and (instance.deadline_at or 0.0) > now:
            return None  # a failed start backs off until its retry time (the sweep's)
        if self.tasks.gpus_busy(node_tasks.HEALTH_CHECK, instance):
            return None
        owner = instance.check_owner
        if instance.hc_grouped:
            # Its GPUs free, it waits for others of its job to start with it.
            if not instance.hc_waiting_for_slot:
                self.records.wait_for_slot(instance, owner, now)
            return self.start_waiting(owner, at_least=GROUP_SIZE if wait_for_group else 1,
                                      turn_within=turn_within).get(inst_id)
        started_by = health_check_started_by(instance)
        settings = self.settings
        claimed = self.records.claim(
            instance, started_by, now + CLAIM_LEASE_SECONDS, owner=owner,
            per_job=settings.max_health_checks_per_job, cluster=settings.max_health_checks_in_flight, now=now)
        if claimed.outcome in (Claim.CLUSTER_FULL, Claim.JOB_FULL):
            if not instance.hc_waiting_for_slot:
                self.records.wait_for_slot(instance, owner, now)
                logger.info("health check waits for a slot", extra={"instance": inst_id, "job_id": owner,
                                                                    "why": claimed.outcome.value})
            return None
        if claimed.instance is None:
            return None
        # The instance as the claim wrote it: a release gives the slot back to the shard and
        # the share the claim recorded (hc_slot_shard, hc_job_slot), not to defaults.
        return self._start(claimed.instance, started_by, turn_within=turn_within)

    def _take_over(self, instance: Instance, now: float, *,
                   turn_within: float = START_TURN_SECONDS) -> tuple[node_tasks.TakeOver, str | None]:
        """A claim with no task recorded: its claimer's still, another taker's, its task found,
        or taken over and started; with the check's task, if one runs now."""
        taken = self.tasks.take_over(node_tasks.HEALTH_CHECK, instance, now, deadline=self.deadline(instance))
        if taken.instance is not None:
            return taken, self._start(taken.instance, instance.check.started_by, turn_within=turn_within)
        return taken, taken.task_arn or None

    def kick(self, job_id: str, *, limit: int = 2, full_groups_only: bool = True) -> list[str]:
        """A slot of ``job_id``'s was given back: start its next waiting checks (the nodes).
        ``full_groups_only``: a grouped check is left to wait for its group (a verdict's slot
        given back is no reason to start it in a smaller one); the sweep's kick, each minute,
        starts whatever waits."""
        return sorted(self.start_waiting(job_id, limit=limit, full_groups_only=full_groups_only))

    def start_all_waiting(self, job_id: str) -> list[str]:
        """Start the job's waiting checks, ``GROUP_SIZE`` a StartTask, while full groups wait
        (at most ``END_GROUPS`` calls): at its attempt's end (no more of its nodes will come
        to wait) and at the sweep's minute kick (a backlog drains ten times as fast as ten
        nodes a minute)."""
        started: list[str] = []
        for _ in range(END_GROUPS):
            group = self.start_waiting(job_id, limit=GROUP_SIZE)
            started += sorted(group)
            if len(group) < GROUP_SIZE:
                break
        return started

    def start_waiting(self, job_id: str, *, limit: int = GROUP_SIZE, at_least: int = 1,
                      full_groups_only: bool = False,
                      turn_within: float = START_TURN_SECONDS) -> dict[str, str]:
        """Start up to ``limit`` (at most ``GROUP_SIZE``) of ``job_id``'s waiting checks in one
        StartTask, if at least ``at_least`` wait (``full_groups_only``: grouped ones only
        ``GROUP_SIZE`` together): each claimed (a full share or cluster leaves the rest
        waiting), then started together. Node -> the task started there."""
        ids = self.data.slots.waiting(job_id, min(limit, GROUP_SIZE))
        if not ids or len(ids) < at_least:
            return {}
        # A check waits only once its node's GPUs were free (a suspect node is out of the
        # stack's placements since): they are not looked up again.
        waiting = [i for i in map(self.data.instances.get_instance, ids) if i is not None
                   and i.state is InstanceState.HEALTH_CHECK_PENDING and i.hc_waiting_for_slot]
        if full_groups_only and sum(i.hc_grouped for i in waiting) < GROUP_SIZE:
            waiting = [i for i in waiting if not i.hc_grouped]
        if not waiting:
            return {}
        started_by, now, settings = group_started_by(waiting), clock.now(), self.settings
        claimed: list[Instance] = []
        for instance in waiting:
            claim = self.records.claim(
                instance, started_by, now + CLAIM_LEASE_SECONDS, owner=instance.check_owner,
                per_job=settings.max_health_checks_per_job, cluster=settings.max_health_checks_in_flight,
                now=now)
            if claim.outcome in (Claim.CLUSTER_FULL, Claim.JOB_FULL):
                break  # the rest wait on, in the queue they are in
            if claim.instance is not None:
                claimed.append(claim.instance)
        if len(claimed) == 1:
            task = self._start(claimed[0], started_by, turn_within=turn_within)
            return {claimed[0].container_inst_id: task} if task else {}
        return self._start_group(claimed, started_by, turn_within=turn_within)[0] if claimed else {}

    def _start_group(self, claimed: list[Instance], started_by: str, *,
                     turn_within: float) -> tuple[dict[str, str], list[Instance]]:
        """One StartTask on the claimed nodes, once its turn at the ECS budget has come (the
        claims, leased for longer than any turn, keep a redelivered event from taking a token
        of its own): node -> the task started there, and the nodes not placed, each given back
        (an attempt counted) for the sweep's retry."""
        kind = node_tasks.HEALTH_CHECK
        try:
            placed = self.tasks.start_many(
                kind, claimed, started_by, turn_within=turn_within,
                release=lambda instance: self.records.release_claim(  # refused: tried again in a minute
                    instance, started_by, placement_failed=False,
                    retry_at=clock.now() + RETRY_INTERVAL_SECONDS),
                record=lambda instance, task_arn: self.tasks.record(kind, instance, started_by, task_arn,
                                                                    deadline=self.deadline(instance)))
        except RateLimited as limited:
            # The stack's ECS budget has no turn in time: StartTask was never called. The
            # slots are given back at once (not held until the claims' lease expires) and the
            # checks are tried again when a token is due (by the sweep; no failed invocation).
            for instance in claimed:
                self.records.release_claim(instance, started_by, placement_failed=False,
                                           retry_at=clock.now() + limited.wait_seconds)
            self.metrics.add_metric("HealthCheckStartsDeferred", "Count", len(claimed))
            return {}, []
        started: dict[str, str] = {}
        unplaced: list[Instance] = []
        for instance in claimed:
            answer = placed[instance.container_inst_id]
            if answer.task_arn:
                started[instance.container_inst_id] = answer.task_arn
                continue
            logger.warning("health check could not be placed", extra={
                "instance": instance.container_inst_id, "reasons": answer.reasons,
                "attempt": instance.check.attempts + 1})
            self.records.release_claim(instance, started_by, placement_failed=True,
                                       retry_at=clock.now() + RETRY_INTERVAL_SECONDS)
            unplaced.append(instance)
        return started, unplaced

    def _start(self, instance: Instance, started_by: str, *,
               turn_within: float = START_TURN_SECONDS) -> str | None:
        """StartTask on the one claimed instance (``_start_group``'s); not placed, its slot
        given back starts the job's next waiting check."""
        started, unplaced = self._start_group([instance], started_by, turn_within=turn_within)
        if unplaced:
            self._kick_after_release(instance)
        return started.get(instance.container_inst_id)

    def _kick_after_release(self, instance: Instance) -> None:
        if instance.hc_owner:
            try:
                self.kick(instance.hc_owner)
            except Exception:  # the sweep looks at every job's queue each minute
                logger.warning("next health check not started", exc_info=True,
                               extra={"job_id": instance.hc_owner})

    def deadline(self, instance: Instance, now: float | None = None) -> float:
        """The check's time limit: from its claim once claimed (a take-over keeps the claim's
        time), from its request while it waits for one."""
        claimed = instance.check.claimed_at if instance.state is InstanceState.HEALTH_CHECKING else None
        started = claimed or instance.hc_requested_at or (clock.now() if now is None else now)
        return started + self.settings.health_check_timeout_seconds

    # -------------------------------------------------------------------- sweep
    def _undiagnosed(self, instance: Instance, what: str) -> str:
        away = self.ecs if self._agent_away(instance) else None
        if not settle_undiagnosed(self.data, self.metrics, self.remediation, self.verdicts.evidence,
                                  instance, what, agent_away=away):
            return "raced"
        self._kick_after_release(instance)
        return "health_check_undiagnosed"

    def _agent_away(self, instance: Instance) -> bool:
        """ECS reads the node's agent disconnected (no answer, or a node it does not know: no)."""
        inst_id = instance.container_inst_id
        try:
            return self.ecs.is_agent_connected(instance.container_instance_arn or inst_id) is False
        except Exception as error:  # throttled, or the Describe budget had no token: no answer
            logger.warning("the node's ECS agent not read: left as it was", extra={
                "instance": inst_id, "error": str(error)})
            return False

    def _sweep_waiting(self, instance: Instance, now: float) -> str:
        """A check waiting for a slot (every ten minutes): let it go if no job it serves is
        still in recovery, else try it (its jobs' queues are kicked every minute anyway)."""
        jobs = [self.data.jobs.get_job(j) for j in sorted(instance.hc_jobs)]
        # A node its jobs left before the verdict (spare first) still needs its check, and so
        # does a node a rank's stop fenced as a suspect (out of placement until it is judged).
        if not instance.hc_left and not instance.fenced \
                and not any(j is not None and j.state in RECOVERING_JOB_STATES for j in jobs):
            self.records.abandon(instance, "every job waiting for it moved on")
            return "health_check_abandoned"
        if self.start_if_ready(instance.container_inst_id) is None:
            owner = instance.hc_owner or instance.check_owner
            self.records.wait_for_slot(instance, owner, now)
        return "health_check_waiting_for_slot"

    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled: placement retries, dead claims, lost verdict events, timeouts."""
        settings = self.settings
        if instance.state is InstanceState.HEALTH_CHECK_PENDING and instance.hc_waiting_for_slot:
            return self._sweep_waiting(instance, now)
        out_of_time = now >= self.deadline(instance, now)
        if instance.state is InstanceState.HEALTH_CHECK_PENDING:
            if out_of_time or instance.check.attempts >= settings.health_check_start_retries:
                attempts = instance.check.attempts
                return self._undiagnosed(instance, f"the health check gave no verdict in {attempts} "
                                                   "attempt(s) (not placed, or it could not run)")
            # A grouped check due again (its start failed) waits for its group here too: the
            # sweep reaches such nodes one by one, so starting each with whatever waits started
            # a backlog one node a call. Its job's kick, in the same sweep, starts the rest.
            if self.start_if_ready(instance.container_inst_id, wait_for_group=instance.hc_grouped) is None:
                inst_id = instance.container_inst_id
                self.data.deadlines.rearm_instance(inst_id, InstanceState.HEALTH_CHECK_PENDING,
                                                   now + RETRY_INTERVAL_SECONDS)
            return "health_check_retried"
        if out_of_time:
            # A check that ended has its verdict in its exit code (its line, lost, is not
            # waited for any more); one with none (or someone else's task) is the stack's
            # failure, not the node's.
            task = self.ecs.describe_task(instance.check.task_arn) if instance.check.task_arn else None
            if task is not None and task.get("lastStatus") == "STOPPED":
                outcome = self.on_stopped(EcsTaskDetail.model_validate(task), decide_now=True)
                if outcome.action not in ("health_check_retry", node_tasks.FOREIGN_TASK):
                    return outcome.action
            elif instance.check.task_arn:
                self.ecs.stop_task(instance.check.task_arn, system_stop_reason("check timed out"))
            return self._undiagnosed(instance, f"no verdict in {settings.health_check_timeout_seconds} s")
        # Within its time: its task looked at (a lost STOPPED event read from ECS), or its
        # claim with none taken over once its lease ends (``NodeTasks.follow``).
        return self.tasks.follow(node_tasks.HEALTH_CHECK, self, instance, now)

    def start(self, instance: Instance) -> str:
        """The sweep's start of a claimed check with no task recorded (``NodeTasks.follow``)."""
        taken, task_arn = self._take_over(instance, clock.now())
        if taken.step in ("claimed", "raced"):
            return "raced" if taken.step == "raced" else "health_check_claimed"
        return "health_check_started" if task_arn else "health_check_not_started"

    def gone(self, instance: Instance) -> str:
        """ECS no longer knows the check's task: its verdict is still waited for until the
        check's time ends (the sweep then reads the task once more, or settles it)."""
        now = clock.now()
        self.tasks.rearm(node_tasks.HEALTH_CHECK, instance,
                         min(self.deadline(instance), now + node_tasks.HEALTH_CHECK.poll_seconds))
        return "health_check_running"
