"""reset_gpu (issue 30, first part): the health check's reset evidence read as GPU signals, the
catalog's choice, escalation (reset -> reboot -> replace), and the planner that carries a reset
out as today's reboot until a recovery stage can reset GPUs. Pure: no AWS."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import DcgmVerdict
from gpu_recovery.domain import policy
from gpu_recovery.domain.escalation import (
    HOUR,
    EscalationPolicy,
    NodeFaultRecord,
    escalate,
    record_fault,
    resets,
)
from gpu_recovery.domain.evidence import DcgmFindings, Evidence, XidEvent, build_evidence
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget, GpuSignalKind, Trigger
from gpu_recovery.domain.job_budgets import JobBudgets
from gpu_recovery.domain.remediation_mode import Effect, effects_of, parse_remediation_mode
from gpu_recovery.domain.remediation_plan import RemediationPolicy, plan_remediation

T = 1_734_220_000.0
CATALOG = load_catalog()
TODAY = RemediationPolicy(catalog=CATALOG, suspect_exit_codes=frozenset({1}))
WITH_RESET = RemediationPolicy(catalog=CATALOG, suspect_exit_codes=frozenset({1}), gpu_reset_enabled=True)
UUID1 = "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809"


def gpu(**fields) -> dict:
    return {"index": 1, "uuid": UUID1, "ecc_uncorrected_volatile": 0, "remap_pending": False,
            "remap_failure": False, **fields}


def verdict(name: str, *gpus: dict, errors=()) -> DcgmFindings:
    code = [n for n in ("healthy", "reboot", "replace", "operator_action", "reset")].index(name)
    return DcgmFindings.from_verdict_json({"verdict": name, "exit_code": code, "gpus": list(gpus),
                                           "errors": list(errors)})


def checked(findings: DcgmFindings, *, xids=()) -> Evidence:
    evidence = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1,
                        xids=tuple(XidEvent(x, UUID1, T - 5) for x in xids))
    return evidence.with_dcgm(findings, T + 150)


# --- the verdict contract -------------------------------------------------------------------


def test_exit_4_is_the_reset_verdict_and_old_codes_keep_their_meaning() -> None:
    assert policy.parse_verdict(4) is DcgmVerdict.RESET
    assert [policy.parse_verdict(c) for c in range(4)] == [
        DcgmVerdict.HEALTHY, DcgmVerdict.REBOOT, DcgmVerdict.REPLACE, DcgmVerdict.OPERATOR_ACTION]
    # A verdict line that could not be read: the exit code alone still names it.
    assert DcgmFindings.from_verdict_json(None, exit_code=4).verdict == "reset"


# --- evidence: the driver's recovery action and page retirement as GPU signals -----------------


@pytest.mark.parametrize(("fields", "kinds"), [
    ({"recovery_action": "gpu_reset"}, {GpuSignalKind.RESET_REQUESTED}),
    ({"recovery_action": "drain_and_reset", "remap_pending": True, "ecc_uncorrected_volatile": 2},
     {GpuSignalKind.RESET_REQUESTED, GpuSignalKind.REMAP_PENDING}),
    ({"recovery_action": "node_reboot"}, {GpuSignalKind.REBOOT_REQUESTED}),
    ({"recovery_action": "drain_p2p"}, {GpuSignalKind.REBOOT_REQUESTED}),
    ({"recovery_action": "none"}, set()),
    ({"recovery_action": "unknown"}, set()),
    ({"recovery_action": "system_reboot"}, set()),  # not in the contract: unknown, never guessed
    ({}, set()),  # an older script: no field
    ({"retired_pages_pending": True}, {GpuSignalKind.RETIREMENT_PENDING}),
    ({"ecc_uncorrected_volatile": 2}, {GpuSignalKind.ECC_UNCORRECTED_VOLATILE}),
    ({"ecc_uncorrected_volatile": 2, "recovery_action": "gpu_reset"}, {GpuSignalKind.RESET_REQUESTED}),
    ({"ecc_uncorrected_volatile": 2, "recovery_action": "node_reboot"},
     {GpuSignalKind.REBOOT_REQUESTED, GpuSignalKind.ECC_UNCORRECTED_VOLATILE}),
])
def test_health_check_gpu_state_becomes_signals(fields: dict, kinds: set) -> None:
    signals = verdict("healthy", gpu(**fields)).signals(T)
    assert {s.kind for s in signals} == kinds
    assert all(s.gpu == UUID1 and s.source == "health_check" for s in signals)


def test_explained_ecc_errors_stay_visible_in_the_signal_detail() -> None:
    signals = verdict("reset", gpu(remap_pending=True, ecc_uncorrected_volatile=3)).signals(T)
    assert [(s.kind, s.detail) for s in signals] == [
        (GpuSignalKind.REMAP_PENDING,
         "row remap pending (3 uncorrected volatile ECC errors, cleared by the reset)")]


def test_findings_with_the_new_fields_round_trip() -> None:
    findings = verdict("reset", gpu(remap_pending=True, recovery_action="drain_and_reset",
                                    retired_pages_pending=None))
    again = DcgmFindings.from_dict(findings.to_dict())
    assert again == findings and again.gpus[0]["recovery_action"] == "drain_and_reset"
    evidence = checked(findings)
    assert Evidence.from_dict(evidence.to_dict()) == evidence


# --- the catalog's decision after the health check ---------------------------------------------


@pytest.mark.parametrize(("findings", "action", "rule"), [
    (verdict("reset", gpu(remap_pending=True)), Action.RESET_GPU, "gpu-remap-pending"),
    (verdict("reset", gpu(recovery_action="gpu_reset")), Action.RESET_GPU, "gpu-recovery-action-reset"),
    (verdict("reset"), Action.RESET_GPU, "dcgm-verdict-reset"),
    (verdict("reboot", gpu(remap_pending=True, recovery_action="node_reboot")), Action.REBOOT,
     "gpu-recovery-action-reboot"),
    (verdict("reboot", gpu(retired_pages_pending=True)), Action.REBOOT, "gpu-retirement-pending"),
    (verdict("replace", gpu(remap_pending=True, remap_failure=True)), Action.REPLACE, "gpu-remap-failure"),
])
def test_with_a_reset_stage_the_plan_resets_only_when_nothing_asks_for_more(findings, action, rule) -> None:
    plan = plan_remediation(checked(findings), WITH_RESET, now=T + 150, job_budgets=JobBudgets())
    assert (plan.action, plan.decision.rule_id) == (action, rule)


def test_a_reset_plan_stops_the_ranks_resets_and_asks_the_breaker() -> None:
    plan = plan_remediation(checked(verdict("reset", gpu(remap_pending=True))), WITH_RESET, now=T + 150,
                            job_budgets=JobBudgets())
    assert plan.execute == (Effect.STOP_TASKS, Effect.RESET_GPU)
    assert plan.needs_breaker and plan.budget is not None and plan.budget.restart
    assert plan.budget is not None and plan.budget.charged is Budget.INFRASTRUCTURE
    assert plan.node_record is not None and plan.node_record.action is Action.RESET_GPU
    assert plan.node_record.executed


def test_observe_mode_records_the_reset_only() -> None:
    observing = RemediationPolicy(catalog=CATALOG, gpu_reset_enabled=True,
                                  modes=parse_remediation_mode("enforce,reset_gpu=observe"))
    plan = plan_remediation(checked(verdict("reset", gpu(remap_pending=True))), observing, now=T + 150)
    assert plan.execute == (Effect.STOP_TASKS,) and plan.record_only == (Effect.RESET_GPU,)
    assert plan.node_record is not None and not plan.node_record.executed


def test_xid_fast_path_resets_without_the_diag() -> None:
    evidence = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1,
                        xids=(XidEvent(119, UUID1, T - 5),))
    plan = plan_remediation(evidence, WITH_RESET, now=T)
    assert (plan.action, plan.decision.rule_id, plan.decision.skip_health_check) == (
        Action.RESET_GPU, "xid-119", True)


# --- no reset stage yet: exactly today's reboot --------------------------------------------------


RESET_EVIDENCE = [
    pytest.param(checked(verdict("reset", gpu(remap_pending=True, ecc_uncorrected_volatile=3,
                                                recovery_action="drain_and_reset"))), id="verdict-reset"),
    pytest.param(checked(verdict("healthy"), xids=(95,)), id="xid-95-after-diag"),
    pytest.param(Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1,
                          xids=(XidEvent(48, UUID1, T - 5),)), id="xid-48-fast-path"),
    pytest.param(checked(verdict("healthy", errors=[{"test": "software", "error_id": 85, "severity": 6}])),
                 id="dcgm-severity-reset"),
]


@pytest.mark.parametrize("evidence", RESET_EVIDENCE)
def test_without_a_reset_stage_a_reset_decision_is_todays_reboot(evidence: Evidence) -> None:
    """What the recovery flow sees today: plan.action reboot, effects stop_tasks + reboot, a
    reboot record for escalation, the reboot label; reset_gpu appears nowhere but in a note."""
    plan = plan_remediation(evidence, TODAY, now=T + 150, job_budgets=JobBudgets())
    assert plan.action is Action.REBOOT and plan.decision.action is Action.REBOOT
    assert plan.execute == (Effect.STOP_TASKS, Effect.REBOOT)
    assert plan.node_record is not None and plan.node_record.action is Action.REBOOT
    assert any("carried out as a reboot" in n for n in plan.decision.notes)
    assert "reset_gpu" not in {plan.to_dict()["action"], *plan.to_dict()["execute"],
                               plan.to_dict()["decision"]["action"]}
    assert any("carried out as a reboot" in line for line in plan.render_lines())


def test_telemetry_remap_pending_with_its_ecc_keeps_todays_rule() -> None:
    """The node agent's report of a pending remap with its ECC errors: the remap's rule decides
    (as before, when gpu-remap-pending came first among equal reboots), now as one signal."""
    item = {"gpu_telemetry": [{"i": 1, "u": UUID1, "rp": True, "ecc": 3}], "last_gpu_report_at": T - 30}
    evidence = build_evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, instance_item=item,
                              exit_code=1, job_id="j", catalog=CATALOG)
    plan = plan_remediation(evidence, TODAY, now=T)
    assert (plan.action, plan.decision.rule_id, plan.decision.skip_health_check) == (
        Action.REBOOT, "gpu-remap-pending", True)


# --- escalation: reset, reset, reboot, reboot, replace --------------------------------------------


def record(at: float, action: Action, cause: str = "gpu-remap-pending",
           executed: bool = True) -> NodeFaultRecord:
    return NodeFaultRecord(at=at, cause=cause, action=action, executed=executed, job_id="j")


def test_a_node_reset_repeatedly_is_rebooted_then_replaced() -> None:
    history: tuple[NodeFaultRecord, ...] = ()
    esc = EscalationPolicy()
    actions = []
    for n in range(5):
        now = T + n * 4 * HOUR
        result = escalate(Action.RESET_GPU, "gpu-remap-pending", history, now, esc)
        actions.append(result.action)
        history = record_fault(history, record(now, result.action), now, esc)
    assert actions == [Action.RESET_GPU, Action.RESET_GPU, Action.REBOOT, Action.REBOOT, Action.REPLACE]


def test_reset_escalation_says_why_and_counts_resets_of_any_cause() -> None:
    history = [record(T - HOUR, Action.RESET_GPU, cause="xid-119"),
               record(T - 2 * HOUR, Action.RESET_GPU, cause="gpu-remap-pending")]
    result = escalate(Action.RESET_GPU, "xid-95", history, T)
    assert (result.action, result.escalated, result.resets) == (Action.REBOOT, True, 2)
    assert "GPUs reset 2 times within 72 h (limit 2): a reset does not hold, reboot the node" in result.reason
    assert result.to_dict()["resets"] == 2


def test_old_unexecuted_and_other_resets_do_not_escalate() -> None:
    history = [record(T - 73 * HOUR, Action.RESET_GPU), record(T - 80 * HOUR, Action.RESET_GPU),
               record(T - HOUR, Action.RESET_GPU, executed=False), record(T - 2 * HOUR, Action.REBOOT)]
    assert resets(history, T, EscalationPolicy()) == 0
    assert escalate(Action.RESET_GPU, "gpu-remap-pending", history, T).action is Action.RESET_GPU


def test_resets_count_as_remediations() -> None:
    history = [record(T - d * 20 * HOUR, Action.RESET_GPU, cause=f"c{d}") for d in range(1, 6)]
    result = escalate(Action.RESET_GPU, "new", history, T, EscalationPolicy(resets_before_reboot=100))
    assert (result.action, result.page_operator, result.quarantine_only) == (Action.REPLACE, True, True)


def test_an_escalated_reset_that_meets_the_reboot_limit_replaces() -> None:
    history = [record(T - HOUR, Action.RESET_GPU), record(T - 2 * HOUR, Action.RESET_GPU),
               record(T - 3 * HOUR, Action.REBOOT), record(T - 4 * HOUR, Action.REBOOT)]
    result = escalate(Action.RESET_GPU, "gpu-remap-pending", history, T)
    assert result.action is Action.REPLACE
    assert result.reason.startswith("GPUs reset 2 times") and "rebooted 2 times" in result.reason


@pytest.mark.parametrize(("field", "value"), [("resets_before_reboot", 0), ("reset_window_seconds", 0)])
def test_reset_escalation_policy_is_validated(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        EscalationPolicy(**{field: value})


# --- vocabulary -------------------------------------------------------------------------------------


def test_reset_gpu_is_a_node_action_milder_than_a_reboot() -> None:
    from gpu_recovery.domain.fault_vocabulary import ACTION_SEVERITY

    assert Action.RESET_GPU in NODE_ACTIONS
    severity = ACTION_SEVERITY
    assert severity[Action.OPERATOR_ACTION] < severity[Action.RESET_GPU] < severity[Action.REBOOT]
    assert effects_of(Action.RESET_GPU) == (Effect.STOP_TASKS, Effect.RESET_GPU)


def test_reset_gpu_cannot_be_enforced_without_stopping_the_ranks() -> None:
    with pytest.raises(ValueError, match="reset_gpu=enforce"):
        parse_remediation_mode("observe,reset_gpu=enforce")


def test_catalog_rules_may_skip_the_diag_for_a_reset() -> None:
    rule = CATALOG.rule("gpu-recovery-action-reset")
    assert rule.action is Action.RESET_GPU and rule.skip_health_check and rule.budget is Budget.INFRASTRUCTURE
