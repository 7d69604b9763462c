"""The stack: composes the constructs of the product (recovery loop, API, job queue).

Attributes for composition:
    config          RecoveryConfig
    access          ClusterAccess (cluster ARN + least-privilege statement builders)
    tables          RecoveryTables (.job_table, .instance_table, .quota_table,
                    .grant_read_write_data, .grant_quota_data)
    notifications   Notifications (.topic, .key, .grant_publish)
    health_check    HealthCheck (.task_definition | None, .log_group | None, .task_reference)
    gang            GangFanout (.queue, .dead_letter_queue, .worker, .grant_send): the gang
                    fan-out queue (its URL is in every function's environment) and worker
    gang_worker     RecoveryFunction: gang.worker
    lambda_defaults LambdaDefaults (shared runtime/layer/env for new RecoveryFunctions)
    recovery        RecoveryFunctions (.task_handler, .dcgm_monitor, .instance_monitor,
                    .sweep, .functions, .dead_letter_queues, .rules)
    node_api        NodeApi (.rest_api, .v1, .stage, .url, .token_table, .functions, ...):
                    THE RestApi (stage prod) with the node routes (token authorizer)
    jobs_api        JobsApi (.function, .idempotency_table, .methods): /v1/jobs and
                    /v1/quotas routes (IAM) on node_api.rest_api
    control_api     JobControlApi (.function, .authorizer_function, .methods): /v1/control
                    routes (control-token authorizer) on api.rest_api
    scheduler       QueueScheduler (.function, .rule, .dead_letter_queue)
    node_agent      NodeAgentDaemon | None (context node_agent_daemon)
    functions       every RecoveryFunction of the stack by name
    invocations     how each of them is invoked (monitoring.Invocation: its alarm policy)
    dead_letter_queues  every dead-letter queue of the stack by name
    rules           every EventBridge rule of the stack by name (the function it triggers)
    monitoring      Monitoring (.dashboard, .error_alarms, .dlq_alarms, .alarms)

Outputs: what ``gpu-recovery-admin doctor`` reads (cluster, tag, tables, topic, health
check, rules and their DLQs, the gang queue, its worker and DLQ) plus the API URL and the
resolved Powertools layer.

Large jobs: every function that may stop or start a gang (the four recovery functions,
the node API and heartbeat sweep, the job-control API, the scheduler, the jobs API, the
worker itself) gets ``sqs:SendMessage`` on the gang queue only. Every one of them calls
StartTask / StopTask through the stack's shared ECS budget, an item of the instance table
(``ECS_API_RATE_PER_SECOND`` / ``ECS_API_BURST``); the jobs and job-control APIs, which
read no other instance item, may read and write that one key only (``dynamodb:LeadingKeys``).

API security (cdk-nag AwsSolutions): every method is AWS_IAM (jobs, quotas, swagger) or
CUSTOM (node routes and job-control routes, each with its Lambda token authorizer); the
stage has access logs, execution logs (ERROR), X-Ray and throttling (api_throttle_rate /
api_throttle_burst); the API has a request validator (node report bodies are
schema-checked; job specs are validated by the jobs handler). No WAF web ACL is created
(AwsSolutions-APIG3 is acknowledged in infra/node_api.py): no default rule set fits both
signed IAM calls and node reports at ~700 requests/s without per-request WAF cost or
false positives on telemetry bodies; associate a web ACL of your choice with the
``prod`` stage if your policy requires one.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import (
    ENV_BATCH_IDENTICAL_STARTS,
    ENV_CLUSTER_NAME,
    ENV_CONTROL_API_URL,
    ENV_DCGM_LEVEL,
    ENV_DEADLINE_INDEX_SHARDS,
    ENV_DEFAULT_NODE_QUOTAS,
    ENV_DEMOTE_AFTER_SECONDS,
    ENV_ECS_API_BURST,
    ENV_ECS_API_RATE,
    ENV_FAULT_CATALOG_OVERRIDE,
    ENV_GANG_INLINE_MAX_RANKS,
    ENV_GANG_QUEUE_URL,
    ENV_GPU_RESET_TASK,
    ENV_HEALTH_CHECK_ALL_NODES,
    ENV_HEALTH_CHECK_GPUS,
    ENV_HEALTH_CHECK_TASK,
    ENV_HEALTH_CHECK_TIMEOUT_MINUTES,
    ENV_HELD_JOB_DEADLINE_SECONDS,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_JOBS_ADMIN_ROLES,
    ENV_JOBS_ALLOWED_FAMILIES,
    ENV_JOBS_ALLOWED_NETWORKS,
    ENV_JOBS_PRIORITY_ROLES,
    ENV_JOBS_TASK_ROLE_PREFIXES,
    ENV_JOBS_TEAM_ROLES,
    ENV_LEND_SPARES,
    ENV_MAX_APP_RESTARTS,
    ENV_MAX_HEALTH_CHECKS_IN_FLIGHT,
    ENV_MAX_HEALTH_CHECKS_PER_JOB,
    ENV_MAX_RECOVERY_ATTEMPTS,
    ENV_POST_REPAIR_VALIDATION,
    ENV_PREEMPTION,
    ENV_PREFLIGHT_SETTINGS,
    ENV_QUOTA_TABLE,
    ENV_REBOOT_DOCUMENT,
    ENV_REBOOT_TIMEOUT_MINUTES,
    ENV_REGISTRATION,
    ENV_RELOCATE_INSTEAD_OF_WAIT,
    ENV_RELOCATION_WAIT_SECONDS,
    ENV_REMEDIATION_SETTINGS,
    ENV_SNS_TOPIC_ARN,
    ENV_SPARE_NODES,
    ENV_SUSPECT_EXIT_CODES,
    ENV_SUSPEND_GRACE_SECONDS,
    ENV_TAG_LOOKUP_QUEUE_URL,
)
from infra.config import RecoveryConfig
from infra.control_api import JobControlApi
from infra.fault_catalog import RUNTIME_PATH, override_layer
from infra.gang import GangFanout
from infra.gpu_reset import GpuReset
from infra.health_check import HealthCheck
from infra.jobs_api import JobsApi
from infra.lambda_common import (
    POWERTOOLS_PACKAGE,
    LambdaDefaults,
    RecoveryFunction,
    pinned_version,
    powertools_layer_arn,
)
from infra.monitoring import Invocation, Monitoring
from infra.node_agent import NodeAgentDaemon
from infra.node_api import HeartbeatConfig, NodeApi
from infra.notifications import Notifications
from infra.reboot_document import RebootDocument
from infra.recovery import ClusterAccess, RecoveryFunctions
from infra.scheduler import QueueScheduler
from infra.tables import RecoveryTables
from infra.tag_lookups import TagLookups


def heartbeat_config(config: RecoveryConfig) -> HeartbeatConfig:
    """The heartbeat / API stage settings of ``config`` (other fields: HeartbeatConfig's)."""
    return HeartbeatConfig(
        stale_seconds=config.heartbeat_stale_seconds,
        node_lost_fail_seconds=config.node_lost_fail_seconds,
        hang_seconds=config.hang_seconds,
        hang_action=config.hang_action,
        throttle_rate=config.api_throttle_rate,
        throttle_burst=config.api_throttle_burst,
        signal_notify_seconds=config.telemetry_notify_interval_seconds,
        signal_retention_seconds=config.telemetry_signal_retention_seconds,
    )


def large_jobs_environment(config: RecoveryConfig, gang_queue_url: str) -> dict[str, str]:
    """Every function's: the gang queue, the ECS budget, grouped starts, health checks at once,
    the deadline index's shards (every reader of the index must read each of them)."""
    return {
        ENV_GANG_QUEUE_URL: gang_queue_url,
        ENV_ECS_API_RATE: f"{config.ecs_api_rate_per_second:g}",
        ENV_ECS_API_BURST: str(config.ecs_api_burst),
        ENV_BATCH_IDENTICAL_STARTS: "true" if config.batch_identical_starts else "false",
        ENV_GANG_INLINE_MAX_RANKS: str(config.gang_inline_max_ranks),
        ENV_DEADLINE_INDEX_SHARDS: str(config.deadline_index_shards),
        ENV_MAX_HEALTH_CHECKS_PER_JOB: str(config.max_health_checks_per_job),
        ENV_MAX_HEALTH_CHECKS_IN_FLIGHT: str(config.max_health_checks_in_flight),
        ENV_REGISTRATION: config.registration,
    }


def jobs_access_environment(config: RecoveryConfig) -> dict[str, str]:
    """The jobs API's authorization settings (gpu_recovery.queue.access.AccessPolicy)."""
    return {
        ENV_JOBS_ADMIN_ROLES: json.dumps(list(config.admin_roles)),
        ENV_JOBS_TEAM_ROLES: json.dumps(list(config.team_roles)),
        ENV_JOBS_ALLOWED_FAMILIES: json.dumps(list(config.allowed_task_families)),
        ENV_JOBS_TASK_ROLE_PREFIXES: json.dumps([config.task_role_name_prefix]),
        ENV_JOBS_PRIORITY_ROLES: json.dumps(list(config.reserved_priority_roles)),
        ENV_JOBS_ALLOWED_NETWORKS: config.allowed_task_networks,
    }


def quota_environment(config: RecoveryConfig, quota_table_name: str) -> dict[str, str]:
    """What the jobs API and the scheduler share of time sharing (TimeSharingSettings):
    the quota table, the deployment's default quotas and a job's default suspend grace."""
    return {
        ENV_QUOTA_TABLE: quota_table_name,
        ENV_DEFAULT_NODE_QUOTAS: config.default_node_quotas or "{}",  # {}: no quota
        ENV_SUSPEND_GRACE_SECONDS: str(config.suspend_grace_seconds),
    }


def scheduler_time_sharing_environment(config: RecoveryConfig, quota_table_name: str,
                                       control_api_url: str) -> dict[str, str]:
    """The scheduler's time-sharing settings: the above, preemption, demotion and the
    control API URL the launcher gives every rank (the suspend channel)."""
    return {
        **quota_environment(config, quota_table_name),
        ENV_PREEMPTION: "true" if config.preemption else "false",
        ENV_DEMOTE_AFTER_SECONDS: str(60 * config.demote_above_normal_minutes),  # 0: never
        ENV_CONTROL_API_URL: control_api_url,
    }


class GpuRecoveryStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: RecoveryConfig, **kwargs: Any
    ) -> None:
        kwargs.setdefault(
            "description", "Keeps multi-node GPU training jobs on Amazon ECS alive"
        )
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        self.access = ClusterAccess(self, config)
        self.tables = RecoveryTables(self, "Tables", removal_policy=config.table_removal_policy)
        self.notifications = Notifications(self, "Notifications", alert_email=config.alert_email)
        self.health_check = HealthCheck(self, "HealthCheck", config=config)
        if self.health_check.task_definition is not None:
            # The stack's own health check runs with its own (CDK-named) roles.
            task_definition = self.health_check.task_definition
            self.access.allow_passing(task_definition.task_role.role_arn, *(
                [task_definition.execution_role.role_arn] if task_definition.execution_role else []))
        self.gpu_reset = GpuReset(self, "GpuReset", config=config)
        reset_definition = self.gpu_reset.task_definition
        self.access.allow_passing(reset_definition.task_role.role_arn, *(
            [reset_definition.execution_role.role_arn] if reset_definition.execution_role else []))
        self.reboot_document = RebootDocument(self, "RebootDocument")
        self.access.use_reboot_document(self.reboot_document.arn)
        self.fault_catalog_layer = override_layer(self, config)
        remediation_env = {
            ENV_MAX_APP_RESTARTS: str(config.max_app_restarts),
            ENV_REMEDIATION_SETTINGS: config.remediation_settings_json,
            ENV_RELOCATE_INSTEAD_OF_WAIT: "true" if config.relocate_instead_of_wait else "false",
            ENV_RELOCATION_WAIT_SECONDS: str(config.relocation_wait_seconds),
            ENV_SPARE_NODES: config.spare_nodes,
            ENV_LEND_SPARES: "true" if config.lend_spares else "false",
            ENV_HELD_JOB_DEADLINE_SECONDS: str(config.held_job_deadline_seconds),
            ENV_POST_REPAIR_VALIDATION: config.validation.to_json(),
        }
        if self.fault_catalog_layer is not None:
            remediation_env[ENV_FAULT_CATALOG_OVERRIDE] = RUNTIME_PATH
        # The queue first: every function's environment names it.
        self.gang = GangFanout(self, "GangFanout")
        self.tag_lookups = TagLookups(self, "TagLookups")
        self.lambda_defaults = LambdaDefaults(
            config=config,
            environment={
                ENV_JOB_TABLE: self.tables.job_table.table_name,
                ENV_INSTANCE_TABLE: self.tables.instance_table.table_name,
                ENV_CLUSTER_NAME: config.cluster_name,
                ENV_HEALTH_CHECK_TASK: self.health_check.task_reference,
                ENV_GPU_RESET_TASK: self.gpu_reset.task_reference,
                ENV_SNS_TOPIC_ARN: self.notifications.topic.topic_arn,
                ENV_MAX_RECOVERY_ATTEMPTS: str(config.max_recovery_attempts),
                ENV_SUSPECT_EXIT_CODES: config.suspect_exit_codes_json,
                ENV_REBOOT_TIMEOUT_MINUTES: str(config.reboot_timeout_minutes),
                ENV_HEALTH_CHECK_TIMEOUT_MINUTES: str(config.health_check_timeout_minutes),
                ENV_DCGM_LEVEL: str(config.dcgm_level),
                ENV_HEALTH_CHECK_GPUS: str(config.health_check_gpus),
                ENV_HEALTH_CHECK_ALL_NODES: "true" if config.health_check_all_nodes else "false",
                **remediation_env,
                ENV_REBOOT_DOCUMENT: self.reboot_document.name,
                **large_jobs_environment(config, self.gang.queue_url),
                ENV_TAG_LOOKUP_QUEUE_URL: self.tag_lookups.queue_url,
                ENV_PREFLIGHT_SETTINGS: config.preflight_settings_json,
            },
            extra_layers=[self.fault_catalog_layer] if self.fault_catalog_layer is not None else [],
        )
        self.recovery = RecoveryFunctions(
            self,
            "Recovery",
            config=config,
            defaults=self.lambda_defaults,
            tables=self.tables,
            notifications=self.notifications,
            health_check=self.health_check,
            access=self.access,
        )
        # One RestApi: node routes (token authorizer) + the jobs routes (IAM) on the same stage.
        self.node_api = NodeApi(
            self,
            "NodeApi",
            defaults=self.lambda_defaults,
            tables=self.tables,
            notifications=self.notifications,
            access=self.access,
            heartbeat=heartbeat_config(config),
            removal_policy=config.table_removal_policy,
        )
        # The training code's suspend channel, on the same RestApi and stage.
        self.control_api = JobControlApi(
            self,
            "JobControlApi",
            rest_api=self.node_api.rest_api,
            defaults=self.lambda_defaults,
            tables=self.tables,
            access=self.access,
            authorizer_cache_seconds=self.node_api.authorizer_cache_seconds,
        )
        quota_table_name = self.tables.quota_table.table_name
        self.scheduler = QueueScheduler(
            self,
            "QueueScheduler",
            job_table=self.tables.job_table,
            instance_table=self.tables.instance_table,
            cluster_name=config.cluster_name,
            defaults=self.lambda_defaults,
            access=self.access,
            topic=self.notifications.topic,
            quota_table=self.tables.quota_table,
            # stage_url, not node_api.url: the scheduler depends on the RestApi resource only
            # (node_api.url -> stage -> deployment -> methods -> jobs API -> scheduler: a cycle).
            extra_environment=scheduler_time_sharing_environment(
                config, quota_table_name, self.node_api.stage_url),
        )
        # Given the scheduler, the jobs API gets SCHEDULER_FUNCTION_NAME and
        # lambda:InvokeFunction on exactly that function (the grant_invoke equivalent).
        # Construct id unchanged since the API was "the queue API": it prefixes deployed
        # resources' logical IDs (a new id would replace the idempotency table).
        self.jobs_api = JobsApi(
            self,
            "JobQueueApi",
            rest_api=self.node_api.rest_api,
            job_table=self.tables.job_table,
            cluster_name=config.cluster_name,
            defaults=self.lambda_defaults,
            scheduler_function=self.scheduler.function,
            training_log_groups=config.training_log_groups,
            extra_environment={**jobs_access_environment(config),
                               **quota_environment(config, quota_table_name)},
            quota_table=self.tables.quota_table,
            removal_policy=(
                RemovalPolicy.DESTROY
                if config.table_removal_policy == "destroy"
                else RemovalPolicy.RETAIN
            ),
        )
        self.gang_worker = self.gang.add_worker(
            defaults=self.lambda_defaults, tables=self.tables, notifications=self.notifications,
            access=self.access, max_concurrency=config.gang_worker_concurrency)
        self.tag_lookup_worker = self.tag_lookups.add_worker(
            defaults=self.lambda_defaults, tables=self.tables, notifications=self.notifications,
            access=self.access, extra=[self.gang.send_statement()])
        self.tag_lookups.grant_send(self.recovery.task_handler)
        # Whoever may stop or start a gang sends its batches to the queue (the worker its
        # own continuations, in add_worker).
        self.gang.grant_send(
            *self.recovery.functions.values(), self.node_api.api_function, self.node_api.sweep_function,
            self.control_api.function, self.scheduler.recovery_function, self.jobs_api.function)
        # The ECS budget's item: the other callers of StartTask / StopTask have the instance
        # table already; these two read no other instance item.
        for fn in (self.jobs_api.function, self.control_api.function):
            fn.add_to_policy(self.tables.ecs_budget_statement())
        # The gang preflight's baselines: the control API judges reports and learns passing runs.
        self.control_api.function.add_to_policy(self.tables.preflight_baselines_statement())
        self.node_agent: NodeAgentDaemon | None = None
        if config.node_agent_daemon:
            self.node_agent = NodeAgentDaemon(
                self, "NodeAgent", cluster_name=config.cluster_name, api_url=self.node_api.url,
                image=config.node_agent_image,
            )

        self.functions: dict[str, RecoveryFunction] = {
            **self.recovery.functions,
            "NodeAuthorizer": self.node_api.authorizer_function,
            "NodeApi": self.node_api.api_function,
            "HeartbeatSweep": self.node_api.sweep_function,
            "JobsApi": self.jobs_api.function,
            "QueueScheduler": self.scheduler.recovery_function,
            "JobControlAuthorizer": self.control_api.authorizer_function,
            "JobControlApi": self.control_api.function,
            "GangWorker": self.gang_worker,
            "TagLookupWorker": self.tag_lookup_worker,
        }
        self.invocations: dict[str, Invocation] = {
            "TaskHandler": Invocation.EVENT,
            "DcgmMonitor": Invocation.EVENT,
            "InstanceMonitor": Invocation.EVENT,
            "RecoverySweep": Invocation.SCHEDULED,
            "HeartbeatSweep": Invocation.SCHEDULED,
            "QueueScheduler": Invocation.SCHEDULED,
            "NodeAuthorizer": Invocation.REQUEST,
            "NodeApi": Invocation.REQUEST,
            "JobsApi": Invocation.REQUEST,
            "JobControlAuthorizer": Invocation.REQUEST,
            "JobControlApi": Invocation.REQUEST,
            "GangWorker": Invocation.QUEUE,
            "TagLookupWorker": Invocation.QUEUE,
        }
        self.dead_letter_queues: dict[str, sqs.IQueue] = {
            **self.recovery.dead_letter_queues,
            "HeartbeatSweep": self.node_api.sweep_dead_letter_queue,
            "QueueScheduler": self.scheduler.dead_letter_queue,
            "GangWorker": self.gang.dead_letter_queue,
            "TagLookupWorker": self.tag_lookups.dead_letter_queue,
        }
        self.rules: dict[str, events.Rule] = {
            **self.recovery.rules,
            "HeartbeatSweep": self.node_api.sweep_rule,
            "QueueScheduler": self.scheduler.rule,
        }
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            functions=self.functions,
            invocations=self.invocations,
            dead_letter_queues=self.dead_letter_queues,
            topic=self.notifications.topic,
            recovery_sweep=self.recovery.sweep,
            rest_api=self.node_api.rest_api,
            work_queues={"GangFanout": self.gang.queue, "TagLookups": self.tag_lookups.queue},
        )
        self._outputs()

    def _outputs(self) -> None:
        """What operators and ``gpu-recovery-admin doctor`` need to find in the account."""
        config = self.config
        CfnOutput(self, "ClusterName", value=config.cluster_name,
                  description="ECS cluster whose GPU training jobs this stack guards")
        CfnOutput(self, "InstanceTagKey", value=config.instance_tag_key,
                  description="Tag the GPU instances need (key) so the stack may reboot them")
        CfnOutput(self, "InstanceTagValue", value=config.instance_tag_value or config.cluster_name,
                  description="... and its value")
        CfnOutput(self, "HeartbeatStaleSeconds", value=str(config.heartbeat_stale_seconds),
                  description="A node that has not reported for this long is silent")
        CfnOutput(self, "PowertoolsVersion", value=pinned_version(POWERTOOLS_PACKAGE),
                  description="Powertools release the functions run (= requirements.txt)")
        CfnOutput(self, "PowertoolsLayerArn", value=powertools_layer_arn(self, config),
                  description="Public Powertools layer of that release, resolved at deploy time")

        CfnOutput(self, "JobTableName", value=self.tables.job_table.table_name)
        CfnOutput(self, "InstanceTableName", value=self.tables.instance_table.table_name)
        CfnOutput(self, "QuotaTableName", value=self.tables.quota_table.table_name,
                  description="Node quotas per user and priority level, and their usage")
        CfnOutput(self, "AlertTopicArn", value=self.notifications.topic.topic_arn)
        CfnOutput(
            self, "HealthCheckTaskDefinitionArn", value=self.health_check.task_definition_arn
        )
        CfnOutput(self, "GpuResetLogGroupName", value=self.gpu_reset.log_group.log_group_name,
                  description="Where each GPU reset task writes what it did (its JSON result line)")
        if self.health_check.log_group is not None:
            CfnOutput(self, "HealthCheckLogGroupName", value=self.health_check.log_group.log_group_name,
                      description="Where each health check writes its DCGM output and verdict line")
        for name, queue in self.dead_letter_queues.items():
            CfnOutput(self, f"{name}DeadLetterQueueUrl", value=queue.queue_url)
        for name, rule in self.rules.items():
            CfnOutput(self, f"{name}RuleName", value=rule.rule_name,
                      description=f"EventBridge rule that triggers {name}")
        CfnOutput(self, "ApiUrl", value=self.node_api.url,
                  description="REST API base URL (stage prod): /v1/report_* (nodes), /v1/jobs and "
                              "/v1/quotas (IAM), /v1/control (training code)")
        CfnOutput(self, "NodeTokenTableName", value=self.node_api.token_table.table_name)
        CfnOutput(self, "IdempotencyTableName", value=self.jobs_api.idempotency_table.table_name)
        CfnOutput(self, "SchedulerFunctionName", value=self.scheduler.function.function_name)
        CfnOutput(self, "GangQueueUrl", value=self.gang.queue_url,
                  description="SQS queue of a large job's stop / start batches (gang fan-out)")
        CfnOutput(self, "GangWorkerFunctionName", value=self.gang_worker.function.function_name,
                  description="Lambda function that runs those batches (SQS event source)")
        if self.node_agent is not None:
            CfnOutput(self, "NodeAgentServiceName", value=self.node_agent.service.attr_name)
