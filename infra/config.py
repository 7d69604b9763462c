"""Deployment configuration, read from CDK context and validated once.

Every option can be set in ``cdk.json`` (``"context"``) or on the command line
(``cdk synth -c key=value``). Values given with ``-c`` arrive as strings, values in
``cdk.json`` as JSON types; both are accepted. A bad value raises ``ConfigError``
naming the key.

Options (key: default -- meaning):

- cluster_name: required -- existing ECS cluster whose GPU training jobs are guarded
- alert_email: none -- e-mail address subscribed to the alert topic
- health_check_family: ``gpu-health-check`` -- family of the DCGM health-check task definition
- health_check_task_arn: none -- use your own health-check task definition (none is created)
- health_check_image: DEFAULT_HEALTH_CHECK_IMAGE -- NVIDIA DCGM image of the health check
- dcgm_level: 2 -- ``dcgmi diag -r`` level, 1..4
- health_check_gpus: 8 -- GPUs the health-check task reserves, 1..16
- max_infra_recoveries: 3 -- a job's infrastructure recoveries (node faults fixed by a
  reboot or a move to healthy nodes), 0..20; a queue job's JobSpec or a tag-registered
  job's ``gpu-recovery:max-infra-recoveries`` tag overrides it
- max_recovery_attempts: -- older name of max_infra_recoveries (kept for existing deployments)
- max_app_restarts: 0 -- a job's restarts after an application error, 0..20 (0: the job fails)
- suspect_exit_codes: ``[1]`` -- exit codes meaning "suspected GPU fault" (JSON list or
  comma string, each 1..255)
- reboot_timeout_minutes: 30 -- an instance must be back within, 1..1440
- health_check_timeout_minutes: 30 -- a health check must finish within, 1..1440
- table_removal_policy: ``retain`` -- ``retain`` or ``destroy`` for the DynamoDB tables
- instance_tag_key: ``gpu-recovery:cluster`` -- tag on the cluster's GPU instances; the
  reboot / SSM permissions are conditioned on it
- instance_tag_value: = cluster_name -- value of that tag
- lambda_architecture: ``x86_64`` -- ``x86_64`` or ``arm64``
- powertools_layer_version: POWERTOOLS_LAYER_VERSION -- version of the public Powertools layer

Node heartbeats, the REST API and the job queue:

- heartbeat_stale_seconds: 180 -- a rank whose node sent no report for longer is marked
  NODE_LOST by the heartbeat sweep, 60..86400 (the node agent reports every 30 s)
- node_lost_fail_seconds: 1800 -- a rank NODE_LOST for longer is handed to the recovery
  loop (suspected node fault); 0 disables, else 60..604800
- hang_seconds: 0 -- a rank whose training step has not advanced for longer while its node
  keeps reporting is HUNG; 0 disables hang detection, else 60..604800
- hang_action: ``notify`` -- on a hang: ``notify`` (alert only) or ``recover`` (recovery loop)
- api_throttle_rate: 1000 -- steady-state requests/s of the API stage (all routes), 1..10000
  (10,000 nodes reporting every 30 s send ~667/s)
- api_throttle_burst: 2000 -- burst requests of the API stage, 1..5000
- node_agent_daemon: false -- also deploy the GPU node agent as an ECS DAEMON service on the
  cluster (``infra/node_agent.py``; each host needs its node token file)
- training_log_groups: ``["/ecs/*"]`` -- CloudWatch log groups (names or ``*`` patterns) the
  jobs API may read training logs from (JSON list or comma string)

Remediation (fault catalog, escalation, blast-radius breaker, observe mode, relocation;
docs/remediation.md):

- fault_catalog_file: none -- a JSON or YAML override of the shipped fault catalog (path,
  relative to the CDK app), merged and validated at synth: a bad file fails ``cdk synth``
  with the validator's messages (rule and field)
- remediation_mode: ``enforce`` -- ``enforce`` or ``observe``, with per-effect exceptions
  (``enforce,reboot=observe``; effects stop_tasks, health_check, reboot, drain, terminate,
  restart_job)
- replace_action: ``quarantine`` -- ``quarantine`` (drain + notify) or ``terminate_in_asg``
  (TerminateInstanceInAutoScalingGroup, capacity kept; ECS Anywhere nodes are quarantined)
- reboots_before_replace: 2 -- reboots for one cause on a node before its next fault replaces it
- reboot_window_hours: 72 -- the window of those reboots
- max_remediations: 5 -- remediations of a node after which it is quarantined and an operator paged
- remediation_window_days: 7 -- the window of those remediations
- breaker_enabled: true -- the blast-radius breaker
- breaker_max_percent: 20 -- share of the cluster's GPU nodes acted on per window before it trips
- breaker_max_nodes: none -- an absolute cap per window as well
- breaker_window_minutes: 10 -- the breaker's sliding window
- relocate_instead_of_wait: false -- move a relocatable job to healthy free nodes as soon as a
  fault is confirmed, instead of waiting for its node's reboot
Authorization of the jobs API and telemetry limits (docs/security.md):

- admin_roles: ``[]`` -- IAM role names (or principal ARNs) that read, list and cancel every
  job, tag-registered ones included
- team_roles: ``[]`` -- IAM role names whose sessions share the jobs submitted under the role
- allowed_task_families: ``["*"]`` -- task-definition families that may be submitted (names,
  or prefixes ending in ``*``); the health-check family is never allowed
- task_role_name_prefix: ``gpu-training-`` -- ``iam:PassRole`` (and job submission) only for
  task / execution roles whose name starts with this; the stack's own health-check roles
  are added by ARN
- reserved_priority_roles: ``[]`` -- IAM role names that may submit at VERY_HIGH and
  EXTREME_HIGH (admins may too)
- telemetry_notify_interval_seconds: 3600 -- at most one hardware-signal e-mail per node and
  signal kind per interval, 60..86400
- telemetry_signal_retention_seconds: 604800 -- a stored hardware signal not seen for this
  long is forgotten, 3600..31536000
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_recovery.constants import DEFAULT_HEALTH_CHECK_FAMILY
from gpu_recovery.domain.fault_catalog import CatalogError, load_catalog, read_catalog_file
from gpu_recovery.domain.job_budgets import DEFAULT_MAX_APP_RESTARTS, DEFAULT_MAX_INFRA_RECOVERIES, MAX_BUDGET
from gpu_recovery.domain.remediation_settings import SETTINGS as REMEDIATION_DEFAULTS
from gpu_recovery.domain.remediation_settings import parse_remediation_settings

# Public layer AWSLambdaPowertoolsPythonV3-python312-<arch>:<version> (account 017000801446).
# Intended to carry Powertools 3.37.0 (requirements.txt pins the same version for tests).
# Verify with: aws ssm get-parameter --name /aws/service/powertools/python/x86_64/python3.12/3.37.0
POWERTOOLS_LAYER_ACCOUNT = "017000801446"
POWERTOOLS_LAYER_VERSION = 40
DEFAULT_HEALTH_CHECK_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
DEFAULT_INSTANCE_TAG_KEY = "gpu-recovery:cluster"

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TASK_DEF_ARN_RE = re.compile(
    r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task-definition/[A-Za-z0-9_-]{1,255}(:\d+)?$"
)
_TAG_KEY_RE = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
_TAG_VALUE_RE = re.compile(r"^[\w.:/=+\-@ ]{0,256}$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")

KNOWN_KEYS = (
    "cluster_name",
    "alert_email",
    "health_check_family",
    "health_check_task_arn",
    "health_check_image",
    "dcgm_level",
    "health_check_gpus",
    "max_recovery_attempts",
    "suspect_exit_codes",
    "reboot_timeout_minutes",
    "health_check_timeout_minutes",
    "table_removal_policy",
    "instance_tag_key",
    "instance_tag_value",
    "lambda_architecture",
    "powertools_layer_version",
    "heartbeat_stale_seconds",
    "node_lost_fail_seconds",
    "hang_seconds",
    "hang_action",
    "api_throttle_rate",
    "api_throttle_burst",
    "node_agent_daemon",
    "training_log_groups",
    "admin_roles",
    "team_roles",
    "allowed_task_families",
    "task_role_name_prefix",
    "reserved_priority_roles",
    "telemetry_notify_interval_seconds",
    "telemetry_signal_retention_seconds",
    "max_infra_recoveries",
    "max_app_restarts",
    "fault_catalog_file",
    "remediation_mode",
    "replace_action",
    "reboots_before_replace",
    "reboot_window_hours",
    "max_remediations",
    "remediation_window_days",
    "breaker_enabled",
    "breaker_max_percent",
    "breaker_max_nodes",
    "breaker_window_minutes",
    "relocate_instead_of_wait",
)
# Context keys handed to the functions as REMEDIATION_SETTINGS (domain.remediation_settings).
REMEDIATION_KEYS = (
    "remediation_mode", "replace_action", "reboots_before_replace", "reboot_window_hours",
    "max_remediations", "remediation_window_days", "breaker_enabled", "breaker_max_percent",
    "breaker_max_nodes", "breaker_window_minutes",
)

HANG_ACTIONS = ("notify", "recover")
DEFAULT_TRAINING_LOG_GROUPS = ("/ecs/*",)
# CloudWatch Logs group names: 1-512 of [.-_/#A-Za-z0-9]; '*' allowed as an IAM wildcard.
_LOG_GROUP_RE = re.compile(r"^[.\-_/#A-Za-z0-9*]{1,512}$")
DEFAULT_TASK_ROLE_PREFIX = "gpu-training-"
# An IAM role / user name, or a principal ARN.
_PRINCIPAL_RE = re.compile(r"^([\w+=,.@-]{1,64}|arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]{1,512})$")
_FAMILY_RE = re.compile(r"^[A-Za-z0-9_-]{0,255}\*?$")
_ROLE_PREFIX_RE = re.compile(r"^[\w+=,.@-]{1,64}$")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class ConfigError(ValueError):
    """A context value is missing or invalid; the message names the key."""


@dataclass(frozen=True)
class RecoveryConfig:
    cluster_name: str
    alert_email: str | None = None
    health_check_family: str = DEFAULT_HEALTH_CHECK_FAMILY
    health_check_task_arn: str | None = None
    health_check_image: str = DEFAULT_HEALTH_CHECK_IMAGE
    dcgm_level: int = 2
    health_check_gpus: int = 8
    max_recovery_attempts: int = DEFAULT_MAX_INFRA_RECOVERIES  # infrastructure recoveries
    max_app_restarts: int = DEFAULT_MAX_APP_RESTARTS
    suspect_exit_codes: tuple[int, ...] = (1,)
    reboot_timeout_minutes: int = 30
    health_check_timeout_minutes: int = 30
    table_removal_policy: str = "retain"
    instance_tag_key: str = DEFAULT_INSTANCE_TAG_KEY
    instance_tag_value: str = ""  # filled with cluster_name by from_context
    lambda_architecture: str = "x86_64"
    powertools_layer_version: int = POWERTOOLS_LAYER_VERSION
    heartbeat_stale_seconds: int = 180
    node_lost_fail_seconds: int = 1800  # 0 disables
    hang_seconds: int = 0  # 0 disables
    hang_action: str = "notify"
    api_throttle_rate: float = 1000.0
    api_throttle_burst: int = 2000
    node_agent_daemon: bool = False
    training_log_groups: tuple[str, ...] = DEFAULT_TRAINING_LOG_GROUPS
    # Remediation: the validated settings (REMEDIATION_SETTINGS), the catalog override (its
    # file and its validated document), relocation.
    remediation: tuple[tuple[str, str], ...] = ()
    fault_catalog_file: str | None = None
    fault_catalog_override: str | None = None  # the override as JSON text (validated)
    relocate_instead_of_wait: bool = False

    @property
    def remediation_settings_json(self) -> str:
        return json.dumps(dict(self.remediation), sort_keys=True)
    admin_roles: tuple[str, ...] = ()
    team_roles: tuple[str, ...] = ()
    allowed_task_families: tuple[str, ...] = ("*",)
    task_role_name_prefix: str = DEFAULT_TASK_ROLE_PREFIX
    reserved_priority_roles: tuple[str, ...] = ()
    telemetry_notify_interval_seconds: int = 3600
    telemetry_signal_retention_seconds: int = 604_800

    @property
    def creates_health_check_task(self) -> bool:
        return self.health_check_task_arn is None

    @property
    def suspect_exit_codes_json(self) -> str:
        return json.dumps(list(self.suspect_exit_codes))

    @classmethod
    def from_context(cls, get: Callable[[str], Any] | Mapping[str, Any]) -> RecoveryConfig:
        """Build from CDK context: pass ``node.try_get_context`` or a plain mapping."""
        getter: Callable[[str], Any] = get.get if isinstance(get, Mapping) else get

        def raw(key: str) -> Any:
            value = getter(key)
            if isinstance(value, str):
                value = value.strip()
                if value == "":
                    return None
            return value

        cluster_name = raw("cluster_name")
        if cluster_name is None:
            raise ConfigError(
                "context key 'cluster_name' is required: the name of the existing ECS "
                "cluster to protect (cdk synth -c cluster_name=<name>)"
            )
        cluster_name = _match(
            "cluster_name", cluster_name, _NAME_RE, "1-255 letters, digits, - or _"
        )

        alert_email = raw("alert_email")
        if alert_email is not None:
            alert_email = _match("alert_email", alert_email, _EMAIL_RE, "an e-mail address")

        task_arn = raw("health_check_task_arn")
        if task_arn is not None:
            task_arn = _match(
                "health_check_task_arn",
                task_arn,
                _TASK_DEF_ARN_RE,
                "an ECS task definition ARN "
                "(arn:aws:ecs:<region>:<account>:task-definition/<family>[:<revision>])",
            )

        removal = raw("table_removal_policy")
        removal = "retain" if removal is None else str(removal).lower()
        if removal not in ("retain", "destroy"):
            raise ConfigError(
                f"context key 'table_removal_policy' must be 'retain' or 'destroy', got {removal!r}"
            )

        arch = raw("lambda_architecture")
        arch = "x86_64" if arch is None else str(arch).lower()
        if arch not in ("x86_64", "arm64"):
            raise ConfigError(
                f"context key 'lambda_architecture' must be 'x86_64' or 'arm64', got {arch!r}"
            )

        tag_key = raw("instance_tag_key") or DEFAULT_INSTANCE_TAG_KEY
        tag_key = _match("instance_tag_key", tag_key, _TAG_KEY_RE, "a valid tag key (1-128 chars)")
        if tag_key.lower().startswith("aws:"):
            raise ConfigError("context key 'instance_tag_key' must not start with 'aws:'")
        tag_value = raw("instance_tag_value")
        tag_value = cluster_name if tag_value is None else str(tag_value)
        tag_value = _match("instance_tag_value", tag_value, _TAG_VALUE_RE, "a valid tag value")

        catalog_file, catalog_override = _fault_catalog(raw("fault_catalog_file"))

        hang_action = raw("hang_action")
        hang_action = "notify" if hang_action is None else str(hang_action).lower()
        if hang_action not in HANG_ACTIONS:
            raise ConfigError(
                f"context key 'hang_action' must be 'notify' or 'recover', got {hang_action!r}"
            )

        return cls(
            cluster_name=cluster_name,
            alert_email=alert_email,
            health_check_family=_match(
                "health_check_family",
                raw("health_check_family") or DEFAULT_HEALTH_CHECK_FAMILY,
                _NAME_RE,
                "1-255 letters, digits, - or _",
            ),
            health_check_task_arn=task_arn,
            health_check_image=_match(
                "health_check_image",
                raw("health_check_image") or DEFAULT_HEALTH_CHECK_IMAGE,
                _IMAGE_RE,
                "a container image reference",
            ),
            dcgm_level=_int("dcgm_level", raw("dcgm_level"), 2, 1, 4),
            health_check_gpus=_int("health_check_gpus", raw("health_check_gpus"), 8, 1, 16),
            max_recovery_attempts=_infra_budget(raw("max_infra_recoveries"), raw("max_recovery_attempts")),
            max_app_restarts=_int("max_app_restarts", raw("max_app_restarts"), DEFAULT_MAX_APP_RESTARTS, 0,
                                  MAX_BUDGET),
            suspect_exit_codes=_exit_codes(raw("suspect_exit_codes")),
            reboot_timeout_minutes=_int(
                "reboot_timeout_minutes", raw("reboot_timeout_minutes"), 30, 1, 1440
            ),
            health_check_timeout_minutes=_int(
                "health_check_timeout_minutes", raw("health_check_timeout_minutes"), 30, 1, 1440
            ),
            table_removal_policy=removal,
            instance_tag_key=tag_key,
            instance_tag_value=tag_value,
            lambda_architecture=arch,
            powertools_layer_version=_int(
                "powertools_layer_version",
                raw("powertools_layer_version"),
                POWERTOOLS_LAYER_VERSION,
                1,
                10_000,
            ),
            heartbeat_stale_seconds=_int(
                "heartbeat_stale_seconds", raw("heartbeat_stale_seconds"), 180, 60, 86_400
            ),
            node_lost_fail_seconds=_int_or_zero(
                "node_lost_fail_seconds", raw("node_lost_fail_seconds"), 1800, 60, 604_800
            ),
            hang_seconds=_int_or_zero("hang_seconds", raw("hang_seconds"), 0, 60, 604_800),
            hang_action=hang_action,
            api_throttle_rate=_number(
                "api_throttle_rate", raw("api_throttle_rate"), 1000.0, 1, 10_000
            ),
            api_throttle_burst=_int(
                "api_throttle_burst", raw("api_throttle_burst"), 2000, 1, 5000
            ),
            node_agent_daemon=_bool("node_agent_daemon", raw("node_agent_daemon"), False),
            training_log_groups=_log_groups(raw("training_log_groups")),
            remediation=_remediation(raw),
            fault_catalog_file=catalog_file,
            fault_catalog_override=catalog_override,
            relocate_instead_of_wait=_bool("relocate_instead_of_wait", raw("relocate_instead_of_wait"),
                                           False),
            admin_roles=_names("admin_roles", raw("admin_roles"), _PRINCIPAL_RE),
            team_roles=_names("team_roles", raw("team_roles"), _PRINCIPAL_RE),
            allowed_task_families=_names("allowed_task_families", raw("allowed_task_families"),
                                         _FAMILY_RE, ("*",)),
            task_role_name_prefix=_match("task_role_name_prefix",
                                         raw("task_role_name_prefix") or DEFAULT_TASK_ROLE_PREFIX,
                                         _ROLE_PREFIX_RE, "1-64 characters of an IAM role name"),
            reserved_priority_roles=_names("reserved_priority_roles", raw("reserved_priority_roles"),
                                           _PRINCIPAL_RE),
            telemetry_notify_interval_seconds=_int(
                "telemetry_notify_interval_seconds", raw("telemetry_notify_interval_seconds"),
                3600, 60, 86_400),
            telemetry_signal_retention_seconds=_int(
                "telemetry_signal_retention_seconds", raw("telemetry_signal_retention_seconds"),
                604_800, 3600, 31_536_000),
        )


def _infra_budget(value: Any, legacy: Any) -> int:
    infra = _int("max_infra_recoveries", value, DEFAULT_MAX_INFRA_RECOVERIES, 0, MAX_BUDGET)
    if legacy is None:
        return infra
    older = _int("max_recovery_attempts", legacy, DEFAULT_MAX_INFRA_RECOVERIES, 0, MAX_BUDGET)
    if value is not None and older != infra:
        raise ConfigError("context keys 'max_infra_recoveries' and 'max_recovery_attempts' (its older name) "
                          f"disagree ({infra} and {older}): give one of them")
    return older


def _remediation(raw: Callable[[str], Any]) -> tuple[tuple[str, str], ...]:
    """The remediation settings given, validated together (every bad key named)."""
    given: dict[str, str] = {}
    for key in REMEDIATION_KEYS:
        value = raw(key)
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, dict):
            value = json.dumps(value)
        given[key] = str(value)
    try:
        parse_remediation_settings(given)
    except ValueError as error:
        message = str(error).removeprefix("remediation settings: ")
        raise ConfigError(f"remediation context key(s): {message}") from error
    # Every key, given or default: the functions' settings say exactly what was deployed.
    return tuple(sorted({**{k: REMEDIATION_DEFAULTS[k][0] for k in REMEDIATION_KEYS}, **given}.items()))


def _fault_catalog(value: Any) -> tuple[str | None, str | None]:
    """The override file, merged onto the shipped catalog and validated now (synth), as JSON."""
    if value is None:
        return None, None
    if not isinstance(value, str):
        raise ConfigError("context key 'fault_catalog_file' must be a path to a JSON or YAML file, "
                          f"got {value!r}")
    from infra import REPO_ROOT

    path = Path(value)
    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / value
    try:
        document = read_catalog_file(path)
        load_catalog(None, override=document)
    except CatalogError as error:
        problems = "\n  ".join(error.errors)
        raise ConfigError(f"context key 'fault_catalog_file' ({value}): the fault catalog is invalid:\n  "
                          f"{problems}") from error
    return value, json.dumps(document, sort_keys=True)


def _match(key: str, value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ConfigError(f"context key {key!r} must be {what}, got {value!r}")
    return value


def _int(key: str, value: Any, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool):
        raise ConfigError(f"context key {key!r} must be an integer {low}..{high}, got {value!r}")
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ConfigError(
                f"context key {key!r} must be an integer {low}..{high}, got {value!r}"
            )
        value = int(value)
    if not isinstance(value, int):
        raise ConfigError(f"context key {key!r} must be an integer {low}..{high}, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"context key {key!r} must be between {low} and {high}, got {value}")
    return value


def _int_or_zero(key: str, value: Any, default: int, low: int, high: int) -> int:
    """0 (disabled) or an integer ``low..high``."""
    number = _int(key, value, default, 0, high)
    if 0 < number < low:
        raise ConfigError(
            f"context key {key!r} must be 0 (disabled) or between {low} and {high}, got {number}"
        )
    return number


def _number(key: str, value: Any, default: float, low: float, high: float) -> float:
    if value is None:
        return default
    hint = f"context key {key!r} must be a number {low:g}..{high:g}, got {value!r}"
    if isinstance(value, bool):
        raise ConfigError(hint)
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", value):
            raise ConfigError(hint)
        value = float(value)
    if not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(hint)
    return float(value)


def _bool(key: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"context key {key!r} must be true or false, got {value!r}")


def _log_groups(value: Any) -> tuple[str, ...]:
    key = "training_log_groups"
    hint = 'a JSON list or comma-separated list of log group names or patterns, e.g. ["/ecs/*"]'
    if value is None:
        return DEFAULT_TRAINING_LOG_GROUPS
    items: Any = value
    if isinstance(value, str):
        if value.startswith("["):
            try:
                items = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}") from exc
        else:
            items = [part.strip() for part in value.split(",")]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
    groups: list[str] = []
    for item in items:
        if not isinstance(item, str) or not _LOG_GROUP_RE.match(item) or item.strip("*/") == "":
            raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
        if item not in groups:
            groups.append(item)
    return tuple(groups)


def _exit_codes(value: Any) -> tuple[int, ...]:
    key = "suspect_exit_codes"
    hint = "a JSON list or comma-separated list of exit codes 1..255, e.g. [1] or 1,134"
    if value is None:
        return (1,)
    items: Any = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}") from exc
        else:
            items = [part.strip() for part in text.split(",")]
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
    codes: list[int] = []
    for item in items:
        if isinstance(item, str) and re.fullmatch(r"\d+", item):
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 255:
            raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
        if item not in codes:
            codes.append(item)
    return tuple(codes)


def _names(key: str, value: Any, pattern: re.Pattern[str],
           default: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A JSON list or comma-separated list of names matching ``pattern``."""
    if value is None:
        return default
    hint = f'context key {key!r} must be a JSON list or comma-separated list of names, got {value!r}'
    items: Any = value
    if isinstance(value, str):
        try:
            items = json.loads(value) if value.startswith("[") else [v.strip() for v in value.split(",")]
        except json.JSONDecodeError as exc:
            raise ConfigError(hint) from exc
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(hint)
    names = tuple(dict.fromkeys(i for i in items if i))
    for name in names:
        if not pattern.match(name) or name == "":
            raise ConfigError(f"context key {key!r}: {name!r} is not a valid entry")
    return names
