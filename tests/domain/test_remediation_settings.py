"""Remediation settings: defaults, every value parsed, every bad key named."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_settings import SETTINGS, parse_remediation_settings


def test_defaults_are_the_documented_ones() -> None:
    s = parse_remediation_settings({})
    assert s.modes.executes(Effect.REBOOT) and s.replace_action == "quarantine"
    assert (s.escalation.reboots_before_replace, s.escalation.reboot_window_seconds) == (2, 72 * 3600)
    assert (s.escalation.max_remediations, s.escalation.remediation_window_seconds) == (5, 7 * 86400)
    assert (s.breaker.enabled, s.breaker.max_share, s.breaker.max_nodes, s.breaker.window_seconds) == (
        True, 0.2, None, 600)
    assert (s.max_infra_recoveries, s.max_app_restarts) == (3, 0)


def test_every_setting_is_read() -> None:
    s = parse_remediation_settings({
        "remediation_mode": "observe", "replace_action": "terminate_in_asg",
        "reboots_before_replace": "3", "reboot_window_hours": "48", "max_remediations": "4",
        "remediation_window_days": "3.5", "breaker_enabled": "false", "breaker_max_percent": "50",
        "breaker_max_nodes": "8", "breaker_window_minutes": "5", "max_infra_recoveries": "2",
        "max_app_restarts": "1", "breaker_auto_close": "false", "cordon_max_percent": "75"})
    assert not s.modes.executes(Effect.STOP_TASKS) and s.replace_action == "terminate_in_asg"
    assert (s.escalation.reboots_before_replace, s.escalation.reboot_window_seconds,
            s.escalation.max_remediations, s.escalation.remediation_window_seconds) == (
        3, 48 * 3600, 4, 3.5 * 86400)
    assert (s.breaker.enabled, s.breaker.max_share, s.breaker.max_nodes, s.breaker.window_seconds,
            s.breaker.auto_close) == (False, 0.5, 8, 300, False)
    assert parse_remediation_settings({}).breaker.auto_close is True
    assert s.cordon.max_share == 0.75 and s.cordon.allowed_nodes(4) == 3
    assert parse_remediation_settings({}).cordon.max_share == 0.5  # NVSentinel's default
    assert (s.max_infra_recoveries, s.max_app_restarts) == (2, 1)
    policy = s.policy(load_catalog(), [1, 134])
    assert policy.suspect_exit_codes == {1, 134} and policy.replace_action == "terminate_in_asg"


def test_every_bad_value_is_named() -> None:
    with pytest.raises(ValueError) as raised:
        parse_remediation_settings({"remediation_mode": "dryrun", "replace_action": "burn",
                                    "breaker_max_percent": "0", "reboots_before_replace": "two",
                                    "breaker_enabled": "yes", "breaker_auto_close": "maybe",
                                    "max_app_restarts": "99", "cordon_max_percent": "101", "colour": "red"})
    message = str(raised.value)
    for key in ("remediation_mode", "replace_action", "breaker_max_percent", "reboots_before_replace",
                "breaker_enabled", "breaker_auto_close must be true or false", "max_app_restarts",
                "cordon_max_percent must be between 1 and 100",
                "unknown setting 'colour'"):
        assert key in message, key
    assert set(SETTINGS) >= {"remediation_mode", "breaker_max_percent"}


@pytest.mark.parametrize(("values", "message"), [
    ({"remediation_mode": "observe,health_check=enforce"},
     "health_check=enforce cannot happen with stop_tasks=observe"),
    ({"remediation_mode": "enforce,drain=observe", "replace_action": "terminate_in_asg"},
     "terminate=enforce needs drain=enforce"),
])
def test_impossible_mode_combinations_are_refused_with_the_fix(values: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match="remediation settings: remediation_mode") as raised:
        parse_remediation_settings(values)
    assert message in str(raised.value)


def test_a_drain_observed_without_termination_is_fine() -> None:
    s = parse_remediation_settings({"remediation_mode": "enforce,drain=observe"})
    assert not s.modes.executes(Effect.DRAIN) and s.modes.executes(Effect.REBOOT)
    s = parse_remediation_settings({"remediation_mode": "enforce,drain=observe,terminate=observe",
                                    "replace_action": "terminate_in_asg"})
    assert not s.modes.executes(Effect.TERMINATE)
