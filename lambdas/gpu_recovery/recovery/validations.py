"""Stage 3b: a repaired node validates under load before it takes work again.

Whatever repaired a node (its reboot came back, its GPU reset passed, a replacement the
stack's termination brought in), the write that used to hand it back (REBOOTING ->
AVAILABLE) hands it here instead (:meth:`Validations.node_back`): the node stays REBOOTING
with a ``validation`` (``domain.validation``), its cordon turns ``validating`` (the
placement attribute every other scheduler reads), and every job waiting for it keeps
waiting. Then, as the GPU reset does:

1. once no rank of the stack's holds the node's GPUs, **claim** the validation task
   (``validation.started_by``: deterministic per node, validation and attempt) before
   StartTask of the health-check task definition with the validation's level and GPU load
   in its environment; a claim taken over looks the task up by its startedBy first;
2. record the task; its STOPPED event (the health-check rule: its group starts with the
   check's) gives the result by the health check's exit-code contract;
3. **passed**: REBOOTING -> AVAILABLE, the cordon cleared, the waiting jobs released (their
   history and restart e-mail say how the node proved itself); **failed**: a node decision
   on the validation's evidence through the fault catalog, counted under the cause of the
   repair that did not hold (reset -> reboot -> replace / quarantine, the breaker, observe
   mode), with one ``validation_failed`` e-mail; a node repaired again keeps its jobs
   waiting, a node that leaves repair lets them go in the same transaction (they relocate,
   wait HELD or fail as for any node lost to them); **no verdict** (the task did not run):
   started again, at most ``START_RETRIES`` times.

The instance keeps a deadline the sweep reaches at every step (GPUs busy, a claim in
flight, a running task: DescribeTasks for a lost event). At ``validation.until`` (its
timeout from the node's return) no task running is a validation that could not run; a task
recorded is described first, as the health check's is at its deadline: stopped, its result
is the one its event gives; pending or running, it keeps its own time
(``domain.validation.task_time_up``: a task placed late gets a whole timeout), then is
stopped with no verdict. A missing answer never fails a repair (``domain.validation``).
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import (
    RETRY_INTERVAL_SECONDS,
    NotificationKind,
    system_stop_reason,
)
from gpu_recovery.domain import ecs_instance_status as ecs_status
from gpu_recovery.domain import validation as policy
from gpu_recovery.domain.cordon import ECS_HELD, ECS_PENDING, failed_check_cordon, validating_record
from gpu_recovery.domain.escalation import history_from_item
from gpu_recovery.domain.evidence import DcgmFindings
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.models import VALIDATION_TASK, Instance, Job, container_instance_id
from gpu_recovery.domain.remediation_plan import plan_remediation
from gpu_recovery.domain.states import RECOVERING_JOB_STATES, InstanceState
from gpu_recovery.domain.validation import Repair, Result, SuspectCheck
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import node_tasks
from gpu_recovery.recovery.breaker.gate import NodeActionGate
from gpu_recovery.recovery.cordons import Cordons
from gpu_recovery.recovery.node_tasks import NodeTasks
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import (
    Invocation,
    ListsContainerInstances,
    MetricsPort,
    Outcome,
    ReplacePort,
    StopsTasks,
    VerdictReaderPort,
    after_commit,
)
from gpu_recovery.recovery.reactions import Reactions, RestartDue
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation, label_for, projected
from gpu_recovery.recovery.remediation.notices import describe_node_effects, details_of
from gpu_recovery.recovery.stage_data import (
    HasInstances,
    HasJobs,
    MarksNodesBack,
    ReadsInstances,
    ReadsJob,
    ReadsNodeItems,
    RecordsNodeDecisions,
)
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.validations import ValidationRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# The verdict line of a failed validation is read again after these pauses inside the event's
# invocation (CloudWatch Logs makes a line readable seconds after it was written); without it
# past the grace the exit code decides alone, as the health check's contract allows.
LOG_PAUSES = (1.0, 2.0, 4.0)
LOG_GRACE_SECONDS = 120.0
APPLY_ROUNDS = 3
# The stack's StopTask of a task past its time: whatever exit the cut-short diag gives then is
# no answer of the node's (on_stopped reads it as no verdict).
OUT_OF_TIME_REASON = system_stop_reason("validation timed out")


class ValidationNodes(ReadsNodeItems, ReadsInstances, Protocol):
    """The node validated, and the nodes of a validation's batch."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...


class ValidationData(HasJobs[ReadsJob], HasInstances[ValidationNodes],
                     MarksNodesBack, RecordsNodeDecisions, Protocol):
    """What the validation reads and writes besides its own records: the node and the jobs
    waiting for it, and the decision a failed one leads to."""

    faults: FaultRepository


class ValidationEcs(StopsTasks, ListsContainerInstances, Protocol):
    """StopTask, and the cluster's nodes (a replacement found)."""


@dataclass(eq=False, repr=False)
class Validations:
    data: ValidationData
    records: ValidationRepository
    ecs: ValidationEcs
    tasks: NodeTasks
    reboots: Reboots
    remediation: NodeRemediation
    cordons: Cordons
    gate: NodeActionGate
    notices: Notices  # the outbox
    _: KW_ONLY
    verdicts: VerdictReaderPort
    replacer: ReplacePort
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    # Told: a failed validation released the jobs waiting for the node.
    reactions: Reactions = field(default_factory=Reactions)

    @property
    def policy(self) -> policy.ValidationPolicy:
        return self.settings.validation

    # ---------------------------------------------------------------- node back
    def node_back(self, instance: Instance, repair: Repair, why: str, *,
                  reset_result: dict[str, Any] | None = None) -> Outcome:
        """The node is back from ``repair``: validate it (the intent, then the task), or, with
        validation off, hand it back at once as before (its jobs' history says so)."""
        settings = self.policy
        inst_id = instance.container_inst_id
        if not settings.enabled:
            return self.reboots.mark_available(instance, repair, why, reset_result=reset_result,
                                               validation={"result": "off", "repair": repair.value})
        repo = self.data
        raw = repo.instances.get_instance_item(inst_id) or {}
        now = clock.now()
        record = policy.new_validation(repair, cause=policy.repair_cause(raw.get("last_fault")), since=now,
                                       policy=settings)
        held = (instance.cordon or {}).get("ecs") == ECS_HELD  # the cordon limit keeps it held
        cordon = validating_record(repair=repair.value, now=now, ecs=ECS_HELD if held else ECS_PENDING,
                                   reason=f"back after {repair.words}: validating ({settings.describe()})")
        back = repo.nodes_back
        if reset_result is not None:
            ok = back.record_gpu_reset_passed(instance, reset_result, now, validation=record,
                                              validating_cordon=cordon)
        else:
            ok = back.mark_instance_back(instance, now, validation=record, validating_cordon=cordon)
        if not ok:
            return Outcome("duplicate", detail={"instance": inst_id})
        logger.info("node back from its repair: validating", extra={
            "instance": inst_id, "repair": repair.value, "evidence": why, "validation": settings.describe()})
        if repair is Repair.REBOOT:
            self.reboots.unmark_quietly(instance.container_instance_arn or inst_id)
        after_commit("validating attribute", self.cordons.sync_quietly, inst_id)
        fresh = repo.instances.get_instance(inst_id)
        started = after_commit("validation start", self.start, fresh) if fresh is not None else None
        return Outcome("validating", detail={"instance": inst_id, "repair": repair.value, "start": started})

    # -------------------------------------------------------------- replacement
    def watch_replacement(self, watcher: Instance, now: float) -> str:
        """The sweep, while a node the stack terminated in its Auto Scaling group awaits its
        replacement: a container instance registered since the termination, unknown to the
        stack, whose EC2 instance is in the same group, is that replacement. It is adopted in
        validation (one transaction with the watch's end), then validated as a repaired node
        is; its failure's cause is ``FALLBACK_CAUSE`` (a new machine: none of its own yet)."""
        watch = watcher.replacement_watch
        if not self.policy.enabled or now >= float(watch.get("until") or 0):
            self.records.close_replacement_watch(watcher)
            if self.policy.enabled:
                self.metrics.add_metric("ReplacementsNotSeen", "Count", 1)
                logger.warning("no replacement registered for a terminated node", extra={
                    "instance": watcher.container_inst_id, "group": watch.get("group")})
            return "replacement_watch_closed"
        described = self.ecs.container_instances(
            (ecs_status.ACTIVE,), query=policy.registered_since(float(watch["since"])))
        candidates = {container_instance_id(ci["containerInstanceArn"]): ci for ci in described}
        candidates.pop(watcher.container_inst_id, None)
        known = self.data.instances.get_instances(candidates) if candidates else {}
        unknown = {n: ci for n, ci in candidates.items() if n not in known}
        ec2_ids = [str(ci.get("ec2InstanceId") or "") for ci in unknown.values()]
        groups = self.replacer.groups_of([i for i in ec2_ids if i.startswith("i-")])
        for node, ci in sorted(unknown.items(), key=lambda kv: (str(kv[1].get("registeredAt")), kv[0])):
            ec2_id = str(ci.get("ec2InstanceId") or "")
            if groups.get(ec2_id, ("", ""))[1] != watch.get("group"):
                continue
            record = policy.new_validation(Repair.REPLACEMENT, cause=policy.FALLBACK_CAUSE, since=now,
                                           policy=self.policy, replaces=watcher.container_inst_id)
            cordon = validating_record(repair=Repair.REPLACEMENT.value, now=now, ecs=ECS_PENDING,
                                       reason=f"replaces {watcher.container_inst_id}: validating "
                                              f"({self.policy.describe()})")
            if not self.records.adopt_replacement(watcher, node, arn=str(ci["containerInstanceArn"]),
                                                  ec2_instance_id=ec2_id, validation=record, cordon=cordon,
                                                  now=now):
                return "raced"
            logger.info("replacement node registered: validating", extra={
                "instance": node, "replaces": watcher.container_inst_id})
            after_commit("validating attribute", self.cordons.sync_quietly, node)
            fresh = self.data.instances.get_instance(node)
            if fresh is not None:
                after_commit("validation start", self.start, fresh)
            return "replacement_validating"
        next_look = min(float(watch["until"]), now + RETRY_INTERVAL_SECONDS)
        self.records.rearm_replacement_watch(watcher, next_look)
        return "replacement_awaited"

    # -------------------------------------------------------------------- start
    def start(self, instance: Instance) -> str:
        """Start the validation task once the node's GPUs are free; finish a dead claim."""
        if not instance.validating:
            return "not_validating"
        return self.tasks.claim_and_start(node_tasks.VALIDATION, self, instance)

    @staticmethod
    def new_started_by(instance: Instance) -> str:
        v = instance.validation
        return policy.started_by(instance.container_inst_id, float(v["since"]), int(v.get("attempts") or 0))

    def start_task(self, instance: Instance, started_by: str) -> str:
        placed = self.tasks.start_claimed(node_tasks.VALIDATION, self, instance, started_by,
                                          environment=self._environment(instance))
        if placed.task_arn is not None:
            return "validation_started"
        # ECS placed nothing (the GPUs not free yet, the agent away: the failures in its
        # 200): tried again each minute until the validation's time is up.
        self.tasks.release(node_tasks.VALIDATION, instance, started_by,
                           min(self.deadline(instance), clock.now() + RETRY_INTERVAL_SECONDS))
        logger.warning("validation task not placed; tried again", extra={
            "instance": instance.container_inst_id, "why": placed.reasons})
        return "validation_not_placed"

    def _environment(self, instance: Instance) -> dict[str, str]:
        v = instance.validation
        load = v.get("load_seconds")
        return self.policy.task_environment(int(v.get("level") or 0) or None,
                                            None if load is None else int(load))

    @staticmethod
    def deadline(instance: Instance) -> float:
        """The validation's time limit (its ``until``)."""
        return float(instance.validation.get("until") or clock.now())

    # ------------------------------------------------------------------- result
    def on_stopped(self, detail: EcsTaskDetail, invocation: Invocation | None = None) -> Outcome:
        """The validation task stopped: its exit code is the verdict (0: passed)."""
        if not self.tasks.runs_our_definition(node_tasks.VALIDATION, detail):
            return Outcome(node_tasks.FOREIGN_TASK, detail={"task": detail.taskArn})
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        repo = self.data
        raw = repo.instances.get_instance_item(inst_id) if inst_id else None
        if raw is None:
            return Outcome("ignored", detail={"why": "untracked instance"})
        instance = repo.instances.instance_from_item(raw)
        if not instance.validating or detail.startedBy != instance.task(VALIDATION_TASK).started_by:
            return Outcome("duplicate", detail={"instance": inst_id, "state": instance.state.value})
        exit_code = detail.exit_code()
        result = policy.judge(exit_code)
        if result is Result.FAILED and (detail.stoppedReason or "").startswith(OUT_OF_TIME_REASON):
            result = Result.NO_VERDICT  # the stack's stop cut it short (``_out_of_time``)
        if result is Result.PASSED:
            return Outcome(self._passed(instance, detail.taskArn), detail={"instance": inst_id})
        if result is Result.NO_VERDICT:
            why = (f"the validation task ended without a verdict (exit {exit_code}, "
                   f"{detail.stoppedReason or 'no reason'})")
            return Outcome(self._no_verdict(instance, raw, why), detail={"instance": inst_id})
        line = self._verdict_line(detail.taskArn, invocation)
        stopped = detail.stoppedAt.timestamp() if detail.stoppedAt else clock.now()
        if line is None and clock.now() < stopped + LOG_GRACE_SECONDS:
            # Its evidence (which GPU, which test) is on its way: the sweep's poll reads it.
            self.tasks.record(node_tasks.VALIDATION, instance, instance.task(VALIDATION_TASK).started_by,
                              detail.taskArn, deadline=self.deadline(instance))
            self.tasks.rearm(node_tasks.VALIDATION, instance,
                             min(self.deadline(instance), clock.now() + RETRY_INTERVAL_SECONDS))
            return Outcome("validation_log_pending", detail={"instance": inst_id})
        return Outcome(self._failed(instance, raw, exit_code, line or {}, task_arn=detail.taskArn),
                       detail={"instance": inst_id})

    def _verdict_line(self, task_arn: str, invocation: Invocation | None) -> dict[str, Any] | None:
        line = self.verdicts.read_verdict(task_arn)
        for pause in LOG_PAUSES:
            if line is not None or invocation is None or clock.now() + pause + 10 > invocation.deadline:
                break
            clock.sleep(pause)
            line = self.verdicts.read_verdict(task_arn)
        return line

    def _passed(self, instance: Instance, task_arn: str) -> str:
        inst_id, now = instance.container_inst_id, clock.now()
        record = policy.result_record(Result.PASSED, validation=instance.validation, now=now, exit_code=0,
                                      task_arn=task_arn)
        if not self.records.pass_validation(instance, record, now):
            return "duplicate"
        self.metrics.add_metric("ValidationsPassed", "Count", 1)
        self.metrics.add_metric("ValidationSeconds", "Seconds", record["seconds"])
        logger.info("validation passed: node available", extra={"instance": inst_id,
                                                                "seconds": record["seconds"]})
        if instance.cordoned:  # healthy again: the cordon cleared in the same write
            after_commit("uncordon after validation", self.cordons.sync_quietly, inst_id)
        after_commit("release after validation", partial(self.reboots.release_waiting, instance,
                                                         validation=record))
        return "validation_passed"

    def _no_verdict(self, instance: Instance, raw: dict[str, Any], why: str) -> str:
        """Started again with a new startedBy, at most START_RETRIES times; then a failure."""
        attempts = instance.task(VALIDATION_TASK).attempts + 1
        if attempts >= policy.START_RETRIES:
            return self._stalled(instance, f"{why}; {attempts} attempt(s)")
        started_by = instance.task(VALIDATION_TASK).started_by
        retry_at = clock.now() + RETRY_INTERVAL_SECONDS
        if not self.tasks.release(node_tasks.VALIDATION, instance, started_by, retry_at, attempt_used=True):
            return "raced"
        logger.warning("validation ended without a verdict: started again", extra={
            "instance": instance.container_inst_id, "why": why, "attempt": attempts + 1})
        fresh = self.data.instances.get_instance(instance.container_inst_id)
        if fresh is not None:
            after_commit("validation restart", self.start, fresh)
        return "validation_retried"

    def _stalled(self, instance: Instance, why: str) -> str:
        """Issue 49: a validation that could not run is not a failed repair. The node stays
        validating (out of service, as it was), an operator is told once, and it is tried
        again (a fresh round of attempts within a fresh timeout): never escalated."""
        now = clock.now()
        inst_id = instance.container_inst_id
        # A check no repair preceded (policy.SUSPECT_CHECKS) that gave no answer holds no node:
        # its cordon goes, the node stays SUSPECT (no queue work) while it is tried again.
        check = policy.suspect_check(instance.validation)
        uncordon = check is not None and bool((instance.cordon or {}).get("validating"))
        also = []
        if not instance.validation.get("stalled_at"):
            kept = (f"{inst_id} kept SUSPECT (no queue work), its cordon lifted: a missing answer holds no "
                    "node" if check is not None else f"{inst_id} kept out of placement until then")
            notice = self.notices.for_node(
                NotificationKind.VALIDATION_FAILED,
                f"GPU node {inst_id}: its {check.name if check else 'validation after repair'} could not run",
                container_inst_id=inst_id, instance_id=instance.ec2_instance_id,
                what_happened=f"The validation of {inst_id} could not run: {why}",
                what_was_done=f"{kept}; not counted as a failed repair",
                operator_action="Look at why the stack's validation task cannot run (its image, the task "
                                "definition, the node's ECS agent, `doctor`): it is tried again meanwhile.")
            also = self.notices.owe([notice], now)
        if not self.records.stall_validation(instance, now, now + self.policy.timeout_seconds, also,
                                             uncordon=uncordon):
            return "raced"
        if also:
            self.notices.send([notice])
        if uncordon:
            after_commit("uncordon after a check gave no answer", self.cordons.sync_quietly, inst_id)
        self.metrics.add_metric("ValidationsStalled", "Count", 1)
        logger.warning("validation could not run: not a failed repair, tried again", extra={
            "instance": inst_id, "why": why})
        return "validation_stalled"

    # ------------------------------------------------------------------ failure
    def _failed(self, instance: Instance, raw: dict[str, Any], exit_code: int | None,
                findings: dict[str, Any], *, task_arn: str = "", why: str = "") -> str:
        """A node decision on the validation's evidence (see the module docstring), with
        every waiting job kept waiting (repaired again) or let go (the node left repair)."""
        repo = self.data
        check = policy.suspect_check(instance.validation)
        if check is not None:
            return self._check_failed(instance, check, exit_code, findings, task_arn=task_arn, why=why)
        for _ in range(APPLY_ROUNDS):
            done = self._decide(instance, raw, exit_code, findings, task_arn=task_arn, why=why)
            if done is not None:
                return done
            fresh = repo.instances.get_instance_item(instance.container_inst_id)
            if fresh is None:
                return "ignored"
            instance, raw = repo.instances.instance_from_item(fresh), fresh
            if not instance.validating:
                return "duplicate"
        return "raced"

    def _check_failed(self, instance: Instance, check: SuspectCheck, exit_code: int | None,
                      findings: dict[str, Any], *, task_arn: str, why: str) -> str:
        """The stack's own check of a node no repair preceded (``policy.SUSPECT_CHECKS``: a lost
        node's reconnect, ``recovery.lost_node_checks``; an operator's return) found a fault. No
        repair was made, so none failed: no node decision, nothing for its history or the
        breaker, no escalation. It stays SUSPECT for a person, now for the check's evidence,
        with one e-mail."""
        inst_id, now = instance.container_inst_id, clock.now()
        verdict = {"exit_code": exit_code, "task_arn": task_arn, "source": check.name, **findings}
        dcgm = DcgmFindings.from_verdict_json(verdict, exit_code=exit_code, task_arn=task_arn)
        record = policy.result_record(Result.FAILED, validation=instance.validation, now=now,
                                      exit_code=exit_code, task_arn=task_arn,
                                      why=why or "; ".join(dcgm.reasons[:3]) or f"verdict {dcgm.verdict}")
        note = policy.history_note(inst_id, record)
        # The stack's own check gave a verdict: trustworthy evidence, the node is known bad (its
        # check's cordon becomes a ``cordoned`` one in the same write: domain.cordon).
        cordon = failed_check_cordon(instance.cordon, cause=check.cause, reason=note, now=now)
        notice = self.notices.for_node(
            NotificationKind.VALIDATION_FAILED, f"GPU node {inst_id} failed the stack's check {check.after}: "
                                                "kept SUSPECT",
            container_inst_id=inst_id, instance_id=instance.ec2_instance_id,
            what_happened=f"{note} (DCGM verdict {dcgm.verdict}, exit {exit_code})",
            what_was_done=f"{inst_id} kept SUSPECT and cordoned (no new work, from the queue or from "
                          "schedulers using the placement attribute); not rebooted, replaced or "
                          "quarantined, nothing counted in its fault history",
            operator_action="Read the check's verdict (the node's last_validation and last_verdict, the "
                            "health-check log group); repair or return the node as the runbook says.")
        if not self.records.fail_suspect_check(instance, record, verdict, note, check.failed_origin, cordon,
                                               also=self.notices.owe([notice], now)):
            return "raced"
        self.notices.send([notice])
        if cordon is not None:
            after_commit("cordon after a failed check", self.cordons.sync_quietly, inst_id)
        self.metrics.add_metric(f"{check.metric}Failed", "Count", 1)
        logger.warning(f"{check.name} failed: kept SUSPECT for a person", extra={
            "instance": inst_id, "exit_code": exit_code, "verdict": str(dcgm.verdict)})
        return "validation_failed"

    def _decide(self, instance: Instance, raw: dict[str, Any], exit_code: int | None,
                findings: dict[str, Any], *, task_arn: str, why: str) -> str | None:
        repo, remediation = self.data, self.remediation
        inst_id, now = instance.container_inst_id, clock.now()
        v = instance.validation
        repair = Repair(str(v.get("repair") or Repair.REBOOT.value))
        verdict = {"exit_code": exit_code, "task_arn": task_arn, "source": "validation after repair",
                   **findings}
        dcgm = DcgmFindings.from_verdict_json(verdict, exit_code=exit_code, task_arn=task_arn)
        evidence = remediation.evidence(inst_id=inst_id, instance_item=raw, trigger=Trigger.VALIDATION,
                                        fault_at=now).with_dcgm(dcgm, now)
        history = history_from_item(raw.get("fault_history"))
        plan = plan_remediation(evidence, remediation.policy, node_history=history, now=now,
                                decided=partial(policy.failure_decision, repair=repair),
                                cause=str(v.get("cause") or policy.FALLBACK_CAUSE))
        if not instance.ec2_instance_id:
            instance = replace(instance, ec2_instance_id=remediation.ranks.ec2_instance_id(instance))
        plan = remediation._for_this_node(plan, instance)
        plan, breaker_update, gate = remediation.ask_gate(plan, inst_id, [], now)
        label = label_for(plan)
        record = policy.result_record(Result.FAILED, validation=v, now=now, exit_code=exit_code,
                                      task_arn=task_arn,
                                      why=why or "; ".join(dcgm.reasons[:3]) or f"verdict {dcgm.verdict}")
        decision = remediation.node_decision(plan, label, instance, (InstanceState.REBOOTING,), evidence,
                                             verdict, remediation.history_with(history, plan, evidence, now),
                                             None, None, [], now, job_ids=sorted(instance.waiting_jobs),
                                             gate=gate)
        to = decision.to or InstanceState.SUSPECT  # observe mode left it alone: out of service, cordoned
        repaired_again = to is InstanceState.REBOOTING
        decision = replace(decision, to=to, validation=self.records.validation_condition(instance),
                           release_waiting=not repaired_again, last_validation=record)
        after = projected(instance, decision)
        note = (f"{policy.history_note(inst_id, record)}; "
                + (f"{inst_id} is repaired again ({plan.action.value}: {plan.escalation.reason})"
                   if repaired_again else describe_node_effects(after, plan)))
        jobs, updates = self._waiting_jobs(instance, note, release=not repaired_again, validation=record)
        notices = remediation.owed_notices.decision_notices(after, plan, evidence, label, [], gate,
                                                            waiting=bool(jobs), anywhere=False)
        notices.append(self._failed_notice(after, plan, evidence, record, jobs, repaired_again))
        if not repo.decisions.record(instance, decision, [], now, breaker_update,
                                     also=[*updates, *remediation.notices.owe(notices, now)]):
            return None
        self.metrics.add_metric("ValidationsFailed", "Count", 1)
        logger.warning("validation failed", extra={
            "instance": inst_id, "repair": repair.value, "action": plan.action.value, "to": to.value,
            "escalation": plan.escalation.reason, "jobs": [j.job_id for j in jobs]})
        remediation.notices.send(notices)
        if gate is not None and gate.tripped is not None:
            self.gate.tripped(gate.tripped)
        after_commit("validation failure", self._after_failure, gate, instance, plan,
                     [] if repaired_again else [j.job_id for j in jobs])
        return "validation_failed"

    def _waiting_jobs(self, instance: Instance, note: str, *, release: bool,
                      validation: dict[str, Any]) -> tuple[list[Job], list[Update]]:
        """The jobs waiting for the node (at most its GPUs' worth: a rank each), and what the
        decision's transaction writes on them: a history line (kept waiting), or their
        release (the node no longer holds their restart: it left repair)."""
        repo = self.data
        jobs: list[Job] = []
        updates: list[Update] = []
        for job_id in sorted(instance.waiting_jobs):
            job = repo.jobs.get_job(job_id)
            if job is None or job.state not in RECOVERING_JOB_STATES or not job.in_fault:
                continue
            suspect = repo.faults.get_suspect(job.job_id, job.attempt, instance.container_inst_id)
            if suspect is None or not suspect.rebooting:
                continue
            jobs.append(job)
            if release:
                updates += repo.nodes_back.node_back_updates(job, instance.container_inst_id, note,
                                                             validation)
            else:
                updates.append(self.records.job_history_note(job, note))
        return jobs, updates

    def _failed_notice(self, after: Instance, plan: Any, evidence: Any, record: dict[str, Any],
                       jobs: list[Job], repaired_again: bool) -> Any:
        inst_id = after.container_inst_id
        waiting = ", ".join(j.job_id for j in jobs[:10]) or "none"
        fate = ("they keep waiting for it" if repaired_again else
                "they no longer wait for it: each moves to healthy nodes, waits or fails as for any node "
                "lost to it")
        return self.notices.for_node(
            NotificationKind.VALIDATION_FAILED,
            f"GPU node {inst_id} failed its validation after repair: "
            + ("repaired again" if repaired_again else plan.action.value),
            container_inst_id=inst_id, instance_id=after.ec2_instance_id,
            what_happened=f"{policy.history_note(inst_id, record)}. Jobs waiting for it: {waiting} ({fate})",
            what_was_done=describe_node_effects(after, plan),
            operator_action=("None if the next repair holds: the node is validated again. A node whose "
                             "repairs keep failing is replaced (or quarantined and paged) by escalation."),
            details=details_of(evidence, plan))

    def _after_failure(self, gate: Any, instance: Instance, plan: Any, released: list[str]) -> None:
        """After the commit: the cordon's attribute, the node's next repair (reboot, reset,
        drain), the released jobs' restarts (each has its own intent: the sweep finishes it)."""
        inst_id = instance.container_inst_id
        self.remediation.after_cordon(gate, inst_id, cordoned=True)
        fresh = self.data.instances.get_instance(inst_id)
        if fresh is not None:
            self.remediation.carry_out(fresh, plan)
        for job_id in released:
            self.reactions.emit(RestartDue(job_id))

    # -------------------------------------------------------------------- sweep
    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled while validating: start what never started, read a result whose event
        was lost, and, once ``until`` is past, settle what ran out of time (``_out_of_time``)."""
        if now < self.deadline(instance):
            return self.tasks.follow(node_tasks.VALIDATION, self, instance, now)
        task_arn = str(instance.validation.get("task_arn") or "")
        if not task_arn:
            # Out of time with no task running (never placed, or none gave a verdict): the
            # stack's failure, not a failed repair.
            seconds = int(self.policy.timeout_seconds)
            return self._stalled(instance, f"the validation could not run within {seconds} s")
        return self._out_of_time(instance, task_arn, now)

    def _out_of_time(self, instance: Instance, task_arn: str, now: float) -> str:
        """Past ``until`` with a task recorded: ECS is asked first (DescribeTasks; failing, it
        raises and nothing is decided: the sweep's next visit asks again). Stopped: its result,
        as its STOPPED event (lost, or still retried) gives it. Pending or running: looked at
        again within its own time, then stopped with no verdict (run again), never a failure:
        the node has given no answer."""
        task = self.tasks.look(task_arn)
        if task is None:
            return self.gone(instance)
        detail = EcsTaskDetail.model_validate(task)
        if detail.lastStatus == "STOPPED":
            return self.on_stopped(detail).action
        seconds = self.policy.timeout_seconds
        time_up = policy.task_time_up(
            until=self.deadline(instance), timeout_seconds=seconds,
            created=detail.createdAt.timestamp() if detail.createdAt else None,
            started=detail.startedAt.timestamp() if detail.startedAt else None)
        if now < time_up:  # placed late: it has not had its time yet
            self.tasks.rearm(node_tasks.VALIDATION, instance,
                             min(time_up, now + node_tasks.VALIDATION.poll_seconds))
            return "validation_running"
        # Stopped first, then the write: its STOPPED event, or the sweep after a crash between
        # the two, settles it the same way, as no verdict (``OUT_OF_TIME_REASON``).
        self.ecs.stop_task(task_arn, OUT_OF_TIME_REASON)
        self.metrics.add_metric("ValidationTimeouts", "Count", 1)
        raw = self.data.instances.get_instance_item(instance.container_inst_id) or {}
        return self._no_verdict(instance, raw, f"the validation task ({detail.lastStatus.lower()}) did not "
                                               f"end within {seconds} s of its start")

    def gone(self, instance: Instance) -> str:
        raw = self.data.instances.get_instance_item(instance.container_inst_id) or {}
        return self._no_verdict(instance, raw, "the validation task is gone (ECS no longer knows it)")
