"""Stage 2, its second half: the DCGM check's verdict, from its STOPPED event (or, the event
lost, from DescribeTasks through the sweep's poll).

The verdict is matched on the check's ``startedBy`` (not on the task ARN, whose write may
have been the one that failed) and on the task definition's family (a task someone else gave
that ``startedBy`` is no verdict: ``NodeTasks.runs_our_definition``), its JSON line read from
the check's log (waited for a little: CloudWatch Logs makes a line readable some seconds after
it was written), and applied by the remediation (``recovery.remediation``) in one transaction
whose conditions make it land once. One delivery of the event holds the verdict's lease
(``recovery.verdict_lease``) so that duplicate copies do not race.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain import policy
from gpu_recovery.domain.evidence import DcgmFindings, Evidence
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.models import Instance, Job, container_instance_id
from gpu_recovery.domain.states import RECOVERING_JOB_STATES, InstanceState
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import verdict_lease
from gpu_recovery.recovery.node_tasks import FOREIGN_TASK, HEALTH_CHECK, NodeTasks
from gpu_recovery.recovery.ports import Invocation, MetricsPort, Outcome, VerdictReaderPort
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation, rebuild
from gpu_recovery.recovery.stage_data import HasInstances, HasJobs, ReadsJob, ReadsNodeItems
from gpu_recovery.repository.base import is_contention
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.health_checks import HealthCheckRepository
from gpu_recovery.repository.verdict_leases import VerdictLeaseRepository

logger = logging.getLogger(__name__)

# A verdict's transaction fails when another verdict of the same job lands first (both
# count on the job's tally), or conflicts with one in flight: decide again on fresh counts.
# A job's DCGM checks end together, so up to hundreds of verdicts (a cascade's suspects) race
# for one tally and land one at a time: keep trying, with a growing full-jitter pause, for
# VERDICT_PATIENCE_SECONDS before leaving it to the sweep's poll of the running check.
VERDICT_ROUNDS = 8  # at least this many rounds, however long they take
VERDICT_MAX_ROUNDS = 64  # and at most this many (a clock that does not move cannot spin it)
VERDICT_PATIENCE_SECONDS = 25.0
_VERDICT_PAUSE_BASE_SECONDS = 0.05
_VERDICT_PAUSE_CAP_SECONDS = 2.0
# What an invocation keeps of its time for the verdict after pausing for its log line.
_LEASE_MARGIN_SECONDS = verdict_lease.MARGIN_SECONDS
# The check prints its JSON verdict line just before it exits, and CloudWatch Logs makes a
# line readable only some seconds after it was written: the STOPPED event can come first.
# The line carries the verdict's evidence (which GPU, which test, the driver's recovery
# action) the remediation plan reads (a row-remap failure replaces the node, a pending remap
# resets its GPUs): deciding on the exit code alone while the line is on its way could reboot
# a node that needs replacing. So the line is read again after these pauses, inside the
# invocation (with _LEASE_MARGIN_SECONDS to spare); a check whose line is still unreadable
# stays HEALTH_CHECKING, unclaimed, and the sweep's poll (DescribeTasks, then the verdict
# again) comes back VERDICT_LOG_RETRY_SECONDS later. Only VERDICT_LOG_GRACE_SECONDS after the
# task stopped is the verdict decided on its exit code alone (the check's contract; the line
# is then taken for lost, e.g. the log driver failed), with a metric and a warning.
VERDICT_LOG_PAUSES = (1.0, 2.0, 4.0, 8.0)
VERDICT_LOG_GRACE_SECONDS = 180.0
VERDICT_LOG_RETRY_SECONDS = 60.0


def _conflicted(error: ClientError) -> bool:
    """A DynamoDB transaction lost to a concurrent one (nothing written; not an EC2 or ECS
    throttle of a later step, which the invocation's retry must see)."""
    code = error.response.get("Error", {}).get("Code", "")
    return code in ("TransactionCanceledException", "TransactionConflictException") and is_contention(error)

class CheckVerdictData(HasJobs[ReadsJob], HasInstances[ReadsNodeItems], Protocol):
    """What a verdict reads and writes: the node, the jobs waiting for it, their suspects'
    recorded evidence."""

    faults: FaultRepository


class HealthCheckVerdicts:
    """``released(instance)``: the check let its slot go (its job's next waiting check may start)."""

    def __init__(self, data: CheckVerdictData, checks: HealthCheckRepository, tasks: NodeTasks,
                 leases: VerdictLeaseRepository, verdicts: VerdictReaderPort, reboots: Reboots,
                 remediation: NodeRemediation, *, catalog: FaultCatalog, metrics: MetricsPort,
                 released: Callable[[Instance], None]) -> None:
        self.data = data
        self.checks = checks
        self.tasks = tasks
        self.leases = leases
        self.reader = verdicts  # the check's verdict line
        self.reboots = reboots
        self.remediation = remediation
        self.catalog = catalog
        self.metrics = metrics  # the service's relay: the invocation's metrics
        self.released = released

    @staticmethod
    def ours(instance: Instance, detail: EcsTaskDetail) -> bool:
        """The stopped task is the instance's running check (matched on its startedBy)."""
        return instance.state is InstanceState.HEALTH_CHECKING and bool(
            (instance.check.started_by and detail.startedBy == instance.check.started_by)
            or (instance.check.task_arn and detail.taskArn == instance.check.task_arn))

    def on_stopped(self, detail: EcsTaskDetail, invocation: Invocation | None = None, *,
                   decide_now: bool = False) -> Outcome:
        """The check's verdict. ``invocation``: the delivery of its STOPPED event, which takes
        the verdict's lease first; None (the sweep reading a lost event from DescribeTasks, a
        test): no lease. The lease only keeps duplicate deliveries from racing; what makes a
        verdict land once is its transaction's conditions (the instance still HEALTH_CHECKING
        with this check's startedBy), so a verdict worked without it is as safe, and the
        sweep's, rarely meets another. ``decide_now``: time is up, a line not read is lost."""
        if not self.tasks.runs_our_definition(HEALTH_CHECK, detail):
            return Outcome(FOREIGN_TASK, detail={"task": detail.taskArn})
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        repo = self.data
        log_findings: dict[str, Any] | None = None
        raw = repo.instances.get_instance_item(inst_id) if inst_id else None
        lease: verdict_lease.HeldLease | None = None
        if invocation is not None and raw is not None:
            leased = self._take_verdict_lease(inst_id, raw, detail, invocation)
            if isinstance(leased, Outcome):
                return leased
            lease, raw = leased
        give_up_at = clock.now() + VERDICT_PATIENCE_SECONDS
        round_ = 0
        while round_ < VERDICT_ROUNDS or (round_ < VERDICT_MAX_ROUNDS and clock.now() < give_up_at):
            if round_:
                raw = repo.instances.get_instance_item(inst_id) if inst_id else None  # read once per round
            instance = repo.instances.instance_from_item(raw) if raw else None
            if instance is None or raw is None:
                return Outcome("ignored", detail={"why": "untracked instance"})
            if not self.ours(instance, detail):
                return self.reboots.converge_after_verdict(instance)
            if log_findings is None and policy.parse_verdict(detail.exit_code()) is not None:
                line, unread = self._verdict_line(detail, invocation, lease)  # once per event
                if line is None and not decide_now and (unread or not self._log_grace_over(detail)):
                    return self._verdict_log_pending(instance, detail, lease)
                if line is None:
                    self.metrics.add_metric("VerdictsWithoutLogLine", "Count", 1)
                    logger.warning("health check's verdict line never became readable: its exit code "
                                   "decides alone", extra={"instance": inst_id, "task": detail.taskArn})
                log_findings = line or {}
            try:
                outcome = self._apply(instance, raw, detail, log_findings or {})
            except ClientError as error:
                if not _conflicted(error):
                    raise
                outcome = None  # its transaction conflicted with another verdict's past its retries
            if outcome is not None:
                return outcome
            # Another verdict of the job landed first: a growing pause, then fresh counts.
            if lease is not None and not lease.keep():
                return Outcome("duplicate", detail={"instance": inst_id, "why": "lease taken over"})
            clock.sleep(random.uniform(0, min(_VERDICT_PAUSE_CAP_SECONDS,
                                              _VERDICT_PAUSE_BASE_SECONDS * 2 ** min(round_, 6))))
            round_ += 1
        return Outcome("duplicate", detail={"instance": inst_id})

    def _verdict_line(self, detail: EcsTaskDetail, invocation: Invocation | None,
                      lease: verdict_lease.HeldLease | None) -> tuple[dict[str, Any] | None, bool]:
        """The check's verdict line, read again after VERDICT_LOG_PAUSES while it is not
        readable yet and the invocation has time (none without an invocation: the sweep does
        not wait, it comes back), and whether the last read failed. A line not there past its
        grace leaves the exit code to decide (the check's contract); a read that failed (ours:
        throttled, denied, its answer lost) decides nothing: the sweep reads again, until the
        check's time is up (``decide_now``)."""
        line, unread = self._read_line(detail)
        if invocation is None:
            return line, unread
        for pause in VERDICT_LOG_PAUSES:
            if line is not None or (self._log_grace_over(detail) and not unread):
                break
            if clock.now() + pause + _LEASE_MARGIN_SECONDS > invocation.deadline:
                break
            if lease is not None and not lease.keep():
                break
            clock.sleep(pause)
            line, unread = self._read_line(detail)
        return line, unread

    def _read_line(self, detail: EcsTaskDetail) -> tuple[dict[str, Any] | None, bool]:
        """The line (None: not there yet) and whether the read failed."""
        try:
            return self.reader.read_verdict(detail.taskArn), False
        except Exception:  # throttled, denied, answer lost: not readable now
            logger.warning("verdict line not read", exc_info=True, extra={"task": detail.taskArn})
            self.metrics.add_metric("VerdictLineReadsFailed", "Count", 1)
            return None, True

    @staticmethod
    def _log_grace_over(detail: EcsTaskDetail) -> bool:
        stopped = detail.stoppedAt or detail.updatedAt
        return stopped is not None and clock.now() >= stopped.timestamp() + VERDICT_LOG_GRACE_SECONDS

    def _verdict_log_pending(self, instance: Instance, detail: EcsTaskDetail,
                             lease: verdict_lease.HeldLease | None) -> Outcome:
        """The verdict line is not readable yet: nothing decided. The check's task is recorded
        (its write may have been the one lost) with the sweep's poll due soon, and this
        invocation's verdict lease is given up (a duplicate copy need not wait for it)."""
        inst_id = instance.container_inst_id
        self.tasks.record_until(HEALTH_CHECK, instance, instance.check.started_by, detail.taskArn,
                                clock.now() + VERDICT_LOG_RETRY_SECONDS)
        if lease is not None:
            lease.give_up()
        self.metrics.add_metric("VerdictsWaitingForLogLine", "Count", 1)
        logger.info("health check's verdict line not readable yet: left for the sweep's poll",
                    extra={"instance": inst_id, "task": detail.taskArn})
        return Outcome("verdict_log_pending", detail={"instance": inst_id})

    def _take_verdict_lease(self, inst_id: str, raw: dict[str, Any], detail: EcsTaskDetail,
                            invocation: Invocation) -> Outcome | tuple[verdict_lease.HeldLease, Any]:
        """Take the lease on the check's verdict (with the instance item as last read, to work
        the verdict on), or look a few times for it (``recovery.verdict_lease``). Each way out
        loses no fault: the check is no longer ours (the holder recorded the verdict: converge
        on it); the lease is taken (over); or it is still another copy's, which works it, and
        should that copy die, the sweep's poll of the check, brought forward to the lease's
        end, reads the verdict from DescribeTasks."""
        repo = self.data
        seen: list[dict[str, Any] | None] = [raw]  # the instance item as last read

        def reread() -> dict[str, Any] | None:
            seen[0] = repo.instances.get_instance_item(inst_id)
            return seen[0]

        def still_ours(item: dict[str, Any]) -> bool:
            return self.ours(repo.instances.instance_from_item(item), detail)

        if not still_ours(raw):
            return self.reboots.converge_after_verdict(repo.instances.instance_from_item(raw))
        taken = verdict_lease.take(self.leases, self.metrics, detail.taskArn, invocation, reread, still_ours)
        last = seen[0]
        if last is None:
            return Outcome("ignored", detail={"why": "untracked instance"})
        if isinstance(taken, verdict_lease.HeldLease):
            return taken, last
        instance = repo.instances.instance_from_item(last)
        if taken is None:
            return self.reboots.converge_after_verdict(instance)
        self.tasks.record_until(HEALTH_CHECK, instance, instance.check.started_by, detail.taskArn,
                                taken.until + verdict_lease.SWEEP_AFTER_LEASE_SECONDS)
        return Outcome("verdict_lease_held", detail={"instance": inst_id, "until": taken.until})

    def _apply(self, instance: Instance, raw: dict[str, Any], detail: EcsTaskDetail,
               log_findings: dict[str, Any]) -> Outcome | None:
        """None when the write lost a race (a job joined meanwhile): read and try again."""
        inst_id = instance.container_inst_id
        repo = self.data
        exit_code = detail.exit_code()
        verdict = policy.parse_verdict(exit_code)
        if verdict is None:
            # The check did not run (image pull, OOM, ...) or says it could not (its exit 5,
            # inconclusive: dcgmi or nvidia-smi missing, no host engine): run it again.
            logger.warning("health check ended without a verdict", extra={
                "instance": inst_id, "exit_code": exit_code, "reason": detail.stoppedReason})
            retry_at = clock.now() + RETRY_INTERVAL_SECONDS
            if not self.checks.retry(instance, instance.check.started_by, retry_at):
                return None
            self.released(instance)
            return Outcome("health_check_retry", detail={"instance": inst_id})
        findings = {"exit_code": exit_code, "verdict": verdict.name.lower(), "task_arn": detail.taskArn,
                    **log_findings}
        # The exit code is the contract; a log line that disagrees (or is missing) never wins.
        findings["exit_code"], findings["verdict"] = exit_code, verdict.name.lower()
        jobs = [j for j in (repo.jobs.get_job(job_id) for job_id in sorted(instance.hc_jobs)) if j]
        now = clock.now()
        dcgm = DcgmFindings.from_verdict_json(findings, exit_code=exit_code, task_arn=detail.taskArn)
        evidence = self.evidence(instance, raw, jobs).with_dcgm(dcgm, now)
        plan = self.remediation.plan(evidence, raw, now=now)
        applied = self.remediation.apply(
            instance, raw, plan, evidence, jobs, from_states=(InstanceState.HEALTH_CHECKING,),
            hc_started_by=instance.check.started_by, hc_jobs_count=len(instance.hc_jobs), findings=findings)
        if applied is None:
            return None
        self.released(instance)
        return Outcome("verdict_applied", detail={"instance": inst_id, "verdict": applied.label.value,
                                                  "instance_action": applied.plan.action.value,
                                                  "jobs": [j.job_id for j, _ in applied.outcomes]})

    def evidence(self, instance: Instance, raw: dict[str, Any], jobs: list[Job]) -> Evidence:
        """The fault's evidence as recorded when it was noticed (with what the node agent
        reported since), else rebuilt from the node's reports around the check's request."""
        # Jobs waiting for the verdict, then those that left before it (spare first).
        faults = [(job.job_id, job.attempt) for job in jobs] + instance.left_jobs
        for job_id, attempt in faults:
            suspect = self.data.faults.get_suspect(job_id, attempt, instance.container_inst_id)
            stored = suspect.record if suspect is not None else {}
            if stored.get("evidence"):
                return rebuild(Evidence.from_dict(stored["evidence"]), raw, self.catalog)
        waiting = next((j for j in jobs if j.state in RECOVERING_JOB_STATES), None)
        fault_at = (waiting.fault_started_at if waiting and waiting.fault_started_at else None) \
            or instance.hc_requested_at or clock.now()
        return self.remediation.evidence(inst_id=instance.container_inst_id, instance_item=raw,
                                         trigger=Trigger.TASK_EXIT, fault_at=fault_at, job=waiting)
