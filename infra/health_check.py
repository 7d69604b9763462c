"""The DCGM health-check ECS task definition (or a reference to the operator's own)."""

from __future__ import annotations

import os
from pathlib import Path

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from gpu_recovery.constants import HEALTH_CHECK_CONTAINER_NAME, HEALTH_CHECK_LOG_STREAM_PREFIX
from infra import REPO_ROOT
from infra.config import ConfigError, RecoveryConfig
from infra.nag import acknowledge

# Tests (or an operator) may point at another copy of the script.
SCRIPT_ENV_VAR = "GPU_RECOVERY_HEALTH_CHECK_SCRIPT"
DEFAULT_SCRIPT = REPO_ROOT / "health_check" / "dcgm_health_check.sh"
# The DCGM monitor reads the verdict line from <prefix>/<container>/<task-id>.
CONTAINER_NAME = HEALTH_CHECK_CONTAINER_NAME
LOG_STREAM_PREFIX = HEALTH_CHECK_LOG_STREAM_PREFIX


def health_check_script_path() -> Path:
    return Path(os.environ.get(SCRIPT_ENV_VAR) or DEFAULT_SCRIPT)


def read_health_check_script() -> str:
    path = health_check_script_path()
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"health-check script {path} not found: it is the command of the DCGM task "
            "definition (set context 'health_check_task_arn' to use your own task definition)"
        ) from exc


class HealthCheck(Construct):
    """``task_reference`` is what the Lambdas pass to StartTask (family or ARN)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: RecoveryConfig) -> None:
        super().__init__(scope, construct_id)
        self.task_definition: ecs.Ec2TaskDefinition | None = None
        self.log_group: logs.LogGroup | None = None
        if config.health_check_task_arn:
            self.task_reference = config.health_check_task_arn
            self.task_definition_arn = config.health_check_task_arn
            return

        self.log_group = logs.LogGroup(
            self,
            "LogGroup",
            retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
        )
        task_definition = ecs.Ec2TaskDefinition(
            self,
            "TaskDefinition",
            family=config.health_check_family,
        )
        # dcgmi diag needs CAP_SYS_ADMIN (profiling / diagnostic plugins), not a fully
        # privileged container.
        linux_parameters = ecs.LinuxParameters(self, "LinuxParameters")
        linux_parameters.add_capabilities(ecs.Capability.SYS_ADMIN)
        task_definition.add_container(
            "Container",
            container_name=CONTAINER_NAME,
            image=ecs.ContainerImage.from_registry(config.health_check_image),
            command=["sh", "-c", read_health_check_script()],
            environment={"DCGM_LEVEL": str(config.dcgm_level)},
            gpu_count=config.health_check_gpus,
            memory_reservation_mib=2048,
            essential=True,
            linux_parameters=linux_parameters,
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix=LOG_STREAM_PREFIX, log_group=self.log_group
            ),
        )
        acknowledge(
            task_definition,
            (
                "AwsSolutions-ECS2",
                "DCGM_LEVEL is a non-secret diagnostic level (1..4); nothing sensitive is "
                "passed as a plain environment variable.",
            ),
        )
        self.task_definition = task_definition
        self.task_reference = config.health_check_family
        self.task_definition_arn = task_definition.task_definition_arn
