"""Stage 2: the DCGM health check of a suspect instance, exactly once per claim.

Open (or join) -> claim -> StartTask -> record the task -> verdict. The claim, with a
deterministic ``startedBy``, is committed before StartTask; a delivery that died after
it leaves a lease that expires, and whoever takes the claim over looks the task up by
``startedBy`` before starting one. The verdict is matched on that ``startedBy`` (not on
the task ARN, whose write may have been the one that failed).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from gpu_recovery import clock
from gpu_recovery.adapters.errors import refused
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    HEALTH_CHECK_GROUP,
    HEALTH_CHECK_STARTED_BY,
    SYSTEM_STOP_REASON_PREFIX,
    NotificationKind,
)
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Instance, Job, container_instance_id
from gpu_recovery.domain.policy import JobVerdictOutcome, VerdictAction
from gpu_recovery.domain.states import (
    HEALTH_CHECK_STATES,
    RECOVERING_JOB_STATES,
    DcgmVerdict,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.ecs_events import EcsTaskDetail
from gpu_recovery.recovery.gang_restart import GangRestart
from gpu_recovery.recovery.ports import Deps, Outcome
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.repository import JobVerdict

logger = logging.getLogger(__name__)

RETRY_INTERVAL_SECONDS = 60
# A running check is looked at this often by the sweep: a verdict event that never
# arrived is read from DescribeTasks instead.
POLL_SECONDS = 300
FOLLOW_UP_SECONDS = 60  # the sweep finishes a verdict's reboot or drain after this
_VERDICT_ROUNDS = 3


def health_check_started_by(instance: Instance) -> str:
    """Deterministic per check and placement attempt: the same claim finds its task."""
    seed = f"{instance.container_inst_id}:{instance.hc_requested_at}:{instance.hc_start_attempts}"
    return f"{HEALTH_CHECK_STARTED_BY}-{hashlib.sha256(seed.encode()).hexdigest()[:16]}"


class HealthChecks:
    def __init__(self, deps: Deps, ranks: RankOperations, reboots: Reboots,
                 restarts: GangRestart) -> None:
        self.deps = deps
        self.ranks = ranks
        self.reboots = reboots
        self.restarts = restarts

    # ------------------------------------------------------------ open / join
    def request(self, job: Job, inst_id: str) -> str:
        """Open or join the health check of an instance (at most one per instance)."""
        repo = self.deps.repo
        instance = repo.get_instance(inst_id)
        if instance is not None and instance.state in HEALTH_CHECK_STATES and job.job_id in instance.hc_jobs:
            return self._start_read(instance) or "waiting_for_gpus"  # joined by an earlier delivery
        now = clock.now()
        opened = repo.open_health_check(inst_id, job.job_id, now=now, retry_at=now + RETRY_INTERVAL_SECONDS)
        if not opened and not repo.join_health_check(inst_id, job.job_id):
            return self._instance_busy(job, inst_id)
        return self.start_if_ready(inst_id) or "waiting_for_gpus"

    def _instance_busy(self, job: Job, inst_id: str) -> str:
        """The instance is already rebooting or quarantined (another job's fault): the
        verdict this job waits for is already known."""
        instance = self.deps.repo.get_instance(inst_id)
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
        if job.suspects.get(inst_id) == label.value:
            return result  # recorded by an earlier delivery
        verdict = DcgmVerdict.REBOOT if label is SuspectVerdict.REBOOT else DcgmVerdict.REPLACE
        record, outcome = self._job_verdict(job, inst_id, label, findings, verdict)
        restart = outcome is JobVerdictOutcome.RESTART_AFTER_REBOOT
        if self.deps.repo.record_verdict_of_busy_instance(instance, record, restart):
            self._notify_outcome(job, outcome, instance, verdict,
                                 VerdictAction.REBOOT if label is SuspectVerdict.REBOOT
                                 else VerdictAction.QUARANTINE)
        return result

    # -------------------------------------------------------------------- start
    def start_if_ready(self, inst_id: str) -> str | None:
        """Start the DCGM task once the instance's GPUs are free; finish a dead claim."""
        instance = self.deps.repo.get_instance(inst_id)
        return self._start_read(instance) if instance is not None else None

    def _start_read(self, instance: Instance) -> str | None:
        inst_id = instance.container_inst_id
        now = clock.now()
        if instance.state is InstanceState.HEALTH_CHECKING:
            if instance.hc_task_arn or (instance.hc_lease_until or 0.0) > now:
                return None  # running, or its claimer may still be starting it
            if not self.deps.repo.take_over_health_check_claim(instance, now + CLAIM_LEASE_SECONDS, now):
                return None
            return self._start(instance, instance.hc_started_by, look_up_first=True)
        if instance.state is not InstanceState.HEALTH_CHECK_PENDING:
            return None
        if instance.hc_start_attempts and (instance.deadline_at or 0.0) > now:
            return None  # a failed start backs off until its retry time (the sweep's)
        busy = self.deps.repo.live_ranks_on_instance(inst_id)
        if busy:
            logger.info("health check waits for GPUs", extra={
                "instance": inst_id, "busy_ranks": [f"{r.job_id}#{r.rank}" for r in busy]})
            return None
        started_by = health_check_started_by(instance)
        if not self.deps.repo.claim_health_check(instance, started_by, now + CLAIM_LEASE_SECONDS):
            return None
        return self._start(instance, started_by, look_up_first=False)

    def _start(self, instance: Instance, started_by: str, *, look_up_first: bool) -> str | None:
        inst_id = instance.container_inst_id
        repo = self.deps.repo
        if look_up_first:
            found = self.deps.ecs.tasks_started_by(started_by)
            if found:
                self._record_task(instance, started_by, found[0])
                return found[0]
        try:
            result = self.deps.ecs.start_task(
                task_definition=self.deps.settings.health_check_task,
                container_instance_arn=instance.container_instance_arn or inst_id,
                started_by=started_by, group=HEALTH_CHECK_GROUP,
                tags=[{"key": "gpu-recovery:purpose", "value": "dcgm-health-check"}],
            )
        except Exception as error:
            if refused(error):  # nothing was started: the next try may start it
                repo.release_health_check_claim(inst_id, started_by, placement_failed=False,
                                                retry_at=clock.now() + RETRY_INTERVAL_SECONDS)
            # Otherwise it may have started: the lease expires and the next try looks it up.
            raise
        if not result.task_arns:
            logger.warning("health check could not be placed", extra={
                "instance": inst_id, "reasons": result.reasons(), "attempt": instance.hc_start_attempts + 1})
            repo.release_health_check_claim(inst_id, started_by, placement_failed=True,
                                            retry_at=clock.now() + RETRY_INTERVAL_SECONDS)
            return None
        task_arn = result.task_arns[0]
        self._record_task(instance, started_by, task_arn)
        self.deps.metrics.add_metric("HealthChecksStarted", "Count", 1)
        logger.info("health check started", extra={"instance": inst_id, "task": task_arn})
        return task_arn

    def _record_task(self, instance: Instance, started_by: str, task_arn: str) -> None:
        now = clock.now()
        timeout_at = (instance.hc_requested_at or now) + self.deps.settings.health_check_timeout_seconds
        self.deps.repo.record_health_check_task(instance.container_inst_id, started_by, task_arn,
                                                min(timeout_at, now + POLL_SECONDS))

    # ------------------------------------------------------------------ verdict
    def on_stopped(self, detail: EcsTaskDetail) -> Outcome:
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        for _ in range(_VERDICT_ROUNDS):
            instance = self.deps.repo.get_instance(inst_id) if inst_id else None
            if instance is None:
                return Outcome("ignored", detail={"why": "untracked instance"})
            ours = instance.state is InstanceState.HEALTH_CHECKING and (
                (instance.hc_started_by and detail.startedBy == instance.hc_started_by)
                or (instance.hc_task_arn and detail.taskArn == instance.hc_task_arn))
            if not ours:
                return self.reboots.converge_after_verdict(instance)
            outcome = self._apply(instance, detail)
            if outcome is not None:
                return outcome
        return Outcome("duplicate", detail={"instance": inst_id})

    def _apply(self, instance: Instance, detail: EcsTaskDetail) -> Outcome | None:
        """None when the write lost a race (a job joined meanwhile): read and try again."""
        inst_id = instance.container_inst_id
        repo = self.deps.repo
        exit_code = detail.exit_code()
        verdict = policy.parse_verdict(exit_code)
        if verdict is None:
            # The check itself did not run (image pull, OOM, ...): run it again.
            logger.warning("health check ended without a verdict", extra={
                "instance": inst_id, "exit_code": exit_code, "reason": detail.stoppedReason})
            if not repo.retry_health_check(inst_id, instance.hc_started_by,
                                           clock.now() + RETRY_INTERVAL_SECONDS):
                return None
            return Outcome("health_check_retry", detail={"instance": inst_id})
        findings = {"exit_code": exit_code, "verdict": verdict.name.lower(), "task_arn": detail.taskArn,
                    **(self.deps.verdicts.read_verdict(detail.taskArn) or {})}
        jobs = [j for j in (repo.get_job(job_id) for job_id in sorted(instance.hc_jobs)) if j]
        waiting = [j for j in jobs if j.state in RECOVERING_JOB_STATES]
        action = policy.instance_action(verdict, waiting)
        label = policy.suspect_label(verdict, action)
        decisions = [self._job_verdict(job, inst_id, label, findings, verdict) for job in waiting]
        restart_jobs = [d.job.job_id for d, o in decisions
                        if o is JobVerdictOutcome.RESTART_AFTER_REBOOT and label is SuspectVerdict.REBOOT]
        now = clock.now()
        to = {VerdictAction.MARK_AVAILABLE: InstanceState.AVAILABLE,
              VerdictAction.REBOOT: InstanceState.REBOOTING,
              VerdictAction.QUARANTINE: InstanceState.QUARANTINED}[action]
        recorded = repo.record_verdict(
            instance, to=to, findings=findings, jobs=[d for d, _ in decisions], now=now,
            follow_up_at=now + FOLLOW_UP_SECONDS,
            quarantine_reason=f"DCGM verdict {verdict.name.lower()}", restart_jobs=restart_jobs)
        if not recorded:
            return None
        logger.info("verdict applied", extra={"instance": inst_id, "verdict": label.value,
                                              "action": action.value})
        fresh = repo.get_instance(inst_id) or instance
        if action is VerdictAction.REBOOT:
            self.reboots.issue(fresh)
        elif action is VerdictAction.QUARANTINE:
            self.reboots.quarantine(fresh)
        for decision, outcome in decisions:
            self._notify_outcome(decision.job, outcome, instance, verdict, action)
        if action is VerdictAction.MARK_AVAILABLE:
            # A healthy instance may be the last one a rebooted job was waiting for.
            for decision, outcome in decisions:
                if outcome is JobVerdictOutcome.RESTART_AFTER_REBOOT:
                    self.restarts.try_restart(decision.job.job_id)
        return Outcome("verdict_applied", detail={"instance": inst_id, "verdict": label.value,
                                                  "instance_action": action.value,
                                                  "jobs": [d.job.job_id for d, _ in decisions]})

    def _job_verdict(self, job: Job, inst_id: str, label: SuspectVerdict, findings: dict[str, Any],
                     verdict: DcgmVerdict) -> tuple[JobVerdict, JobVerdictOutcome]:
        suspects = {**job.suspects, inst_id: label.value}
        outcome = policy.job_outcome(suspects, job)
        to, spend, deadline, error = job.state, False, None, ""
        if outcome is JobVerdictOutcome.RESTART_AFTER_REBOOT:
            if job.state is JobState.PENDING_HEALTHCHECK:
                to, spend = JobState.PENDING_RESTART, True
            deadline = clock.now() + RETRY_INTERVAL_SECONDS
        elif outcome in (JobVerdictOutcome.FAIL_APPLICATION_ERROR, JobVerdictOutcome.FAIL_NODE_FAULT):
            to, error = JobState.FAILED, self._failure_text(outcome, inst_id, verdict, job)
        record = JobVerdict(job=job, to=to, label=label, findings=findings, last_error=error,
                            spend_recovery=spend, deadline_at=deadline)
        return record, outcome

    @staticmethod
    def _failure_text(outcome: JobVerdictOutcome, inst_id: str, verdict: DcgmVerdict, job: Job) -> str:
        if outcome is JobVerdictOutcome.FAIL_APPLICATION_ERROR:
            return (f"DCGM found the GPUs of {inst_id} healthy: the failure was the "
                    f"application's ({job.last_error})")
        if verdict is DcgmVerdict.REBOOT:
            return (f"{inst_id} needs a reboot but the job used all {job.max_recovery_attempts} "
                    "recovery attempt(s)")
        if verdict is DcgmVerdict.OPERATOR_ACTION:
            return (f"{inst_id} has a configuration problem DCGM reported (e.g. persistence mode "
                    "off); a reboot cannot fix it")
        return f"{inst_id} has a GPU fault a reboot cannot fix (DCGM verdict {verdict.name.lower()})"

    def _notify_outcome(self, job: Job, outcome: JobVerdictOutcome, instance: Instance,
                        verdict: DcgmVerdict, action: VerdictAction) -> None:
        if outcome in (JobVerdictOutcome.WAIT, JobVerdictOutcome.RESTART_AFTER_REBOOT):
            return
        job = self.deps.repo.get_job(job.job_id) or job
        self.deps.metrics.add_metric("Failures", "Count", 1)
        if outcome is JobVerdictOutcome.FAIL_APPLICATION_ERROR:
            self.ranks.notify(job, instance, NotificationKind.APPLICATION_ERROR,
                              "Job failed: application error (GPUs healthy)",
                              what_happened=f"{job.last_error}; DCGM health check passed",
                              what_was_done="Job marked FAILED; the instance is back in service",
                              operator_action="Look at the job's logs: the GPUs passed DCGM diagnostics.")
            return
        quarantined = action is VerdictAction.QUARANTINE
        self.ranks.notify(
            job, instance, NotificationKind.QUARANTINED if quarantined else NotificationKind.FAILED,
            "Job failed: GPU node quarantined" if quarantined else "Job failed: GPU fault",
            what_happened=f"{job.last_error}; DCGM verdict: {verdict.name.lower()}",
            what_was_done=("Job marked FAILED; instance drained (DRAINING) so nothing new is placed "
                           "on it" if quarantined else "Job marked FAILED"),
            operator_action=("Inspect the node (DCGM verdict in the job record and the health-check "
                             "log), replace or repair it, then set it ACTIVE again and resubmit the job."),
        )

    # -------------------------------------------------------------------- sweep
    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled: placement retries, dead claims, lost verdict events, timeouts."""
        settings = self.deps.settings
        requested = instance.hc_requested_at or now
        out_of_time = now >= requested + settings.health_check_timeout_seconds
        if instance.state is InstanceState.HEALTH_CHECK_PENDING:
            if out_of_time or instance.hc_start_attempts >= settings.health_check_start_retries:
                return self.reboots.time_out(
                    instance, NotificationKind.HEALTH_CHECK_TIMEOUT,
                    f"health check could not start ({instance.hc_start_attempts} placement attempt(s))",
                    verdict=SuspectVerdict.UNAVAILABLE, quarantine=False)
            if self.start_if_ready(instance.container_inst_id) is None:
                self.deps.repo.rearm_instance(instance.container_inst_id, InstanceState.HEALTH_CHECK_PENDING,
                                              now + RETRY_INTERVAL_SECONDS)
            return "health_check_retried"
        if out_of_time:
            if instance.hc_task_arn:
                self.deps.ecs.stop_task(instance.hc_task_arn,
                                        f"{SYSTEM_STOP_REASON_PREFIX} health check timed out")
            return self.reboots.time_out(instance, NotificationKind.HEALTH_CHECK_TIMEOUT,
                                         "health check did not finish in time",
                                         verdict=SuspectVerdict.TIMEOUT)
        if not instance.hc_task_arn:
            started = self.start_if_ready(instance.container_inst_id)
            if started is None:
                self.deps.repo.rearm_instance(instance.container_inst_id, InstanceState.HEALTH_CHECKING,
                                              max(instance.hc_lease_until or now, now + 1))
            return "health_check_resumed"
        task = self.deps.ecs.describe_task(instance.hc_task_arn)
        if task is not None and task.get("lastStatus") == "STOPPED":
            # Its STOPPED event was lost (or is still being retried): read it from ECS.
            return self.on_stopped(EcsTaskDetail.model_validate(task)).action
        self.deps.repo.rearm_instance(instance.container_inst_id, InstanceState.HEALTH_CHECKING,
                                      min(requested + settings.health_check_timeout_seconds,
                                          now + POLL_SECONDS))
        return "health_check_running"
