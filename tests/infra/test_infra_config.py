"""Configuration from CDK context: defaults and clear errors naming the key."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest

from infra import REPO_ROOT, node_agent
from infra.config import DEFAULT_HEALTH_CHECK_IMAGE, KNOWN_KEYS, ConfigError, RecoveryConfig


def test_defaults_are_documented_values() -> None:
    """Given only cluster_name, When parsed, Then every option has its documented default."""
    config = RecoveryConfig.from_context({"cluster_name": "gpu-cluster"})
    assert config.health_check_family == "gpu-health-check"
    assert config.health_check_task_arn is None and config.creates_health_check_task
    assert config.dcgm_level == 2
    assert config.health_check_gpus == 8
    assert config.max_recovery_attempts == 3  # infrastructure recoveries (max_infra_recoveries)
    assert config.max_app_restarts == 0
    settings = dict(config.remediation)
    assert settings["remediation_mode"] == "enforce" and settings["replace_action"] == "quarantine"
    assert settings["breaker_max_percent"] == "20" and settings["breaker_window_minutes"] == "10"
    assert config.fault_catalog_file is None and config.relocate_instead_of_wait is False
    assert config.relocation_wait_seconds == 1800
    assert config.spare_nodes == "0"
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


def test_heartbeat_api_and_queue_defaults() -> None:
    """Given only cluster_name, Then the heartbeat / API / queue options have their defaults."""
    config = RecoveryConfig.from_context({"cluster_name": "c"})
    assert config.heartbeat_stale_seconds == 180
    assert config.node_lost_fail_seconds == 1800
    assert config.hang_seconds == 0
    assert config.hang_action == "notify"
    assert config.api_throttle_rate == 1000.0
    assert config.api_throttle_burst == 2000
    assert config.node_agent_daemon is False
    assert config.training_log_groups == ("/ecs/*",)


def test_heartbeat_api_and_queue_values_from_cli_strings() -> None:
    """Given -c style strings, When parsed, Then they become typed values; 0 disables."""
    config = RecoveryConfig.from_context(
        {
            "cluster_name": "c",
            "heartbeat_stale_seconds": "240",
            "node_lost_fail_seconds": "0",
            "hang_seconds": "900",
            "hang_action": "RECOVER",
            "api_throttle_rate": "250.5",
            "api_throttle_burst": "500",
            "node_agent_daemon": "true",
            "training_log_groups": "/ecs/*, /aws/batch/job,/ecs/*",
        }
    )
    assert config.heartbeat_stale_seconds == 240
    assert config.node_lost_fail_seconds == 0
    assert config.hang_seconds == 900
    assert config.hang_action == "recover"
    assert config.api_throttle_rate == 250.5
    assert config.api_throttle_burst == 500
    assert config.node_agent_daemon is True
    assert config.training_log_groups == ("/ecs/*", "/aws/batch/job")
    assert RecoveryConfig.from_context(
        {"cluster_name": "c", "training_log_groups": '["/ecs/train"]', "node_agent_daemon": False,
         "api_throttle_rate": 10}
    ).training_log_groups == ("/ecs/train",)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("heartbeat_stale_seconds", "59"),
        ("heartbeat_stale_seconds", "0"),
        ("heartbeat_stale_seconds", "86401"),
        ("node_lost_fail_seconds", "30"),  # 0 disables; otherwise at least a minute
        ("node_lost_fail_seconds", "-1"),
        ("node_lost_fail_seconds", "604801"),
        ("hang_seconds", "59"),
        ("hang_seconds", "1.5"),
        ("hang_action", "reboot"),
        ("api_throttle_rate", "0"),
        ("api_throttle_rate", "10001"),
        ("api_throttle_rate", "fast"),
        ("api_throttle_rate", True),
        ("api_throttle_burst", "0"),
        ("api_throttle_burst", "5001"),
        ("node_agent_daemon", "maybe"),
        ("training_log_groups", "*"),  # every log group of the account: refused
        ("training_log_groups", "/"),
        ("training_log_groups", "[]"),
        ("training_log_groups", "bad group name"),
        ("training_log_groups", "[1]"),
        ("training_log_groups", "["),
    ],
)
def test_bad_heartbeat_api_and_queue_values_name_their_key(key: str, value: object) -> None:
    """Given an invalid value for a new option, When parsed, Then ConfigError names the key."""
    with pytest.raises(ConfigError, match=f"'{key}'"):
        RecoveryConfig.from_context({"cluster_name": "c", key: value})


def test_cdk_json_context_matches_the_documented_defaults() -> None:
    """Given cdk.json's context (plus a cluster name), When parsed, Then it equals the
    defaults of an empty context: cdk.json restates the defaults, it does not change them."""
    context = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    assert set(context) <= set(KNOWN_KEYS)
    assert {
        "heartbeat_stale_seconds", "node_lost_fail_seconds", "hang_seconds", "hang_action",
        "api_throttle_rate", "api_throttle_burst", "node_agent_daemon", "training_log_groups",
    } <= set(context)
    assert RecoveryConfig.from_context({**context, "cluster_name": "c"}) == (
        RecoveryConfig.from_context({"cluster_name": "c"})
    )


def test_infra_reads_no_context_key_outside_the_registry() -> None:
    """Every context key goes through RecoveryConfig.from_context (validated, documented,
    "did you mean"): app.py hands it the whole context, and nothing under infra/ (nor
    app.py) reads a key on its own with try_get_context / get_context, which the strict
    registry would not know (node_agent_image once was read that way)."""
    import re

    raw_reads = re.compile(r"\b(try_get_context|get_context)\s*\(")
    offenders = [f"{path.relative_to(REPO_ROOT)}:{number}"
                 for path in [*sorted((REPO_ROOT / "infra").rglob("*.py")), REPO_ROOT / "app.py"]
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if raw_reads.search(line)]
    assert offenders == []
    app_source = (REPO_ROOT / "app.py").read_text()
    assert "RecoveryConfig.from_context(app.node.get_all_context())" in app_source


@pytest.mark.parametrize("value", [True, False, "true", "false", "1", "0", "yes", "no"])
def test_node_agent_keys_are_registry_options(value: object) -> None:
    """Given node_agent_daemon in any accepted spelling and node_agent_image, Then the
    registry parses both (the daemon construct takes the parsed image)."""
    config = RecoveryConfig.from_context({"cluster_name": "c", "node_agent_daemon": value,
                                          "node_agent_image": "my.registry/agent:2"})
    assert config.node_agent_daemon is (str(value).lower() in ("true", "1", "yes"))
    assert config.node_agent_image == "my.registry/agent:2"
    assert RecoveryConfig.from_context({"cluster_name": "c"}).node_agent_image == node_agent.DEFAULT_IMAGE
    with pytest.raises(ConfigError, match="'node_agent_image'"):
        RecoveryConfig.from_context({"cluster_name": "c", "node_agent_image": "not an image"})


def test_time_sharing_keys() -> None:
    """Issue 10's keys: default quotas as a JSON object (text or cdk.json object; level names
    or values), preemption, the default grace and the ABOVE_NORMAL demotion (0: never)."""
    defaults = RecoveryConfig.from_context({"cluster_name": "c"})
    assert defaults.default_node_quotas is None  # unlimited
    assert defaults.preemption is True and defaults.suspend_grace_seconds == 60
    assert defaults.demote_above_normal_minutes == 30
    config = RecoveryConfig.from_context({
        "cluster_name": "c", "default_node_quotas": '{"HIGH": 8, "0": 64}', "preemption": "false",
        "suspend_grace_seconds": "5", "demote_above_normal_minutes": "0"})
    assert json.loads(config.default_node_quotas or "") == {"HIGH": 8, "0": 64}
    assert config.preemption is False and config.suspend_grace_seconds == 5
    assert config.demote_above_normal_minutes == 0
    from_json = RecoveryConfig.from_context({"cluster_name": "c", "default_node_quotas": {"LOW": 2},
                                             "suspend_grace_seconds": 3600})
    assert json.loads(from_json.default_node_quotas or "") == {"LOW": 2}
    assert from_json.suspend_grace_seconds == 3600


@pytest.mark.parametrize(("key", "value", "says"), [
    ("default_node_quotas", '{"HGH": 8}', "level 'HGH'"),
    ("default_node_quotas", '{"HIGH": -1}', "0..100000 nodes"),
    ("default_node_quotas", "[8]", "JSON object"),
    ("default_node_quotas", "HIGH=8", "JSON object"),
    ("suspend_grace_seconds", "4", "between 5 and 3600"),
    ("suspend_grace_seconds", "3601", "between 5 and 3600"),
    ("demote_above_normal_minutes", "-1", "0 (disabled)"),
    ("preemption", "sometimes", "true or false"),
])
def test_bad_time_sharing_values_fail_synthesis_naming_the_key(key: str, value: str, says: str) -> None:
    """Given a bad time-sharing value, When the app is built (as `cdk synth -c` does), Then
    it stops before any construct with a ConfigError naming the key and the problem."""
    from app import build_app

    app = cdk.App(context={"cluster_name": "c", key: value})
    with pytest.raises(ConfigError, match=f"'{key}'") as error:
        build_app(app)
    assert says in str(error.value)


def test_large_job_keys() -> None:
    """Issue 18's keys: the ECS budget (the stack's share of the account's 40/s and its
    burst), health checks at once per job and per cluster, the gang workers at once and
    grouped starts; their defaults are the functions' own (one source of truth)."""
    from gpu_recovery.domain import rate_limit
    from gpu_recovery.settings import DEFAULT_HEALTH_CHECKS_IN_FLIGHT, DEFAULT_HEALTH_CHECKS_PER_JOB

    defaults = RecoveryConfig.from_context({"cluster_name": "c"})
    assert (defaults.ecs_api_rate_per_second, defaults.ecs_api_burst) == (36.0, 90)
    assert (defaults.ecs_api_rate_per_second, defaults.ecs_api_burst) == (
        rate_limit.DEFAULT_RATE, rate_limit.DEFAULT_BURST)
    assert defaults.ecs_api_rate_per_second < rate_limit.ECS_ACCOUNT_RATE  # room for other callers
    assert defaults.ecs_api_burst < rate_limit.ECS_ACCOUNT_BURST
    assert (defaults.max_health_checks_per_job, defaults.max_health_checks_in_flight) == (
        DEFAULT_HEALTH_CHECKS_PER_JOB, DEFAULT_HEALTH_CHECKS_IN_FLIGHT) == (2048, 2048)
    assert defaults.gang_worker_concurrency == 8 and defaults.batch_identical_starts is True
    config = RecoveryConfig.from_context({
        "cluster_name": "c", "ecs_api_rate_per_second": "18.5", "ecs_api_burst": "40",
        "max_health_checks_per_job": "16", "max_health_checks_in_flight": "64",
        "gang_worker_concurrency": "2", "batch_identical_starts": "false"})
    assert (config.ecs_api_rate_per_second, config.ecs_api_burst) == (18.5, 40)
    assert (config.max_health_checks_per_job, config.max_health_checks_in_flight) == (16, 64)
    assert config.gang_worker_concurrency == 2 and config.batch_identical_starts is False
    edges = RecoveryConfig.from_context({"cluster_name": "c", "ecs_api_rate_per_second": 0.1,
                                         "gang_worker_concurrency": 100})
    assert (edges.ecs_api_rate_per_second, edges.gang_worker_concurrency) == (0.1, 100)


@pytest.mark.parametrize(("key", "value", "says"), [
    ("ecs_api_rate_per_second", "0", "0.1..1000"),
    ("ecs_api_rate_per_second", "0.05", "0.1..1000"),
    ("ecs_api_rate_per_second", "1001", "0.1..1000"),
    ("ecs_api_rate_per_second", "fast", "0.1..1000"),
    ("ecs_api_rate_per_second", True, "0.1..1000"),
    ("ecs_api_burst", "0", "between 1 and 2500"),
    ("ecs_api_burst", "2501", "between 1 and 2500"),
    ("ecs_api_burst", "1.5", "integer 1..2500"),
    ("max_health_checks_per_job", "0", "between 1 and 10000"),
    ("max_health_checks_in_flight", "-3", "between 1 and 10000"),
    ("max_health_checks_in_flight", "many", "integer 1..10000"),
    ("gang_worker_concurrency", "1", "between 2 and 100"),  # SQS event sources: at least 2
    ("gang_worker_concurrency", "101", "between 2 and 100"),
    ("batch_identical_starts", "maybe", "true or false"),
])
def test_bad_large_job_values_fail_synthesis_naming_the_key(key: str, value: object, says: str) -> None:
    """Given a bad large-job value, When the app is built, Then it stops before any construct
    with a ConfigError naming the key and what it accepts."""
    from app import build_app

    app = cdk.App(context={"cluster_name": "c", key: value})
    with pytest.raises(ConfigError, match=f"'{key}'") as error:
        build_app(app)
    assert says in str(error.value)


def test_preflight_keys_reach_the_functions_settings() -> None:
    """The preflight's deploy options become PREFLIGHT_SETTINGS as the functions parse it: the
    users a baseline needs before it judges others (``min_users``) among them."""
    from gpu_recovery.domain.preflight.settings import parse_preflight_settings

    defaults = parse_preflight_settings(json.loads(
        RecoveryConfig.from_context({"cluster_name": "c"}).preflight_settings_json))
    assert defaults.baseline.min_users == 3
    config = RecoveryConfig.from_context({"cluster_name": "c", "preflight_min_users": "5"})
    assert parse_preflight_settings(json.loads(config.preflight_settings_json)).baseline.min_users == 5
    for bad in ("0", "17", "many"):
        with pytest.raises(ConfigError, match="'preflight_min_users'"):
            RecoveryConfig.from_context({"cluster_name": "c", "preflight_min_users": bad})


def test_the_ecs_budget_bounds_are_the_functions_bounds() -> None:
    """What synthesis accepts, the functions accept (settings.ecs_api_bucket), and the bounds
    are the same: a deployable value never fails a cold start."""
    from gpu_recovery import constants as c
    from gpu_recovery.settings import SettingsError, ecs_api_bucket

    for rate, burst in (("0.1", "1"), ("1000", "2500"), ("36", "90")):
        config = RecoveryConfig.from_context({"cluster_name": "c", "ecs_api_rate_per_second": rate,
                                              "ecs_api_burst": burst})
        bucket = ecs_api_bucket({c.ENV_ECS_API_RATE: f"{config.ecs_api_rate_per_second:g}",
                                 c.ENV_ECS_API_BURST: str(config.ecs_api_burst)})
        assert (bucket.rate, bucket.burst) == (config.ecs_api_rate_per_second, config.ecs_api_burst)
    with pytest.raises(SettingsError):
        ecs_api_bucket({c.ENV_ECS_API_RATE: "1000.5"})


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"remediation_mode": "observ"}, "remediation_mode"),
        ({"replace_action": "terminate"}, "replace_action"),
        ({"breaker_max_percent": "0"}, "breaker_max_percent"),
        ({"reboots_before_replace": "zero"}, "reboots_before_replace"),
        ({"max_app_restarts": "21"}, "max_app_restarts"),
        ({"max_infra_recoveries": "2", "max_recovery_attempts": "1"}, "max_infra_recoveries"),
        ({"relocate_instead_of_wait": "maybe"}, "relocate_instead_of_wait"),
        ({"relocation_wait_seconds": "-5"}, "relocation_wait_seconds"),
        ({"relocation_wait_seconds": "half an hour"}, "relocation_wait_seconds"),
        ({"spare_nodes": "some"}, "spare_nodes"),
        ({"spare_nodes": "-2"}, "spare_nodes"),
        ({"spare_nodes": "80%"}, "spare_nodes"),
        ({"fault_catalog_file": "does/not/exist.json"}, "fault_catalog_file"),
    ],
)
def test_bad_remediation_values_name_their_key(context: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RecoveryConfig.from_context({"cluster_name": "c", **context})


def test_the_older_budget_name_still_works() -> None:
    config = RecoveryConfig.from_context({"cluster_name": "c", "max_recovery_attempts": "1"})
    assert config.max_recovery_attempts == 1


def test_a_bad_fault_catalog_fails_synthesis_with_the_validators_messages(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Given an override whose rule has a typo'd action and a new rule missing its fields,
    When the app is synthesized, Then it fails before anything is built, naming each rule
    and field at fault."""
    from app import build_app

    bad = tmp_path / "catalog.json"
    bad.write_text(json.dumps({"rules": [{"id": "xid-79", "action": "reboo"},
                                         {"id": "site-rule", "match": {"xid": [9999]}}]}))
    app = cdk.App(context={"cluster_name": "c", "fault_catalog_file": str(bad)})
    with pytest.raises(ConfigError) as error:
        build_app(app)
    message = str(error.value)
    assert "rules[13] (id 'xid-79'): field 'action' must be one of" in message
    assert "(id 'site-rule'): field 'source' is required" in message
    assert "field 'match.xid' must be a list of XID numbers 1..1023; not: 9999" in message
def test_authorization_and_telemetry_keys() -> None:
    """Issue 8's keys: lists as JSON or comma strings, a role-name prefix, bounded ints."""
    config = RecoveryConfig.from_context({
        "cluster_name": "c", "admin_roles": "gpu-ops, arn:aws:iam::111122223333:user/alice",
        "team_roles": '["ml-team"]', "allowed_task_families": "llama-*", "task_role_name_prefix": "ml-",
        "reserved_priority_roles": "gpu-ops", "telemetry_notify_interval_seconds": "600",
        "telemetry_signal_retention_seconds": 7200})
    assert config.admin_roles == ("gpu-ops", "arn:aws:iam::111122223333:user/alice")
    assert config.team_roles == ("ml-team",) and config.allowed_task_families == ("llama-*",)
    assert config.task_role_name_prefix == "ml-" and config.reserved_priority_roles == ("gpu-ops",)
    assert config.telemetry_notify_interval_seconds == 600
    assert config.telemetry_signal_retention_seconds == 7200
    defaults = RecoveryConfig.from_context({"cluster_name": "c"})
    assert defaults.allowed_task_families == ("*",) and defaults.task_role_name_prefix == "gpu-training-"
    assert defaults.admin_roles == () and defaults.telemetry_notify_interval_seconds == 3600


@pytest.mark.parametrize(("key", "value"), [
    ("admin_roles", "bad name!"), ("allowed_task_families", "a*b"), ("task_role_name_prefix", "a/b"),
    ("telemetry_notify_interval_seconds", "5"), ("team_roles", '["ok", 3]'),
])
def test_bad_authorization_keys_are_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        RecoveryConfig.from_context({"cluster_name": "c", key: value})


# ----------------------------------------------------------------- strict configuration
def test_misspelled_key_fails_naming_the_right_key() -> None:
    """Given -c max_recovery_attemps=3 (a typo), When parsed, Then synthesis stops with a
    "did you mean" naming max_recovery_attempts instead of deploying the default."""
    with pytest.raises(ConfigError, match=r"unknown context key 'max_recovery_attemps': "
                                          r"did you mean 'max_recovery_attempts'\?"):
        RecoveryConfig.from_context({"cluster_name": "c", "max_recovery_attemps": "3"})


@pytest.mark.parametrize(("typo", "meant"), [
    ("max-recovery-attempts", "max_recovery_attempts"), ("Alert_Email", "alert_email"),
    ("dcgm_levle", "dcgm_level"), ("heartbeat_stale_secs", "heartbeat_stale_seconds"),
    ("clustername", "cluster_name"), ("gang-workers-concurrency", "gang_worker_concurrency"),
    ("ecs_api_rate", "ecs_api_rate_per_second"),
])
def test_did_you_mean_handles_dashes_case_and_transpositions(typo: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"'{typo}': did you mean '{meant}'"):
        RecoveryConfig.from_context({"cluster_name": "c", typo: "1"})


def test_every_unknown_key_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        RecoveryConfig.from_context({"cluster_name": "c", "dcgm_levle": 2, "something_else": 1})
    message = str(caught.value)
    assert "'dcgm_levle'" in message and "'something_else': it is not an option" in message


@pytest.mark.parametrize("key", [
    "@aws-cdk/core:newStyleStackSynthesis", "@aws-cdk/aws-lambda:recognizeVersionProps",
    "aws:cdk:enable-path-metadata", "aws:cdk:bundling-stacks",
    "availability-zones:account=111122223333:region=us-east-1", "cdk-migrate",
    "acknowledged-issue-numbers", "cli-telemetry",
])
def test_cdk_own_keys_are_not_ours(key: str) -> None:
    """Given the keys the CDK toolkit and feature flags put in context, Then they pass."""
    config = RecoveryConfig.from_context({"cluster_name": "c", key: True})
    assert config.cluster_name == "c"


def test_retired_key_says_what_replaced_it() -> None:
    with pytest.raises(ConfigError, match=r"'powertools_layer_version' is no longer used.*requirements.txt"):
        RecoveryConfig.from_context({"cluster_name": "c", "powertools_layer_version": 40})


def test_app_synthesis_refuses_a_misspelled_key() -> None:
    """Given the real app with a typo in its context (as `cdk synth -c` passes it), Then
    building the app raises before any construct is made."""
    from app import build_app

    app = cdk.App(context={"cluster_name": "c", "max_recovery_attemps": "3"})
    with pytest.raises(ConfigError, match="did you mean 'max_recovery_attempts'"):
        build_app(app)


def test_app_py_prints_one_line_and_exits_1_on_a_misspelled_key() -> None:
    """Given `python app.py` run by the CDK CLI with a typo in the context, and none of jsii's
    variables that silence its Node.js banner set (as in a user's shell), Then it exits 1
    with one line naming the key (no traceback, no banner echoed as Python bytes b'!! ...'),
    before synthesizing anything."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE_WARNING")}
    env["CDK_CONTEXT_JSON"] = json.dumps({"cluster_name": "c", "max_recovery_attemps": "3"})
    result = subprocess.run([sys.executable, str(REPO_ROOT / "app.py")], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("configuration error: unknown context key 'max_recovery_attemps': did you mean "
                           "'max_recovery_attempts'?"), result.stderr


def test_a_missing_cluster_name_names_the_make_form_of_the_fix() -> None:
    """`make synth` without the cluster (as the README once listed it) says how, with make."""
    with pytest.raises(ConfigError) as refused:
        RecoveryConfig.from_context({})
    assert 'make synth CDK_ARGS="-c cluster_name=<value>"' in str(refused.value)


def test_every_field_is_one_documented_option() -> None:
    """Every RecoveryConfig field is declared with option(): one key, one default, one parser,
    one line of doc (the registry the README table, validation and "did you mean" read)."""
    import dataclasses

    from infra.config import OPTIONS

    fields = [f.name for f in dataclasses.fields(RecoveryConfig)]
    assert [o.key for o in OPTIONS] == fields == list(KNOWN_KEYS)
    for opt in OPTIONS:
        assert opt.doc and "\n" not in opt.doc and "|" not in opt.doc and len(opt.doc) <= 100, opt.key
        assert opt.required or opt.derive is not None or opt.default is None or (
            opt.parse(opt.key, opt.default if not isinstance(opt.default, tuple) else list(opt.default))
            == opt.default), f"{opt.key}: its default does not pass its own parser"


def test_parsed_defaults_are_the_dataclass_defaults() -> None:
    """The defaults come from one place: an empty context gives the dataclass's defaults."""
    assert RecoveryConfig.from_context({"cluster_name": "c"}) == RecoveryConfig(
        cluster_name="c", instance_tag_value="c")


def test_the_configuration_tables_are_generated_from_the_code() -> None:
    """docs/configuration.md's table is exactly markdown_table(), every key; the README's is
    the table of COMMON_KEYS, each a key of the registry (regenerate both: make config-docs)."""
    from infra.config import OPTIONS
    from infra.config.tables import (
        COMMON_KEYS,
        CONFIG_DOCS_PATH,
        README_PATH,
        docs_with_table,
        markdown_table,
        readme_with_table,
    )

    page = CONFIG_DOCS_PATH.read_text()
    assert docs_with_table(page) == page, "docs/configuration.md's table drifted: run make config-docs"
    table = markdown_table()
    assert table in page
    for opt in OPTIONS:
        assert f"| `{opt.key}` |" in table
    stale = page.replace("| `dcgm_level` |", "| `dcgm_levels` |")
    assert docs_with_table(stale) == page
    readme = README_PATH.read_text()
    assert readme_with_table(readme) == readme, "README configuration table drifted: run make config-docs"
    assert set(COMMON_KEYS) <= set(KNOWN_KEYS)
    common = markdown_table(COMMON_KEYS)
    assert common in readme and common.count("\n| `") == len(COMMON_KEYS)
    assert "docs/configuration.md" in readme
    assert "config-docs:" in (REPO_ROOT / "Makefile").read_text()


def test_spare_nodes_is_a_count_or_a_percentage_of_the_gpu_nodes() -> None:
    """Issue 19's hot spares: ``2`` (cdk.json number or -c text) or ``5%``, normalised."""
    for raw, parsed in ((2, "2"), ("2", "2"), ("5%", "5%"), (" 2.5 % ", "2.5%"), ("0", "0")):
        assert RecoveryConfig.from_context({"cluster_name": "c", "spare_nodes": raw}).spare_nodes == parsed
