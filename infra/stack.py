"""The stack: composes the constructs; later constructs (API, scheduler) plug in here.

Attributes for composition:
    config          RecoveryConfig
    access          ClusterAccess (cluster ARN + least-privilege statement builders)
    tables          RecoveryTables (.job_table, .instance_table, .grant_read_write_data)
    notifications   Notifications (.topic, .key, .grant_publish)
    health_check    HealthCheck (.task_definition | None, .log_group | None, .task_reference)
    lambda_defaults LambdaDefaults (shared runtime/layer/env for new RecoveryFunctions)
    recovery        RecoveryFunctions (.task_handler, .dcgm_monitor, .instance_monitor,
                    .sweep, .functions, .dead_letter_queues, .rules, .dlq_alarms)
    monitoring      Monitoring (.dashboard, .error_alarms)
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from gpu_recovery.constants import (
    ENV_CLUSTER_NAME,
    ENV_DCGM_LEVEL,
    ENV_HEALTH_CHECK_GPUS,
    ENV_HEALTH_CHECK_TASK,
    ENV_HEALTH_CHECK_TIMEOUT_MINUTES,
    ENV_INSTANCE_TABLE,
    ENV_JOB_TABLE,
    ENV_MAX_RECOVERY_ATTEMPTS,
    ENV_REBOOT_TIMEOUT_MINUTES,
    ENV_SNS_TOPIC_ARN,
    ENV_SUSPECT_EXIT_CODES,
)
from infra.config import RecoveryConfig
from infra.health_check import HealthCheck
from infra.lambda_common import LambdaDefaults
from infra.monitoring import Monitoring
from infra.notifications import Notifications
from infra.recovery import ClusterAccess, RecoveryFunctions
from infra.tables import RecoveryTables


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
        self.lambda_defaults = LambdaDefaults(
            config=config,
            environment={
                ENV_JOB_TABLE: self.tables.job_table.table_name,
                ENV_INSTANCE_TABLE: self.tables.instance_table.table_name,
                ENV_CLUSTER_NAME: config.cluster_name,
                ENV_HEALTH_CHECK_TASK: self.health_check.task_reference,
                ENV_SNS_TOPIC_ARN: self.notifications.topic.topic_arn,
                ENV_MAX_RECOVERY_ATTEMPTS: str(config.max_recovery_attempts),
                ENV_SUSPECT_EXIT_CODES: config.suspect_exit_codes_json,
                ENV_REBOOT_TIMEOUT_MINUTES: str(config.reboot_timeout_minutes),
                ENV_HEALTH_CHECK_TIMEOUT_MINUTES: str(config.health_check_timeout_minutes),
                ENV_DCGM_LEVEL: str(config.dcgm_level),
                ENV_HEALTH_CHECK_GPUS: str(config.health_check_gpus),
            },
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
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            functions=self.recovery.functions,
            dead_letter_queues=self.recovery.dead_letter_queues,
            topic=self.notifications.topic,
        )

        CfnOutput(self, "JobTableName", value=self.tables.job_table.table_name)
        CfnOutput(self, "InstanceTableName", value=self.tables.instance_table.table_name)
        CfnOutput(self, "AlertTopicArn", value=self.notifications.topic.topic_arn)
        CfnOutput(
            self, "HealthCheckTaskDefinitionArn", value=self.health_check.task_definition_arn
        )
        for name, queue in self.recovery.dead_letter_queues.items():
            CfnOutput(self, f"{name}DeadLetterQueueUrl", value=queue.queue_url)
