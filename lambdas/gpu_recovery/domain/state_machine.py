"""The job state machine: which transitions are legal, shared by recovery and queue."""

from __future__ import annotations

from gpu_recovery.domain.states import ACTIVE_JOB_STATES as ACTIVE_JOB_STATES
from gpu_recovery.domain.states import JobState as S

# from-state -> states it may move to. Terminal states have no way out.
JOB_TRANSITIONS: dict[S, frozenset[S]] = {
    # QUEUED / PENDING_RESOURCES -> SUSPENDED: the owner holds a waiting job (gpujobs suspend).
    S.QUEUED: frozenset({S.PENDING_RESOURCES, S.STARTING, S.CANCELED, S.SUSPENDED}),
    S.PENDING_RESOURCES: frozenset({S.QUEUED, S.STARTING, S.CANCELED, S.FAILED, S.SUSPENDED}),
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
            S.USER_STOPPED, S.CANCELING, S.CANCELED, S.PENDING_RESOURCES, S.SUSPENDING,
        }
    ),
    # SUSPENDING: rank 0 checkpoints during the grace, then every rank is stopped. A rank
    # that fails on its own during the grace is a fault like in RUNNING (recovery wins over
    # the suspension); every rank stopped -> SUSPENDED. SUSPENDING -> RUNNING: a move off a
    # node with a driver warning that the job did not take within its bound (it keeps running).
    S.SUSPENDING: frozenset(
        {S.SUSPENDED, S.COMPLETE, S.FAILED, S.USER_STOPPED, S.CANCELING, S.CANCELED,
         S.PENDING_HEALTHCHECK, S.PENDING_RESTART, S.RUNNING}
    ),
    # SUSPENDED -> STARTING: resumed by the scheduler like a queued job.
    S.SUSPENDED: frozenset({S.STARTING, S.CANCELED}),
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
        {S.STARTING, S.PENDING_RESOURCES, S.HELD, S.FAILED, S.USER_STOPPED, S.CANCELED}
    ),
    # HELD (a node's reboot held back by the breaker, the job cannot move) -> PENDING_RESTART
    # once every node it waits for is back; FAILED at its deadline, when the breaker's
    # backlog is dropped, or when a node it waits for is lost.
    S.HELD: frozenset({S.PENDING_RESTART, S.FAILED, S.USER_STOPPED, S.CANCELING, S.CANCELED}),
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
