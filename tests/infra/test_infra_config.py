"""Configuration from CDK context: defaults and clear errors naming the key."""

from __future__ import annotations

import pytest

from infra.config import DEFAULT_HEALTH_CHECK_IMAGE, ConfigError, RecoveryConfig


def test_defaults_are_documented_values() -> None:
    """Given only cluster_name, When parsed, Then every option has its documented default."""
    config = RecoveryConfig.from_context({"cluster_name": "gpu-cluster"})
    assert config.health_check_family == "gpu-health-check"
    assert config.health_check_task_arn is None and config.creates_health_check_task
    assert config.dcgm_level == 2
    assert config.health_check_gpus == 8
    assert config.max_recovery_attempts == 1
    assert config.suspect_exit_codes == (1,)
    assert config.suspect_exit_codes_json == "[1]"
    assert config.reboot_timeout_minutes == 30
    assert config.health_check_timeout_minutes == 30
    assert config.table_removal_policy == "retain"
    assert config.instance_tag_key == "gpu-recovery:cluster"
    assert config.instance_tag_value == "gpu-cluster"
    assert config.health_check_image == DEFAULT_HEALTH_CHECK_IMAGE
    assert "dcgm:4." in config.health_check_image and "ubuntu22.04" in config.health_check_image
    assert config.alert_email is None


def test_values_from_cli_strings_are_parsed() -> None:
    """Given -c style string values, When parsed, Then they become typed values."""
    config = RecoveryConfig.from_context(
        {
            "cluster_name": "c1",
            "dcgm_level": "3",
            "health_check_gpus": "4",
            "suspect_exit_codes": "1, 134,1",
            "table_removal_policy": "DESTROY",
        }
    )
    assert (config.dcgm_level, config.health_check_gpus) == (3, 4)
    assert config.suspect_exit_codes == (1, 134)
    assert config.table_removal_policy == "destroy"


def test_suspect_exit_codes_accept_json_list() -> None:
    """Given a JSON list (string or list), When parsed, Then the codes are kept in order."""
    assert RecoveryConfig.from_context(
        {"cluster_name": "c", "suspect_exit_codes": "[1, 139]"}
    ).suspect_exit_codes == (1, 139)
    assert RecoveryConfig.from_context(
        {"cluster_name": "c", "suspect_exit_codes": [2]}
    ).suspect_exit_codes == (2,)


def test_missing_cluster_name_is_a_clear_error() -> None:
    """Given no cluster_name, When parsed, Then the error names the key and how to set it."""
    with pytest.raises(ConfigError, match=r"'cluster_name' is required.*-c cluster_name="):
        RecoveryConfig.from_context({})


@pytest.mark.parametrize("value", ["0", "5", "two", True, 2.5])
def test_bad_dcgm_level_is_rejected(value: object) -> None:
    """Given a dcgm_level outside 1..4 or not an integer, Then the error names the key."""
    with pytest.raises(ConfigError, match="'dcgm_level'"):
        RecoveryConfig.from_context({"cluster_name": "c", "dcgm_level": value})


@pytest.mark.parametrize("value", ["abc", "[1, \"x\"]", "[", "[]", "0", "1,256", [True], {"a": 1}])
def test_bad_suspect_exit_codes_are_rejected(value: object) -> None:
    """Given malformed or out-of-range exit codes, Then the error names the key and format."""
    with pytest.raises(ConfigError, match="'suspect_exit_codes' must be a JSON list"):
        RecoveryConfig.from_context({"cluster_name": "c", "suspect_exit_codes": value})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster_name", "bad name!"),
        ("table_removal_policy", "snapshot"),
        ("alert_email", "not-an-email"),
        ("health_check_task_arn", "gpu-health-check:1"),
        ("instance_tag_key", "aws:reserved"),
        ("lambda_architecture", "sparc"),
        ("max_recovery_attempts", "-1"),
    ],
)
def test_other_bad_values_name_their_key(key: str, value: str) -> None:
    """Given an invalid value for a key, When parsed, Then ConfigError names that key."""
    context = {"cluster_name": "c", key: value}
    with pytest.raises(ConfigError, match=f"'{key}'"):
        RecoveryConfig.from_context(context)


def test_config_is_frozen() -> None:
    """Given a parsed config, When a field is assigned, Then it is refused."""
    config = RecoveryConfig.from_context({"cluster_name": "c"})
    with pytest.raises(AttributeError):
        config.dcgm_level = 4  # type: ignore[misc]
