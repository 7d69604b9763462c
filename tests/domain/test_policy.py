"""Fault policy, without any emulator: what a stop, a verdict or an instance event means."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import DcgmVerdict, InstanceState, JobState, RankState
from gpu_recovery.domain import policy
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.policy import JobVerdictOutcome, StopKind, TaskStop, VerdictAction

SUSPECT = (1,)


def job(attempts_left: int = 1) -> Job:
    return Job("j", JobState.PENDING_HEALTHCHECK, world_size=2, max_recovery_attempts=1,
               recoveries_used=1 - attempts_left)


@pytest.mark.parametrize(
    ("stop", "rank_state", "expected"),
    [
        (TaskStop(0, "EssentialContainerExited", "Essential container in task exited"),
         RankState.RUNNING, StopKind.SUCCEEDED),
        (TaskStop(1, "EssentialContainerExited", ""), RankState.RUNNING, StopKind.SUSPECTED_GPU_FAULT),
        (TaskStop(2, "EssentialContainerExited", ""), RankState.RUNNING, StopKind.FAILED),
        (TaskStop(None, "TaskFailedToStart", "CannotPullContainerError"), RankState.RUNNING,
         StopKind.FAILED),
        (TaskStop(143, "UserInitiated", "stopped by alice"), RankState.RUNNING,
         StopKind.STOPPED_BY_USER),
        # A stop this system asked for is never a failure, whatever the exit code.
        (TaskStop(1, "UserInitiated", "gpu-recovery: rank 1 suspected"), RankState.RUNNING,
         StopKind.STOPPED_BY_SYSTEM),
        (TaskStop(1, "EssentialContainerExited", ""), RankState.STOP_REQUESTED,
         StopKind.STOPPED_BY_SYSTEM),
    ],
)
def test_classify_stop(stop: TaskStop, rank_state: RankState, expected: StopKind) -> None:
    """Given a stopped task, When classified, Then the kind follows the fault policy."""
    assert policy.classify_stop(stop, rank_state, SUSPECT) is expected


def test_suspect_exit_codes_are_configurable() -> None:
    """Given suspect codes (1, 134), Then 134 is a suspected fault and 1 still is."""
    stop = TaskStop(134, "EssentialContainerExited", "")
    assert policy.classify_stop(stop, RankState.RUNNING, (1, 134)) is StopKind.SUSPECTED_GPU_FAULT
    assert policy.classify_stop(stop, RankState.RUNNING, (1,)) is StopKind.FAILED


@pytest.mark.parametrize(("code", "verdict"), [(0, DcgmVerdict.HEALTHY), (1, DcgmVerdict.REBOOT),
                                               (2, DcgmVerdict.REPLACE), (3, DcgmVerdict.OPERATOR_ACTION),
                                               (137, None), (None, None)])
def test_parse_verdict_follows_the_exit_code_contract(code: int | None, verdict: DcgmVerdict | None) -> None:
    assert policy.parse_verdict(code) is verdict


def test_operator_action_verdict_never_reboots() -> None:
    """Given a configuration-problem verdict (health check exit 3), Then the node is drained
    for an operator, never rebooted, whatever the jobs' budgets."""
    assert policy.instance_action(DcgmVerdict.OPERATOR_ACTION, [job(1)]) is VerdictAction.QUARANTINE
    assert policy.instance_action(DcgmVerdict.OPERATOR_ACTION, []) is VerdictAction.QUARANTINE


def test_instance_action_reboots_only_with_budget() -> None:
    """Given a reboot verdict, Then reboot if a waiting job has budget, else quarantine."""
    assert policy.instance_action(DcgmVerdict.REBOOT, [job(1)]) is VerdictAction.REBOOT
    assert policy.instance_action(DcgmVerdict.REBOOT, [job(0)]) is VerdictAction.QUARANTINE
    assert policy.instance_action(DcgmVerdict.REBOOT, []) is VerdictAction.QUARANTINE
    assert policy.instance_action(DcgmVerdict.REPLACE, [job(1)]) is VerdictAction.QUARANTINE
    assert policy.instance_action(DcgmVerdict.HEALTHY, [job(0)]) is VerdictAction.MARK_AVAILABLE


@pytest.mark.parametrize(
    ("suspects", "left", "expected"),
    [
        ({"a": "HEALTHY"}, 1, JobVerdictOutcome.FAIL_APPLICATION_ERROR),
        ({"a": "HEALTHY", "b": "PENDING"}, 1, JobVerdictOutcome.WAIT),
        ({"a": "REBOOT"}, 1, JobVerdictOutcome.RESTART_AFTER_REBOOT),
        ({"a": "REBOOT", "b": "PENDING"}, 1, JobVerdictOutcome.RESTART_AFTER_REBOOT),
        ({"a": "REBOOT", "b": "HEALTHY"}, 1, JobVerdictOutcome.RESTART_AFTER_REBOOT),
        ({"a": "REBOOT"}, 0, JobVerdictOutcome.FAIL_NODE_FAULT),
        ({"a": "REPLACE", "b": "REBOOT"}, 1, JobVerdictOutcome.FAIL_NODE_FAULT),
        ({"a": "TIMEOUT"}, 1, JobVerdictOutcome.FAIL_NODE_FAULT),
    ],
)
def test_job_outcome_combines_every_suspect_instance(
    suspects: dict[str, str], left: int, expected: JobVerdictOutcome
) -> None:
    """Given the verdicts of all suspect instances, Then the job's fate is decided once."""
    assert policy.job_outcome(suspects, job(left)) is expected


def rebooting(**kw: object) -> Instance:
    return Instance("ci-1", state=InstanceState.REBOOTING, reboot_requested_at=1000.0, **kw)  # type: ignore[arg-type]


def test_active_event_before_the_disconnect_is_not_back() -> None:
    """Given a reboot requested, When an ACTIVE+connected event arrives before any
    disconnect, Then the instance is not back (ECS emits such events all the time)."""
    assert not policy.instance_is_back(rebooting(), status="ACTIVE", agent_connected=True)


def test_back_after_a_disconnect_seen_after_the_request() -> None:
    inst = rebooting()
    assert policy.is_disconnect_after_reboot(inst, agent_connected=False, event_time=1001.0)
    inst.seen_disconnected_after_reboot = True
    assert policy.instance_is_back(inst, status="ACTIVE", agent_connected=True)
    assert not policy.instance_is_back(inst, status="DRAINING", agent_connected=True)


def test_a_disconnect_from_before_the_request_does_not_count() -> None:
    """Given a delayed disconnect event older than the reboot request, Then it is ignored."""
    assert not policy.is_disconnect_after_reboot(rebooting(), agent_connected=False, event_time=999.0)


def test_back_when_boot_time_is_later_than_the_request() -> None:
    assert policy.instance_is_back(rebooting(boot_time=1100.0), status="ACTIVE", agent_connected=True)
    assert not policy.instance_is_back(rebooting(boot_time=900.0), status="ACTIVE", agent_connected=True)


def test_gang_restart_waits_for_every_instance() -> None:
    ok = Instance("a", state=InstanceState.AVAILABLE)
    assert policy.gang_ready([ok, Instance("b", state=InstanceState.AVAILABLE)])
    assert not policy.gang_ready([ok, Instance("b", state=InstanceState.REBOOTING)])
    assert not policy.gang_ready([ok, Instance("b", state=InstanceState.HEALTH_CHECKING)])
