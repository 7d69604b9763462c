"""Observe-only mode per effect, and a job's two budgets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_recovery.domain.fault_vocabulary import Action, Budget
from gpu_recovery.domain.job_budgets import JobBudgets, settle, validate_limits
from gpu_recovery.domain.remediation_mode import (
    Effect,
    Mode,
    RemediationModes,
    combination_errors,
    effects_of,
    parse_remediation_mode,
)

# --- remediation mode ---------------------------------------------------------------------


def test_default_is_enforce_everything() -> None:
    modes = parse_remediation_mode("")
    assert all(modes.executes(e) for e in Effect)
    assert parse_remediation_mode(None) == modes


def test_observe_records_everything_and_executes_nothing() -> None:
    modes = parse_remediation_mode("observe")
    assert modes.split(effects_of(Action.REBOOT)) == ((), (Effect.STOP_TASKS, Effect.REBOOT))
    assert not any(modes.executes(e) for e in Effect)


@pytest.mark.parametrize("text", ["enforce,reboot=observe,terminate=observe",
                                  ' {"default": "enforce", "reboot": "observe", "terminate": "OBSERVE"}'])
def test_per_effect_exceptions(text: str) -> None:
    modes = parse_remediation_mode(text)
    assert modes.executes(Effect.STOP_TASKS) and modes.executes(Effect.DRAIN)
    assert not modes.executes(Effect.REBOOT) and not modes.executes(Effect.TERMINATE)
    assert modes.describe() == "enforce,reboot=observe,terminate=observe"
    assert modes.to_dict() == {"default": "enforce", "reboot": "observe", "terminate": "observe"}


def test_observe_with_an_enforced_exception() -> None:
    modes = parse_remediation_mode("observe,stop_tasks=enforce")
    assert modes.split(effects_of(Action.REPLACE)) == ((Effect.STOP_TASKS,), (Effect.DRAIN,))
    assert modes.mode_for(Effect.REBOOT) is Mode.OBSERVE


@pytest.mark.parametrize(("text", "message"), [
    ("dry-run", "mode must be 'enforce' or 'observe'"),
    ("enforce,reboots=observe", "unknown effect 'reboots'"),
    ("enforce,observe", "only the first item may be a bare mode"),
    ("{not json", "not valid JSON"),
    ('["observe"]', "JSON must be an object"),
    ('{"reboot": "maybe"}', "remediation_mode.reboot"),
])
def test_bad_settings_say_what_to_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="remediation_mode") as raised:
        parse_remediation_mode(text)
    assert message in str(raised.value)


@pytest.mark.parametrize("text", [
    "observe,health_check=enforce",  # the diag needs the GPUs the job's ranks hold
    "enforce,stop_tasks=observe",
    "observe,reboot=enforce",
    "observe,restart_job=enforce",
    '{"default": "enforce", "stop_tasks": "observe", "reboot": "observe"}',
])
def test_effects_that_need_the_ranks_stopped_are_refused_without_stop_tasks(text: str) -> None:
    with pytest.raises(ValueError, match="stop_tasks=observe") as raised:
        parse_remediation_mode(text)
    assert "remediation_mode:" in str(raised.value) and "use 'observe' for everything" in str(raised.value)


@pytest.mark.parametrize("text", [
    "observe", "observe,stop_tasks=enforce", "enforce,health_check=observe",
    "enforce,reboot=observe", "enforce,drain=observe", "enforce,restart_job=observe",
    "observe,stop_tasks=enforce,reboot=enforce,drain=enforce",
])
def test_combinations_the_loop_can_carry_out_are_accepted(text: str) -> None:
    assert parse_remediation_mode(text).describe()


def test_termination_needs_the_drain_only_when_nodes_are_terminated() -> None:
    modes = parse_remediation_mode("enforce,drain=observe")
    assert combination_errors(modes) == []
    [error] = combination_errors(modes, replace_action="terminate_in_asg")
    assert "terminate=enforce needs drain=enforce" in error and "add terminate=observe" in error
    assert combination_errors(parse_remediation_mode("enforce,drain=observe,terminate=observe"),
                              replace_action="terminate_in_asg") == []


@pytest.mark.parametrize(("action", "replace_action", "quarantine_only", "effects"), [
    (Action.NONE, "quarantine", False, ()),
    (Action.APPLICATION_ERROR, "quarantine", False, (Effect.STOP_TASKS, Effect.RESTART_JOB)),
    (Action.RESTART_JOB, "quarantine", False, (Effect.STOP_TASKS, Effect.RESTART_JOB)),
    (Action.HEALTH_CHECK, "quarantine", False, (Effect.STOP_TASKS, Effect.HEALTH_CHECK)),
    (Action.OPERATOR_ACTION, "terminate_in_asg", False, (Effect.STOP_TASKS, Effect.DRAIN)),
    (Action.REBOOT, "quarantine", False, (Effect.STOP_TASKS, Effect.REBOOT)),
    (Action.REPLACE, "quarantine", False, (Effect.STOP_TASKS, Effect.DRAIN)),
    (Action.REPLACE, "terminate_in_asg", False, (Effect.STOP_TASKS, Effect.DRAIN, Effect.TERMINATE)),
    (Action.REPLACE, "terminate_in_asg", True, (Effect.STOP_TASKS, Effect.DRAIN)),
])
def test_effects_of_each_action(action, replace_action, quarantine_only, effects) -> None:
    assert effects_of(action, replace_action=replace_action, quarantine_only=quarantine_only) == effects


def test_operator_action_never_reboots() -> None:
    assert Effect.REBOOT not in effects_of(Action.OPERATOR_ACTION)
    with pytest.raises(ValueError, match="replace_action"):
        effects_of(Action.REPLACE, replace_action="terminate")


@given(st.sampled_from(list(Action)),
       st.dictionaries(st.sampled_from(list(Effect)), st.sampled_from(list(Mode))),
       st.sampled_from(list(Mode)))
def test_split_partitions_the_effects(action, per_effect, default) -> None:
    modes = RemediationModes(default, per_effect)
    effects = effects_of(action)
    execute, record = modes.split(effects)
    assert sorted(execute + record, key=effects.index) == list(effects)
    assert all(modes.mode_for(e) is Mode.ENFORCE for e in execute)
    assert all(modes.mode_for(e) is Mode.OBSERVE for e in record)


# --- job budgets --------------------------------------------------------------------------------


def test_defaults_three_infrastructure_recoveries_and_no_application_restart() -> None:
    budgets = JobBudgets()
    assert budgets.remaining(Budget.INFRASTRUCTURE) == 3
    assert settle(budgets, Budget.APPLICATION).restart is False  # fails as before


def test_each_budget_is_spent_separately() -> None:
    budgets = JobBudgets(max_infra_recoveries=1, max_app_restarts=2)
    first = settle(budgets, Budget.APPLICATION)
    assert first.restart and first.charged is Budget.APPLICATION
    assert first.budgets.remaining(Budget.INFRASTRUCTURE) == 1
    infra = settle(first.budgets, Budget.INFRASTRUCTURE)
    assert infra.restart and settle(infra.budgets, Budget.INFRASTRUCTURE).restart is False
    assert "infrastructure recoveries 1 of 1 used, application-error restarts 1 of 2 used" in infra.reason


def test_flapping_repeat_is_free_but_application_errors_always_pay() -> None:
    spent = JobBudgets(max_infra_recoveries=1, infra_recoveries_used=1)
    repeat = settle(spent, Budget.INFRASTRUCTURE, charge=False)
    assert repeat.restart and repeat.charged is Budget.NONE and repeat.budgets == spent
    assert settle(JobBudgets(), Budget.APPLICATION, charge=False).restart is False
    assert settle(spent, Budget.NONE).restart


def test_limits_are_validated_with_the_field_name() -> None:
    assert validate_limits(3, 0) == []
    errors = validate_limits(-1, "2")
    assert any("max_infra_recoveries" in e for e in errors) and any("max_app_restarts" in e for e in errors)
    with pytest.raises(ValueError, match="max_app_restarts"):
        JobBudgets(max_app_restarts=99)
    with pytest.raises(ValueError, match="no infrastructure budget left"):
        JobBudgets(max_infra_recoveries=0).spend(Budget.INFRASTRUCTURE)


@given(st.integers(0, 5), st.integers(0, 5), st.lists(st.sampled_from([Budget.INFRASTRUCTURE,
                                                                      Budget.APPLICATION]), max_size=15))
def test_never_more_restarts_than_each_budget(max_infra, max_app, faults) -> None:
    budgets = JobBudgets(max_infra_recoveries=max_infra, max_app_restarts=max_app)
    restarts = {Budget.INFRASTRUCTURE: 0, Budget.APPLICATION: 0}
    for kind in faults:
        outcome = settle(budgets, kind)
        budgets = outcome.budgets
        restarts[kind] += outcome.restart
    assert restarts[Budget.INFRASTRUCTURE] == min(max_infra, faults.count(Budget.INFRASTRUCTURE))
    assert restarts[Budget.APPLICATION] == min(max_app, faults.count(Budget.APPLICATION))
