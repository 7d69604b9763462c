"""From evidence to a plan: the issue's catalog classes end to end, pure (no AWS)."""

from __future__ import annotations

from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.escalation import NodeFaultRecord, record_fault
from gpu_recovery.domain.evidence import DcgmFindings, Evidence, XidEvent
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.fault_vocabulary import Action, Budget, Trigger
from gpu_recovery.domain.job_budgets import JobBudgets
from gpu_recovery.domain.remediation_mode import Effect, parse_remediation_mode
from gpu_recovery.domain.remediation_plan import RemediationPolicy, plan_remediation

T = 1_734_220_000.0
POLICY = RemediationPolicy(catalog=load_catalog(), suspect_exit_codes=frozenset({1}))


def xid_fault(xid: int, at: float = T, node: str = "ci-1", job: str = "j") -> Evidence:
    return Evidence(node_id=node, fault_at=at, trigger=Trigger.TASK_EXIT, job_id=job, exit_code=1,
                    xids=(XidEvent(xid, "GPU-a", at - 5),))


def test_fast_path_xid_79_reboots_without_the_diag() -> None:
    plan = plan_remediation(xid_fault(79), POLICY, now=T, job_budgets=JobBudgets())
    assert plan.action is Action.REBOOT and plan.decision.skip_health_check
    assert plan.execute == (Effect.STOP_TASKS, Effect.REBOOT) and Effect.HEALTH_CHECK not in plan.execute
    assert plan.needs_breaker and plan.budget is not None and plan.budget.restart
    assert plan.budget is not None and plan.budget.charged is Budget.INFRASTRUCTURE
    assert plan.node_record is not None and plan.node_record.executed and plan.node_record.charged_job


def test_suspect_exit_runs_the_diag_and_leaves_the_budget_for_later() -> None:
    evidence = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1)
    plan = plan_remediation(evidence, POLICY, now=T, job_budgets=JobBudgets())
    assert plan.action is Action.HEALTH_CHECK and plan.execute == (Effect.STOP_TASKS, Effect.HEALTH_CHECK)
    assert plan.budget is None and plan.node_record is None
    assert not plan.needs_breaker


def test_flapping_node_is_replaced_on_its_third_fault_and_charged_to_the_job_once() -> None:
    history: tuple[NodeFaultRecord, ...] = ()
    budgets = JobBudgets(max_infra_recoveries=3)
    actions, used = [], []
    for n in range(3):
        now = T + n * 3600
        plan = plan_remediation(xid_fault(79, at=now), POLICY, node_history=history, now=now,
                                job_budgets=budgets)
        actions.append(plan.action)
        assert plan.budget is not None and plan.node_record is not None
        budgets = plan.budget.budgets
        used.append(budgets.infra_recoveries_used)
        history = record_fault(history, plan.node_record, now, POLICY.escalation)
    assert actions == [Action.REBOOT, Action.REBOOT, Action.REPLACE]
    assert used == [1, 1, 1]
    assert "rebooted 2 times for 'xid-79'" in plan.escalation.reason
    assert plan.execute == (Effect.STOP_TASKS, Effect.DRAIN)  # replace_action quarantine


def test_replace_in_an_asg_terminates_unless_the_node_exhausted_its_remediations() -> None:
    asg = RemediationPolicy(catalog=POLICY.catalog, replace_action="terminate_in_asg")
    plan = plan_remediation(xid_fault(64), asg, now=T)
    assert plan.execute == (Effect.STOP_TASKS, Effect.DRAIN, Effect.TERMINATE)
    worn = [NodeFaultRecord(at=T - d * 3600, cause=f"c{d}", action=Action.REBOOT) for d in range(1, 6)]
    paged = plan_remediation(xid_fault(64), asg, node_history=worn, now=T)
    assert paged.escalation.page_operator and paged.execute == (Effect.STOP_TASKS, Effect.DRAIN)


def test_breaker_trip_turns_node_effects_into_records() -> None:
    """4 of 16 nodes within 10 minutes: the 4th node's reboot is not carried out, its tasks
    are still stopped, the node history says not executed and the e-mail says why."""
    state = breaker.new_state()
    plans = []
    for n in range(4):
        now = T + 60 * n
        plan = plan_remediation(xid_fault(79, at=now, node=f"ci-{n}"), POLICY, now=now)
        verdict = breaker.record_action(state, node=f"ci-{n}", action=plan.action.value, now=now,
                                        cluster_gpu_nodes=16)
        state = verdict.state
        plans.append(plan.with_breaker(verdict))
    assert [Effect.REBOOT in p.execute for p in plans] == [True, True, True, False]
    blocked = plans[-1]
    assert blocked.execute == (Effect.STOP_TASKS,) and blocked.record_only == (Effect.REBOOT,)
    assert blocked.blocked_by_breaker and blocked.node_record is not None
    assert blocked.node_record.executed is False
    assert any("breaker tripped" in line for line in blocked.render_lines())


def test_observe_mode_changes_nothing_but_says_what_it_would_do() -> None:
    observe = RemediationPolicy(catalog=POLICY.catalog, modes=parse_remediation_mode("observe"))
    plan = plan_remediation(xid_fault(79), observe, now=T, job_budgets=JobBudgets())
    assert plan.execute == () and plan.record_only == (Effect.STOP_TASKS, Effect.REBOOT)
    assert not plan.needs_breaker
    assert plan.node_record is not None and plan.node_record.executed is False
    assert "Would have done (not carried out): stop_tasks, reboot (observe mode)" in plan.render_lines()


def test_persistence_mode_diag_failure_is_an_operator_action_without_reboot() -> None:
    evidence = Evidence(node_id="ci-1", fault_at=T, trigger=Trigger.TASK_EXIT, job_id="j", exit_code=1)
    findings = DcgmFindings.from_verdict_json({
        "verdict": "operator_action", "exit_code": 3, "dcgmi_exit_code": 226,
        "errors": [{"test": "software", "error_id": 29, "severity": 5, "category": 8}]})
    plan = plan_remediation(evidence.with_dcgm(findings, T + 150), POLICY, now=T + 150,
                            job_budgets=JobBudgets())
    assert plan.action is Action.OPERATOR_ACTION
    assert Effect.REBOOT not in plan.execute and Effect.DRAIN in plan.execute
    assert plan.decision.rule_id == "dcgm-error-29-persistence-mode"


def test_node_is_rebooted_even_when_the_job_has_no_recovery_left() -> None:
    plan = plan_remediation(xid_fault(79), POLICY, now=T, job_budgets=JobBudgets(max_infra_recoveries=0))
    assert Effect.REBOOT in plan.execute
    assert plan.budget is not None and plan.budget.restart is False
    assert "no infrastructure budget left" in plan.budget.reason


def test_application_error_without_budget_does_not_restart() -> None:
    plan = plan_remediation(xid_fault(13), POLICY, now=T, job_budgets=JobBudgets())
    assert plan.action is Action.APPLICATION_ERROR
    assert plan.execute == (Effect.STOP_TASKS,) and plan.budget is not None and plan.budget.restart is False
    allowed = plan_remediation(xid_fault(13), POLICY, now=T, job_budgets=JobBudgets(max_app_restarts=1))
    assert allowed.execute == (Effect.STOP_TASKS, Effect.RESTART_JOB)
    assert allowed.to_dict()["budget"]["charged"] == "application"
