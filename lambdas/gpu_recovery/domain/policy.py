"""Fault policy: what a stopped task, a DCGM verdict or an instance event means.

Every function here is pure: it takes what the handler read and returns a decision.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import Enum

from gpu_recovery.constants import (
    SYSTEM_STOP_REASON_PREFIX,
    DcgmVerdict,
    InstanceState,
    JobState,
    RankState,
)
from gpu_recovery.domain.models import Instance, Job


class StopKind(str, Enum):
    SUCCEEDED = "SUCCEEDED"  # exit 0
    STOPPED_BY_SYSTEM = "STOPPED_BY_SYSTEM"  # we asked ECS to stop it: not a failure
    STOPPED_BY_USER = "STOPPED_BY_USER"  # someone else stopped it: no recovery
    SUSPECTED_GPU_FAULT = "SUSPECTED_GPU_FAULT"  # exit code in the suspect set
    FAILED = "FAILED"  # any other exit (or none: failed to start)


@dataclass(frozen=True)
class TaskStop:
    """What an ``ECS Task State Change`` with lastStatus STOPPED tells us."""

    exit_code: int | None
    stop_code: str
    stopped_reason: str


def classify_stop(stop: TaskStop, rank_state: RankState, suspect_exit_codes: Collection[int]) -> StopKind:
    # Our own StopTask calls carry our reason prefix and happen after the rank was
    # marked STOP_REQUESTED; either is enough (the mark may race the event).
    if rank_state is RankState.STOP_REQUESTED or stop.stopped_reason.startswith(
        SYSTEM_STOP_REASON_PREFIX
    ):
        return StopKind.STOPPED_BY_SYSTEM
    if stop.stop_code == "UserInitiated":
        return StopKind.STOPPED_BY_USER
    if stop.exit_code == 0:
        return StopKind.SUCCEEDED
    if stop.exit_code is not None and stop.exit_code in suspect_exit_codes:
        return StopKind.SUSPECTED_GPU_FAULT
    return StopKind.FAILED


def describe_failure(stop: TaskStop) -> str:
    code = "no exit code" if stop.exit_code is None else f"exit code {stop.exit_code}"
    reason = stop.stopped_reason or stop.stop_code or "unknown reason"
    return f"{code}: {reason}"


class VerdictAction(str, Enum):
    MARK_AVAILABLE = "MARK_AVAILABLE"  # healthy: the failure was the application's
    REBOOT = "REBOOT"
    QUARANTINE = "QUARANTINE"


def parse_verdict(exit_code: int | None) -> DcgmVerdict | None:
    """The health check's exit-code contract; anything else means it did not run."""
    if exit_code is None:
        return None
    try:
        return DcgmVerdict(exit_code)
    except ValueError:
        return None


def instance_action(verdict: DcgmVerdict, waiting_jobs: Iterable[Job]) -> VerdictAction:
    """What to do with the node itself once its verdict is known.

    A reboot is spent only if some waiting job still has recovery budget; otherwise
    the node is drained (quarantined) for an operator. A configuration problem
    (OPERATOR_ACTION) is never rebooted: a reboot does not fix it.
    """
    if verdict is DcgmVerdict.HEALTHY:
        return VerdictAction.MARK_AVAILABLE
    if verdict in (DcgmVerdict.REPLACE, DcgmVerdict.OPERATOR_ACTION):
        return VerdictAction.QUARANTINE
    if any(may_reboot_for(job) for job in waiting_jobs):
        return VerdictAction.REBOOT
    return VerdictAction.QUARANTINE


def may_reboot_for(job: Job) -> bool:
    """A job may spend a reboot: it has budget left, or this fault already paid for it
    (PENDING_RESTART: another suspect instance of the same fault is being rebooted)."""
    return job.attempts_left > 0 or job.state is JobState.PENDING_RESTART


class JobVerdictOutcome(str, Enum):
    WAIT = "WAIT"  # other suspect instances still being checked
    RESTART_AFTER_REBOOT = "RESTART_AFTER_REBOOT"
    FAIL_APPLICATION_ERROR = "FAIL_APPLICATION_ERROR"
    FAIL_NODE_FAULT = "FAIL_NODE_FAULT"


def job_outcome(suspects: dict[str, str], job: Job) -> JobVerdictOutcome:
    """Decide the job's fate from the verdicts of all its suspect instances."""
    verdicts = set(suspects.values())
    if verdicts & {"REPLACE", "TIMEOUT", "UNAVAILABLE", "QUARANTINED"}:
        return JobVerdictOutcome.FAIL_NODE_FAULT
    if "REBOOT" in verdicts:
        if not may_reboot_for(job):
            return JobVerdictOutcome.FAIL_NODE_FAULT
        if "PENDING" in verdicts:
            # Reboot now; the job restarts once every instance is back, and a later
            # bad verdict on another instance still fails it.
            return JobVerdictOutcome.RESTART_AFTER_REBOOT
        return JobVerdictOutcome.RESTART_AFTER_REBOOT
    if "PENDING" in verdicts:
        return JobVerdictOutcome.WAIT
    return JobVerdictOutcome.FAIL_APPLICATION_ERROR


def instance_is_back(
    instance: Instance,
    *,
    status: str,
    agent_connected: bool,
) -> bool:
    """A rebooted instance is back only after a disconnect seen after the request.

    ECS emits ACTIVE container-instance events for many reasons and ``status`` stays
    ACTIVE across a reboot, so a plain ACTIVE event is never enough.
    """
    if instance.state is not InstanceState.REBOOTING or instance.reboot_requested_at is None:
        return False
    if status != "ACTIVE" or not agent_connected:
        return False
    booted_after_request = (
        instance.boot_time is not None and instance.boot_time > instance.reboot_requested_at
    )
    return instance.seen_disconnected_after_reboot or booted_after_request


def is_disconnect_after_reboot(instance: Instance, *, agent_connected: bool, event_time: float) -> bool:
    return (
        instance.state is InstanceState.REBOOTING
        and instance.reboot_requested_at is not None
        and not agent_connected
        and event_time >= instance.reboot_requested_at
        and not instance.seen_disconnected_after_reboot
    )


def gang_ready(instances: Iterable[Instance]) -> bool:
    """A job restarts only when every instance it needs is available again."""
    return all(inst.state is InstanceState.AVAILABLE for inst in instances)


# A job waiting for these can never be restarted on its own nodes: an operator must act.
UNUSABLE_INSTANCE_STATES = frozenset({InstanceState.QUARANTINED, InstanceState.SUSPECT})
