"""The GPU reset ECS task definition (recovery.gpu_resets starts it on a node whose decision
is reset_gpu, once every rank on it has stopped)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from gpu_recovery.constants import DEFAULT_GPU_RESET_FAMILY
from infra import REPO_ROOT
from infra.config import ConfigError, RecoveryConfig
from infra.nag import acknowledge

SCRIPT = REPO_ROOT / "health_check" / "gpu_reset.sh"
CONTAINER_NAME = "gpu-reset"


class GpuReset(Construct):
    """``task_reference`` is what the Lambdas pass to StartTask (the family)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: RecoveryConfig) -> None:
        super().__init__(scope, construct_id)
        try:
            script = SCRIPT.read_text()
        except FileNotFoundError as exc:
            raise ConfigError(f"GPU reset script {SCRIPT} not found: it is the reset task's command") from exc
        self.log_group = logs.LogGroup(self, "LogGroup", retention=logs.RetentionDays.THREE_MONTHS,
                                       removal_policy=RemovalPolicy.DESTROY)
        task_definition = ecs.Ec2TaskDefinition(self, "TaskDefinition", family=DEFAULT_GPU_RESET_FAMILY)
        # Every GPU of the node (the same count as the health check): ECS places the task only
        # when no other task holds one, and nvidia-smi -r resets them all in one command.
        task_definition.add_container(
            "Container",
            container_name=CONTAINER_NAME,
            image=ecs.ContainerImage.from_registry(config.health_check_image),
            command=["sh", "-c", script],
            gpu_count=config.health_check_gpus,
            memory_reservation_mib=512,
            essential=True,
            # nvidia-smi -r needs root on the host's GPU devices (a reset is a privileged
            # operation on the PCI device), which CAP_SYS_ADMIN alone does not give.
            privileged=True,
            logging=ecs.LogDrivers.aws_logs(stream_prefix="gpu-reset", log_group=self.log_group),
        )
        acknowledge(
            task_definition,
            ("AwsSolutions-ECS2", "No environment variables are set on the reset container."),
        )
        self.task_definition = task_definition
        self.task_reference = DEFAULT_GPU_RESET_FAMILY
        self.task_definition_arn = task_definition.task_definition_arn
