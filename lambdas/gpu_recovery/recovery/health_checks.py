"""Stage 2: the DCGM health check of a suspect instance, exactly once per claim.

Open (or join) -> claim -> StartTask -> record the task -> verdict. The claim, with a
deterministic ``startedBy``, is committed before StartTask; a delivery that died after
it leaves a lease that expires, and whoever takes the claim over looks the task up by
``startedBy`` before starting one. The verdict is matched on that ``startedBy`` (not on
the task ARN, whose write may have been the one that failed).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    RETRY_INTERVAL_SECONDS,
    SYSTEM_STOP_REASON_PREFIX,
)
from gpu_recovery.domain import policy
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.escalation import history_from_item
from gpu_recovery.domain.evidence import DcgmFindings, Evidence
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.models import Instance, Job, container_instance_id
from gpu_recovery.domain.policy import JobOutcome
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.states import (
    HEALTH_CHECK_STATES,
    RECOVERING_JOB_STATES,
    InstanceState,
    JobState,
    SuspectVerdict,
)
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import node_tasks, verdict_lease
from gpu_recovery.recovery.goodput_metrics import job_failed
from gpu_recovery.recovery.node_tasks import NodeTasks
from gpu_recovery.recovery.ports import Deps, Invocation, Outcome, after_commit
from gpu_recovery.recovery.ranks import RankOperations
from gpu_recovery.recovery.reactions import Reactions, RestartDue
from gpu_recovery.recovery.reboots import Reboots
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation, rebuild
from gpu_recovery.recovery.undiagnosed import settle_undiagnosed
from gpu_recovery.repository.base import is_contention
from gpu_recovery.repository.health_check_slots import Claim

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
# A running check is looked at this often by the sweep: a verdict event that never
# arrived is read from DescribeTasks instead.
POLL_SECONDS = 300
FOLLOW_UP_SECONDS = 60  # the sweep finishes a verdict's reboot or drain after this
# A verdict's transaction fails when another verdict of the same job lands first (both
# count on the job's tally), or conflicts with one in flight: decide again on fresh counts.
# A job's DCGM checks end together, so up to hundreds of verdicts (a cascade's suspects) race
# for one tally and land one at a time: keep trying, with a growing full-jitter pause, for
# VERDICT_PATIENCE_SECONDS before leaving it to the sweep's poll of the running check.
_VERDICT_ROUNDS = 8  # at least this many rounds, however long they take
_VERDICT_MAX_ROUNDS = 64  # and at most this many (a clock that does not move cannot spin it)
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


def health_check_started_by(instance: Instance) -> str:
    """Deterministic per check and placement attempt: the same claim finds its task."""
    return task_started_by.node_task(task_started_by.HEALTH_CHECK, instance.container_inst_id,
                                     instance.hc_requested_at, instance.hc_start_attempts)


class HealthChecks:
    def __init__(self, deps: Deps, ranks: RankOperations, reboots: Reboots, remediation: NodeRemediation,
                 tasks: NodeTasks, *, reactions: Reactions | None = None) -> None:
        self.deps = deps
        self.tasks = tasks
        self.ranks = ranks
        self.reboots = reboots
        self.remediation = remediation
        self.reactions = reactions or Reactions()  # told: a verdict lets a job restart, or move

    # ------------------------------------------------------------ open / join
    def request(self, job: Job, inst_id: str, *, opened: Callable[[], None] | None = None) -> str:
        """Open or join the health check of an instance (at most one per instance).
        ``opened``: called once the check is open or joined (its instance's deadline then
        brings the sweep to it), before the start waits for its turn at the ECS budget."""
        if not self.deps.policy.modes.executes(Effect.HEALTH_CHECK):
            return self._diag_observed(job, inst_id)
        repo = self.deps.repo
        instance = repo.get_instance(inst_id)
        if instance is not None and instance.state in HEALTH_CHECK_STATES and job.job_id in instance.hc_jobs:
            if opened is not None:  # joined by an earlier delivery
                opened()
            return self._start_read(instance, turn_within=EVENT_START_TURN_SECONDS) or "waiting_for_gpus"
        now = clock.now()
        if not repo.open_health_check(inst_id, job.job_id, now=now, retry_at=now + RETRY_INTERVAL_SECONDS) \
                and not repo.join_health_check(inst_id, job.job_id):
            return self._instance_busy(job, inst_id)
        if opened is not None:
            opened()
        return self.start_if_ready(inst_id, turn_within=EVENT_START_TURN_SECONDS) or "waiting_for_gpus"

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
        for _ in range(_VERDICT_ROUNDS):
            suspect = self.deps.repo.faults.get_suspect(job.job_id, job.attempt, inst_id)
            if suspect is not None and not suspect.pending:
                return result  # recorded by an earlier delivery
            history = history_from_item(instance.fault_history)
            now = clock.now()
            job = self.deps.repo.faults.counted(job)
            record, outcome = self.remediation.settlement.job_verdict(job, inst_id, label, None, None,
                                                                      findings, history, now)
            after = replace(job, state=record.to, last_error=record.last_error or job.last_error)
            notice = self.remediation.owed_notices.outcome_notice(after, outcome, instance, None, None, label)
            owed = self.remediation.notices.owe([notice], now)
            if self.deps.repo.record_verdict_of_busy_instance(instance, record, record.waits_for_reboot,
                                                              also=owed):
                self.remediation.notices.send([notice])
                if outcome.fails:
                    job_failed(self.deps, job.job_id)
                if outcome.restarts:
                    after_commit("restart", self.reactions.emit, RestartDue(job.job_id))
                return result
            fresh = self.deps.repo.get_job(job.job_id)
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
        repo = self.deps.repo
        suspect = repo.faults.get_suspect(job.job_id, job.attempt, inst_id)
        if suspect is not None and not suspect.pending:
            return "observed"
        raw = repo.get_instance_item(inst_id)
        if raw is None:
            return "instance_missing"
        instance = repo.instance_from_item(raw)
        now = clock.now()
        evidence = self._evidence(instance, raw, [job])
        plan = self.remediation.plan(evidence, raw, now=now)
        findings = {"verdict": "not run", "source": "observe mode", "rule": plan.decision.rule_id,
                    "reason": plan.decision.reason[:300]}
        record, outcome = self.remediation.settlement.job_verdict(
            job, inst_id, SuspectVerdict.BLOCKED, plan, evidence, findings,
            history_from_item(raw.get("fault_history")), now)
        if outcome.fails:
            outcome = JobOutcome.FAIL_OBSERVED
            record = replace(record, to=JobState.FAILED, spend="", deadline_at=None, relocate=False,
                             last_error=(f"observe mode: the DCGM diag of {inst_id} would have run "
                                         f"({plan.decision.reason})"))
        notice = self.remediation.owed_notices.outcome_notice(
            replace(job, state=record.to, last_error=record.last_error or job.last_error), outcome, instance,
            plan, evidence, SuspectVerdict.BLOCKED)
        if not repo.record_verdict_of_busy_instance(instance, record, restart=False,
                                                    also=self.remediation.notices.owe([notice], now)):
            return "raced"
        self.remediation.notices.send([notice])
        self.deps.metrics.add_metric("ObservedFaults", "Count", 1)
        if outcome.fails:
            job_failed(self.deps, job.job_id)
        last_fault = {"at": now, "evidence": evidence.to_dict(), "plan": plan.to_dict(), "jobs": [job.job_id]}
        after_commit("observed fault", partial(repo.record_observed_fault, inst_id, fault_history=None,
                                               last_fault=last_fault))
        if outcome is JobOutcome.RELOCATE:
            after_commit("relocation", self.reactions.emit, RestartDue(job.job_id))
        return "observed"

    # -------------------------------------------------------------------- start
    def start_if_ready(self, inst_id: str, *, turn_within: float = START_TURN_SECONDS) -> str | None:
        """Start the DCGM task once the instance's GPUs are free; finish a dead claim.
        ``turn_within``: how long it may wait for its turn at the ECS budget."""
        instance = self.deps.repo.get_instance(inst_id)
        return self._start_read(instance, turn_within=turn_within) if instance is not None else None

    def _start_read(self, instance: Instance, *, turn_within: float = START_TURN_SECONDS) -> str | None:
        inst_id = instance.container_inst_id
        now = clock.now()
        if instance.state is InstanceState.HEALTH_CHECKING:
            if instance.hc_task_arn or (instance.hc_lease_until or 0.0) > now:
                return None  # running, or its claimer may still be starting it
            if not self.deps.repo.take_over_health_check_claim(instance, now + CLAIM_LEASE_SECONDS, now):
                return None
            return self._start(instance, instance.hc_started_by, look_up_first=True, turn_within=turn_within)
        if instance.state is not InstanceState.HEALTH_CHECK_PENDING:
            return None
        if instance.hc_start_attempts and not instance.hc_waiting_for_slot \
                and (instance.deadline_at or 0.0) > now:
            return None  # a failed start backs off until its retry time (the sweep's)
        busy = self.deps.repo.live_ranks_on_instance(inst_id)
        if busy:
            logger.info("health check waits for GPUs", extra={
                "instance": inst_id, "busy_ranks": [f"{r.job_id}#{r.rank}" for r in busy]})
            return None
        started_by = health_check_started_by(instance)
        owner = instance.check_owner
        settings = self.deps.settings
        claimed = self.deps.repo.claim_health_check(
            instance, started_by, now + CLAIM_LEASE_SECONDS, owner=owner,
            per_job=settings.max_health_checks_per_job, cluster=settings.max_health_checks_in_flight, now=now)
        if claimed.outcome in (Claim.CLUSTER_FULL, Claim.JOB_FULL):
            if not instance.hc_waiting_for_slot:
                self.deps.repo.wait_for_health_check_slot(instance, owner, now)
                logger.info("health check waits for a slot", extra={"instance": inst_id, "job_id": owner,
                                                                    "why": claimed.outcome.value})
            return None
        if claimed.instance is None:
            return None
        # The instance as the claim wrote it: a release gives the slot back to the shard and
        # the share the claim recorded (hc_slot_shard, hc_job_slot), not to defaults.
        return self._start(claimed.instance, started_by, look_up_first=False, turn_within=turn_within)

    def kick(self, job_id: str, *, limit: int = 2) -> list[str]:
        """A slot of ``job_id``'s was given back: start its next waiting checks."""
        started = []
        for inst_id in self.deps.repo.slots.waiting(job_id, limit):
            task = self.start_if_ready(inst_id)
            if task:
                started.append(inst_id)
        return started

    def _start(self, instance: Instance, started_by: str, *, look_up_first: bool,
               turn_within: float = START_TURN_SECONDS) -> str | None:
        """StartTask on the claimed instance, once its turn at the ECS budget has come (the
        claim, leased for longer than any turn, keeps a redelivered event from taking a
        token of its own)."""
        repo = self.deps.repo
        if look_up_first:
            found = self.tasks.found(started_by)
            if found:
                self._record_task(instance, started_by, found)
                return found
        try:
            placed = self.tasks.start(
                node_tasks.HEALTH_CHECK, instance, started_by, turn_within=turn_within,
                release=lambda: repo.release_health_check_claim(  # refused: tried again in a minute
                    instance, started_by, placement_failed=False,
                    retry_at=clock.now() + RETRY_INTERVAL_SECONDS),
                record=lambda task_arn: self._record_task(instance, started_by, task_arn))
        except RateLimited as limited:
            # The stack's ECS budget has no turn in time: StartTask was never called. The
            # slot is given back at once (not held until the claim's lease expires) and the
            # check is tried again when a token is due (by the sweep; no failed invocation).
            repo.release_health_check_claim(instance, started_by, placement_failed=False,
                                            retry_at=clock.now() + limited.wait_seconds)
            self.deps.metrics.add_metric("HealthCheckStartsDeferred", "Count", 1)
            return None
        if placed.task_arn is None:
            logger.warning("health check could not be placed", extra={
                "instance": instance.container_inst_id, "reasons": placed.reasons,
                "attempt": instance.hc_start_attempts + 1})
            repo.release_health_check_claim(instance, started_by, placement_failed=True,
                                            retry_at=clock.now() + RETRY_INTERVAL_SECONDS)
            self._kick_after_release(instance)
        return placed.task_arn

    def _kick_after_release(self, instance: Instance) -> None:
        if instance.hc_owner:
            try:
                self.kick(instance.hc_owner)
            except Exception:  # the sweep looks at every job's queue each minute
                logger.warning("next health check not started", exc_info=True,
                               extra={"job_id": instance.hc_owner})

    def _record_task(self, instance: Instance, started_by: str, task_arn: str) -> None:
        now = clock.now()
        started = instance.hc_claimed_at or instance.hc_requested_at or now
        timeout_at = started + self.deps.settings.health_check_timeout_seconds
        self.deps.repo.record_health_check_task(instance.container_inst_id, started_by, task_arn,
                                                min(timeout_at, now + POLL_SECONDS))

    # ------------------------------------------------------------------ verdict
    @staticmethod
    def _ours(instance: Instance, detail: EcsTaskDetail) -> bool:
        """The stopped task is the instance's running check (matched on its startedBy)."""
        return instance.state is InstanceState.HEALTH_CHECKING and bool(
            (instance.hc_started_by and detail.startedBy == instance.hc_started_by)
            or (instance.hc_task_arn and detail.taskArn == instance.hc_task_arn))

    def on_stopped(self, detail: EcsTaskDetail, invocation: Invocation | None = None, *,
                   decide_now: bool = False) -> Outcome:
        """The check's verdict. ``invocation``: the delivery of its STOPPED event, which takes
        the verdict's lease first; None (the sweep reading a lost event from DescribeTasks, a
        test): no lease. The lease only keeps duplicate deliveries from racing; what makes a
        verdict land once is its transaction's conditions (the instance still HEALTH_CHECKING
        with this check's startedBy), so a verdict worked without it is as safe, and the
        sweep's, rarely meets another. ``decide_now``: time is up, a line not read is lost."""
        inst_id = container_instance_id(detail.containerInstanceArn or "")
        repo = self.deps.repo
        log_findings: dict[str, Any] | None = None
        raw = repo.get_instance_item(inst_id) if inst_id else None
        lease: verdict_lease.HeldLease | None = None
        if invocation is not None and raw is not None:
            leased = self._take_verdict_lease(inst_id, raw, detail, invocation)
            if isinstance(leased, Outcome):
                return leased
            lease, raw = leased
        give_up_at = clock.now() + VERDICT_PATIENCE_SECONDS
        round_ = 0
        while round_ < _VERDICT_ROUNDS or (round_ < _VERDICT_MAX_ROUNDS and clock.now() < give_up_at):
            if round_:
                raw = repo.get_instance_item(inst_id) if inst_id else None  # read once per round
            instance = repo.instance_from_item(raw) if raw else None
            if instance is None or raw is None:
                return Outcome("ignored", detail={"why": "untracked instance"})
            if not self._ours(instance, detail):
                return self.reboots.converge_after_verdict(instance)
            if log_findings is None and policy.parse_verdict(detail.exit_code()) is not None:
                line = self._verdict_line(detail, invocation, lease)  # once per event
                if line is None and not self._log_grace_over(detail) and not decide_now:
                    return self._verdict_log_pending(instance, detail, lease)
                if line is None:
                    self.deps.metrics.add_metric("VerdictsWithoutLogLine", "Count", 1)
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
                      lease: verdict_lease.HeldLease | None) -> dict[str, Any] | None:
        """The check's verdict line, read again after VERDICT_LOG_PAUSES while it is not
        readable yet and the invocation has time (none without an invocation: the sweep does
        not wait, it comes back). A read that fails is a line not readable yet: the log is
        read again later, and past its grace the exit code decides (the check's contract)."""
        line = self._read_line(detail)
        if invocation is None:
            return line
        for pause in VERDICT_LOG_PAUSES:
            if line is not None or self._log_grace_over(detail):
                break
            if clock.now() + pause + _LEASE_MARGIN_SECONDS > invocation.deadline:
                break
            if lease is not None and not lease.keep():
                break
            clock.sleep(pause)
            line = self._read_line(detail)
        return line

    def _read_line(self, detail: EcsTaskDetail) -> dict[str, Any] | None:
        try:
            return self.deps.verdicts.read_verdict(detail.taskArn)
        except Exception:  # throttled, denied, answer lost: not readable now
            logger.warning("verdict line not read", exc_info=True, extra={"task": detail.taskArn})
            self.deps.metrics.add_metric("VerdictLineReadsFailed", "Count", 1)
            return None

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
        self.deps.repo.record_health_check_task(inst_id, instance.hc_started_by, detail.taskArn,
                                                clock.now() + VERDICT_LOG_RETRY_SECONDS)
        if lease is not None:
            lease.give_up()
        self.deps.metrics.add_metric("VerdictsWaitingForLogLine", "Count", 1)
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
        repo = self.deps.repo
        seen: list[dict[str, Any] | None] = [raw]  # the instance item as last read

        def reread() -> dict[str, Any] | None:
            seen[0] = repo.get_instance_item(inst_id)
            return seen[0]

        def still_ours(item: dict[str, Any]) -> bool:
            return self._ours(repo.instance_from_item(item), detail)

        if not still_ours(raw):
            return self.reboots.converge_after_verdict(repo.instance_from_item(raw))
        taken = verdict_lease.take(self.deps, detail.taskArn, invocation, reread, still_ours)
        last = seen[0]
        if last is None:
            return Outcome("ignored", detail={"why": "untracked instance"})
        if isinstance(taken, verdict_lease.HeldLease):
            return taken, last
        instance = repo.instance_from_item(last)
        if taken is None:
            return self.reboots.converge_after_verdict(instance)
        repo.record_health_check_task(inst_id, instance.hc_started_by, detail.taskArn,
                                      taken.until + verdict_lease.SWEEP_AFTER_LEASE_SECONDS)
        return Outcome("verdict_lease_held", detail={"instance": inst_id, "until": taken.until})

    def _apply(self, instance: Instance, raw: dict[str, Any], detail: EcsTaskDetail,
               log_findings: dict[str, Any]) -> Outcome | None:
        """None when the write lost a race (a job joined meanwhile): read and try again."""
        inst_id = instance.container_inst_id
        repo = self.deps.repo
        exit_code = detail.exit_code()
        verdict = policy.parse_verdict(exit_code)
        if verdict is None:
            # The check itself did not run (image pull, OOM, ...): run it again.
            logger.warning("health check ended without a verdict", extra={
                "instance": inst_id, "exit_code": exit_code, "reason": detail.stoppedReason})
            if not repo.retry_health_check(instance, instance.hc_started_by,
                                           clock.now() + RETRY_INTERVAL_SECONDS):
                return None
            self._kick_after_release(instance)
            return Outcome("health_check_retry", detail={"instance": inst_id})
        findings = {"exit_code": exit_code, "verdict": verdict.name.lower(), "task_arn": detail.taskArn,
                    **log_findings}
        # The exit code is the contract; a log line that disagrees (or is missing) never wins.
        findings["exit_code"], findings["verdict"] = exit_code, verdict.name.lower()
        jobs = [j for j in (repo.get_job(job_id) for job_id in sorted(instance.hc_jobs)) if j]
        now = clock.now()
        dcgm = DcgmFindings.from_verdict_json(findings, exit_code=exit_code, task_arn=detail.taskArn)
        evidence = self._evidence(instance, raw, jobs).with_dcgm(dcgm, now)
        plan = self.remediation.plan(evidence, raw, now=now)
        applied = self.remediation.apply(
            instance, raw, plan, evidence, jobs, from_states=(InstanceState.HEALTH_CHECKING,),
            hc_started_by=instance.hc_started_by, hc_jobs_count=len(instance.hc_jobs), findings=findings)
        if applied is None:
            return None
        self._kick_after_release(instance)
        return Outcome("verdict_applied", detail={"instance": inst_id, "verdict": applied.label.value,
                                                  "instance_action": applied.plan.action.value,
                                                  "jobs": [j.job_id for j, _ in applied.outcomes]})

    def _evidence(self, instance: Instance, raw: dict[str, Any], jobs: list[Job]) -> Evidence:
        """The fault's evidence as recorded when it was noticed (with what the node agent
        reported since), else rebuilt from the node's reports around the check's request."""
        # Jobs waiting for the verdict, then those that left before it (spare first).
        faults = [(job.job_id, job.attempt) for job in jobs] + instance.left_jobs
        for job_id, attempt in faults:
            suspect = self.deps.repo.faults.get_suspect(job_id, attempt, instance.container_inst_id)
            stored = suspect.record if suspect is not None else {}
            if stored.get("evidence"):
                return rebuild(Evidence.from_dict(stored["evidence"]), raw, self.deps.policy.catalog)
        waiting = next((j for j in jobs if j.state in RECOVERING_JOB_STATES), None)
        fault_at = (waiting.fault_started_at if waiting and waiting.fault_started_at else None) \
            or instance.hc_requested_at or clock.now()
        return self.remediation.evidence(inst_id=instance.container_inst_id, instance_item=raw,
                                         trigger=Trigger.TASK_EXIT, fault_at=fault_at, job=waiting)

    # -------------------------------------------------------------------- sweep
    def _undiagnosed(self, instance: Instance, what: str) -> str:
        if not settle_undiagnosed(self.deps, self.remediation, self._evidence, instance, what):
            return "raced"
        self._kick_after_release(instance)
        return "health_check_undiagnosed"

    def _sweep_waiting(self, instance: Instance, now: float) -> str:
        """A check waiting for a slot (every ten minutes): let it go if no job it serves is
        still in recovery, else try it (its jobs' queues are kicked every minute anyway)."""
        jobs = [self.deps.repo.get_job(j) for j in sorted(instance.hc_jobs)]
        # A node its jobs left before the verdict (spare first) still needs its check, and so
        # does a node a rank's stop fenced as a suspect (out of placement until it is judged).
        if not instance.hc_left and not instance.fenced \
                and not any(j is not None and j.state in RECOVERING_JOB_STATES for j in jobs):
            self.deps.repo.abandon_health_check(instance, "every job waiting for it moved on")
            return "health_check_abandoned"
        if self.start_if_ready(instance.container_inst_id) is None:
            owner = instance.hc_owner or instance.check_owner
            self.deps.repo.wait_for_health_check_slot(instance, owner, now)
        return "health_check_waiting_for_slot"

    def sweep(self, instance: Instance, now: float) -> str:
        """Scheduled: placement retries, dead claims, lost verdict events, timeouts."""
        settings = self.deps.settings
        if instance.state is InstanceState.HEALTH_CHECK_PENDING and instance.hc_waiting_for_slot:
            return self._sweep_waiting(instance, now)
        requested = (instance.hc_claimed_at if instance.state is InstanceState.HEALTH_CHECKING
                     else None) or instance.hc_requested_at or now
        out_of_time = now >= requested + settings.health_check_timeout_seconds
        if instance.state is InstanceState.HEALTH_CHECK_PENDING:
            if out_of_time or instance.hc_start_attempts >= settings.health_check_start_retries:
                attempts = instance.hc_start_attempts
                return self._undiagnosed(instance, f"the health check could not start "
                                                   f"({attempts} placement attempt(s))")
            if self.start_if_ready(instance.container_inst_id) is None:
                self.deps.repo.rearm_instance(instance.container_inst_id, InstanceState.HEALTH_CHECK_PENDING,
                                              now + RETRY_INTERVAL_SECONDS)
            return "health_check_retried"
        if out_of_time:
            # A check that ended has its verdict in its exit code (its line, lost, is not
            # waited for any more); one with none is the stack's failure, not the node's.
            task = self.deps.ecs.describe_task(instance.hc_task_arn) if instance.hc_task_arn else None
            if task is not None and task.get("lastStatus") == "STOPPED":
                outcome = self.on_stopped(EcsTaskDetail.model_validate(task), decide_now=True)
                if outcome.action != "health_check_retry":
                    return outcome.action
            elif instance.hc_task_arn:
                self.deps.ecs.stop_task(instance.hc_task_arn, f"{SYSTEM_STOP_REASON_PREFIX} check timed out")
            return self._undiagnosed(instance, f"no verdict in {settings.health_check_timeout_seconds} s")
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
