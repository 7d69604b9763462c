"""The queue scheduler: one Lambda (reserved concurrency 1) ticked every minute.

Usage from the stack (the API invokes ``.function`` asynchronously after submit/cancel)::

    self.scheduler = QueueScheduler(
        self, "QueueScheduler",
        job_table=self.tables.job_table, instance_table=self.tables.instance_table,
        cluster_name=config.cluster_name, defaults=self.lambda_defaults,
        access=self.access, topic=self.notifications.topic,
        quota_table=self.tables.quota_table,          # time sharing: quota charges
        extra_environment={...},                      # quota / preemption / control URL
    )
    api_function.add_environment(ENV_SCHEDULER_FUNCTION, self.scheduler.function.function_name)
    self.scheduler.function.grant_invoke(api_function)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from gpu_recovery.constants import ENV_SCHEDULER_LEASE_SECONDS as ENV_LEASE_SECONDS
from gpu_recovery.constants import ENV_SCHEDULER_MAX_ADMISSIONS as ENV_MAX_ADMISSIONS
from gpu_recovery.constants import ENV_SCHEDULER_MAX_UNPLACED as ENV_MAX_UNPLACED
from gpu_recovery.constants import ENV_SCHEDULER_TIME_BUDGET_SECONDS as ENV_TIME_BUDGET_SECONDS
from gpu_recovery.constants import (
    QUEUE_SCHEDULER_RATE_SECONDS,
    QUEUE_SCHEDULER_TIMEOUT_SECONDS,
    table_definitions,
)
from infra.lambda_common import (
    SCHEDULED_ASYNC_RETRIES,
    SCHEDULED_MAX_EVENT_AGE,
    LambdaDefaults,
    RecoveryFunction,
)
from infra.nag import acknowledge
from infra.recovery import (
    DLQ_RETENTION,
    EVENT_RETRY_ATTEMPTS,
    ClusterAccess,
    acknowledge_star,
    nag_resource_id,
)
from infra.tables import READ_WRITE_DATA_ACTIONS

TIMEOUT = Duration.seconds(QUEUE_SCHEDULER_TIMEOUT_SECONDS)  # < the lease: a tick never outlives it
LEASE_SECONDS = 120
TIME_BUDGET_SECONDS = 60
# A tick is superseded by the next one a minute later: old events are worth nothing.
TICK_MAX_EVENT_AGE = SCHEDULED_MAX_EVENT_AGE

_JOB_TABLE_ACTIONS = [
    "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:PutItem",
    "dynamodb:UpdateItem", "dynamodb:ConditionCheckItem",
]
_INSTANCE_TABLE_ACTIONS = [
    "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
]


class QueueScheduler(Construct):
    """Scheduler Lambda, its every-minute rule, retries and DLQ, least-privilege role
    (the DLQ's alarm: infra/monitoring.py).

    Attributes: ``function`` (lambda.Function), ``recovery_function`` (RecoveryFunction),
    ``rule``, ``dead_letter_queue``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_table: dynamodb.ITable,
        instance_table: dynamodb.ITable,
        cluster_name: str,
        defaults: LambdaDefaults,
        access: ClusterAccess | None = None,
        topic: sns.ITopic | None = None,
        max_admissions_per_tick: int = 20,
        max_unplaced_per_tick: int = 32,
        quota_table: dynamodb.ITable | None = None,
        extra_environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if access is None or access.config.cluster_name != cluster_name:
            access = ClusterAccess(self, dataclasses.replace(defaults.config, cluster_name=cluster_name))
        self.access = access
        self.recovery_function = RecoveryFunction(
            self,
            "Scheduler",
            defaults=defaults,
            handler="handlers.queue_scheduler.lambda_handler",
            service_name="queue-scheduler",
            description="Job queue tick: gang-admit queued jobs onto free GPU nodes and start them",
            timeout=TIMEOUT,
            extra_environment={
                ENV_LEASE_SECONDS: str(LEASE_SECONDS),
                ENV_TIME_BUDGET_SECONDS: str(TIME_BUDGET_SECONDS),
                ENV_MAX_ADMISSIONS: str(max_admissions_per_tick),
                ENV_MAX_UNPLACED: str(max_unplaced_per_tick),
                # Time sharing (quota table, preemption, grace, demotion, control URL).
                **(extra_environment or {}),
            },
        )
        self.function: lambda_.Function = self.recovery_function.function
        # One tick at a time (the lease item is the second fence).
        cfn = self.function.node.default_child
        assert isinstance(cfn, lambda_.CfnFunction)
        cfn.reserved_concurrent_executions = 1

        fn = self.recovery_function
        fn.add_to_policy(
            *access.start_task(),
            *access.stop_task(),
            *access.list_tasks(),
            *access.describe_tasks(),
            *access.describe_container_instances(),
            iam.PolicyStatement(
                sid="ListContainerInstancesOfCluster",
                actions=["ecs:ListContainerInstances"],
                resources=[access.cluster_arn],
            ),
            iam.PolicyStatement(
                sid="DescribeTaskDefinitionsAndHosts",
                actions=["ecs:DescribeTaskDefinition", "ec2:DescribeInstances",
                         "ssm:DescribeInstanceInformation"],
                resources=["*"],
            ),
        )
        fn.add_to_policy(*self._table_statements(job_table, instance_table, quota_table))
        if topic is not None:
            # The recovery loop's restart resume (queue jobs) may notify: Publish on this
            # topic only, and the two KMS actions SNS needs when the topic is encrypted.
            fn.add_to_policy(iam.PolicyStatement(
                sid="PublishNotifications", actions=["sns:Publish"], resources=[topic.topic_arn]))
            if topic.master_key is not None:
                fn.add_to_policy(iam.PolicyStatement(
                    sid="EncryptNotifications", actions=["kms:Decrypt", "kms:GenerateDataKey"],
                    resources=[topic.master_key.key_arn]))

        self.dead_letter_queue = sqs.Queue(
            self, "Dlq", encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True,
            retention_period=DLQ_RETENTION,
        )
        acknowledge(self.dead_letter_queue, (
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of the schedule target and the "
            "Lambda on-failure destination; a DLQ of a DLQ would never be read.",
        ))
        self.function.configure_async_invoke(
            max_event_age=TICK_MAX_EVENT_AGE,
            # A failed tick is retried (a throttle passes); three failures reach the DLQ.
            retry_attempts=SCHEDULED_ASYNC_RETRIES,
            on_failure=destinations.SqsDestination(self.dead_letter_queue),
        )
        self.rule = events.Rule(
            self, "TickRule", description="Queue scheduler tick",
            schedule=events.Schedule.rate(Duration.seconds(QUEUE_SCHEDULER_RATE_SECONDS)),
        )
        self.rule.add_target(targets.LambdaFunction(
            self.function, dead_letter_queue=self.dead_letter_queue,
            retry_attempts=EVENT_RETRY_ATTEMPTS, max_event_age=TICK_MAX_EVENT_AGE,
        ))
        self._acknowledge_wildcards()

    @staticmethod
    def _table_statements(job_table: dynamodb.ITable, instance_table: dynamodb.ITable,
                          quota_table: dynamodb.ITable | None) -> list[iam.PolicyStatement]:
        definitions = table_definitions()

        def arns(table: dynamodb.ITable, logical: str) -> list[str]:
            names = [g["IndexName"] for g in definitions[logical].get("GlobalSecondaryIndexes", [])]
            return [table.table_arn, *(f"{table.table_arn}/index/{n}" for n in names)]

        statements = [
            # Every index of the job table, by-holding included (time-sharing housekeeping).
            iam.PolicyStatement(sid="JobTableData", actions=_JOB_TABLE_ACTIONS,
                                resources=arns(job_table, "job")),
            iam.PolicyStatement(sid="InstanceTableData", actions=_INSTANCE_TABLE_ACTIONS,
                                resources=arns(instance_table, "instance")),
        ]
        if quota_table is not None:
            # Quota charges: written in a launch claim's transaction, released in the
            # housekeeping's; limits read at admission.
            statements.append(iam.PolicyStatement(sid="QuotaTableData", actions=READ_WRITE_DATA_ACTIONS,
                                                  resources=arns(quota_table, "quota")))
        return statements

    def _acknowledge_wildcards(self) -> None:
        access, role = self.access, self.recovery_function.role
        reasons = {
            access.task_definition_arns: (
                "ecs:StartTask starts each queued job with its own task definition (any "
                "family, unknown at deploy time); limited to this cluster by ArnEquals ecs:cluster."
            ),
            access.task_arns: (
                "Task ids are generated by ECS; access is limited to tasks of this one "
                "cluster (task/<cluster>/*) and additionally by ArnEquals ecs:cluster."
            ),
            access.container_instance_arns: (
                "Container instance ids are generated by ECS; limited to instances of this "
                "one cluster (container-instance/<cluster>/*) and ArnEquals ecs:cluster."
            ),
            access.task_role_arns: (
                "Jobs run with their own task and execution roles (unknown at deploy time); "
                "PassRole only with iam:PassedToService ecs-tasks.amazonaws.com."
            ),
        }
        for resource, reason in reasons.items():
            acknowledge(role, (f"AwsSolutions-IAM5[Resource::{nag_resource_id(self, resource)}]", reason))
        acknowledge_star(self.recovery_function)
