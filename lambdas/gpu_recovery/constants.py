"""Single source of truth shared by ``infra/``, ``lambdas/`` and ``local_mode/``.

Table keys and indexes, environment variable names, state names and task tags are defined
here once (the EventBridge patterns built from them: ``gpu_recovery.event_patterns``; the
CloudWatch metric names: ``gpu_recovery.metric_names``).
Nothing in this module imports boto3 or the CDK, so every layer can import it.
"""

from __future__ import annotations

from typing import Any

# The domain's vocabulary (states, verdicts, notification kinds, the stop reason's prefix),
# re-exported for infra/ and local mode, which take the shared names from this module.
from gpu_recovery.domain.notifications import NotificationKind  # noqa: F401
from gpu_recovery.domain.states import (  # noqa: F401
    ACTIVE_JOB_STATES,
    HOLDING_RANK_STATES,
    LIVE_RANK_STATES,
    SYSTEM_STOP_REASON_PREFIX,
    TERMINAL_JOB_STATES,
    DcgmVerdict,
    InstanceState,
    JobState,
    RankState,
    system_stop_reason,
)

# --------------------------------------------------------------------------------------
# Environment variables (names kept from the original design where it had them)
# --------------------------------------------------------------------------------------
ENV_JOB_TABLE = "TRAINING_JOB_TABLE_NAME"
ENV_INSTANCE_TABLE = "CONTAINER_INSTANCE_TABLE_NAME"
ENV_CLUSTER_NAME = "ECS_CLUSTER_NAME"
ENV_HEALTH_CHECK_TASK = "DCGM_HEALTH_CHECK_TASK"  # task definition ARN or family
ENV_GPU_RESET_TASK = "GPU_RESET_TASK"  # task definition ARN or family of the GPU reset task
# Validation after repair (domain.validation.ValidationPolicy as JSON; "" or absent: off).
ENV_POST_REPAIR_VALIDATION = "POST_REPAIR_VALIDATION"
ENV_SNS_TOPIC_ARN = "SNS_TOPIC_ARN"
ENV_MAX_RECOVERY_ATTEMPTS = "MAX_RECOVERY_ATTEMPTS"
ENV_SUSPECT_EXIT_CODES = "SUSPECT_EXIT_CODES"  # JSON list, e.g. "[1]"
ENV_REBOOT_TIMEOUT_MINUTES = "REBOOT_TIMEOUT_MINUTES"
ENV_HEALTH_CHECK_TIMEOUT_MINUTES = "HEALTH_CHECK_TIMEOUT_MINUTES"
ENV_HEALTH_CHECK_START_RETRIES = "HEALTH_CHECK_START_RETRIES"
ENV_DCGM_LEVEL = "DCGM_LEVEL"
ENV_HEALTH_CHECK_GPUS = "HEALTH_CHECK_GPUS"
ENV_HEARTBEAT_STALE_SECONDS = "HEARTBEAT_STALE_SECONDS"
ENV_NODE_LOST_FAIL_SECONDS = "NODE_LOST_FAIL_SECONDS"
ENV_HANG_SECONDS = "HANG_SECONDS"
ENV_HANG_ACTION = "HANG_ACTION"
ENV_NODE_TOKEN_TABLE = "NODE_TOKEN_TABLE_NAME"
ENV_IDEMPOTENCY_TABLE = "IDEMPOTENCY_TABLE_NAME"
ENV_SCHEDULER_FUNCTION = "SCHEDULER_FUNCTION_NAME"
ENV_HEALTH_CHECK_LOG_GROUP = "HEALTH_CHECK_LOG_GROUP"
ENV_RESTART_START_RETRIES = "RESTART_START_RETRIES"
ENV_HEARTBEAT_MAX_SKEW_SECONDS = "HEARTBEAT_MAX_SKEW_SECONDS"
ENV_HEALTH_CHECK_ALL_NODES = "HEALTH_CHECK_ALL_NODES"  # "true": check every node of a faulted job
ENV_SCHEDULER_MAX_ADMISSIONS = "SCHEDULER_MAX_ADMISSIONS"
ENV_SCHEDULER_MAX_UNPLACED = "SCHEDULER_MAX_UNPLACED"
ENV_SCHEDULER_LEASE_SECONDS = "SCHEDULER_LEASE_SECONDS"
ENV_SCHEDULER_TIME_BUDGET_SECONDS = "SCHEDULER_TIME_BUDGET_SECONDS"
# Remediation (fault catalog, escalation, breaker, observe mode, budgets, relocation).
ENV_MAX_APP_RESTARTS = "MAX_APP_RESTARTS"  # a job's application-error restarts (default 0)
# JSON object of domain.remediation_settings keys (remediation_mode, replace_action, ...).
ENV_REMEDIATION_SETTINGS = "REMEDIATION_SETTINGS"
ENV_RELOCATE_INSTEAD_OF_WAIT = "RELOCATE_INSTEAD_OF_WAIT"  # "true": move a job off a rebooting node
# Seconds a relocatable job waits for a healthy node to free up before it fails (0: at once).
ENV_RELOCATION_WAIT_SECONDS = "RELOCATION_WAIT_SECONDS"
# Healthy free GPU nodes the queue scheduler keeps out of queue work: "2" or "5%".
ENV_SPARE_NODES = "SPARE_NODES"
ENV_LEND_SPARES = "LEND_SPARES"  # "true": spares run LOW queue jobs until needed (domain.placement)
# Seconds a job that cannot move waits (HELD) for the breaker's reset to reboot its node.
ENV_HELD_JOB_DEADLINE_SECONDS = "HELD_JOB_DEADLINE_SECONDS"
ENV_DEADLINE_INDEX_SHARDS = "DEADLINE_INDEX_SHARDS"
ENV_FAULT_CATALOG_OVERRIDE = "FAULT_CATALOG_OVERRIDE"  # the deployment's catalog override (a layer's JSON)
# Large jobs: the gang fan-out queue, the ECS control-plane budget, health checks at once.
ENV_GANG_QUEUE_URL = "GANG_QUEUE_URL"  # SQS queue of stop/start batches ("": run them inline)
ENV_GANG_INLINE_MAX_RANKS = "GANG_INLINE_MAX_RANKS"  # a gang this small: its batches run inline
ENV_ECS_API_RATE = "ECS_API_RATE_PER_SECOND"  # the stack's share of the account's 40/s
ENV_ECS_API_BURST = "ECS_API_BURST"
ENV_BATCH_IDENTICAL_STARTS = "BATCH_IDENTICAL_STARTS"  # "false": one StartTask per rank
ENV_MAX_HEALTH_CHECKS_PER_JOB = "MAX_HEALTH_CHECKS_PER_JOB"
ENV_MAX_HEALTH_CHECKS_IN_FLIGHT = "MAX_HEALTH_CHECKS_IN_FLIGHT"
# How a task is recognised as a protected rank: "convention" (its event's group and
# container environment only), "tags" (DescribeTasks), "both" (the convention first).
ENV_REGISTRATION = "REGISTRATION"
REGISTRATION_MODES = ("convention", "tags", "both")
FAULT_CATALOG_LAYER_DIR = "fault-catalog"  # /opt/<dir>/override.json in the Lambda runtime
FAULT_CATALOG_OVERRIDE_FILE = "override.json"

# Recovery functions run at most this long (infra sets their timeouts from it), so a
# claim (health-check start, reboot call, rank launch) older than the lease belongs to
# an invocation that died: the next sweep or redelivery takes it over.
RECOVERY_FUNCTION_TIMEOUT_SECONDS = 60
CLAIM_LEASE_SECONDS = RECOVERY_FUNCTION_TIMEOUT_SECONDS + 15
MAX_STOP_ROUNDS = 6  # a stop fan-out's paced rounds of asking again (recovery.gang), then given up
# The gang fan-out's worker claims rank launches too: a recovery function by the rule above. Its
# queue (infra/gang.py): visibility 6x its timeout (AWS's advice), the DLQ after this many receives.
GANG_WORKER_TIMEOUT_SECONDS = RECOVERY_FUNCTION_TIMEOUT_SECONDS
GANG_QUEUE_VISIBILITY_TIMEOUT_SECONDS = 6 * GANG_WORKER_TIMEOUT_SECONDS
GANG_QUEUE_MAX_RECEIVES = 5
GANG_BATCH_SIZE = 1  # a batch is up to 100 ranks of ECS work already
# Batches at once (the config's default). A start batch does DynamoDB work per rank (its
# launch claim, its registration) around few StartTasks (10 ranks a call): 4 workers started
# 8,192 per-GPU ranks at ~18 calls/s, half the budget; 8 keep up with it (docs/benchmarks.md).
DEFAULT_GANG_WORKER_CONCURRENCY = 8
# Lambda's async retries and event ages (event functions; scheduled ones); the three scheduled
# functions' rates and timeouts (the queue scheduler's below its tick lease).
RECOVERY_ASYNC_RETRIES, RECOVERY_EVENT_MAX_AGE_SECONDS = 2, 2 * 3600
SCHEDULED_ASYNC_RETRIES, SCHEDULED_MAX_EVENT_AGE_SECONDS = 2, 5 * 60
RECOVERY_SWEEP_RATE_SECONDS, RECOVERY_SWEEP_TIMEOUT_SECONDS = 60, 55
#: a recovery step that must be looked at again (a claim in flight, GPUs still held, nothing
#: placed yet) is due this far ahead: the recovery sweep's next run
RETRY_INTERVAL_SECONDS = RECOVERY_SWEEP_RATE_SECONDS
#: the recovery sweep takes what falls due this long after its own start too: EventBridge runs a
#: scheduled rule within its minute, not on the same second each minute, so a step rearmed a sweep
#: interval after one sweep's start could fall just after the next one's and wait a minute more
SWEEP_DUE_LEAD_SECONDS = RECOVERY_SWEEP_RATE_SECONDS // 4
#: the same while AWS takes a node away (recovery.aws_notices): a 2-minute notice has no minute to lose
NOTICE_RETRY_SECONDS = RECOVERY_SWEEP_RATE_SECONDS // 2
HEARTBEAT_SWEEP_RATE_SECONDS, HEARTBEAT_SWEEP_TIMEOUT_SECONDS = 60, 55
QUEUE_SCHEDULER_RATE_SECONDS, QUEUE_SCHEDULER_TIMEOUT_SECONDS = 60, 90
#: A queue launch's rank lease (``recovery.gang``): outlasts the tick too, which starts small launches
LAUNCH_LEASE_SECONDS = max(QUEUE_SCHEDULER_TIMEOUT_SECONDS, RECOVERY_FUNCTION_TIMEOUT_SECONDS) + 15
# Tag lookups (issue 28): a task with no rank and no registration convention is described by a
# worker on this queue, up to 100 tasks per DescribeTasks (the API's limit; SQS batches them, waiting
# up to the window), under the stack's Describe budget (its token bucket: ECS_DESCRIBE_RATE_PER_SECOND).
ENV_TAG_LOOKUP_QUEUE_URL = "TAG_LOOKUP_QUEUE_URL"  # "": described inline by the task handler
TAG_LOOKUP_BATCH_SIZE, TAG_LOOKUP_BATCHING_WINDOW_SECONDS = 100, 2
TAG_LOOKUP_WORKER_TIMEOUT_SECONDS = RECOVERY_FUNCTION_TIMEOUT_SECONDS
TAG_LOOKUP_VISIBILITY_TIMEOUT_SECONDS = 6 * TAG_LOOKUP_WORKER_TIMEOUT_SECONDS
TAG_LOOKUP_MAX_RECEIVES = 10
TAG_LOOKUP_WORKER_CONCURRENCY = 5
ECS_DESCRIBE_RATE_PER_SECOND, ECS_DESCRIBE_BURST = 10.0, 20
# Telemetry: per node and signal kind, at most one notification per this many seconds;
# stored signals not seen for the retention period are forgotten.
ENV_HW_SIGNAL_NOTIFY_SECONDS = "HW_SIGNAL_NOTIFY_SECONDS"
ENV_HW_SIGNAL_RETENTION_SECONDS = "HW_SIGNAL_RETENTION_SECONDS"
# The stack's reboot-only SSM Command document (ECS Anywhere hosts).
ENV_REBOOT_DOCUMENT = "REBOOT_DOCUMENT_NAME"
# Jobs API authorization (JSON lists): admin principals, team roles, task-definition
# families that may be submitted, task-role name prefixes, roles that may use the
# reserved (highest) priorities.
ENV_JOBS_ADMIN_ROLES = "JOBS_ADMIN_ROLES"
ENV_JOBS_TEAM_ROLES = "JOBS_TEAM_ROLES"
ENV_JOBS_ALLOWED_FAMILIES = "JOBS_ALLOWED_TASK_FAMILIES"
ENV_JOBS_TASK_ROLE_PREFIXES = "JOBS_TASK_ROLE_PREFIXES"
ENV_JOBS_PRIORITY_ROLES = "JOBS_RESERVED_PRIORITY_ROLES"
# The subnets and security groups a job's `network` may name (JSON list of grants:
# queue.access.parse_allowed_networks); none: no job may name a network.
ENV_JOBS_ALLOWED_NETWORKS = "JOBS_ALLOWED_TASK_NETWORKS"

# Time sharing: node quotas, preemption, graceful suspend.
ENV_QUOTA_TABLE = "QUOTA_TABLE_NAME"
# Operator side, not a function's: the stack's outputs file (`cdk deploy --outputs-file`) that
# `gpu-recovery-admin doctor` reads when --outputs-file is not given (make playground exports it).
ENV_STACK_OUTPUTS_FILE = "GPU_RECOVERY_OUTPUTS_FILE"
ENV_DEFAULT_NODE_QUOTAS = "DEFAULT_NODE_QUOTAS"  # JSON object: priority level -> nodes
ENV_PREEMPTION = "PREEMPTION_ENABLED"  # "false": a blocked job never suspends others
ENV_SUSPEND_GRACE_SECONDS = "SUSPEND_GRACE_SECONDS"  # default grace of a job (JobSpec overrides)
ENV_DEMOTE_AFTER_SECONDS = "DEMOTE_ABOVE_NORMAL_AFTER_SECONDS"  # 0: never
ENV_CONTROL_API_URL = "JOB_CONTROL_API_URL"  # given to every queue rank (suspend client)
ENV_CONTROL_POLL_SECONDS = "JOB_CONTROL_POLL_SECONDS"  # how often the client may ask
ENV_PREFLIGHT_SETTINGS = "PREFLIGHT_SETTINGS"  # JSON object: domain.preflight.settings

# Powertools' own variables, set by infra and by local mode alike.
ENV_POWERTOOLS_SERVICE_NAME = "POWERTOOLS_SERVICE_NAME"
ENV_POWERTOOLS_METRICS_NAMESPACE = "POWERTOOLS_METRICS_NAMESPACE"

# --------------------------------------------------------------------------------------
# DynamoDB: job table (original name "ecs-job-sub")
# --------------------------------------------------------------------------------------
DEFAULT_JOB_TABLE_NAME = "ecs-job-sub"
JOB_PK = "job_id_rank"  # "<job_id>#<rank>" for rank items, "<job_id>#JOB" for the job item
JOB_ITEM_SUFFIX = "JOB"

# Index: look a rank up from the task ARN in an ECS event.
JOB_BY_TASK_INDEX = "by-task-arn"
JOB_BY_TASK_PK = "task_arn"
# Index: every item of one job (job item + rank items), sorted by the table key.
JOB_BY_JOB_INDEX = "by-job-id"
JOB_BY_JOB_PK = "job_id"
JOB_BY_JOB_SK = "job_id_rank"
# Sparse index: only ranks that are live (STARTING/RUNNING/NODE_LOST) carry this
# attribute, so "what runs on this instance" never reads history.
JOB_BY_INSTANCE_INDEX = "by-container-instance"
JOB_BY_INSTANCE_PK = "live_container_inst_id"
JOB_BY_INSTANCE_SK = "job_id_rank"

# Sparse index shared by both tables' sweeps: only items with a pending deadline
# (reboot, health check, restart) carry these attributes, so the scheduled sweep
# reads only what can have timed out, never the whole table.
DEADLINE_INDEX = "by-deadline"
DEADLINE_PK = "deadline_bucket"  # the item's shard's bucket while a deadline is set
DEADLINE_SK = "deadline_at"  # epoch seconds (number)
DEADLINE_BUCKET = "DEADLINE"  # what writers set. Over DEADLINE_INDEX_SHARDS keys (docs/sizing.md):
# the repository's gateway puts an item in its key's shard, readers Query every shard.
DEADLINE_SHARDS_MAX = 32


def deadline_bucket(shard: int) -> str:
    """The by-deadline key of ``shard`` (shard 0: "DEADLINE", as unsharded: nothing stranded)."""
    return DEADLINE_BUCKET if shard == 0 else f"{DEADLINE_BUCKET}#{shard:02d}"

# Sparse index of heartbeating ranks (node heartbeats; issue 40, defect 9): only ranks in
# RUNNING / NODE_LOST / HUNG that have had at least one heartbeat carry HB_PK, so the stale
# sweep reads only the stale ones. Spread over HB_SHARDS partition keys ("WATCHED#07", a hash
# of job and rank: one key would take every heartbeat's index write, past one partition's
# 1,000 WCU/s), sorted by HB_SK, the start of the heartbeat's time slot (a heartbeat moves the
# entry only when it enters a new slot), KEYS_ONLY (an update that moves no key costs the
# index nothing). docs/heartbeats.md "The heartbeat index" has the arithmetic.
JOB_BY_HEARTBEAT_INDEX = "by-heartbeat-slot"
HB_PK = "hb_shard"  # "WATCHED#<shard>" while the rank is watched
HB_SK = "hb_slot"  # epoch seconds (number): the last heartbeat's slot start
HB_AT = "last_heartbeat_at"  # epoch seconds (number): the last heartbeat, exactly (no index key)
HB_BUCKET = "WATCHED"
# 10,000 nodes x 8 ranks, reports every 30 s, 90 s slots (staggered per shard): each entry
# moves every third report, ~1,800 index WCU/s in all, a shard ~55 on average and ~180 in the
# 30 s after its slot starts (make bench, docs/benchmarks.md); the sweep's 32 Queries a
# minute cost ~16 RCU. The functions' count: the stack deploys 32; local mode's two-node
# campaign worlds give fewer (HEARTBEAT_INDEX_SHARDS: the same writes and sweep, fewer Queries).
HB_SHARDS, ENV_HEARTBEAT_INDEX_SHARDS = 32, "HEARTBEAT_INDEX_SHARDS"

# Queue indexes (issue: job queue). Sparse: only QUEUED / PENDING_RESOURCES job items
# carry QUEUE_PK, ordered by QUEUE_SK = "<999-priority:03d>#<submitted_at:017.6f>#<job_id>"
# so ascending order is priority high -> low, then first come first served.
JOB_BY_QUEUE_INDEX = "by-queue-order"
QUEUE_PK = "queue_bucket"
QUEUE_SK = "queue_order"
QUEUE_BUCKET = "QUEUE"
# Listing, newest first: every queue-submitted job item carries these.
JOB_BY_USER_INDEX = "by-user"
USER_PK = "user"
SUBMITTED_SK = "submitted_at"  # epoch seconds (number)
JOB_BY_STATE_INDEX = "by-state"
STATE_PK = "job_state"
JOB_LIST_INDEX = "by-submitted"
LIST_PK = "list_bucket"  # constant LIST_BUCKET on every job item created by the queue
LIST_BUCKET = "JOB"
# Sparse index of queue jobs that hold nodes (and a quota charge): the scheduler releases
# the charges of jobs that stopped holding, demotes ABOVE_NORMAL jobs and picks
# preemption victims from it, reading only the jobs holding nodes. Only the attributes
# those need are projected.
JOB_BY_HOLDING_INDEX = "by-holding"
HOLDING_PK = "holding_bucket"  # constant HOLDING_BUCKET while a quota charge is held
HOLDING_SK = "holding_since"  # epoch seconds (number)
HOLDING_BUCKET = "HOLDING"
HOLDING_PROJECTION = ("job_id", "job_state", "user", "quota_subject", "priority", "world_size",
                      "gpus_per_node", "quota_charge", "launched_at", "attempt", "suspend", "source",
                      "suspend_grace_seconds")


# The job-control channel's environment (the launcher puts it in a task's environment;
# the routes and the gateway's answers: gpu_recovery.api_routes).
CONTROL_TOKEN_ENV = "GPU_RECOVERY_CONTROL_TOKEN"
CONTROL_URL_ENV = "GPU_RECOVERY_CONTROL_URL"
RESUME_COUNT_ENV = "RESUME_COUNT"


def queue_order(priority: int, submitted_at: float, job_id: str) -> str:
    return f"{999 - priority:03d}#{submitted_at:017.6f}#{job_id}"


# A job relocated off a faulty node goes back to the queue ahead of every job of its
# priority ("!" sorts before the digits of a submission time), keeping its original
# submission order among relocated jobs.
RELOCATED_QUEUE_MARK = "!"


def relocated_queue_order(priority: int, submitted_at: float, job_id: str) -> str:
    return f"{999 - priority:03d}#{RELOCATED_QUEUE_MARK}{submitted_at:017.6f}#{job_id}"


# --------------------------------------------------------------------------------------
# DynamoDB: node token table (issue: node heartbeats) — one item per node, token hash only
# --------------------------------------------------------------------------------------
NODE_TOKEN_PK = "node_id"

# --------------------------------------------------------------------------------------
# DynamoDB: container-instance table (original name "ecs_container_instance")
# --------------------------------------------------------------------------------------
DEFAULT_INSTANCE_TABLE_NAME = "ecs_container_instance"
DEFAULT_NODE_TOKEN_TABLE_NAME = "gpu_node_token"
DEFAULT_IDEMPOTENCY_TABLE_NAME = "gpu_job_idempotency"
# Node quotas and their usage: one partition ("QUOTA"), one item per user and level, so
# listing them is a Query, never a Scan.
DEFAULT_QUOTA_TABLE_NAME = "gpu_job_quota"
# Sparse index of health checks waiting for a slot (their job's share or the cluster's
# limit), per owner job, oldest first: a slot given back starts the job's next one.
INSTANCE_BY_HC_WAIT_INDEX = "by-health-check-wait"
HC_WAIT_PK = "hc_wait_job"  # the job whose share the waiting check counts against
HC_WAIT_SK = "hc_requested_at"  # epoch seconds (number)

QUOTA_PK = "quota_bucket"
QUOTA_SK = "quota_key"  # "<user>#<priority:03d>"
QUOTA_BUCKET = "QUOTA"
INSTANCE_PK = "container_inst_id"  # container instance id (last part of the ARN)
# The blast-radius breaker's state: one item in the container-instance table.
BREAKER_ITEM_KEY = "BREAKER#node-actions"
# ECS attribute syncs still to do ("<node>#<version>", domain.cordon) and the holds, over
# CORDON_SYNC_SHARDS items by the node's hash (repository.cordons says why).
CORDON_SYNC_ITEM_KEY = "CORDON#ecs-attribute-sync"
CORDON_SYNC_SHARDS = 16
# The stack's share of the account's ECS control-plane request bucket (a GCRA).
ECS_RATE_ITEM_KEY = "RATE#ecs-control-plane"
ECS_DESCRIBE_RATE_ITEM_KEY = "RATE#ecs-describe"  # the stack's DescribeTasks budget
# DCGM health checks running in the cluster (their slots), beside the breaker: on shard
# items (no hot item), plus the unsharded item of before (released and read, not claimed).
HEALTH_CHECK_SLOTS_KEY = "SLOTS#health-checks"
HEALTH_CHECK_SLOT_SHARDS = 64


def health_check_slot_shard_key(shard: int) -> str:
    return f"{HEALTH_CHECK_SLOTS_KEY}#{shard}"


def job_item_key(job_id: str) -> str:
    return f"{job_id}#{JOB_ITEM_SUFFIX}"


def rank_item_key(job_id: str, rank: int) -> str:
    return f"{job_id}#{rank}"


# Items of a job beside its job item and rank items (job ids never contain "#"). None of
# them grows with the job's size: a suspect per node, a latch shard per 64 ranks.
def suspect_item_key(job_id: str, attempt: int, container_inst_id: str) -> str:
    """One suspect node of the fault of ``attempt``: its verdict and evidence."""
    return f"{job_id}#S#a{attempt}#{container_inst_id}"


def suspect_key_prefix(job_id: str, attempt: int) -> str:
    return f"{job_id}#S#a{attempt}#"


def latch_shard_key(job_id: str, attempt: int, shard: int) -> str:
    """64 ranks' arrivals at the attempt's latches (registered, ended, done)."""
    return f"{job_id}#L#a{attempt}#{shard}"


def fault_tally_shard_key(job_id: str, attempt: int, shard: int) -> str:
    """Healthy verdicts of the fault of ``attempt`` counted off the job item (no hot item)."""
    return f"{job_id}#T#a{attempt}#{shard}"


def latch_head_key(job_id: str, attempt: int) -> str:
    """The attempt's latches: which shards are complete."""
    return f"{job_id}#L#a{attempt}"


def unprotected_task_key(task_arn: str) -> str:
    """A task DescribeTasks showed not to be a protected rank (a negative record with a TTL:
    its later events cost no DescribeTasks). Carries the task index's key, so the lookup that
    finds a rank by its task finds this record in the same query."""
    return f"UNPROTECTED#{task_arn}"


def verdict_lease_key(task_arn: str) -> str:
    """Which delivery of a health check's STOPPED event works its verdict (no transaction's)."""
    return f"VERDICT#{task_arn.rsplit('/', 1)[-1]}"


def refused_item_key(job_id: str) -> str:
    """Marks a tagged job refused (too large): operators are told once."""
    return f"{job_id}#REFUSED"


def placement_item_key(job_id: str, attempt: int) -> str:
    """Where the gang restart that starts ``attempt`` moves ranks off unusable nodes."""
    return f"{job_id}#P#a{attempt}"


def launch_plan_key(job_id: str, attempt: int, chunk: int) -> str:
    """A queue launch's nodes (80 ranks per item): the job item keeps only their count."""
    return f"{job_id}#LP#a{attempt}#{chunk}"


def notice_item_key(owner: str, digest: str) -> str:
    """An e-mail owed (the notice outbox): committed with the decision it reports, marked
    sent once published (then expired by the table's TTL). ``owner``: the job id, or
    ``node:<container instance id>``."""
    return f"{owner}#N#{digest}"


def preflight_item_key(job_id: str, attempt: int) -> str:
    """The gang preflight of ``attempt``: its round, its tests and results, what it pinned."""
    return f"{job_id}#PF#a{attempt}"


# The gang preflight's baselines in the instance table: <prefix><node class>#<node count>.
PREFLIGHT_BASELINE_PREFIX = "PREFLIGHT_BASELINE#"


def tenant_evidence_job_key(job_id: str) -> str:
    """The suspects a job's own evidence named that the stack's check cleared (issue 49)."""
    return f"{job_id}#TE"


def tenant_evidence_user_key(user: str) -> str:
    """The same, for every job of one user (a small bounded item, in the job table)."""
    return f"TENANT_EVIDENCE#{user}"


def health_check_slots_key(job_id: str) -> str:
    """The job's DCGM health checks running at once (its share of the cluster's)."""
    return f"{job_id}#HC"


def _gsi(name: str, pk: str, sk: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": pk, "KeyType": "HASH"},
            {"AttributeName": sk, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }


def table_definitions() -> dict[str, dict[str, Any]]:
    """Key schema and indexes of every table, as DynamoDB CreateTable arguments.

    infra/ turns these into CDK tables; local mode and tests create them in moto.
    """
    keys_only = {"ProjectionType": "KEYS_ONLY"}
    deadline_index = _gsi(DEADLINE_INDEX, DEADLINE_PK, DEADLINE_SK)
    return {
        "node_token": {
            "KeySchema": [{"AttributeName": NODE_TOKEN_PK, "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": NODE_TOKEN_PK, "AttributeType": "S"}],
        },
        "job": {
            "KeySchema": [{"AttributeName": JOB_PK, "KeyType": "HASH"}],
            "AttributeDefinitions": [
                {"AttributeName": JOB_PK, "AttributeType": "S"},
                {"AttributeName": JOB_BY_TASK_PK, "AttributeType": "S"},
                {"AttributeName": JOB_BY_JOB_PK, "AttributeType": "S"},
                {"AttributeName": JOB_BY_INSTANCE_PK, "AttributeType": "S"},
                {"AttributeName": DEADLINE_PK, "AttributeType": "S"},
                {"AttributeName": DEADLINE_SK, "AttributeType": "N"},
                {"AttributeName": HB_PK, "AttributeType": "S"},
                {"AttributeName": HB_SK, "AttributeType": "N"},
                {"AttributeName": QUEUE_PK, "AttributeType": "S"},
                {"AttributeName": QUEUE_SK, "AttributeType": "S"},
                {"AttributeName": USER_PK, "AttributeType": "S"},
                {"AttributeName": SUBMITTED_SK, "AttributeType": "N"},
                {"AttributeName": STATE_PK, "AttributeType": "S"},
                {"AttributeName": LIST_PK, "AttributeType": "S"},
                {"AttributeName": HOLDING_PK, "AttributeType": "S"},
                {"AttributeName": HOLDING_SK, "AttributeType": "N"},
            ],
            "GlobalSecondaryIndexes": [
                # KEYS_ONLY: readers re-read the item by key, and an update that touches no
                # key attribute (every heartbeat) then costs no write on these indexes.
                {
                    "IndexName": JOB_BY_TASK_INDEX,
                    "KeySchema": [{"AttributeName": JOB_BY_TASK_PK, "KeyType": "HASH"}],
                    "Projection": keys_only,
                },
                {
                    "IndexName": JOB_BY_JOB_INDEX,
                    "KeySchema": [
                        {"AttributeName": JOB_BY_JOB_PK, "KeyType": "HASH"},
                        {"AttributeName": JOB_BY_JOB_SK, "KeyType": "RANGE"},
                    ],
                    "Projection": keys_only,
                },
                _gsi(JOB_BY_INSTANCE_INDEX, JOB_BY_INSTANCE_PK, JOB_BY_INSTANCE_SK),
                deadline_index,
                {**_gsi(JOB_BY_HEARTBEAT_INDEX, HB_PK, HB_SK), "Projection": keys_only},
                _gsi(JOB_BY_QUEUE_INDEX, QUEUE_PK, QUEUE_SK),
                _gsi(JOB_BY_USER_INDEX, USER_PK, SUBMITTED_SK),
                _gsi(JOB_BY_STATE_INDEX, STATE_PK, SUBMITTED_SK),
                _gsi(JOB_LIST_INDEX, LIST_PK, SUBMITTED_SK),
                {
                    "IndexName": JOB_BY_HOLDING_INDEX,
                    "KeySchema": [
                        {"AttributeName": HOLDING_PK, "KeyType": "HASH"},
                        {"AttributeName": HOLDING_SK, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "INCLUDE",
                                   "NonKeyAttributes": list(HOLDING_PROJECTION)},
                },
            ],
        },
        "quota": {
            "KeySchema": [
                {"AttributeName": QUOTA_PK, "KeyType": "HASH"},
                {"AttributeName": QUOTA_SK, "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": QUOTA_PK, "AttributeType": "S"},
                {"AttributeName": QUOTA_SK, "AttributeType": "S"},
            ],
        },
        "instance": {
            "KeySchema": [{"AttributeName": INSTANCE_PK, "KeyType": "HASH"}],
            "AttributeDefinitions": [
                {"AttributeName": INSTANCE_PK, "AttributeType": "S"},
                {"AttributeName": DEADLINE_PK, "AttributeType": "S"},
                {"AttributeName": DEADLINE_SK, "AttributeType": "N"},
                {"AttributeName": HC_WAIT_PK, "AttributeType": "S"},
                {"AttributeName": HC_WAIT_SK, "AttributeType": "N"},
            ],
            "GlobalSecondaryIndexes": [
                deadline_index,
                {
                    "IndexName": INSTANCE_BY_HC_WAIT_INDEX,
                    "KeySchema": [
                        {"AttributeName": HC_WAIT_PK, "KeyType": "HASH"},
                        {"AttributeName": HC_WAIT_SK, "KeyType": "RANGE"},
                    ],
                    "Projection": keys_only,
                },
            ],
        },
    }


NOTIFICATION_KIND_ATTRIBUTE = "event_kind"
#: a notice's id (its content's digest): the same on a repeat of it (published at least once)
NOTICE_ID_ATTRIBUTE = "notice_id"

# The largest job the recovery loop protects (tasks), and the queue's largest (nodes): one
# task per GPU on 1,024 nodes of 8 GPUs. A larger tagged job is refused loudly.
MAX_WORLD_SIZE = 8192
MAX_QUEUE_NODES = 1024
# ECS: at most 50 tags a task, those prefixed aws: aside (ECS API Reference, Tag). A restarted
# task carries its original's tags plus gpu-recovery:attempt: a tagged job with no room for
# it is refused at registration (recovery/task_refusals.py, TooManyTags).
MAX_TASK_TAGS = 50

# --------------------------------------------------------------------------------------
# ECS task tags that opt a job in to recovery
# --------------------------------------------------------------------------------------
TAG_JOB_ID = "gpu-recovery:job-id"
TAG_RANK = "gpu-recovery:rank"
TAG_WORLD_SIZE = "gpu-recovery:world-size"
TAG_ATTEMPT = "gpu-recovery:attempt"
# On tasks one StartTask started for several identical ranks (one set of overrides and tags
# for up to 10 nodes): the ranks of that call as space-separated runs, "3 11 19", "0-3 5" (ECS
# tag values take no comma: domain/launch_plan.py); each task is the rank planned on its
# container instance. Training code of such jobs takes its rank from its rendezvous.
TAG_RANKS = "gpu-recovery:ranks"
# Optional task tags of tag-registered jobs: relocation opt-in and per-job budgets.
TAG_RELOCATABLE = "gpu-recovery:relocatable"  # "true": may be restarted on other nodes
TAG_MAX_INFRA_RECOVERIES = "gpu-recovery:max-infra-recoveries"
TAG_MAX_APP_RESTARTS = "gpu-recovery:max-app-restarts"
TAG_PURPOSE = "gpu-recovery:purpose"  # which of the stack's own node tasks (recovery/node_tasks.py)
# awsvpc tasks: their security groups (and subnets), space-separated (domain.task_network).
TAG_SECURITY_GROUPS, TAG_SUBNETS = "gpu-recovery:security-groups", "gpu-recovery:subnets"
# The registration convention (docs/architecture.md "Registration"): a task whose ``group``
# is ``gpu-recovery:<job-id>`` and whose container environment carries RANK and WORLD_SIZE
# (ATTEMPT optional, 1 by default) is a protected rank, registered from its ECS event alone
# (no DescribeTasks). The queue's launcher and the gang restart start every task this way.
JOB_GROUP_PREFIX = "gpu-recovery:"
ENV_VAR_RANK = "RANK"
ENV_VAR_WORLD_SIZE = "WORLD_SIZE"
ENV_VAR_ATTEMPT = "ATTEMPT"
# Optional, as the tags of the same meaning: relocation opt-in and per-job budgets.
ENV_VAR_RELOCATABLE = "GPU_RECOVERY_RELOCATABLE"
ENV_VAR_MAX_INFRA_RECOVERIES = "GPU_RECOVERY_MAX_INFRA_RECOVERIES"
ENV_VAR_MAX_APP_RESTARTS = "GPU_RECOVERY_MAX_APP_RESTARTS"
ENV_VAR_SECURITY_GROUPS, ENV_VAR_SUBNETS = "GPU_RECOVERY_SECURITY_GROUPS", "GPU_RECOVERY_SUBNETS"
# A task found not protected is not described again for this long (DynamoDB TTL deletes
# the record later; readers ignore an expired one).
UNPROTECTED_TASK_TTL_SECONDS = 14 * 24 * 3600
JOB_TABLE_TTL_ATTRIBUTE = "purge_at"


def job_group(job_id: str) -> str:
    """The ``group`` of a job's tasks under the registration convention."""
    return f"{JOB_GROUP_PREFIX}{job_id}"


# Health-check tasks are started with this group / startedBy so their events are
# routed to the DCGM monitor and never to the training-task handler.
HEALTH_CHECK_GROUP = "gpu-recovery-health-check"
# The GPU reset task (recovery.gpu_resets): its group starts with HEALTH_CHECK_GROUP so the
# same event rules route its STOPPED event to the health-check monitor (never to the
# training-task handler); the monitor tells the two apart by this group.
GPU_RESET_GROUP = f"{HEALTH_CHECK_GROUP}-gpu-reset"
# A repaired node's validation (recovery.validations): the health-check task definition with
# its level and load in the container's environment; its group routes its STOPPED event to the
# health-check monitor like the check's.
GPU_VALIDATION_GROUP = f"{HEALTH_CHECK_GROUP}-validation"
DEFAULT_GPU_RESET_FAMILY = "gpu-reset"

# The custom container-instance attributes the rule matches (event_patterns' instance pattern):
# a node the stack reboots (value: the request's epoch seconds), a lost node SUSPECT until its
# ECS agent reconnects and the stack's own check passes it (recovery.lost_node_checks).
REBOOTING_ATTRIBUTE, LOST_NODE_ATTRIBUTE = "gpu-recovery.rebooting", "gpu-recovery.lost-node"

DEFAULT_HEALTH_CHECK_FAMILY = "gpu-health-check"
# Reboot-only SSM document: the name local mode uses (the stack passes its own name).
DEFAULT_REBOOT_DOCUMENT_NAME = "GpuRecovery-RebootNode"
HEALTH_CHECK_CONTAINER_NAME = "dcgm"
HEALTH_CHECK_LOG_STREAM_PREFIX = "dcgm"  # awslogs stream: <prefix>/<container>/<task-id>
