"""The vocabulary of the recovery loop and the queue: states, verdicts and state sets.

Defined once here (the domain owns them); ``gpu_recovery.constants`` re-exports them
for ``infra/`` and local mode. Pure: no I/O, no environment.
"""

from __future__ import annotations

from enum import Enum

# StopTask reasons this system sets; a stop carrying it is not a user stop (domain.policy).
SYSTEM_STOP_REASON_PREFIX = "gpu-recovery:"


def system_stop_reason(why: str) -> str:
    """The StopTask reason this system gives for ``why`` (prefixed; at most ECS's 255 characters)."""
    return f"{SYSTEM_STOP_REASON_PREFIX} {why}"[:255]


class JobState(str, Enum):
    """One state machine for the job record (shared with the queue service)."""

    QUEUED = "QUEUED"
    PENDING_RESOURCES = "PENDING_RESOURCES"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PENDING_HEALTHCHECK = "PENDING_HEALTHCHECK"
    PENDING_RESTART = "PENDING_RESTART"
    # A job that cannot move (not relocatable) waiting for a node whose reboot the
    # blast-radius breaker held back: until the breaker's reset carries it out, or
    # held_job_deadline_seconds pass. Its budget is not charged for the wait.
    HELD = "HELD"
    NODE_LOST = "NODE_LOST"
    HUNG = "HUNG"
    # Time sharing: rank 0 was told to checkpoint and call go_suspend(); its ranks are
    # then stopped (at go_suspend() or after the grace). SUSPENDED: every rank stopped,
    # GPUs free; queued again at its original position (or held, for a user's suspend).
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"
    CANCELING = "CANCELING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    USER_STOPPED = "USER_STOPPED"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETE, JobState.FAILED, JobState.USER_STOPPED, JobState.CANCELED}
)
# Ranks are (or should be) running on ECS: a suspected fault can enter recovery from these.
ACTIVE_JOB_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.NODE_LOST, JobState.HUNG})
# Waiting in the queue (the scheduler may admit it; a held SUSPENDED job is not in the
# queue index until it is resumed).
QUEUED_JOB_STATES = frozenset({JobState.QUEUED, JobState.PENDING_RESOURCES, JobState.SUSPENDED})
# The queue scheduler owns these (every minute, through the queue index); every other state
# that is neither RUNNING nor terminal has a deadline the recovery sweep reaches (the
# backstop invariant, docs/recovery-loop.md).
QUEUE_OWNED_JOB_STATES = QUEUED_JOB_STATES
# In the queue and never suspended: the scheduler's claim starts these as a new attempt
# (a SUSPENDED job is claimed as a resume); a user's suspend holds them at once.
WAITING_JOB_STATES = QUEUED_JOB_STATES - {JobState.SUSPENDED}
# Started (by the scheduler or a gang restart) and in no trouble: a launch in flight can
# still complete or fail from these (the recovery loop marks the job RUNNING as soon as
# rank 0 runs, before the launcher has finished).
STARTED_JOB_STATES = frozenset({JobState.STARTING, JobState.RUNNING})
# Ended, or ending (CANCELING): nothing may mark a launch of the job complete, and a launch
# left in flight is abandoned (every task it started is stopped).
ENDING_JOB_STATES = TERMINAL_JOB_STATES | {JobState.CANCELING}
# The recovery loop owns the job: its nodes are held for the gang restart.
RECOVERING_JOB_STATES = frozenset({JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART, JobState.HELD})
# The recovery loop is handling the job (in recovery, or a node lost / a rank hung): a
# user's suspend or resume waits until it is RUNNING again.
RECOVERY_OWNED_JOB_STATES = RECOVERING_JOB_STATES | {JobState.NODE_LOST, JobState.HUNG}
# A queue job in these holds its nodes (its quota charge stays); in any other state it
# holds none and its charge is released.
HOLDING_JOB_STATES = ACTIVE_JOB_STATES | RECOVERING_JOB_STATES | {JobState.SUSPENDING,
                                                                  JobState.CANCELING}


class RankState(str, Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    NODE_LOST = "NODE_LOST"
    HUNG = "HUNG"
    STOP_REQUESTED = "STOP_REQUESTED"  # this system asked ECS to stop it
    DONE = "DONE"  # exited 0
    FAILED = "FAILED"  # exited non-zero on its own
    STOPPED = "STOPPED"  # stopped by this system or a user

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_RANK_STATES


TERMINAL_RANK_STATES = frozenset({RankState.DONE, RankState.FAILED, RankState.STOPPED})
# Holding GPUs and not yet asked to stop.
LIVE_RANK_STATES = frozenset(
    {RankState.STARTING, RankState.RUNNING, RankState.NODE_LOST, RankState.HUNG}
)
# Watched by the heartbeat service (started and not asked to stop).
HEARTBEAT_WATCHED_RANK_STATES = frozenset({RankState.RUNNING, RankState.NODE_LOST, RankState.HUNG})
# Holding GPUs: live, or asked to stop and not yet seen STOPPED.
HOLDING_RANK_STATES = LIVE_RANK_STATES | {RankState.STOP_REQUESTED}


class InstanceState(str, Enum):
    AVAILABLE = "AVAILABLE"
    HEALTH_CHECK_PENDING = "HEALTH_CHECK_PENDING"  # waiting for its GPUs to be free
    HEALTH_CHECKING = "HEALTH_CHECKING"
    REBOOTING = "REBOOTING"
    QUARANTINED = "QUARANTINED"  # drained; needs an operator
    SUSPECT = "SUSPECT"  # hardware signals from telemetry


# A job waiting for these can never be restarted on its own nodes: an operator must act.
UNUSABLE_INSTANCE_STATES = frozenset({InstanceState.QUARANTINED, InstanceState.SUSPECT})
# A health check of the instance is open (a suspect job joins it).
HEALTH_CHECK_STATES = frozenset({InstanceState.HEALTH_CHECK_PENDING, InstanceState.HEALTH_CHECKING})


class DcgmVerdict(int, Enum):
    """Exit-code contract of the health-check task (health_check/dcgm_health_check.sh)."""

    HEALTHY = 0
    REBOOT = 1
    REPLACE = 2
    OPERATOR_ACTION = 3  # a configuration problem (e.g. persistence mode off): a reboot cannot fix it
    # Every failure is one a GPU reset clears (a pending row remap, the driver's recovery action
    # Reset / Drain and Reset): the catalog's reset_gpu. Worst-first: 2 > 1 > 4 > 3 > 0.
    RESET = 4


# The check's own "no verdict" (its verdict line says "inconclusive"): it could not run or
# could not evaluate (dcgmi or nvidia-smi missing, no DCGM host engine, its awk failed), so it
# says nothing about the GPUs. Not a DcgmVerdict on purpose: like a task that never ran, the
# check is run again, then the node is undiagnosed (a validation stalls), never repaired.
DCGM_INCONCLUSIVE_EXIT_CODE = 5


class SuspectVerdict(str, Enum):
    """What a job records per suspect instance (``job.suspects``)."""

    PENDING = "PENDING"
    HEALTHY = "HEALTHY"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"
    QUARANTINED = "QUARANTINED"
    OPERATOR_ACTION = "OPERATOR_ACTION"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"  # AWS takes the node (a notice): the job moves, the node is not suspected
    BLOCKED = "BLOCKED"  # needed a node action that was not carried out (observe mode, breaker)
    # The job moved to a spare before the verdict (spare first): the verdict is the node's only.
    LEFT = "LEFT"


# A job with any of these verdicts cannot be restarted on its own nodes.
FATAL_SUSPECT_VERDICTS = frozenset(
    {SuspectVerdict.REPLACE, SuspectVerdict.QUARANTINED, SuspectVerdict.OPERATOR_ACTION,
     SuspectVerdict.TIMEOUT, SuspectVerdict.UNAVAILABLE, SuspectVerdict.BLOCKED, SuspectVerdict.LEFT}
)


class JobOutcome(str, Enum):
    """A waiting job's fate once a node decision (a verdict) of its fault is known."""

    WAIT = "wait"  # other suspects of the fault still being checked
    RESTART_AFTER_REBOOT = "restart_after_reboot"  # restart once the node is back
    RESTART = "restart"  # no node fault: restart on the same nodes (budget permitting)
    RELOCATE = "relocate"  # a node is unusable: restart on healthy nodes
    # A node's reboot was held back by the blast-radius breaker and the job cannot move:
    # it waits (HELD once every verdict is in) for the breaker's reset, budget not charged.
    HOLD = "hold"
    FAIL_APPLICATION_ERROR = "fail_application_error"
    FAIL_NODE_FAULT = "fail_node_fault"
    FAIL_NO_BUDGET = "fail_no_budget"
    FAIL_OBSERVED = "fail_observed"  # the restart itself is observe-only

    @property
    def restarts(self) -> bool:
        return self in (JobOutcome.RESTART_AFTER_REBOOT, JobOutcome.RESTART, JobOutcome.RELOCATE)

    @property
    def fails(self) -> bool:
        return self.value.startswith("fail_")
