"""The one job state machine shared by the recovery loop and the queue."""

from __future__ import annotations

import itertools

import pytest

from gpu_recovery.constants import TERMINAL_JOB_STATES, JobState
from gpu_recovery.domain.state_machine import (
    JOB_TRANSITIONS,
    InvalidTransition,
    can_transition,
    check_transition,
    sources_of,
)


def test_every_state_has_a_row() -> None:
    assert set(JOB_TRANSITIONS) == set(JobState)


@pytest.mark.parametrize("terminal", sorted(TERMINAL_JOB_STATES, key=lambda s: s.value))
def test_terminal_states_have_no_way_out(terminal: JobState) -> None:
    """Given a terminal job, Then nothing (not even a late heartbeat) revives it."""
    assert JOB_TRANSITIONS[terminal] == frozenset()
    with pytest.raises(InvalidTransition):
        check_transition(terminal, JobState.RUNNING)


def test_recovery_path_is_legal() -> None:
    path = [JobState.RUNNING, JobState.PENDING_HEALTHCHECK, JobState.PENDING_RESTART,
            JobState.STARTING, JobState.RUNNING, JobState.COMPLETE]
    for current, target in itertools.pairwise(path):
        assert can_transition(current, target), (current, target)


def test_node_lost_and_hung_come_back_to_running() -> None:
    assert can_transition(JobState.NODE_LOST, JobState.RUNNING)
    assert can_transition(JobState.HUNG, JobState.RUNNING)
    assert not can_transition(JobState.PENDING_RESTART, JobState.RUNNING)


def test_sources_of_is_the_inverse_relation() -> None:
    assert JobState.RUNNING in sources_of(JobState.PENDING_HEALTHCHECK)
    assert JobState.COMPLETE not in sources_of(JobState.RUNNING)
