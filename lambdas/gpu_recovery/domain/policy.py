"""Fault policy: what a stopped task, a DCGM verdict or an instance event means.

Every function here is pure: it takes what a stage read and returns a decision.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.states import (
    ACTIVE_JOB_STATES,
    RECOVERING_JOB_STATES,
    SYSTEM_STOP_REASON_PREFIX,
    UNUSABLE_INSTANCE_STATES,
    DcgmVerdict,
    InstanceState,
    JobOutcome,
    JobState,
)

__all__ = ["UNUSABLE_INSTANCE_STATES", "JobOutcome"]


# =============================================================== a training task stopped
class StopKind(str, Enum):
    SUCCEEDED = "SUCCEEDED"  # exit 0
    STOPPED_BY_SYSTEM = "STOPPED_BY_SYSTEM"  # our StopTask: not a failure
    STOPPED_BY_USER = "STOPPED_BY_USER"  # someone else's StopTask: no recovery
    SUSPECTED_GPU_FAULT = "SUSPECTED_GPU_FAULT"  # exited on its own with a suspect code
    FAILED = "FAILED"  # any other exit (or none: failed to start)


@dataclass(frozen=True)
class TaskStop:
    """What an ``ECS Task State Change`` with lastStatus STOPPED tells us."""

    exit_code: int | None
    stop_code: str
    stopped_reason: str


def classify_stop(stop: TaskStop, suspect_exit_codes: Collection[int]) -> StopKind:
    """Who stopped the task is what ECS says, never whether we had meant to stop it.

    A StopTask (ours or a user's) gives ``stopCode=UserInitiated`` and its reason; ours
    carries our prefix. A container that died on its own gives
    ``EssentialContainerExited`` and its exit code, and is a suspect even when our
    StopTask was already on its way (in an NCCL cascade the order is arbitrary).
    """
    ours = stop.stopped_reason.startswith(SYSTEM_STOP_REASON_PREFIX)
    if ours:
        return StopKind.STOPPED_BY_SYSTEM
    if stop.stop_code == "UserInitiated":
        return StopKind.STOPPED_BY_USER
    if stop.exit_code == 0:
        return StopKind.SUCCEEDED
    if stop.exit_code is not None and stop.exit_code in suspect_exit_codes:
        return StopKind.SUSPECTED_GPU_FAULT
    return StopKind.FAILED


class StopReaction(str, Enum):
    """What the job does about one rank's stop (given the job's current state)."""

    RECORD = "RECORD"  # only the rank changes
    MAYBE_COMPLETE = "MAYBE_COMPLETE"  # complete once every rank exited 0
    USER_STOPPED = "USER_STOPPED"
    FAIL_JOB = "FAIL_JOB"
    ENTER_RECOVERY = "ENTER_RECOVERY"  # first suspect of a fault
    ADD_SUSPECT = "ADD_SUSPECT"  # another suspect of the fault being handled
    # A later exit of the fault, with no evidence of its own: it died of the fault (an NCCL
    # peer); its node is checked only if the fault's checks find nothing (domain.suspects).
    COUPLED = "COUPLED"
    RESTART = "RESTART"  # no node action (application error within budget, transient fault)
    FAIL_OBSERVED = "FAIL_OBSERVED"  # observe mode: recorded and notified, nothing done


def _running(job_state: JobState, suspend_stopping: bool) -> bool:
    """Are the job's ranks meant to be running? A SUSPENDING job's are during its grace
    (rank 0 checkpoints): a rank failing on its own then is a fault as in RUNNING. Once
    its ranks are being stopped, a rank's own exit is the cascade of that stop."""
    if job_state is JobState.SUSPENDING:
        return not suspend_stopping
    return job_state in ACTIVE_JOB_STATES


def _names_suspects(job_state: JobState, fault_found: bool) -> bool:
    """A fault still open to suspects: its checks run, or a verdict found a fault and moved the
    job on to its restart before every rank had ended (``fault_found``: a late rank's exit with
    a fault of its own names its node too; the restart waits for its check)."""
    return job_state is JobState.PENDING_HEALTHCHECK or \
        (job_state is JobState.PENDING_RESTART and fault_found)


def stop_reaction(kind: StopKind, job_state: JobState, same_attempt: bool, *,
                  suspend_stopping: bool = False, fault_found: bool = False) -> StopReaction:
    if not same_attempt or job_state.is_terminal:
        return StopReaction.RECORD
    if job_state is JobState.SUSPENDING and kind in (StopKind.SUCCEEDED, StopKind.STOPPED_BY_USER):
        # The program finished, or someone else stopped a rank: as for a running job.
        suspend_stopping = False
    active = _running(job_state, suspend_stopping)
    if kind is StopKind.SUCCEEDED:
        return StopReaction.MAYBE_COMPLETE if active else StopReaction.RECORD
    if kind is StopKind.STOPPED_BY_USER:
        # A user stop during a health check ends the job too: the user wanted it gone.
        recovering = job_state in RECOVERING_JOB_STATES
        return StopReaction.USER_STOPPED if active or recovering else StopReaction.RECORD
    if kind is StopKind.SUSPECTED_GPU_FAULT:
        if active:
            return StopReaction.ENTER_RECOVERY
        if _names_suspects(job_state, fault_found):
            return StopReaction.ADD_SUSPECT
        return StopReaction.RECORD
    if kind is StopKind.FAILED:
        # During a fault's recovery the other ranks die of all sorts (NCCL aborts,
        # SIGTERM handlers): only suspect exits add suspects, other exits are recorded.
        return StopReaction.FAIL_JOB if active else StopReaction.RECORD
    return StopReaction.RECORD


def fault_reaction(job_state: JobState, same_attempt: bool, *, node_fault: bool, observed: bool,
                   may_restart: bool, suspend_stopping: bool = False,
                   fault_found: bool = False) -> StopReaction:
    """What the job does about a rank that exited on its own (not 0, not a stop), once the
    fault catalog said what its node needs.

    ``node_fault``: the catalog wants the node checked (health check) or acted on (fast
    path); ``observed``: that recovery cannot even begin (observe mode keeps the ranks
    running or the diag from starting); ``may_restart``: for a fault without node action,
    the job's budget allows a restart and restarts are enforced.
    """
    if not same_attempt or job_state.is_terminal:
        return StopReaction.RECORD
    active = _running(job_state, suspend_stopping)
    if node_fault:
        if active:
            return StopReaction.FAIL_OBSERVED if observed else StopReaction.ENTER_RECOVERY
        if _names_suspects(job_state, fault_found):
            return StopReaction.ADD_SUSPECT
        return StopReaction.RECORD
    if active:
        return StopReaction.RESTART if may_restart else StopReaction.FAIL_JOB
    return StopReaction.RECORD


def stack_remediation(instance: Instance | None) -> str:
    """What this stack is doing to a node that takes its ranks down ("" when nothing).

    A rank that stops on such a node was killed, or is about to be, by the stack's own
    remediation (its reboot, the GPU reset before it, its replacement): whatever its exit
    code, that is an infrastructure fault of the node, never the application's. A REBOOTING
    node is always one the stack will reboot or reset (a reboot the breaker held back leaves
    the node SUSPECT, not REBOOTING); a drain alone stops no standalone task.
    """
    if instance is None:
        return ""
    if instance.state is InstanceState.REBOOTING:
        return "resetting the GPUs of" if instance.reset_pending else "rebooting"
    if instance.terminate_pending:
        return "replacing"
    return ""


def describe_failure(stop: TaskStop) -> str:
    code = "no exit code" if stop.exit_code is None else f"exit code {stop.exit_code}"
    reason = stop.stopped_reason or stop.stop_code or "unknown reason"
    return f"{code}: {reason}"


# ==================================================================== DCGM verdicts
def parse_verdict(exit_code: int | None) -> DcgmVerdict | None:
    """The health check's exit-code contract; anything else means it gave no verdict: it did
    not run, or it says so itself (``DCGM_INCONCLUSIVE_EXIT_CODE``). (What a verdict does to
    the node and its jobs is the fault catalog's: ``recovery.remediation``.)"""
    if exit_code is None:
        return None
    try:
        return DcgmVerdict(exit_code)
    except ValueError:
        return None


