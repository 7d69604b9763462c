"""The records of the simulated ECS data plane, one family for both worlds: GPU nodes
(container instances), the tasks they run, task definitions (the in-memory control plane's;
the moto world reads moto's), run plans and the timeline the demo prints.

A task names its node (``Task.node`` is the node's name) and carries its tags as a dict
(``Task.tag_list`` is the ECS API's list); ``Node.container_instance_arn`` is the container
instance's ARN. ``Node.status`` and ``Node.attributes`` are the control plane's: the
in-memory one (``ecs_cluster``) keeps them here, the moto world keeps them in step with
moto's container instance (moto's record answers the API).

The state transitions of the data plane live here too, once for both worlds: a task's
RUNNING, its stop request and its STOPPED (``Task.mark_running``, ``Task.request_stop``,
``Task.mark_stopped``), a node's reboot (``Node.request_reboot``, ``Node.back_from_reboot``),
the health check's verdict (``health_check_verdict``), StartTask's placement verdict
(``placement_failure``), a training task's gang (``gang_of``) and the task and the
container instance as ECS describes them (``describe_task``, ``describe_container_instance``).
Each world decides when they happen (its timings, its driver), emits the events and keeps its
control plane in step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpu_recovery import constants as C

from ..events import gpu_resource
from ..health_verdicts import REBOOT_FIXES, VERDICT_EXIT, verdict_line


class TimelineEntry(NamedTuple):
    time: float
    kind: str
    text: str


class Placement(NamedTuple):
    """A task ECS placed: when, on which node (its name), by whom (``startedBy``), and
    what the node's health was then (a training task on a node whose fault is not judged
    yet, or judged bad, runs on a bad GPU)."""

    time: float
    node: str
    started_by: str
    task_arn: str
    health: str
    training: bool  # not a health check nor a GPU reset
    # A fault the node's last repair left behind, seen only under load (``Node.latent``): a
    # training task placed here fails again minutes in ("" : none).
    latent: str = ""


@dataclass
class TaskDefinition:
    """A task definition of the in-memory control plane (one essential container)."""

    arn: str
    family: str
    revision: int
    gpus: int
    container: str = "trainer"
    image: str = "trainer:latest"
    memory: int = 4096
    network_mode: str = "host"  # bridge | host | awsvpc | none


@dataclass
class Node:
    """One simulated GPU host and its ECS container instance."""

    name: str
    kind: str  # "ec2" | "anywhere"
    instance_id: str
    container_instance_arn: str
    gpu_ids: list[str]
    boot_time: float
    registered_at: float
    health: str = "healthy"
    agent_connected: bool = True
    status: str = "ACTIVE"  # ACTIVE | DRAINING | INACTIVE (deregistered)
    capacity_reservation_id: str = ""  # a Capacity Block's (cr-...): its expiration warning names it
    taken_at: float | None = None  # AWS announced it takes the node then (a notice: sim.aws_notices)
    allocations: dict[str, list[str]] = field(default_factory=dict)  # task arn -> gpu ids
    reservations: dict[int, list[str]] = field(default_factory=dict)  # pending StartTask
    attributes: dict[str, str | None] = field(default_factory=dict)  # custom ECS attributes (cordon)
    version: int = 1
    agent_version: str = "1.89.3"  # versionInfo.agentVersion: an agent update changes it
    agent_update_status: str | None = None  # agentUpdateStatus: the most recent update's (None: never)
    reboots: int = 0
    rebooting: bool = False
    reboot_requested_at: float | None = None
    # The driver's warnings its node agent reports (GPU index -> "recovery_action",
    # "remap_pending", "counters": {name: [value, per hour, since]}); {} when none.
    gpu_state: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Repairs that do not hold (issue 43): after each of the next ``unheld_repairs`` repairs
    # (a reboot or a GPU reset that heals it) the node passes idle checks but keeps ``latent``,
    # the health it had, which a GPU load (a validation's) or ``latent_after_seconds`` of a
    # training task's work brings back.
    unheld_repairs: int = 0
    latent: str | None = None
    latent_after_seconds: float = 180.0
    # False: the host lost power (what the stack sees is its agents going silent and its ECS
    # agent disconnecting): not a healthy node, whatever its GPUs (``repair_ledger``).
    powered: bool = True

    def repaired(self, before: str) -> None:
        """A repair healed ``before``: unless it does not hold, nothing is left of it."""
        if self.unheld_repairs > 0 and before != "healthy":
            self.unheld_repairs -= 1
            self.latent = before

    def under_load(self) -> str | None:
        """A GPU load brings a latent fault back (the health it shows now); None: none."""
        if self.latent is None:
            return None
        self.health, self.latent = self.latent, None
        return self.health

    @property
    def container_instance_id(self) -> str:
        return self.container_instance_arn.rsplit("/", 1)[-1]

    @property
    def used_gpus(self) -> set[str]:
        used = {g for ids in self.allocations.values() for g in ids}
        return used | {g for ids in self.reservations.values() for g in ids}

    @property
    def free_gpu_ids(self) -> list[str]:
        used = self.used_gpus
        return [g for g in self.gpu_ids if g not in used]

    @property
    def reboot_stop_reason(self) -> str:
        """The stoppedReason of the tasks a reboot of this host kills."""
        host = "EC2" if self.kind == "ec2" else "ECS Anywhere"
        return f"Host {host} (instance {self.instance_id}) rebooted"

    def request_reboot(self, now: float) -> bool:
        """A reboot is asked for (counted); False when the node is rebooting already (the
        request changes nothing else)."""
        self.reboots += 1
        self.reboot_requested_at = now
        if self.rebooting:
            return False
        self.rebooting = True
        return True

    def back_from_reboot(self, now: float) -> str:
        """The host is up again and its agent connected, with a new boot time; a fault a
        reboot clears is gone. Returns the health before."""
        before = self.health
        self.agent_connected = True
        self.rebooting = False
        self.boot_time = now
        if before in REBOOT_FIXES:
            self.health = "healthy"
            self.repaired(before)
        if self.health == "healthy":
            self.gpu_state = {}  # the warning's cause is gone, the volatile counters cleared
        return before

    def gpu_report_fields(self, index: int, now: float) -> dict[str, Any]:
        """What the node agent reports of GPU ``index`` beside its usual row: the driver's
        recovery action, the remapped-rows state and the counters (as the tools print them)."""
        state = self.gpu_state.get(index) or {}
        row: dict[str, Any] = {"recovery_action": state.get("recovery_action", "none"),
                               "remapped_rows_pending": bool(state.get("remap_pending")),
                               "ecc_corrected_volatile": 0, "nvlink_crc_errors": 0,
                               "nvlink_replay_errors": 0, "nvlink_recovery_errors": 0}
        for name, (value, per_hour, since) in (state.get("counters") or {}).items():
            row[name] = int(value + per_hour * max(0.0, now - since) / 3600)
        return row


@dataclass
class Task:
    """A task the data plane runs (in the moto world it mirrors, and keeps in step, moto's
    Task; in the scale world it is the control plane's record too)."""

    arn: str
    node: str  # the node's name
    task_definition_arn: str
    family: str
    group: str
    started_by: str
    overrides: dict[str, Any]
    tags: dict[str, str]
    gpu_ids: list[str]
    containers: list[dict[str, Any]]
    created_at: float
    cpu: str = "0"
    memory: str = "0"
    last_status: str = "PENDING"
    desired_status: str = "RUNNING"
    started_at: float | None = None
    stopping_at: float | None = None
    stopped_at: float | None = None
    updated_at: float = 0.0
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_code: int | None = None
    version: int = 0
    plan_token: int = 0
    #: a rank's planned run, held until its gang's rendezvous (``Plan.gang``); None: not held
    held_plan: Plan | None = None
    health_check: bool = False
    gpu_reset: bool = False  # the GPU reset task (a health check's kin: never a training task)
    validation: bool = False  # a health check run as a validation after repair (its group)
    attachments: list[dict[str, Any]] = field(default_factory=list)  # an awsvpc task's interface

    def environment(self) -> dict[str, str]:
        """Its first container's environment overrides (the validation's level and load)."""
        for container in (self.overrides or {}).get("containerOverrides") or []:
            return {str(e.get("name")): str(e.get("value")) for e in container.get("environment") or []}
        return {}

    @property
    def load_seconds(self) -> int:
        raw = self.environment().get("VALIDATION_LOAD_SECONDS", "0")
        return int(raw) if raw.isdigit() else 0

    @property
    def label(self) -> str:
        if self.gpu_reset:
            return "GPU reset"
        if self.validation:
            return "validation"
        if self.health_check:
            return "health check"
        job, rank = self.tags.get(C.TAG_JOB_ID), self.tags.get(C.TAG_RANK)
        if job is not None:
            return f"rank {rank} of job {job}" if rank is not None else f"job {job}"
        return f"task {self.arn.rsplit('/', 1)[-1][:8]} ({self.family})"

    @property
    def done(self) -> bool:
        return self.last_status == "STOPPED"

    @property
    def tag_list(self) -> list[dict[str, str]]:
        """The tags as the ECS API lists them."""
        return [{"key": k, "value": v} for k, v in self.tags.items()]

    def mark_running(self, now: float) -> None:
        """PENDING -> RUNNING, the containers with it."""
        self.last_status = "RUNNING"
        self.started_at = now
        for container in self.containers:
            container["lastStatus"] = "RUNNING"

    def request_stop(self, now: float, reason: str) -> bool:
        """StopTask: desiredStatus STOPPED, stopCode UserInitiated and ``reason``; False (and
        nothing changed) when the task is stopped or stopping already."""
        if self.done or self.desired_status == "STOPPED":
            return False
        self.desired_status = "STOPPED"
        self.stopping_at = now
        self.stop_code = "UserInitiated"
        self.stopped_reason = reason
        return True

    def mark_stopped(self, now: float, exit_code: int | None, stop_code: str, reason: str) -> None:
        """-> STOPPED. A stop the user asked for keeps its stopCode and reason; a task that never
        ran failed to start and has no exit code."""
        was_started = self.started_at is not None
        self.last_status = "STOPPED"
        self.desired_status = "STOPPED"
        self.stopping_at = self.stopping_at or now
        self.stopped_at = now
        if self.stop_code != "UserInitiated":
            self.stop_code = stop_code if was_started else "TaskFailedToStart"
            self.stopped_reason = reason
        self.exit_code = exit_code if was_started else None
        for i, container in enumerate(self.containers):
            container["lastStatus"] = "STOPPED"
            if was_started:
                container["exitCode"] = exit_code if i == 0 else 0


def placement_failure(node: Node, gpus: int, status: str) -> str:
    """StartTask's ``failures[].reason`` for placing a task needing ``gpus`` GPUs on ``node``
    whose container instance is ``status`` ("" when it fits). The strings are ECS's ("API
    failure reasons", docs.aws.amazon.com/AmazonECS/latest/developerguide/api_failures_messages.html):
    ``AGENT`` when the instance's agent is disconnected, ``RESOURCE:GPU`` when its GPUs are
    not there to take (taken, the host rebooting, the instance not ACTIVE); an unknown
    instance is ``MISSING`` (:data:`MISSING`)."""
    if not node.agent_connected:
        return "AGENT"
    if status != "ACTIVE" or node.rebooting or len(node.free_gpu_ids) < gpus:
        return "RESOURCE:GPU"
    return ""


#: StartTask's failure reason for a container instance the cluster does not know
MISSING = "MISSING"


def gang_of(task: Task) -> str | None:
    """The training job ``task`` is a rank of (its job tag, else its job group under the
    registration convention); None for a task of no job. The ranks of one gang share NCCL
    communicators: one rank's crash is the others' NCCL error."""
    if task.health_check:
        return None
    job = task.tags.get(C.TAG_JOB_ID)
    if job is not None:
        return job
    return task.group if task.group.startswith(C.JOB_GROUP_PREFIX) else None


def health_check_verdict(task: Task, node: Node, dcgm_level: int) -> tuple[int, str, str]:
    """The DCGM health check's verdict on ``node`` as it is now: its exit code, the log
    stream it prints to and its verdict line (the JSON the stack reads). A check with a GPU
    load (a validation after repair) brings a latent fault back first: what an idle check
    passes, the load finds."""
    level = int(task.environment().get("DCGM_LEVEL") or dcgm_level)
    load = task.load_seconds
    under_load = node.under_load() if load > 0 else None
    code = VERDICT_EXIT[node.health]
    stream = f"{C.HEALTH_CHECK_LOG_STREAM_PREFIX}/{task.containers[0]['name']}/{task.arn.rsplit('/', 1)[-1]}"
    return code, stream, verdict_line(code, level, task.gpu_ids, node.name, load_seconds=load,
                                      load_failed=under_load is not None)


def describe_container_instance(
    node: Node,
    cluster_arn: str,
    now: float,
    *,
    status: str,
    attributes: list[dict[str, Any]] | None = None,
    registered: list[dict[str, Any]] | None = None,
    remaining: list[dict[str, Any]] | None = None,
    version_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ContainerInstance object as ECS describes it (and puts it in the container-instance
    state-change event): the node's GPUs registered and free after the control plane's other
    ``registered`` / ``remaining`` resources, its ``status`` and ``attributes`` (custom ones
    included) as the control plane holds them, its agent's version and last update's status."""
    return {
        "agentConnected": node.agent_connected,
        "attributes": list(attributes or []),
        "clusterArn": cluster_arn,
        "containerInstanceArn": node.container_instance_arn,
        "ec2InstanceId": node.instance_id,
        "registeredResources": [*(registered or []), gpu_resource(node.gpu_ids)],
        "remainingResources": [*(remaining or []), gpu_resource(node.free_gpu_ids)],
        "status": status,
        "version": node.version,
        "versionInfo": {**(version_info or {}), "agentVersion": node.agent_version},
        **({"agentUpdateStatus": node.agent_update_status} if node.agent_update_status else {}),
        "registeredAt": node.registered_at,
        "updatedAt": now,
        "accountType": "ec2_instance",
    }


def describe_task(task: Task, node: Node, cluster_arn: str, region: str) -> dict[str, Any]:
    """The Task object as ECS describes it (and puts it in the task state-change event);
    fields not set yet are None."""
    return {
        "attachments": [dict(a) for a in task.attachments],
        "availabilityZone": f"{region}a",
        "clusterArn": cluster_arn,
        "containerInstanceArn": node.container_instance_arn,
        "containers": [dict(c) for c in task.containers],
        "cpu": task.cpu,
        "createdAt": task.created_at,
        "desiredStatus": task.desired_status,
        "group": task.group,
        "launchType": "EC2" if node.kind == "ec2" else "EXTERNAL",
        "lastStatus": task.last_status,
        "memory": task.memory,
        "overrides": task.overrides,
        "startedAt": task.started_at,
        "startedBy": task.started_by,
        "stoppingAt": task.stopping_at,
        "stoppedAt": task.stopped_at,
        "executionStoppedAt": task.stopped_at,
        "stoppedReason": task.stopped_reason,
        "stopCode": task.stop_code,
        "taskArn": task.arn,
        "taskDefinitionArn": task.task_definition_arn,
        "updatedAt": task.updated_at,
        "version": task.version,
    }


@dataclass
class Plan:
    """How a task ends once RUNNING: ``exit_code`` after ``run_seconds`` (None: never).
    ``gang``: a training rank's ``run_seconds`` count from its gang's rendezvous, the moment
    every rank of its attempt is RUNNING (``rendezvous_of``), as NCCL's init waits for all."""

    run_seconds: float | None
    exit_code: int = 0
    gang: bool = False


def rendezvous_of(task: Task) -> tuple[str, str, int] | None:
    """(job, attempt, world size) of a training rank whose tags say so; None otherwise."""
    job, size = gang_of(task), task.tags.get(C.TAG_WORLD_SIZE)
    if job is None or size is None or not size.isdigit():
        return None
    return job, task.tags.get(C.TAG_ATTEMPT, "1"), int(size)


#: What ECS answers a StartTask / RunTask whose network configuration does not fit the task
#: definition's network mode (InvalidParameterException; tryretool/retool-onpremise#84,
#: muya/amazon-ecs-run-task#7, aws/aws-cdk#13348 for the three messages)
NETWORK_REQUIRED = "Network Configuration must be provided when networkMode 'awsvpc' is specified."
NETWORK_NOT_VALID = "Network Configuration is not valid for the given networkMode of this task definition."
PUBLIC_IP_NOT_SUPPORTED = "Assign public IP is not supported for this launch type."


def start_task_network_refusal(network_mode: str, params: dict[str, Any]) -> str | None:
    """Why ECS refuses a StartTask's ``networkConfiguration`` for a task definition in
    ``network_mode`` on EC2 container instances (None: it does not), for both control planes:
    required for ``awsvpc`` (the StartTask API reference), refused for the other modes, and no
    public IP outside Fargate."""
    vpc = (params.get("networkConfiguration") or {}).get("awsvpcConfiguration")
    if network_mode == "awsvpc" and not vpc:
        return NETWORK_REQUIRED
    if network_mode != "awsvpc" and params.get("networkConfiguration"):
        return NETWORK_NOT_VALID
    if vpc and vpc.get("assignPublicIp") == "ENABLED":
        return PUBLIC_IP_NOT_SUPPORTED
    return None


#: ListTasks filters that ECS refuses beside ``startedBy`` ("When you specify startedBy as the
#: filter, it must be the only filter that you use": the API reference; the answer is an
#: InvalidParameterException, aws/aws-sdk-go-v2#1893)
LIST_TASKS_FILTERS = ("containerInstance", "family", "serviceName", "desiredStatus", "launchType")
STARTED_BY_ALONE = "cannot specify startedBy with other arguments"


def list_tasks_refusal(params: dict[str, Any]) -> str | None:
    """Why ECS refuses a ListTasks request (None: it does not), for both control planes."""
    if params.get("startedBy") and any(params.get(f) for f in LIST_TASKS_FILTERS):
        return STARTED_BY_ALONE
    return None
