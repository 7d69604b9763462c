"""Per-node escalation: reboot first, replace after repeated reboots for one cause, quarantine
and page after too many remediations, and a flapping node charged to a job only once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_recovery.domain.escalation import (
    DAY,
    HOUR,
    EscalationPolicy,
    NodeFaultRecord,
    charges_job,
    escalate,
    history_from_item,
    history_to_item,
    record_fault,
)
from gpu_recovery.domain.evidence import XidEvent
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action

T = 1_734_220_000.0
POLICY = EscalationPolicy()


def reboot(at: float, cause: str = "xid-79", executed: bool = True, job: str = "j",
           charged: bool = True) -> NodeFaultRecord:
    return NodeFaultRecord(at=at, cause=cause, action=Action.REBOOT, executed=executed, job_id=job,
                           charged_job=charged)


def test_first_and_second_fault_reboot_the_third_replaces() -> None:
    """GPUd's threshold: after 2 reboots for the same cause within 72 h, a reboot becomes a
    replacement (the flapping node of the demo is replaced on its 3rd fault)."""
    history: tuple[NodeFaultRecord, ...] = ()
    actions = []
    for n in range(3):
        now = T + n * 6 * HOUR
        result = escalate(Action.REBOOT, "xid-79", history, now, POLICY)
        actions.append(result.action)
        history = record_fault(history, reboot(now), now, POLICY)
    assert actions == [Action.REBOOT, Action.REBOOT, Action.REPLACE]
    assert "rebooted 2 times for 'xid-79' within 72 h" in escalate(Action.REBOOT, "xid-79", history[:2],
                                                                    T + 12 * HOUR, POLICY).reason


def test_other_causes_old_reboots_and_unexecuted_ones_do_not_escalate() -> None:
    history = [reboot(T - HOUR, cause="xid-48"), reboot(T - 2 * HOUR, cause="xid-48"),
               reboot(T - 73 * HOUR), reboot(T - 80 * HOUR), reboot(T - HOUR, executed=False),
               reboot(T - 2 * HOUR, executed=False)]
    assert escalate(Action.REBOOT, "xid-79", history, T, POLICY).action is Action.REBOOT


def test_too_many_remediations_quarantine_and_page() -> None:
    """NVSentinel: 5 remediations on a node in 7 days -> contact support. Here: a node already
    remediated 5 times within 7 days is quarantined (never terminated) and a person paged."""
    history = [reboot(T - d * DAY, cause=f"cause-{d}") for d in range(1, 6)]
    result = escalate(Action.REBOOT, "new-cause", history, T, POLICY)
    assert (result.action, result.page_operator, result.quarantine_only, result.escalated) == (
        Action.REPLACE, True, True, True)
    assert result.remediations == 5
    fewer = escalate(Action.REBOOT, "new-cause", history[:4], T, POLICY)
    assert (fewer.action, fewer.page_operator) == (Action.REBOOT, False)
    week_old = [reboot(T - 8 * DAY, cause=f"c{d}") for d in range(6)]
    assert escalate(Action.REBOOT, "new-cause", week_old, T, POLICY).action is Action.REBOOT


def test_actions_without_a_node_effect_pass_through() -> None:
    history = [reboot(T - HOUR * h) for h in range(1, 8)]
    for action in (Action.APPLICATION_ERROR, Action.RESTART_JOB, Action.HEALTH_CHECK, Action.NONE):
        result = escalate(action, "xid-79", history, T, POLICY)
        assert (result.action, result.escalated, result.page_operator) == (action, False, False)


def test_flapping_node_is_charged_to_a_job_once_per_cause() -> None:
    history = [reboot(T - HOUR)]
    assert charges_job(history, "j", "xid-79", T, POLICY) is False
    assert charges_job(history, "other-job", "xid-79", T, POLICY) is True
    assert charges_job(history, "j", "xid-48", T, POLICY) is True
    assert charges_job(history, "j", "xid-79", T + 72 * HOUR, POLICY) is True
    assert charges_job([reboot(T - HOUR, charged=False)], "j", "xid-79", T, POLICY) is True


def test_history_round_trips_and_is_bounded() -> None:
    record = NodeFaultRecord(at=T, cause="xid-13", action=Action.APPLICATION_ERROR, job_id="j",
                             xids=(XidEvent(13, "GPU-a", T - 5),))
    assert history_from_item(history_to_item([record])) == (record,)
    policy = EscalationPolicy(max_records=10)
    history: tuple[NodeFaultRecord, ...] = ()
    for n in range(30):
        history = record_fault(history, reboot(T + n), T + n, policy)
    assert len(history) == 10 and history[-1].at == T + 29
    # the same record twice (a redelivered event) is kept once
    assert record_fault(history, history[-1], T + 29, policy) == history


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="reboots_before_replace"):
        EscalationPolicy(reboots_before_replace=0)
    with pytest.raises(ValueError, match="reboot_window_seconds"):
        EscalationPolicy(reboot_window_seconds=0)


# --- properties ---------------------------------------------------------------------------------

offsets = st.lists(st.tuples(st.floats(min_value=0, max_value=10 * DAY), st.booleans(),
                             st.sampled_from(["xid-79", "xid-48"])), max_size=12)


@settings(max_examples=200, deadline=None)
@given(offsets, st.integers(1, 4), st.integers(1, 8))
def test_escalation_matches_counting_the_windows(records, threshold, max_remediations) -> None:
    """For any history: a reboot becomes a replacement exactly when the executed same-cause
    reboots in the last 72 h reach the threshold, or the node's executed remediations in the
    last 7 days reach the limit (which also pages)."""
    policy = EscalationPolicy(reboots_before_replace=threshold, max_remediations=max_remediations,
                              max_records=50)
    history = [reboot(T - age, cause=cause, executed=executed) for age, executed, cause in records]
    same = sum(1 for age, executed, cause in records
               if executed and cause == "xid-79" and 0 <= age < 72 * HOUR)
    total = sum(1 for age, executed, _ in records if executed and 0 <= age < 7 * DAY)
    result = escalate(Action.REBOOT, "xid-79", history, T, policy)
    expected = Action.REPLACE if same >= threshold or total >= max_remediations else Action.REBOOT
    assert result.action is expected
    assert result.page_operator == (total >= max_remediations)
    assert result.action in NODE_ACTIONS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20 * 86400), max_size=40, unique=True))
def test_recorded_history_is_sorted_bounded_and_only_what_windows_can_see(times) -> None:
    history: tuple[NodeFaultRecord, ...] = ()
    now = T
    for offset in sorted(times):
        now = T + offset
        history = record_fault(history, reboot(now), now, POLICY)
    assert len(history) <= POLICY.max_records
    assert [r.at for r in history] == sorted(r.at for r in history)
    assert all(now - r.at < POLICY.retention_seconds for r in history)
    # whatever was dropped could not have changed a decision
    full = [reboot(T + o) for o in times]
    assert escalate(Action.REBOOT, "xid-79", full, now, POLICY) == escalate(
        Action.REBOOT, "xid-79", history, now, POLICY)
