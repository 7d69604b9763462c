"""The job state machine: which transitions are legal, shared by recovery and queue."""

from __future__ import annotations

from gpu_recovery.domain.states import ACTIVE_JOB_STATES as ACTIVE_JOB_STATES
from gpu_recovery.domain.states import JobState as S

# from-state -> states it may move to. Terminal states have no way out.
JOB_TRANSITIONS: dict[S, frozenset[S]] = {
    S.QUEUED: frozenset({S.PENDING_RESOURCES, S.STARTING, S.CANCELED}),
    S.PENDING_RESOURCES: frozenset({S.QUEUED, S.STARTING, S.CANCELED, S.FAILED}),
    S.STARTING: frozenset(
        {
            S.RUNNING, S.PENDING_RESOURCES, S.PENDING_HEALTHCHECK, S.PENDING_RESTART, S.COMPLETE,
            S.FAILED, S.USER_STOPPED, S.CANCELING, S.CANCELED, S.NODE_LOST,
        }
    ),
    # RUNNING -> PENDING_RESOURCES: a queue launch rolled back (a later rank could not
    # be placed) after rank 0 was already seen RUNNING.
    # ACTIVE -> PENDING_RESTART: a fault that needs no node action (an application error
    # within its budget, a transient fault): the gang restarts on the same nodes.
    S.RUNNING: frozenset(
        {
            S.PENDING_HEALTHCHECK, S.PENDING_RESTART, S.NODE_LOST, S.HUNG, S.COMPLETE, S.FAILED,
            S.USER_STOPPED, S.CANCELING, S.CANCELED, S.PENDING_RESOURCES,
        }
    ),
    S.NODE_LOST: frozenset(
        {S.RUNNING, S.PENDING_HEALTHCHECK, S.PENDING_RESTART, S.COMPLETE, S.FAILED, S.USER_STOPPED,
         S.CANCELING}
    ),
    S.HUNG: frozenset(
        {S.RUNNING, S.PENDING_HEALTHCHECK, S.PENDING_RESTART, S.COMPLETE, S.FAILED, S.USER_STOPPED,
         S.CANCELING}
    ),
    S.PENDING_HEALTHCHECK: frozenset(
        {S.PENDING_RESTART, S.FAILED, S.USER_STOPPED, S.CANCELING, S.CANCELED}
    ),
    # PENDING_RESTART -> PENDING_RESOURCES: a queue job relocated off a faulty node goes
    # back through the scheduler (head of its priority) to start on healthy nodes.
    S.PENDING_RESTART: frozenset(
        {S.STARTING, S.PENDING_RESOURCES, S.FAILED, S.USER_STOPPED, S.CANCELED}
    ),
    S.CANCELING: frozenset({S.CANCELED}),
    S.COMPLETE: frozenset(),
    S.FAILED: frozenset(),
    S.USER_STOPPED: frozenset(),
    S.CANCELED: frozenset(),
}


class InvalidTransition(ValueError):
    def __init__(self, current: S, target: S) -> None:
        super().__init__(f"job cannot move from {current.value} to {target.value}")
        self.current = current
        self.target = target


def can_transition(current: S, target: S) -> bool:
    return target in JOB_TRANSITIONS[current]


def sources_of(target: S) -> frozenset[S]:
    """Every state from which ``target`` is reachable in one step (for conditions)."""
    return frozenset(src for src, targets in JOB_TRANSITIONS.items() if target in targets)


def check_transition(current: S, target: S) -> None:
    if not can_transition(current, target):
        raise InvalidTransition(current, target)
