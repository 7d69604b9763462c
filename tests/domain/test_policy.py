"""Fault policy, without any emulator: what a stop, a verdict or an instance event means."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import DcgmVerdict, InstanceState, JobState
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.policy import (
    StopKind,
    StopReaction,
    TaskStop,
    classify_stop,
)

SUSPECT = (1,)


@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (TaskStop(0, "EssentialContainerExited", "Essential container in task exited"), StopKind.SUCCEEDED),
        (TaskStop(1, "EssentialContainerExited", ""), StopKind.SUSPECTED_GPU_FAULT),
        (TaskStop(2, "EssentialContainerExited", ""), StopKind.FAILED),
        (TaskStop(None, "TaskFailedToStart", "CannotPullContainerError"), StopKind.FAILED),
        (TaskStop(143, "UserInitiated", "stopped by alice"), StopKind.STOPPED_BY_USER),
        # A stop this system asked for is never a failure, whatever the exit code.
        (TaskStop(1, "UserInitiated", "gpu-recovery: rank 1 suspected"), StopKind.STOPPED_BY_SYSTEM),
    ],
)
def test_classify_stop_trusts_what_ecs_says(stop: TaskStop, expected: StopKind) -> None:
    """Given a stopped task, When classified, Then the kind follows the event's stop code,
    reason and exit code."""
    assert policy.classify_stop(stop, SUSPECT) is expected


def test_a_rank_that_died_on_its_own_is_a_suspect_even_if_we_meant_to_stop_it() -> None:
    """The classification takes no rank state at all: a container that exited on its own
    (EssentialContainerExited, suspect code) is a suspect whatever we had intended, so
    the NCCL cascade's order cannot blame the wrong node."""
    assert policy.classify_stop(TaskStop(1, "EssentialContainerExited", "Essential container in task exited"),
                                SUSPECT) is StopKind.SUSPECTED_GPU_FAULT


def test_suspect_exit_codes_are_configurable() -> None:
    """Given suspect codes (1, 134), Then 134 is a suspected fault and 1 still is."""
    stop = TaskStop(134, "EssentialContainerExited", "")
    assert policy.classify_stop(stop, (1, 134)) is StopKind.SUSPECTED_GPU_FAULT
    assert policy.classify_stop(stop, (1,)) is StopKind.FAILED


@pytest.mark.parametrize(
    ("kind", "state", "same", "expected"),
    [
        (StopKind.SUSPECTED_GPU_FAULT, JobState.RUNNING, True, StopReaction.ENTER_RECOVERY),
        (StopKind.SUSPECTED_GPU_FAULT, JobState.NODE_LOST, True, StopReaction.ENTER_RECOVERY),
        (StopKind.SUSPECTED_GPU_FAULT, JobState.PENDING_HEALTHCHECK, True, StopReaction.ADD_SUSPECT),
        (StopKind.SUSPECTED_GPU_FAULT, JobState.PENDING_RESTART, True, StopReaction.RECORD),
        (StopKind.SUSPECTED_GPU_FAULT, JobState.STARTING, True, StopReaction.ENTER_RECOVERY),
        (StopKind.SUSPECTED_GPU_FAULT, JobState.RUNNING, False, StopReaction.RECORD),
        # Other exits during a fault's recovery (NCCL aborts, SIGTERM handlers) do not fail it.
        (StopKind.FAILED, JobState.PENDING_HEALTHCHECK, True, StopReaction.RECORD),
        (StopKind.FAILED, JobState.RUNNING, True, StopReaction.FAIL_JOB),
        (StopKind.STOPPED_BY_USER, JobState.RUNNING, True, StopReaction.USER_STOPPED),
        (StopKind.STOPPED_BY_USER, JobState.PENDING_HEALTHCHECK, True, StopReaction.USER_STOPPED),
        (StopKind.STOPPED_BY_SYSTEM, JobState.PENDING_HEALTHCHECK, True, StopReaction.RECORD),
        (StopKind.SUCCEEDED, JobState.RUNNING, True, StopReaction.MAYBE_COMPLETE),
        (StopKind.SUCCEEDED, JobState.FAILED, True, StopReaction.RECORD),
    ],
)
def test_stop_reaction_depends_on_the_job_state(kind: StopKind, state: JobState, same: bool,
                                                expected: StopReaction) -> None:
    assert policy.stop_reaction(kind, state, same) is expected


@pytest.mark.parametrize(("code", "verdict"), [(0, DcgmVerdict.HEALTHY), (1, DcgmVerdict.REBOOT),
                                               (2, DcgmVerdict.REPLACE), (3, DcgmVerdict.OPERATOR_ACTION),
                                               (4, DcgmVerdict.RESET), (5, None), (137, None), (None, None)])
def test_parse_verdict_follows_the_exit_code_contract(code: int | None, verdict: DcgmVerdict | None) -> None:
    assert policy.parse_verdict(code) is verdict


@pytest.mark.parametrize(
    ("state", "node_fault", "observed", "may_restart", "expected"),
    [
        (JobState.RUNNING, True, False, False, StopReaction.ENTER_RECOVERY),
        (JobState.RUNNING, True, True, False, StopReaction.FAIL_OBSERVED),
        (JobState.PENDING_HEALTHCHECK, True, False, False, StopReaction.ADD_SUSPECT),
        (JobState.PENDING_RESTART, True, False, False, StopReaction.RECORD),
        (JobState.PENDING_RESTART, False, False, True, StopReaction.RECORD),
        (JobState.RUNNING, False, False, True, StopReaction.RESTART),
        (JobState.RUNNING, False, False, False, StopReaction.FAIL_JOB),
        (JobState.PENDING_HEALTHCHECK, False, False, True, StopReaction.RECORD),
        (JobState.FAILED, True, False, True, StopReaction.RECORD),
    ],
)
def test_fault_reaction_follows_the_catalog_decision(state: JobState, node_fault: bool, observed: bool,
                                                     may_restart: bool, expected: StopReaction) -> None:
    assert policy.fault_reaction(state, True, node_fault=node_fault, observed=observed,
                                 may_restart=may_restart) is expected
    assert policy.fault_reaction(state, False, node_fault=node_fault, observed=observed,
                                 may_restart=may_restart) is StopReaction.RECORD




def test_a_late_fault_is_a_suspect_of_a_restart_whose_fault_a_check_found_and_of_no_other() -> None:
    """A verdict that found a fault moves the job to its restart before every rank ended: a
    later exit with a node fault names its node (checked before the restart); a restart with no
    fault found (an application error's, a move off a node AWS takes) names none."""
    for found, expected in ((True, StopReaction.ADD_SUSPECT), (False, StopReaction.RECORD)):
        assert policy.fault_reaction(JobState.PENDING_RESTART, True, node_fault=True, observed=False,
                                     may_restart=False, fault_found=found) is expected
        assert policy.stop_reaction(StopKind.SUSPECTED_GPU_FAULT, JobState.PENDING_RESTART, True,
                                    fault_found=found) is expected
    assert policy.fault_reaction(JobState.PENDING_RESTART, False, node_fault=True, observed=False,
                                 may_restart=False, fault_found=True) is StopReaction.RECORD


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        (None, ""),
        (Instance("i-1"), ""),
        (Instance("i-1", state=InstanceState.REBOOTING, reboot_requested_at=10.0), "rebooting"),
        (Instance("i-1", state=InstanceState.REBOOTING, reset_pending=True), "resetting the GPUs of"),
        (Instance("i-1", state=InstanceState.QUARANTINED, terminate_pending=True), "replacing"),
        # Drained only (no standalone task is stopped by a drain), held back by the breaker
        # (SUSPECT), or being checked: the stack is not taking the node down.
        (Instance("i-1", state=InstanceState.QUARANTINED, drain_pending=True), ""),
        (Instance("i-1", state=InstanceState.SUSPECT), ""),
        (Instance("i-1", state=InstanceState.HEALTH_CHECKING), ""),
    ],
)
def test_stack_remediation_names_what_the_stack_is_doing_to_the_node(instance: Instance | None,
                                                                     expected: str) -> None:
    """Given a rank's node, Then a stop there is the stack's own doing exactly while the node
    is being rebooted, reset or replaced by it."""
    assert policy.stack_remediation(instance) == expected


def test_a_rank_killed_by_the_stacks_reboot_enters_recovery_instead_of_failing_the_job() -> None:
    """Given exit 137 (not a suspect code: the catalog alone would charge or fail the job)
    on a node the stack is rebooting, Then it is a node fault: the running job enters
    recovery, one waiting for verdicts adds the node as a suspect; the budget is not asked."""
    stop = TaskStop(137, "EssentialContainerExited", "Host EC2 (instance i-0b) rebooted")
    assert policy.classify_stop(stop, SUSPECT) is StopKind.FAILED
    node_fault = bool(policy.stack_remediation(Instance("i-1", state=InstanceState.REBOOTING)))
    for may_restart in (True, False):
        assert policy.fault_reaction(JobState.RUNNING, True, node_fault=node_fault, observed=False,
                                     may_restart=may_restart) is StopReaction.ENTER_RECOVERY
    assert policy.fault_reaction(JobState.PENDING_HEALTHCHECK, True, node_fault=node_fault, observed=False,
                                 may_restart=False) is StopReaction.ADD_SUSPECT


def test_the_stacks_own_stop_reason_is_prefixed_and_within_ecs_limit() -> None:
    """Every StopTask this system makes says so (``classify_stop`` reads the prefix) and fits
    ECS's 255 characters, however long its ``why``."""
    from gpu_recovery.domain.states import system_stop_reason

    long = system_stop_reason("x" * 400)
    assert len(long) == 255
    for reason in (system_stop_reason("check timed out"), long):
        assert classify_stop(TaskStop(None, "UserInitiated", reason), ()) is StopKind.STOPPED_BY_SYSTEM
