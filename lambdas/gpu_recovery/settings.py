"""Runtime settings, read once from the environment the stack (or local mode) sets."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpu_recovery import constants as c
from gpu_recovery.domain.breaker.hold import DEFAULT_HELD_JOB_DEADLINE_SECONDS, MAX_HELD_JOB_DEADLINE_SECONDS
from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS, START_BATCH_RANKS
from gpu_recovery.domain.heartbeat_policy import (
    DEFAULT_HANG_SECONDS,
    DEFAULT_MAX_SKEW_SECONDS,
    DEFAULT_NODE_LOST_FAIL_SECONDS,
    DEFAULT_SIGNAL_NOTIFY_SECONDS,
    DEFAULT_SIGNAL_RETENTION_SECONDS,
    DEFAULT_STALE_SECONDS,
    HANG_ACTIONS,
    HeartbeatSettings,
)
from gpu_recovery.domain.job_budgets import DEFAULT_MAX_APP_RESTARTS, DEFAULT_MAX_INFRA_RECOVERIES
from gpu_recovery.domain.preflight.settings import PreflightPolicy, parse_preflight_settings
from gpu_recovery.domain.rate_limit import DEFAULT_BURST, DEFAULT_RATE, ECS_ACCOUNT_RATE, TokenBucket
from gpu_recovery.domain.relocation import (
    DEFAULT_RELOCATION_WAIT_SECONDS,
    MAX_RELOCATION_WAIT_SECONDS,
    SparePool,
)
from gpu_recovery.domain.remediation_settings import (
    SETTINGS as REMEDIATION_KEYS,
)
from gpu_recovery.domain.remediation_settings import (
    RemediationSettings,
    parse_remediation_settings,
)
from gpu_recovery.domain.time_sharing import (
    DEFAULT_DEMOTE_AFTER_SECONDS,
    DEFAULT_SUSPEND_GRACE_SECONDS,
    MAX_SUSPEND_GRACE_SECONDS,
    MIN_SUSPEND_GRACE_SECONDS,
    parse_priority,
)
from gpu_recovery.domain.validation import ValidationError, ValidationPolicy
from gpu_recovery.settings_base import (  # noqa: F401  (node_token_table: re-exported)
    SettingsError,
    node_token_table,
)
from gpu_recovery.settings_base import env_bool as _bool
from gpu_recovery.settings_base import env_bounded as _bounded
from gpu_recovery.settings_base import env_int as _int
from gpu_recovery.settings_base import env_list as _list
from gpu_recovery.settings_base import env_required as _required

if TYPE_CHECKING:
    from gpu_recovery.queue.access import AccessPolicy, NetworkGrant

# DCGM health checks at once: per cluster, and per job (a share, so other jobs still get
# theirs; a share as large as the cluster's is no share and is not counted). The job's
# restart waits for every verdict, so a limit below the job's suspect count adds a whole
# diag (~2 min) per wave: an NCCL cascade makes nearly every node of a job a suspect, and
# the defaults let two of the largest supported jobs (1,024 nodes) check every node at
# once. The checks run on the jobs' own stopped nodes; what they share, the ECS StartTask
# budget, is paced by the stack's ECS budget anyway.
DEFAULT_HEALTH_CHECKS_IN_FLIGHT = 2048
DEFAULT_HEALTH_CHECKS_PER_JOB = DEFAULT_HEALTH_CHECKS_IN_FLIGHT


# The stack's DescribeTasks budget for unknown tasks (half the account's 20/s).
DESCRIBE_BUCKET = TokenBucket(rate=c.ECS_DESCRIBE_RATE_PER_SECOND, burst=c.ECS_DESCRIBE_BURST)


def parse_exit_codes(raw: str) -> tuple[int, ...]:
    """``"[1, 134]"`` or ``"1,134"`` -> (1, 134)."""
    text = raw.strip()
    try:
        values = json.loads(text) if text.startswith("[") else [v for v in text.split(",") if v.strip()]
        codes = tuple(int(v) for v in values)
    except (ValueError, TypeError) as error:
        raise SettingsError(
            f"{c.ENV_SUSPECT_EXIT_CODES} must be a JSON list of integers, got {raw!r}"
        ) from error
    if 0 in codes:
        raise SettingsError(f"{c.ENV_SUSPECT_EXIT_CODES} cannot contain 0 (success)")
    return codes


def remediation_settings_from_env(env: Mapping[str, str]) -> RemediationSettings:
    """``REMEDIATION_SETTINGS`` (a JSON object of remediation settings) plus the two job
    budgets from ``MAX_RECOVERY_ATTEMPTS`` / ``MAX_APP_RESTARTS``, validated in one go."""
    raw = (env.get(c.ENV_REMEDIATION_SETTINGS) or "").strip()
    values: dict[str, str] = {}
    if raw:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as error:
            raise SettingsError(f"{c.ENV_REMEDIATION_SETTINGS} must be a JSON object: {error.msg}") from error
        if not isinstance(parsed, dict):
            raise SettingsError(f"{c.ENV_REMEDIATION_SETTINGS} must be a JSON object of "
                                f"{', '.join(REMEDIATION_KEYS)}")
        values = {str(k): "" if v is None else (json.dumps(v) if isinstance(v, dict) else str(v))
                  for k, v in parsed.items()}
    for key, name in (("max_infra_recoveries", c.ENV_MAX_RECOVERY_ATTEMPTS),
                      ("max_app_restarts", c.ENV_MAX_APP_RESTARTS)):
        if env.get(name):
            values[key] = str(env[name])
    try:
        return parse_remediation_settings(values)
    except ValueError as error:
        raise SettingsError(str(error)) from error


def job_budget_defaults(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """The deployment's default job budgets (infrastructure recoveries, application-error
    restarts), for services that read nothing else (the jobs API)."""
    env = os.environ if env is None else env
    settings = remediation_settings_from_env(
        {k: v for k, v in env.items() if k in (c.ENV_MAX_RECOVERY_ATTEMPTS, c.ENV_MAX_APP_RESTARTS)})
    return settings.max_infra_recoveries, settings.max_app_restarts


@dataclass(frozen=True)
class Settings:
    job_table: str
    instance_table: str
    cluster: str
    health_check_task: str
    topic_arn: str
    max_recovery_attempts: int = 3  # a job's infrastructure recoveries (deployment default)
    suspect_exit_codes: tuple[int, ...] = (1,)
    reboot_timeout_seconds: int = 30 * 60
    health_check_timeout_seconds: int = 30 * 60
    health_check_start_retries: int = 5
    health_check_log_group: str = ""
    restart_start_retries: int = 3
    # On a suspected GPU fault, health-check every node of the job (in parallel) rather
    # than only the nodes whose rank failed on its own.
    check_all_nodes_on_fault: bool = False
    max_app_restarts: int = 0  # a job's application-error restarts (deployment default)
    # Fault catalog, escalation, breaker, observe mode (domain.remediation_settings).
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    # Move a job to healthy free nodes as soon as a fault is confirmed instead of waiting
    # for its node's reboot (relocatable jobs only).
    relocate_instead_of_wait: bool = False
    # A relocatable tag-registered job with no healthy free node waits this long for one
    # (the sweep retries every minute), then fails; 0: fails at once.
    relocation_wait_seconds: int = DEFAULT_RELOCATION_WAIT_SECONDS
    # Hot spares the queue scheduler keeps free; relocation finds them among the free nodes.
    spare_nodes: SparePool = field(default_factory=SparePool)
    # A job that cannot move waits (HELD) this long for the breaker's reset to reboot a
    # node it needs, then fails; 0: fails at once.
    held_job_deadline_seconds: int = DEFAULT_HELD_JOB_DEADLINE_SECONDS
    fault_catalog_override: str = ""  # path of the deployment's catalog override ("" = none)
    reboot_document: str = c.DEFAULT_REBOOT_DOCUMENT_NAME
    # Large jobs: the fan-out queue ("" = batches run in the invoking function), the ECS
    # control-plane budget shared by the stack, grouped StartTask of identical ranks, and
    # DCGM health checks at once (per job, per cluster).
    gang_queue_url: str = ""
    gang_inline_max_ranks: int = INLINE_MAX_RANKS  # a gang this small runs its batches inline
    ecs_api: TokenBucket = field(default_factory=TokenBucket)
    batch_identical_starts: bool = True
    max_health_checks_per_job: int = DEFAULT_HEALTH_CHECKS_PER_JOB
    max_health_checks_in_flight: int = DEFAULT_HEALTH_CHECKS_IN_FLIGHT
    # The GPU reset task (recovery.gpu_resets) and how long a reset may take before the
    # sweep falls back to a reboot (nvidia-smi -r and a short DCGM diag: about a minute).
    gpu_reset_task: str = c.DEFAULT_GPU_RESET_FAMILY
    gpu_reset_timeout_seconds: int = 10 * 60
    # Validation after repair (domain.validation): off unless the deployment turns it on
    # (infra passes the context keys; validate_after_repair defaults to true there).
    validation: ValidationPolicy = field(default_factory=ValidationPolicy)
    # How a task is recognised as a protected rank (constants.REGISTRATION_MODES).
    registration: str = "both"
    tag_lookup_queue_url: str = ""  # "": unknown tasks are described inline (one at a time)
    # The gang preflight: which jobs run it, its rounds' bound, the baseline rule and floors.
    preflight: PreflightPolicy = field(default_factory=PreflightPolicy)
    control_poll_seconds: int = 2  # what the control API asks clients to poll at (at least)
    # The by-deadline index's partition key split over this many values (constants.
    # DEADLINE_SHARDS_MAX at most): one partition takes ~1,000 WCU/s (docs/sizing.md).
    deadline_index_shards: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        missing = [
            name
            for name in (c.ENV_JOB_TABLE, c.ENV_INSTANCE_TABLE, c.ENV_CLUSTER_NAME)
            if not env.get(name)
        ]
        if missing:
            raise SettingsError(f"missing environment variables: {', '.join(missing)}")
        remediation = remediation_settings_from_env(env)
        return cls(
            job_table=env[c.ENV_JOB_TABLE],
            instance_table=env[c.ENV_INSTANCE_TABLE],
            cluster=env[c.ENV_CLUSTER_NAME],
            health_check_task=env.get(c.ENV_HEALTH_CHECK_TASK) or c.DEFAULT_HEALTH_CHECK_FAMILY,
            gpu_reset_task=env.get(c.ENV_GPU_RESET_TASK) or c.DEFAULT_GPU_RESET_FAMILY,
            topic_arn=env.get(c.ENV_SNS_TOPIC_ARN, ""),
            max_recovery_attempts=remediation.max_infra_recoveries,
            suspect_exit_codes=parse_exit_codes(env.get(c.ENV_SUSPECT_EXIT_CODES) or "[1]"),
            reboot_timeout_seconds=60 * _int(env, c.ENV_REBOOT_TIMEOUT_MINUTES, 30, minimum=1),
            health_check_timeout_seconds=60
            * _int(env, c.ENV_HEALTH_CHECK_TIMEOUT_MINUTES, 30, minimum=1),
            health_check_start_retries=_int(env, c.ENV_HEALTH_CHECK_START_RETRIES, 5, minimum=1),
            health_check_log_group=env.get(c.ENV_HEALTH_CHECK_LOG_GROUP, ""),
            restart_start_retries=_int(env, c.ENV_RESTART_START_RETRIES, 3, minimum=1),
            check_all_nodes_on_fault=_bool(env, c.ENV_HEALTH_CHECK_ALL_NODES, False),
            max_app_restarts=remediation.max_app_restarts,
            remediation=remediation,
            relocate_instead_of_wait=_bool(env, c.ENV_RELOCATE_INSTEAD_OF_WAIT, False),
            relocation_wait_seconds=_bounded(env, c.ENV_RELOCATION_WAIT_SECONDS,
                                             DEFAULT_RELOCATION_WAIT_SECONDS, 0, MAX_RELOCATION_WAIT_SECONDS),
            spare_nodes=spare_pool(env),
            held_job_deadline_seconds=_bounded(env, c.ENV_HELD_JOB_DEADLINE_SECONDS,
                                               DEFAULT_HELD_JOB_DEADLINE_SECONDS, 0,
                                               MAX_HELD_JOB_DEADLINE_SECONDS),
            fault_catalog_override=env.get(c.ENV_FAULT_CATALOG_OVERRIDE, ""),
            reboot_document=env.get(c.ENV_REBOOT_DOCUMENT) or c.DEFAULT_REBOOT_DOCUMENT_NAME,
            gang_queue_url=env.get(c.ENV_GANG_QUEUE_URL, ""),
            gang_inline_max_ranks=gang_inline_max_ranks(env),
            ecs_api=ecs_api_bucket(env),
            batch_identical_starts=_bool(env, c.ENV_BATCH_IDENTICAL_STARTS, True),
            max_health_checks_per_job=_int(env, c.ENV_MAX_HEALTH_CHECKS_PER_JOB,
                                           DEFAULT_HEALTH_CHECKS_PER_JOB, minimum=1),
            max_health_checks_in_flight=_int(env, c.ENV_MAX_HEALTH_CHECKS_IN_FLIGHT,
                                             DEFAULT_HEALTH_CHECKS_IN_FLIGHT, minimum=1),
            registration=registration_mode(env),
            tag_lookup_queue_url=env.get(c.ENV_TAG_LOOKUP_QUEUE_URL, ""),
            preflight=preflight_policy(env),
            control_poll_seconds=_int(env, c.ENV_CONTROL_POLL_SECONDS, 2, minimum=1),
            deadline_index_shards=_bounded(env, c.ENV_DEADLINE_INDEX_SHARDS, 1, 1, c.DEADLINE_SHARDS_MAX),
            validation=validation_policy(env),
        )


def preflight_policy(env: Mapping[str, str] | None = None) -> PreflightPolicy:
    """``PREFLIGHT_SETTINGS`` (a JSON object; empty: the defaults)."""
    env = os.environ if env is None else env
    raw = (env.get(c.ENV_PREFLIGHT_SETTINGS) or "").strip()
    try:
        parsed = json.loads(raw) if raw else {}
    except json.JSONDecodeError as error:
        raise SettingsError(f"{c.ENV_PREFLIGHT_SETTINGS} must be a JSON object: {error.msg}") from error
    if not isinstance(parsed, dict):
        raise SettingsError(f"{c.ENV_PREFLIGHT_SETTINGS} must be a JSON object")
    try:
        return parse_preflight_settings(parsed)
    except ValueError as error:
        raise SettingsError(f"{c.ENV_PREFLIGHT_SETTINGS}: {error}") from error


def validation_policy(env: Mapping[str, str]) -> ValidationPolicy:
    try:
        return ValidationPolicy.from_json(env.get(c.ENV_POST_REPAIR_VALIDATION) or "")
    except ValidationError as error:
        raise SettingsError(f"{c.ENV_POST_REPAIR_VALIDATION}: {error}") from error


def registration_mode(env: Mapping[str, str]) -> str:
    raw = (env.get(c.ENV_REGISTRATION) or "both").strip().lower()
    if raw not in c.REGISTRATION_MODES:
        raise SettingsError(f"{c.ENV_REGISTRATION} must be one of {', '.join(c.REGISTRATION_MODES)}, "
                            f"got {raw!r}")
    return raw


def gang_inline_max_ranks(env: Mapping[str, str]) -> int:
    """The largest gang whose stop and start batches run in the invocation that asks (0: every
    gang's go through the gang queue); at most one start batch."""
    return _bounded(env, c.ENV_GANG_INLINE_MAX_RANKS, INLINE_MAX_RANKS, 0, START_BATCH_RANKS)


def ecs_api_bucket(env: Mapping[str, str] | None = None) -> TokenBucket:
    """The stack's share of the account's ECS control-plane bucket (every function that
    calls StartTask / StopTask / UpdateContainerInstancesState uses the same one)."""
    env = os.environ if env is None else env
    raw = (env.get(c.ENV_ECS_API_RATE) or "").strip()
    try:
        rate = float(raw) if raw else DEFAULT_RATE
    except ValueError as error:
        raise SettingsError(f"{c.ENV_ECS_API_RATE} must be a number, got {raw!r}") from error
    if not 0.1 <= rate <= ECS_ACCOUNT_RATE * 25:
        raise SettingsError(f"{c.ENV_ECS_API_RATE} must be 0.1..{ECS_ACCOUNT_RATE * 25:g}, got {rate:g}")
    burst = _int(env, c.ENV_ECS_API_BURST, DEFAULT_BURST, minimum=1)
    return TokenBucket(rate=rate, burst=burst)


@dataclass(frozen=True)
class TimeSharingSettings:
    """Quotas, preemption, suspend grace and demotion (the scheduler and the jobs API)."""

    quota_table: str = c.DEFAULT_QUOTA_TABLE_NAME
    default_node_quotas: Mapping[int, int] = field(default_factory=dict)  # level -> nodes
    preemption: bool = True
    suspend_grace_seconds: int = DEFAULT_SUSPEND_GRACE_SECONDS
    demote_after_seconds: int = DEFAULT_DEMOTE_AFTER_SECONDS  # ABOVE_NORMAL -> NORMAL (0: never)
    control_api_url: str = ""  # given to every queue rank ("" : no suspend channel)
    control_poll_seconds: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TimeSharingSettings:
        env = os.environ if env is None else env
        grace = _int(env, c.ENV_SUSPEND_GRACE_SECONDS, DEFAULT_SUSPEND_GRACE_SECONDS,
                     minimum=MIN_SUSPEND_GRACE_SECONDS)
        if grace > MAX_SUSPEND_GRACE_SECONDS:
            raise SettingsError(f"{c.ENV_SUSPEND_GRACE_SECONDS} must be <= {MAX_SUSPEND_GRACE_SECONDS}, "
                                f"got {grace}")
        return cls(
            quota_table=env.get(c.ENV_QUOTA_TABLE) or c.DEFAULT_QUOTA_TABLE_NAME,
            default_node_quotas=parse_node_quotas(env.get(c.ENV_DEFAULT_NODE_QUOTAS) or ""),
            preemption=_bool(env, c.ENV_PREEMPTION, True),
            suspend_grace_seconds=grace,
            demote_after_seconds=_int(env, c.ENV_DEMOTE_AFTER_SECONDS, DEFAULT_DEMOTE_AFTER_SECONDS),
            control_api_url=(env.get(c.ENV_CONTROL_API_URL) or "").rstrip("/"),
            control_poll_seconds=_int(env, c.ENV_CONTROL_POLL_SECONDS, 2, minimum=1),
        )


def parse_node_quotas(raw: str) -> dict[int, int]:
    """``{"HIGH": 8, "LOW": 64}`` (level names or values) -> {30: 8, 0: 64}."""
    text = raw.strip()
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise SettingsError(f"{c.ENV_DEFAULT_NODE_QUOTAS} must be a JSON object: {error.msg}") from error
    if not isinstance(parsed, dict):
        raise SettingsError(f"{c.ENV_DEFAULT_NODE_QUOTAS} must be a JSON object of level -> nodes")
    quotas: dict[int, int] = {}
    for level, nodes in parsed.items():
        try:
            value = parse_priority(level)
        except ValueError as error:
            raise SettingsError(f"{c.ENV_DEFAULT_NODE_QUOTAS}: level {level!r} {error}") from error
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 0 <= nodes <= 100_000:
            raise SettingsError(f"{c.ENV_DEFAULT_NODE_QUOTAS}: {level} must be 0..100000 nodes, "
                                f"got {nodes!r}")
        quotas[value] = nodes
    return quotas


# The least SCHEDULER_TIME_BUDGET_SECONDS accepted: the tick's drain of the launches an older
# release left in flight leaves admission 15 s (queue.scheduler.ADMISSION_MARGIN_SECONDS) and
# takes a further entry only while 10 s are left (queue.ledger_drain.ENTRY_MARGIN_SECONDS); 30 s
# cover both with the first entry's calls besides. Not derived from them: queue.scheduler
# imports this module.
MIN_SCHEDULER_TIME_BUDGET_SECONDS = 30


@dataclass(frozen=True)
class SchedulerConfig:
    """The queue scheduler's tick (infra sets the lease and budgets from the same names)."""

    lease_seconds: int = 120
    page_size: int = 25
    max_admissions: int = 20  # per tick: each costs nnodes StartTask calls
    max_unplaced: int = 32  # stop reading after this many jobs that could not be placed
    time_budget_seconds: float = 60.0
    sharing: TimeSharingSettings = field(default_factory=TimeSharingSettings)
    spares: SparePool = field(default_factory=SparePool)  # healthy free nodes kept out of queue work
    lend_spares: bool = False  # spares run LOW-priority queue jobs until a relocation needs them

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SchedulerConfig:
        env = os.environ if env is None else env
        return cls(
            lease_seconds=_int(env, c.ENV_SCHEDULER_LEASE_SECONDS, 120, minimum=1),
            max_admissions=_int(env, c.ENV_SCHEDULER_MAX_ADMISSIONS, 20, minimum=1),
            max_unplaced=_int(env, c.ENV_SCHEDULER_MAX_UNPLACED, 32, minimum=1),
            time_budget_seconds=float(_int(env, c.ENV_SCHEDULER_TIME_BUDGET_SECONDS, 60,
                                           minimum=MIN_SCHEDULER_TIME_BUDGET_SECONDS)),
            sharing=TimeSharingSettings.from_env(env),
            spares=spare_pool(env),
            lend_spares=_bool(env, c.ENV_LEND_SPARES, False),
        )


def spare_pool(env: Mapping[str, str]) -> SparePool:
    """``SPARE_NODES``: a node count or a percentage of the GPU nodes ("" : none)."""
    raw = (env.get(c.ENV_SPARE_NODES) or "").strip()
    if not raw:
        return SparePool()
    try:
        return SparePool.parse(raw)
    except ValueError as error:
        raise SettingsError(f"{c.ENV_SPARE_NODES}: {error}") from error


def _no_access_rules() -> AccessPolicy:
    # The queue's access rules load with the jobs API's settings, not with every function's.
    from gpu_recovery.queue.access import AccessPolicy

    return AccessPolicy()


@dataclass(frozen=True)
class JobsApiSettings:
    """The jobs API's settings (``runtime.jobs_service`` and the handler's idempotency layer)."""

    job_table: str
    cluster: str  # the cluster submits are checked against (capacity, task definitions)
    # The jobs API reads no instance item; the repository it shares with the recovery loop
    # names the table all the same (the stack's default name when the function has none).
    instance_table: str = c.DEFAULT_INSTANCE_TABLE_NAME
    scheduler_function: str = ""  # "" : no scheduler to wake up (its schedule picks jobs up)
    idempotency_table: str = c.DEFAULT_IDEMPOTENCY_TABLE_NAME
    # (infrastructure recoveries, application restarts) of a job that names none
    default_budgets: tuple[int, int] = (DEFAULT_MAX_INFRA_RECOVERIES, DEFAULT_MAX_APP_RESTARTS)
    access: AccessPolicy = field(default_factory=_no_access_rules)
    sharing: TimeSharingSettings = field(default_factory=TimeSharingSettings)
    gang_queue_url: str = ""  # a large job's cancel sends its stop batches here
    gang_inline_max_ranks: int = INLINE_MAX_RANKS  # ... a job this small's cancel stops its ranks itself

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobsApiSettings:
        env = os.environ if env is None else env
        _required(env, c.ENV_JOB_TABLE, c.ENV_CLUSTER_NAME)
        return cls(
            job_table=env[c.ENV_JOB_TABLE].strip(),
            cluster=env[c.ENV_CLUSTER_NAME].strip(),
            instance_table=(env.get(c.ENV_INSTANCE_TABLE) or "").strip() or c.DEFAULT_INSTANCE_TABLE_NAME,
            scheduler_function=(env.get(c.ENV_SCHEDULER_FUNCTION) or "").strip(),
            idempotency_table=(env.get(c.ENV_IDEMPOTENCY_TABLE) or "").strip()
            or c.DEFAULT_IDEMPOTENCY_TABLE_NAME,
            default_budgets=job_budget_defaults(env),
            access=access_policy(env),
            sharing=TimeSharingSettings.from_env(env),
            gang_queue_url=(env.get(c.ENV_GANG_QUEUE_URL) or "").strip(),
            gang_inline_max_ranks=gang_inline_max_ranks(env),
        )


@dataclass(frozen=True)
class JobControlSettings:
    """The job-control channel's settings (control API and its authorizer)."""

    job_table: str
    instance_table: str = c.DEFAULT_INSTANCE_TABLE_NAME  # read by no control route (see above)
    control_poll_seconds: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobControlSettings:
        env = os.environ if env is None else env
        _required(env, c.ENV_JOB_TABLE)
        return cls(
            job_table=env[c.ENV_JOB_TABLE].strip(),
            instance_table=(env.get(c.ENV_INSTANCE_TABLE) or "").strip() or c.DEFAULT_INSTANCE_TABLE_NAME,
            control_poll_seconds=TimeSharingSettings.from_env(env).control_poll_seconds,
        )


def heartbeat_settings(env: Mapping[str, str] | None = None) -> HeartbeatSettings:
    """The heartbeat service's settings (the domain owns the record, not the parsing)."""
    env = os.environ if env is None else env
    action = (env.get(c.ENV_HANG_ACTION) or "notify").strip().lower()
    if action not in HANG_ACTIONS:
        raise SettingsError(f"{c.ENV_HANG_ACTION} must be one of {', '.join(HANG_ACTIONS)}, got {action!r}")
    return HeartbeatSettings(
        stale_seconds=_int(env, c.ENV_HEARTBEAT_STALE_SECONDS, DEFAULT_STALE_SECONDS, 1),
        node_lost_fail_seconds=_int(env, c.ENV_NODE_LOST_FAIL_SECONDS, DEFAULT_NODE_LOST_FAIL_SECONDS),
        hang_seconds=_int(env, c.ENV_HANG_SECONDS, DEFAULT_HANG_SECONDS),
        hang_action=action,
        max_skew_seconds=_int(env, c.ENV_HEARTBEAT_MAX_SKEW_SECONDS, DEFAULT_MAX_SKEW_SECONDS, 1),
        signal_notify_seconds=_int(env, c.ENV_HW_SIGNAL_NOTIFY_SECONDS, DEFAULT_SIGNAL_NOTIFY_SECONDS),
        signal_retention_seconds=_int(env, c.ENV_HW_SIGNAL_RETENTION_SECONDS,
                                      DEFAULT_SIGNAL_RETENTION_SECONDS, 60),
    )


def heartbeat_index_shards(env: Mapping[str, str] | None = None) -> int:
    """The heartbeat index's partition keys (``HB_SHARDS``, what the stack deploys; fewer only
    where the functions are told so: local mode's two-node campaign worlds)."""
    env = os.environ if env is None else env
    shards = _int(env, c.ENV_HEARTBEAT_INDEX_SHARDS, c.HB_SHARDS, 1)
    if shards > c.HB_SHARDS:
        raise SettingsError(f"{c.ENV_HEARTBEAT_INDEX_SHARDS} must be 1..{c.HB_SHARDS}, got {shards}")
    return shards


def access_policy(env: Mapping[str, str] | None = None) -> AccessPolicy:
    """Who may do what through the jobs API (JSON lists or comma-separated values)."""
    from gpu_recovery.domain.models import family_of
    from gpu_recovery.queue.access import AccessPolicy

    env = os.environ if env is None else env
    health = {c.DEFAULT_HEALTH_CHECK_FAMILY}
    if env.get(c.ENV_HEALTH_CHECK_TASK):
        health.add(family_of(env[c.ENV_HEALTH_CHECK_TASK]))
    return AccessPolicy(
        admin_roles=_list(env, c.ENV_JOBS_ADMIN_ROLES, ()),
        team_roles=_list(env, c.ENV_JOBS_TEAM_ROLES, ()),
        allowed_families=_list(env, c.ENV_JOBS_ALLOWED_FAMILIES, ("*",)),
        task_role_prefixes=_list(env, c.ENV_JOBS_TASK_ROLE_PREFIXES, ("*",)),
        reserved_priority_roles=_list(env, c.ENV_JOBS_PRIORITY_ROLES, ()),
        health_check_families=frozenset(health),
        allowed_networks=_allowed_networks(env),
    )


def _allowed_networks(env: Mapping[str, str]) -> tuple[NetworkGrant, ...]:
    from gpu_recovery.queue.access import parse_allowed_networks

    try:
        return parse_allowed_networks(env.get(c.ENV_JOBS_ALLOWED_NETWORKS) or "")
    except ValueError as error:
        raise SettingsError(f"{c.ENV_JOBS_ALLOWED_NETWORKS}: {error}") from error
