"""Deployment configuration: one declarative registry of this app's CDK context keys.

Every key is one field of :class:`RecoveryConfig`, declared with :func:`option`: its
default, its parser (type and accepted values) and a one-line doc. From these fields come

* validation (``RecoveryConfig.from_context``): a bad value raises ``ConfigError`` naming
  the key; a key that is not ours fails with a "did you mean" suggestion;
* the configuration tables: every key in docs/configuration.md, the keys most deployments
  set (``COMMON_KEYS``) in the README (:func:`markdown_table`; ``make config-docs`` rewrites
  both, a test fails when either drifts).

To add a key: add one field with ``option(...)`` (a test checks that every field is one).
Values given with ``-c key=value`` arrive as strings, values in ``cdk.json`` as JSON
types; both are accepted. CDK's own keys (``@aws-cdk/...``, ``aws:cdk:...``, ``cdk-...``,
context lookups such as ``availability-zones:...``) are not ours and are left alone.

``python -m infra.config`` prints the full table; ``--write-docs`` updates both tables
(``tables``). What each key accepts: ``parsers``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gpu_recovery.constants import (
    DEADLINE_SHARDS_MAX,
    DEFAULT_GANG_WORKER_CONCURRENCY,
    DEFAULT_HEALTH_CHECK_FAMILY,
    REGISTRATION_MODES,
)
from gpu_recovery.domain.breaker.hold import DEFAULT_HELD_JOB_DEADLINE_SECONDS, MAX_HELD_JOB_DEADLINE_SECONDS
from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS, START_BATCH_RANKS
from gpu_recovery.domain.job_budgets import DEFAULT_MAX_APP_RESTARTS, DEFAULT_MAX_INFRA_RECOVERIES, MAX_BUDGET
from gpu_recovery.domain.preflight.baseline import DEFAULT_MIN_USERS, DEFAULT_SLOW_FRACTION, MAX_USERS
from gpu_recovery.domain.preflight.settings import (
    DEFAULT_MIN_NODES,
    DEFAULT_ROUND_SECONDS,
    MAX_MIN_NODES,
    MAX_ROUND_SECONDS,
    MIN_ROUND_SECONDS,
    parse_preflight_settings,
)
from gpu_recovery.domain.rate_limit import DEFAULT_BURST as DEFAULT_ECS_API_BURST
from gpu_recovery.domain.rate_limit import DEFAULT_RATE as DEFAULT_ECS_API_RATE
from gpu_recovery.domain.rate_limit import ECS_ACCOUNT_BURST, ECS_ACCOUNT_RATE
from gpu_recovery.domain.relocation import DEFAULT_RELOCATION_WAIT_SECONDS, MAX_RELOCATION_WAIT_SECONDS
from gpu_recovery.domain.remediation_settings import SETTINGS as REMEDIATION_DEFAULTS
from gpu_recovery.domain.remediation_settings import parse_remediation_settings
from gpu_recovery.domain.time_sharing import (
    DEFAULT_DEMOTE_AFTER_SECONDS,
    DEFAULT_SUSPEND_GRACE_SECONDS,
    MAX_SUSPEND_GRACE_SECONDS,
    MIN_SUSPEND_GRACE_SECONDS,
)
from gpu_recovery.domain.validation import MAX_LOAD_SECONDS as MAX_VALIDATION_LOAD_SECONDS
from gpu_recovery.domain.validation import MAX_TIMEOUT_SECONDS as MAX_VALIDATION_TIMEOUT_SECONDS
from gpu_recovery.domain.validation import ValidationError, ValidationPolicy
from gpu_recovery.settings import DEFAULT_HEALTH_CHECKS_IN_FLIGHT, DEFAULT_HEALTH_CHECKS_PER_JOB
from infra.catalog_file import read_catalog_document
from infra.config.parsers import (
    ConfigError,
    Parser,
    boolean,
    catalog_file,
    choice,
    exit_codes,
    instance_tag_key,
    integer,
    log_groups,
    names,
    node_quotas,
    number,
    preflight_floors,
    remediation_setting,
    resolve_catalog_path,
    spare_count,
    task_networks,
    text,
)

VALIDATION_DEFAULTS = ValidationPolicy(enabled=True)
DEFAULT_HEALTH_CHECK_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
# Any image with Python 3.8+ runs the agent (its source is the container command).
DEFAULT_NODE_AGENT_IMAGE = "public.ecr.aws/docker/library/python:3.12-slim"
DEFAULT_INSTANCE_TAG_KEY = "gpu-recovery:cluster"
DEFAULT_TRAINING_LOG_GROUPS = ("/ecs/*",)
DEFAULT_TASK_ROLE_PREFIX = "gpu-training-"
HANG_ACTIONS = ("notify", "recover")
MAX_HEALTH_CHECKS = 10_000

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TASK_DEF_ARN_RE = re.compile(
    r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task-definition/[A-Za-z0-9_-]{1,255}(:\d+)?$"
)
_TAG_VALUE_RE = re.compile(r"^[\w.:/=+\-@ ]{0,256}$")
_IMAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
# An IAM role / user name, or a principal ARN.
_PRINCIPAL_RE = re.compile(r"^([\w+=,.@-]{1,64}|arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]{1,512})$")
_FAMILY_RE = re.compile(r"^[A-Za-z0-9_-]{0,255}\*?$")
_ROLE_PREFIX_RE = re.compile(r"^[\w+=,.@-]{1,64}$")

# Keys this app once read; setting one fails synthesis with what replaced it.
RETIRED_KEYS = {
    "powertools_layer_version": (
        "the Powertools layer is no longer chosen by number: the stack resolves the layer of "
        "the exact version pinned in requirements.txt from its public SSM parameter"
    ),
}
# Context keys of the CDK toolkit that look like ours (no '@', ':' or 'cdk' prefix):
# ``cdk acknowledge`` and ``cdk cli-telemetry --disable`` write them to cdk.context.json.
_TOOLKIT_KEYS = frozenset({"acknowledged-issue-numbers", "cli-telemetry"})

# Context keys handed to the functions as REMEDIATION_SETTINGS (domain.remediation_settings
# validates them: one source of truth for their bounds).
REMEDIATION_KEYS = (
    "remediation_mode", "replace_action", "reboots_before_replace", "reboot_window_hours",
    "max_remediations", "remediation_window_days", "breaker_enabled", "breaker_max_percent",
    "breaker_max_nodes", "breaker_window_minutes", "breaker_auto_close", "cordon_max_percent", "gpu_reset",
    "warning_checkpoint_seconds",
)




# --------------------------------------------------------------------------- registry
REQUIRED: Any = object()  # sentinel: the key has no default


@dataclass(frozen=True)
class Option:
    """One context key: what ``option()`` records in its field's metadata."""

    key: str
    default: Any
    parse: Parser
    doc: str
    default_text: str | None = None
    derive: Callable[[Mapping[str, Any]], Any] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.required:
            return "required"
        if self.default is None:
            return "none"
        value = list(self.default) if isinstance(self.default, tuple) else self.default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def option(default: Any, parse: Parser, doc: str, *, default_text: str | None = None,
           derive: Callable[[Mapping[str, Any]], Any] | None = None) -> Any:
    """A :class:`RecoveryConfig` field that is a context key.

    ``default``: the value when the key is absent (``REQUIRED``: no default); ``derive``
    computes it from the keys parsed before instead (then say so in ``default_text``).
    ``doc``: one line for the configuration tables (the key's meaning, not its accepted values,
    which come from ``parse``).
    """
    meta = {"option": (default, parse, doc, default_text, derive)}
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class RecoveryConfig:
    # --- the cluster and the recovery loop
    cluster_name: str = option(REQUIRED, text(_NAME_RE, "1-255 letters, digits, - or _", "cluster name"),
                               "the existing ECS cluster to guard")
    alert_email: str | None = option(None, text(_EMAIL_RE, "an e-mail address", "e-mail address"),
                                     "subscribed to the operator SNS topic")
    health_check_family: str = option(
        DEFAULT_HEALTH_CHECK_FAMILY, text(_NAME_RE, "1-255 letters, digits, - or _", "family name"),
        "family of the health-check task definition the stack creates")
    health_check_task_arn: str | None = option(
        None, text(_TASK_DEF_ARN_RE, "an ECS task definition ARN "
                   "(arn:aws:ecs:<region>:<account>:task-definition/<family>[:<revision>])",
                   "task definition ARN"),
        "your own health-check task definition (same contract); none is created")
    health_check_image: str = option(DEFAULT_HEALTH_CHECK_IMAGE,
                                     text(_IMAGE_RE, "a container image reference", "image reference"),
                                     "NVIDIA DCGM image of the health check")
    dcgm_level: int = option(2, integer(1, 4), "`dcgmi diag -r` level (1 quick, 2 ~2 min, 3 ~15 min)")
    health_check_gpus: int = option(8, integer(1, 16), "GPUs the health-check task reserves (a whole node)")
    max_infra_recoveries: int = option(
        DEFAULT_MAX_INFRA_RECOVERIES, integer(0, MAX_BUDGET),
        "a job's infrastructure recoveries (reboot or move) before it fails")
    max_recovery_attempts: int = option(
        DEFAULT_MAX_INFRA_RECOVERIES, integer(0, MAX_BUDGET),
        "older name of `max_infra_recoveries`",
        default_text="`max_infra_recoveries`", derive=lambda values: values["max_infra_recoveries"])
    max_app_restarts: int = option(DEFAULT_MAX_APP_RESTARTS, integer(0, MAX_BUDGET),
                                   "a job's restarts after an application error (0: the job fails)")
    health_check_all_nodes: bool = option(
        False, boolean(), "on a GPU fault, check every node of the job, not only the first exits and nodes "
                          "with evidence")
    suspect_exit_codes: tuple[int, ...] = option(
        (1,), exit_codes(), "exit codes meaning a suspected GPU fault (JSON list or `1,134`)")
    reboot_timeout_minutes: int = option(
        30, integer(1, 1440), "a node must be back within this of its reboot (of the request if never "
                              "sent), else quarantine")
    health_check_timeout_minutes: int = option(30, integer(1, 1440),
                                               "a health check must start and finish within this")
    table_removal_policy: str = option("retain", choice("retain", "destroy"),
                                       "what stack deletion does to the DynamoDB tables")
    instance_tag_key: str = option(DEFAULT_INSTANCE_TAG_KEY, Parser(instance_tag_key, "tag key, not `aws:`"),
                                   "tag on the GPU instances: only tagged ones may be rebooted")
    instance_tag_value: str = option(
        "", text(_TAG_VALUE_RE, "a valid tag value", "tag value"), "value of that tag",
        default_text="cluster name", derive=lambda values: values["cluster_name"])
    lambda_architecture: str = option("x86_64", choice("x86_64", "arm64"), "CPU architecture of the Lambdas")
    # --- node heartbeats, the REST API and the job queue
    heartbeat_stale_seconds: int = option(180, integer(60, 86_400),
                                          "a rank silent this long is NODE_LOST; also the least gap "
                                          "between a lost node's two ECS reads")
    node_lost_fail_seconds: int = option(1800, integer(60, 604_800, zero_disables=True),
                                         "NODE_LOST this long goes to the recovery loop (0: never)")
    hang_seconds: int = option(0, integer(60, 604_800, zero_disables=True),
                               "a rank whose `step` stalls this long while reporting is HUNG (0: off)")
    hang_action: str = option("notify", choice(*HANG_ACTIONS),
                              "on a hang: alert only, or hand the job to the recovery loop")
    api_throttle_rate: float = option(1000.0, number(1, 10_000), "API stage steady-state requests/s")
    api_throttle_burst: int = option(2000, integer(1, 5000), "API stage burst requests")
    node_agent_daemon: bool = option(False, boolean(), "also deploy the node agent as an ECS daemon service")
    node_agent_image: str = option(DEFAULT_NODE_AGENT_IMAGE,
                                   text(_IMAGE_RE, "a container image reference", "image reference"),
                                   "its image (Python 3.8+)", default_text="`python:3.12-slim` (ECR Public)")
    training_log_groups: tuple[str, ...] = option(
        DEFAULT_TRAINING_LOG_GROUPS, log_groups(), "log groups the jobs API may read training logs from")
    # --- authorization of the jobs API and telemetry (docs/security.md)
    admin_roles: tuple[str, ...] = option((), names(_PRINCIPAL_RE, "IAM role names / ARNs"),
                                          "roles that read, list and cancel every job")
    team_roles: tuple[str, ...] = option((), names(_PRINCIPAL_RE, "IAM role names / ARNs"),
                                         "roles whose sessions share the jobs submitted under the role")
    allowed_task_families: tuple[str, ...] = option(
        ("*",), names(_FAMILY_RE, "families or `prefix*`"),
        "task-definition families that may be submitted")
    task_role_name_prefix: str = option(
        DEFAULT_TASK_ROLE_PREFIX, text(_ROLE_PREFIX_RE, "1-64 characters of an IAM role name",
                                       "role name prefix"),
        "`iam:PassRole` only for job roles named with this prefix")
    reserved_priority_roles: tuple[str, ...] = option(
        (), names(_PRINCIPAL_RE, "IAM role names / ARNs"),
        "roles that may submit at VERY_HIGH / EXTREME_HIGH")
    allowed_task_networks: str = option(
        "[]", task_networks(),
        "subnets and security groups a job's `network` may name, optionally per principal",
        default_text="none (a job naming a network is refused)")
    telemetry_notify_interval_seconds: int = option(
        3600, integer(60, 86_400), "at most one hardware-signal e-mail per node and kind per interval")
    telemetry_signal_retention_seconds: int = option(
        604_800, integer(3600, 31_536_000), "a hardware signal not seen this long is forgotten")
    # --- remediation (docs/remediation.md)
    fault_catalog_file: str | None = option(
        None, catalog_file(), "fault-catalog override, validated at synth")
    remediation_mode: str = option(
        REMEDIATION_DEFAULTS["remediation_mode"][0],
        remediation_setting("`enforce` / `observe`[,effect=mode]"),
        "act, or only record what would be done (per effect)")
    replace_action: str = option(
        REMEDIATION_DEFAULTS["replace_action"][0], remediation_setting("`quarantine` / `terminate_in_asg`"),
        "replacing a node: drain it, or terminate it in its Auto Scaling group")
    reboots_before_replace: str = option(
        REMEDIATION_DEFAULTS["reboots_before_replace"][0], remediation_setting("integer"),
        "reboots for one cause before the next fault replaces the node")
    reboot_window_hours: str = option(REMEDIATION_DEFAULTS["reboot_window_hours"][0],
                                      remediation_setting("hours"), "the window of those reboots")
    max_remediations: str = option(
        REMEDIATION_DEFAULTS["max_remediations"][0], remediation_setting("integer"),
        "remediations of a node before it is quarantined, an operator paged")
    remediation_window_days: str = option(REMEDIATION_DEFAULTS["remediation_window_days"][0],
                                          remediation_setting("days"), "the window of those remediations")
    breaker_enabled: str = option(REMEDIATION_DEFAULTS["breaker_enabled"][0],
                                  remediation_setting("`true` / `false`"), "the blast-radius breaker")
    breaker_max_percent: str = option(
        REMEDIATION_DEFAULTS["breaker_max_percent"][0], remediation_setting("1..100"),
        "% of GPU nodes acted on per window before the breaker trips")
    breaker_max_nodes: str = option(
        REMEDIATION_DEFAULTS["breaker_max_nodes"][0], remediation_setting("integer"),
        "also cap nodes acted on per window", default_text="none")
    breaker_window_minutes: str = option(REMEDIATION_DEFAULTS["breaker_window_minutes"][0],
                                         remediation_setting("minutes"), "the breaker's sliding window")
    breaker_auto_close: str = option(
        REMEDIATION_DEFAULTS["breaker_auto_close"][0], remediation_setting("`true` / `false`"),
        "the breaker closes by itself once the nodes it acted on are back healthy (false: only a reset)")
    cordon_max_percent: str = option(
        REMEDIATION_DEFAULTS["cordon_max_percent"][0], remediation_setting("1..100"),
        "% of GPU nodes cordoned (known bad) per 5 minutes before the cordon limit trips")
    gpu_reset: str = option(
        REMEDIATION_DEFAULTS["gpu_reset"][0], remediation_setting("`true` / `false`"),
        "GPU reset (a privileged ECS task) where it suffices, else reboot; false: always reboot")
    warning_checkpoint_seconds: str = option(
        REMEDIATION_DEFAULTS["warning_checkpoint_seconds"][0], remediation_setting("seconds 0..21600"),
        "a job on a node with a driver warning checkpoints within this and moves (0: never asked)")
    relocate_instead_of_wait: bool = option(
        False, boolean(), "move relocatable jobs to free healthy nodes at once, not after the reboot")
    relocation_wait_seconds: int = option(
        DEFAULT_RELOCATION_WAIT_SECONDS, integer(0, MAX_RELOCATION_WAIT_SECONDS),
        "no free healthy node: a relocatable job waits this long, then fails")
    spare_nodes: str = option("0", spare_count(), "GPU nodes kept free of queue work for relocation")
    lend_spares: bool = option(
        False, boolean(), "spares run LOW-priority queue jobs until a relocation needs them (suspended)")
    held_job_deadline_seconds: int = option(
        DEFAULT_HELD_JOB_DEADLINE_SECONDS, integer(0, MAX_HELD_JOB_DEADLINE_SECONDS),
        "HELD jobs wait this long for a breaker reset")
    # --- validation after repair (docs/remediation.md#validation-after-repair)
    validate_after_repair: bool = option(
        True, boolean(), "a rebooted, reset or replacement node runs a DCGM diag and a GPU load before work")
    validation_dcgm_level: int = option(VALIDATION_DEFAULTS.dcgm_level, integer(1, 4),
                                        "`dcgmi diag -r` level of that validation")
    validation_load_seconds: int = option(
        VALIDATION_DEFAULTS.load_seconds, integer(0, MAX_VALIDATION_LOAD_SECONDS),
        "seconds of GPU load (DCGM targeted stress) after the diag (0: none)")
    validation_timeout_minutes: int = option(
        VALIDATION_DEFAULTS.timeout_seconds // 60, integer(1, MAX_VALIDATION_TIMEOUT_SECONDS // 60),
        "a validation task's time from its start; past it: stopped, no verdict (never a failed repair)")
    # --- time sharing (quotas, preemption, suspend)
    default_node_quotas: str | None = option(None, node_quotas(),
                                             "nodes per user and level (none: unlimited)")
    preemption: bool = option(True, boolean(), "higher priorities suspend lower ones")
    suspend_grace_seconds: int = option(
        DEFAULT_SUSPEND_GRACE_SECONDS, integer(MIN_SUSPEND_GRACE_SECONDS, MAX_SUSPEND_GRACE_SECONDS),
        "default time to checkpoint before a forced suspend")
    demote_above_normal_minutes: int = option(
        DEFAULT_DEMOTE_AFTER_SECONDS // 60, integer(1, 10_080, zero_disables=True),
        "ABOVE_NORMAL runs this long, then NORMAL (0: never)")
    # --- large jobs (docs/sizing.md#large-jobs)
    ecs_api_rate_per_second: float = option(
        DEFAULT_ECS_API_RATE, number(0.1, ECS_ACCOUNT_RATE * 25),
        f"ECS start/stop calls/s of the stack (its share of the account's {ECS_ACCOUNT_RATE:g}/s)")
    ecs_api_burst: int = option(DEFAULT_ECS_API_BURST, integer(1, ECS_ACCOUNT_BURST * 25),
                                f"... and at once (the account's: {ECS_ACCOUNT_BURST})")
    max_health_checks_per_job: int = option(
        DEFAULT_HEALTH_CHECKS_PER_JOB, integer(1, MAX_HEALTH_CHECKS), "DCGM checks running at once per job")
    max_health_checks_in_flight: int = option(
        DEFAULT_HEALTH_CHECKS_IN_FLIGHT, integer(1, MAX_HEALTH_CHECKS), "... and per cluster")
    gang_worker_concurrency: int = option(
        DEFAULT_GANG_WORKER_CONCURRENCY, integer(2, 100), "large-job stop/start batches run at once")
    batch_identical_starts: bool = option(True, boolean(), "up to 10 identical ranks per StartTask")
    gang_inline_max_ranks: int = option(
        INLINE_MAX_RANKS, integer(0, START_BATCH_RANKS),
        "a gang this small is stopped and started by the invocation that asks (0: always the gang queue)")
    deadline_index_shards: int = option(
        1, integer(1, DEADLINE_SHARDS_MAX),
        "partition keys of the by-deadline index (one takes ~1,000 writes/s; raise only: docs/sizing.md)")
    registration: str = option(
        "both", choice(*REGISTRATION_MODES),
        "how tasks are registered (docs/architecture.md#registering-jobs-what-gets-protected)")
    # --- gang preflight (docs/preflight.md)
    preflight_min_nodes: int = option(
        DEFAULT_MIN_NODES, integer(1, MAX_MIN_NODES, zero_disables=True),
        "jobs this size or larger run the gang preflight after restarts (0: on request)")
    preflight_round_seconds: int = option(
        DEFAULT_ROUND_SECONDS, integer(MIN_ROUND_SECONDS, MAX_ROUND_SECONDS),
        "bound of each preflight round (the first: twice); a group silent by then hung")
    preflight_slow_fraction: float = option(
        DEFAULT_SLOW_FRACTION, number(0.05, 1.0),
        "a run under this share of its learned busbw baseline is slow")
    preflight_min_users: int = option(
        DEFAULT_MIN_USERS, integer(1, MAX_USERS),
        "distinct users whose preflight runs must teach a baseline before it judges others")
    preflight_floors: str | None = option(
        None, preflight_floors(), "operator floors (GB/s) per instance type, never learned below")

    @property
    def validation(self) -> ValidationPolicy:
        """The functions' validation after repair (``POST_REPAIR_VALIDATION``)."""
        return ValidationPolicy(enabled=self.validate_after_repair, dcgm_level=self.validation_dcgm_level,
                                load_seconds=self.validation_load_seconds,
                                timeout_seconds=60 * self.validation_timeout_minutes)

    @property
    def remediation(self) -> tuple[tuple[str, str], ...]:
        """Every remediation setting, given or default: the functions' settings say exactly
        what was deployed."""
        return tuple(sorted((key, getattr(self, key)) for key in REMEDIATION_KEYS))

    @property
    def preflight_settings_json(self) -> str:
        """PREFLIGHT_SETTINGS: the functions validate it with the same parser."""
        settings: dict[str, Any] = {"min_nodes": self.preflight_min_nodes,
                                    "round_seconds": self.preflight_round_seconds,
                                    "slow_fraction": self.preflight_slow_fraction,
                                    "min_users": self.preflight_min_users}
        if self.preflight_floors:
            settings["floors"] = json.loads(self.preflight_floors)
        parse_preflight_settings(settings)
        return json.dumps(settings, sort_keys=True)

    @property
    def remediation_settings_json(self) -> str:
        return json.dumps(dict(self.remediation), sort_keys=True)

    @cached_property
    def fault_catalog_override(self) -> str | None:
        """The override document as JSON text (validated when the key was parsed)."""
        if self.fault_catalog_file is None:
            return None
        document = read_catalog_document(resolve_catalog_path(self.fault_catalog_file))
        return json.dumps(document, sort_keys=True)

    @property
    def creates_health_check_task(self) -> bool:
        return self.health_check_task_arn is None

    @property
    def suspect_exit_codes_json(self) -> str:
        return json.dumps(list(self.suspect_exit_codes))

    @classmethod
    def from_context(cls, context: Callable[[str], Any] | Mapping[str, Any]) -> RecoveryConfig:
        """Build from CDK context, validating every key.

        Given a mapping (``app.node.get_all_context()``), keys that are not this app's and
        not CDK's fail with a "did you mean" suggestion. A getter
        (``node.try_get_context``) cannot be enumerated: only the values are checked.
        """
        if isinstance(context, Mapping):
            check_unknown_keys(context)
            getter: Callable[[str], Any] = context.get
        else:
            getter = context
        values: dict[str, Any] = {}
        for opt in OPTIONS:
            raw = getter(opt.key)
            if isinstance(raw, str):
                raw = raw.strip() or None
            if raw is not None:
                values[opt.key] = opt.parse(opt.key, raw)
            elif opt.required:
                raise ConfigError(f"context key {opt.key!r} is required: {opt.doc} (make synth "
                                  f'CDK_ARGS="-c {opt.key}=<value>"; cdk synth -c {opt.key}=<value>)')
            elif opt.derive is not None:
                values[opt.key] = opt.derive(values)
            else:
                values[opt.key] = opt.default
        _check_together(values, given={opt.key for opt in OPTIONS if getter(opt.key) not in (None, "")})
        return cls(**values)


def _check_together(values: dict[str, Any], given: set[str]) -> None:
    """Constraints across keys (``values`` is completed in place)."""
    if "max_recovery_attempts" in given:
        infra, older = values["max_infra_recoveries"], values["max_recovery_attempts"]
        if "max_infra_recoveries" in given and infra != older:
            raise ConfigError("context keys 'max_infra_recoveries' and 'max_recovery_attempts' (its older "
                              f"name) disagree ({infra} and {older}): give one of them")
        values["max_infra_recoveries"] = older
    try:
        parse_remediation_settings({key: values[key] for key in REMEDIATION_KEYS})
    except ValueError as error:
        message = str(error).removeprefix("remediation settings: ")
        raise ConfigError(f"remediation context key(s): {message}") from error
    try:
        ValidationPolicy(enabled=values["validate_after_repair"], dcgm_level=values["validation_dcgm_level"],
                         load_seconds=values["validation_load_seconds"],
                         timeout_seconds=60 * values["validation_timeout_minutes"])
    except ValidationError as error:
        raise ConfigError(f"validation context key(s): {error}") from error


def _options() -> tuple[Option, ...]:
    found = []
    for f in dataclasses.fields(RecoveryConfig):
        if "option" not in f.metadata:
            raise TypeError(f"RecoveryConfig.{f.name} must be declared with option(...)")
        default, parse, doc, default_text, derive = f.metadata["option"]
        found.append(Option(f.name, default, parse, doc, default_text, derive))
    return tuple(found)


OPTIONS: tuple[Option, ...] = _options()
KNOWN_KEYS: tuple[str, ...] = tuple(o.key for o in OPTIONS)


def is_foreign_key(key: str) -> bool:
    """CDK's own context (feature flags, toolkit settings, cached lookups) is not ours."""
    return (key.startswith(("@", "aws:", "cdk-", "cdk:", "aws-cdk")) or ":" in key
            or "/" in key or key in _TOOLKIT_KEYS)


def check_unknown_keys(context: Mapping[str, Any]) -> None:
    problems = []
    for key in sorted(context):
        if key in KNOWN_KEYS or is_foreign_key(key):
            continue
        if key in RETIRED_KEYS:
            problems.append(f"context key {key!r} is no longer used: {RETIRED_KEYS[key]}; remove it")
            continue
        normalized = key.strip().lower().replace("-", "_")
        # A key cut short (ecs_api_rate) means the one key it begins, when there is one.
        extended = [k for k in KNOWN_KEYS if k.startswith(normalized)]
        match = extended if len(extended) == 1 else difflib.get_close_matches(
            normalized, KNOWN_KEYS, n=1, cutoff=0.6)
        hint = f"did you mean {match[0]!r}?" if match else "it is not an option of this app"
        problems.append(f"unknown context key {key!r}: {hint}")
    if problems:
        raise ConfigError("; ".join(problems) + " (options: docs/configuration.md, "
                          "or `python -m infra.config`)")


# --------------------------------------------------------------------------- the tables
