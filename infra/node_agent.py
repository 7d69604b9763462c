"""Optional: run the GPU node agent as an ECS DAEMON service (context ``node_agent_daemon=true``).

One agent task per container instance of the cluster. The agent's source
(``agent/gpu_node_agent.py``, standard library only) is embedded in the container
command (``python3 -c <source>``), like the DCGM task embeds its script, so any image
with Python 3.8+ works (default: the public ``python:3.12-slim``; set context
``node_agent_image`` to your own, e.g. one with util-linux ``dmesg``). Both context keys
are read by ``infra.config`` (the registry), never here.

Tokens are per node, the task definition is shared, so the token is NOT passed by
ECS: each host keeps its own token in ``/etc/gpu-node-agent/token`` (mode 0600), which
the task mounts read-only and re-reads every cycle (rotation = rewrite the file).
Provision it when the host joins, e.g. with the admin CLI from a trusted machine::

    TOKEN=$(gpu-recovery-admin issue-token --node-id <container-instance-id>)
    aws ssm send-command --document-name AWS-RunShellScript --targets Key=InstanceIds,Values=<i-...> \
      --parameters commands="install -d -m 0700 /etc/gpu-node-agent && umask 077 && \
                             echo '$TOKEN' > /etc/gpu-node-agent/token"

(``send-command`` parameters are visible in SSM history: prefer a SecureString parameter
``/gpu-recovery/node-token/<node-id>`` read by the host's user data if that matters.)

Like agent/README.md: host network (ECS introspection on localhost:51678), host PID
namespace (pid liveness of gputasker metadata files), NVIDIA runtime env to get
nvidia-smi without reserving GPUs, CAP_SYSLOG for ``dmesg``.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra import REPO_ROOT
from infra.config import DEFAULT_NODE_AGENT_IMAGE
from infra.nag import acknowledge

AGENT_PATH = REPO_ROOT / "agent" / "gpu_node_agent.py"
DEFAULT_IMAGE = DEFAULT_NODE_AGENT_IMAGE
TOKEN_DIR = "/etc/gpu-node-agent"
PROGRESS_DIR = "/var/run/gpu-recovery/progress"
RUNNING_TASKS_DIR = "/var/lib/gpu-recovery/running_tasks"


class NodeAgentDaemon(Construct):
    """``task_definition``, ``service`` (CfnService, DAEMON), ``log_group``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        api_url: str,
        image: str = DEFAULT_IMAGE,
        interval_seconds: int = 30,
        agent_path: Path = AGENT_PATH,
        running_tasks_dir: str = RUNNING_TASKS_DIR,
    ) -> None:
        super().__init__(scope, construct_id)
        source = agent_path.read_text()
        self.log_group = logs.LogGroup(self, "LogGroup", retention=logs.RetentionDays.ONE_MONTH,
                                       removal_policy=RemovalPolicy.DESTROY)
        task_definition = ecs.Ec2TaskDefinition(
            self, "TaskDefinition", family="gpu-node-agent", network_mode=ecs.NetworkMode.HOST,
            pid_mode=ecs.PidMode.HOST,
        )
        for name, path in (("token", TOKEN_DIR), ("running-tasks", running_tasks_dir),
                           ("progress", PROGRESS_DIR)):
            task_definition.add_volume(name=name, host=ecs.Host(source_path=path))
        linux = ecs.LinuxParameters(self, "LinuxParameters", init_process_enabled=True)
        linux.add_capabilities(ecs.Capability.SYSLOG)
        container = task_definition.add_container(
            "Agent",
            container_name="agent",
            image=ecs.ContainerImage.from_registry(image),
            command=["python3", "-c", source],
            essential=True,
            memory_limit_mib=256,
            memory_reservation_mib=128,
            linux_parameters=linux,
            environment={
                "GPU_AGENT_API_URL": api_url,
                "GPU_AGENT_TOKEN_FILE": f"/host{TOKEN_DIR}/token",
                "GPU_AGENT_TASKS_DIR": "/host/running_tasks",
                "GPU_AGENT_PROGRESS_DIR": "/host/progress",
                "GPU_AGENT_XID_COMMAND": "dmesg",
                "GPU_AGENT_INTERVAL": str(interval_seconds),
                # NVIDIA runtime injects nvidia-smi without reserving GPUs in ECS.
                "NVIDIA_VISIBLE_DEVICES": "all",
                "NVIDIA_DRIVER_CAPABILITIES": "utility",
            },
            logging=ecs.LogDrivers.aws_logs(stream_prefix="agent", log_group=self.log_group),
        )
        for name, path in (("token", f"/host{TOKEN_DIR}"), ("running-tasks", "/host/running_tasks"),
                           ("progress", "/host/progress")):
            container.add_mount_points(ecs.MountPoint(source_volume=name, container_path=path,
                                                      read_only=True))
        acknowledge(
            task_definition,
            ("AwsSolutions-ECS2", "The environment holds only the API URL, paths and intervals; the "
                                  "node token is a host file mounted read-only, never an env var."),
        )
        self.task_definition = task_definition
        self.service = ecs.CfnService(
            self, "Service",
            cluster=cluster_name,
            service_name="gpu-node-agent",
            task_definition=task_definition.task_definition_arn,
            scheduling_strategy="DAEMON",
            launch_type="EC2",
            deployment_configuration=ecs.CfnService.DeploymentConfigurationProperty(
                maximum_percent=100, minimum_healthy_percent=0),
            propagate_tags="TASK_DEFINITION",
        )
        Stack.of(self)  # fails early outside a stack
