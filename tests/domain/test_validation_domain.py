"""The pure rules of validation after repair (domain.validation): its settings, the verdict
of its task, the decision on a failure (always a node action, counted under the cause of the
repair that did not hold, so escalation bounds it), and the placement value of a node in it."""

from __future__ import annotations

from functools import partial

import pytest

from gpu_recovery.domain import placement
from gpu_recovery.domain.classify import Decision
from gpu_recovery.domain.cordon import ECS_HELD, ECS_PENDING, validating_record
from gpu_recovery.domain.escalation import NodeFaultRecord, record_fault
from gpu_recovery.domain.evidence import DcgmFindings, Evidence
from gpu_recovery.domain.fault_catalog import default_catalog
from gpu_recovery.domain.fault_vocabulary import Action, Budget, Trigger
from gpu_recovery.domain.remediation_plan import RemediationPolicy, plan_remediation
from gpu_recovery.domain.validation import (
    FALLBACK_CAUSE,
    Repair,
    Result,
    ValidationError,
    ValidationPolicy,
    email_clause,
    failure_decision,
    history_note,
    judge,
    new_validation,
    repair_cause,
    started_by,
    task_time_up,
)

POLICY = RemediationPolicy(catalog=default_catalog(), gpu_reset_enabled=True)


def test_settings_are_bounded_and_read_from_the_functions_environment() -> None:
    on = ValidationPolicy(enabled=True)
    assert (on.dcgm_level, on.load_seconds, on.timeout_seconds) == (1, 30, 600)
    assert ValidationPolicy.from_json(on.to_json()) == on
    assert ValidationPolicy.from_json("") == ValidationPolicy()  # absent: off
    assert not ValidationPolicy().enabled
    assert on.task_environment() == {"DCGM_LEVEL": "1", "VALIDATION_LOAD_SECONDS": "30"}
    assert on.describe() == "DCGM diag level 1 + 30 s GPU load"
    for bad, words in (({"dcgm_level": 5}, "validation_dcgm_level must be 1..4"),
                       ({"load_seconds": -1}, "validation_load_seconds must be 0..3600"),
                       ({"dcgm_level": 3, "timeout_seconds": 600}, "leaves no room for a level-3 diag")):
        with pytest.raises(ValidationError, match=words):
            ValidationPolicy(enabled=True, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="unknown validation setting"):
        ValidationPolicy.from_json('{"enabled": true, "level": 2}')
    with pytest.raises(ValidationError, match="'enabled' must be true or false"):
        ValidationPolicy.from_json('{"enabled": "yes"}')


def test_the_task_verdict_follows_the_health_checks_contract() -> None:
    assert judge(0) is Result.PASSED
    assert all(judge(code) is Result.FAILED for code in (1, 2, 3, 4))
    assert judge(None) is Result.NO_VERDICT and judge(137) is Result.NO_VERDICT
    assert started_by("n", 1.0, 0) == started_by("n", 1.0, 0) != started_by("n", 1.0, 1)
    assert len(started_by("node-with-a-long-id-0123456789", 1.5e9, 2)) <= 36  # ECS startedBy


def _failed_validation(history: tuple, now: float, verdict: int = 1, cause: str = "xid-79") -> object:
    evidence = Evidence(node_id="n", fault_at=now, trigger=Trigger.VALIDATION).with_dcgm(
        DcgmFindings.from_verdict_json(None, exit_code=verdict), now)
    return plan_remediation(evidence, POLICY, node_history=history, now=now,
                            decided=partial(failure_decision, repair=Repair.REBOOT), cause=cause)


def test_a_repair_that_keeps_failing_climbs_its_causes_ladder_and_charges_no_job() -> None:
    """XID 79 rebooted the node; its validations fail: reboot again (one earlier reboot for
    the cause), then the third failure replaces it (two reboots for the cause)."""
    now = 1_000_000.0
    history = record_fault((), NodeFaultRecord(at=now, cause="xid-79", action=Action.REBOOT, job_id="j",
                                               charged_job=True), now)
    actions = []
    for step in range(1, 3):
        plan = _failed_validation(history, now + step * 600)
        actions.append(plan.action)
        assert plan.node_record.cause == "xid-79" and not plan.node_record.charged_job
        assert plan.decision.reason.startswith("validation after its reboot failed")
        history = record_fault(history, plan.node_record, now + step * 600)
    assert actions == [Action.REBOOT, Action.REPLACE]


def test_a_failure_the_catalog_would_not_act_on_still_repairs_the_node() -> None:
    mild = Decision(Action.APPLICATION_ERROR, "site:odd-override", "an override", Budget.APPLICATION)
    decided = failure_decision(mild, Repair.GPU_RESET)
    assert decided.action is Action.REBOOT and decided.rule_id == FALLBACK_CAUSE
    assert decided.budget is Budget.NONE and "validation after its GPU reset failed" in decided.reason
    reset = failure_decision(Decision(Action.RESET_GPU, "dcgm-verdict-reset", "r", Budget.INFRASTRUCTURE),
                             Repair.GPU_RESET)
    assert (reset.action, reset.rule_id) == (Action.RESET_GPU, "dcgm-verdict-reset")
    assert reset.budget is Budget.NONE


def test_the_record_the_repair_cause_and_what_jobs_and_emails_say() -> None:
    on = ValidationPolicy(enabled=True)
    record = new_validation(Repair.REBOOT, cause="xid-79", since=100.0, policy=on)
    assert (record["until"], record["level"], record["load_seconds"], record["attempts"]) == (700.0, 1, 30, 0)
    assert repair_cause({"plan": {"decision": {"rule_id": "dcgm-verdict-reboot"}}}) == "dcgm-verdict-reboot"
    assert repair_cause(None) == FALLBACK_CAUSE
    passed = {"result": "passed", "repair": "reboot", "level": 1, "load_seconds": 45, "seconds": 57.0}
    assert email_clause("node-b", passed) == ("validated node-b after its reboot (DCGM level 1 + 45 s GPU "
                                              "load): passed in 57 s")
    assert history_note("node-b", passed).startswith("node-b passed its validation after its reboot")
    off = {"result": "off", "repair": "gpu_reset"}
    assert email_clause("node-b", off) == ("node-b not validated after its GPU reset "
                                           "(validate_after_repair is false)")


def test_a_validating_node_is_unavailable_to_every_scheduler_unless_the_cordon_limit_holds_it() -> None:
    cordon = validating_record(repair="reboot", reason="back", now=1.0, ecs=ECS_PENDING)
    assert placement.attribute_value(cordon, {"why": "reserved", "job": "j"}) == placement.VALIDATING
    put, delete = placement.attributes_wanted(cordon, None)
    assert put == {placement.UNAVAILABLE_ATTRIBUTE: "validating", placement.DEPRECATED_CORDON_ATTRIBUTE: ""}
    assert delete == []
    held = validating_record(repair="reboot", reason="back", now=1.0, ecs=ECS_HELD)
    assert placement.attribute_value(held, None) is None


def test_a_task_still_running_at_until_keeps_a_whole_timeout_from_its_start() -> None:
    """``until`` counts from the node's return; a task placed late is not cut short by it: it
    has the timeout from its start (from its creation while pending), never less than until."""
    up = partial(task_time_up, until=1600.0, timeout_seconds=600)
    assert up(created=1000.0, started=1000.0) == 1600.0  # placed at once: until
    assert up(created=1500.0, started=1550.0) == 2150.0  # GPUs busy, a slow pull: its own time
    assert up(created=1500.0, started=None) == 2100.0  # still pending: counted from its creation
    assert up(created=None, started=None) == 1600.0  # ECS gave neither: until
