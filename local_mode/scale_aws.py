"""Stand-ins of the AWS services the recovery loop calls, for the scale simulator: an ECS
cluster (control plane and data plane) and boto3-shaped clients of ECS, EC2, SSM,
CloudWatch Logs and SNS, so the project's *real* adapters (``EcsAdapter``,
``RebootAdapter``, ``VerdictLogReader``, ``SnsNotifier``) run on top of them.

Every client call goes through :class:`~local_mode.scale_sim.SimClient`: botocore
parameter validation, the account's rate limits and botocore's standard retries, the
call's latency in simulated time, and the account's call statistics.

**ECS** (:class:`EcsCluster`): GPU nodes (container instances, GPU ids as ECS reports
them); StartTask on named container instances (up to 10 per call, one task each;
``failures`` with reason ``RESOURCE:GPU`` when the GPUs are taken, ``AGENT`` when the
agent is disconnected, ``MISSING`` for an unknown instance, HTTP 200 as ECS answers);
tasks go PENDING (+``pending_delay``) and RUNNING (+``run_delay``); StopTask emits the
``desiredStatus`` STOPPED event at once and STOPPED (exit 143, stopCode UserInitiated and
the given reason) after ``stop_delay``; a task exits on its own when the scenario says
(``exit_task``, ``fail_gpu``); DescribeTasks (tags with ``include=["TAGS"]``), ListTasks
(``startedBy``, ``desiredStatus``, ``containerInstance``, ``family``; 100 a page),
DescribeContainerInstances / ListContainerInstances, UpdateContainerInstancesState
(DRAINING). A reboot (RebootInstances, or the reboot document through SSM for ``mi-``
nodes) kills the node's tasks (exit 137) after 5 s, disconnects the agent after
``disconnect_delay`` and reconnects it after ``reboot_seconds`` with a new boot time (a
``reboot_fixable`` node is healthy again). DCGM health-check tasks (the health-check
family or group) exit after ``dcgm_seconds`` with the node's verdict code (0 healthy,
1 reboot, 2 replace, 3 operator action) and print the verdict JSON line to the log group.
Every change is an EventBridge event shaped by ``local_mode/events.py`` (task events carry
no tags; container-instance events on registration, placement, stop, drain, disconnect
and reconnect).

Not modelled: RunTask and placement strategies, services, task-definition registration
through the API, CPU/memory, ENIs, the ~1 h retention of stopped tasks (kept forever),
EC2/SSM/SNS/Logs rate limits (only their latency).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from local_mode import events as ev
from local_mode.health_verdicts import HEALTH_VALUES, VERDICT_EXIT, verdict_line
from local_mode.scale_sim import ACCOUNT_ID, REGION, Account, EventBus, SimClient, Simulation

SNS_MAX_MESSAGE_BYTES = 256 * 1024
HEALTH_CHECK_LOG_GROUP = "/ecs/gpu-health-check"
PAGE_SIZE = 100
MAX_START_INSTANCES = 10


@dataclass
class TaskDefinition:
    arn: str
    family: str
    revision: int
    gpus: int
    container: str = "trainer"
    image: str = "trainer:latest"
    memory: int = 4096


@dataclass
class SimNode:
    """A GPU host and its ECS container instance."""

    name: str
    kind: str  # "ec2" | "anywhere"
    instance_id: str
    arn: str
    gpu_ids: list[str]
    registered_at: float
    boot_time: float
    health: str = "healthy"
    agent_connected: bool = True
    status: str = "ACTIVE"
    version: int = 1
    rebooting: bool = False
    reboots: int = 0
    allocations: dict[str, list[str]] = field(default_factory=dict)  # task arn -> GPU ids
    attributes: dict[str, str | None] = field(default_factory=dict)  # custom ECS attributes (cordon)

    @property
    def id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]

    def free_gpus(self) -> list[str]:
        used = {g for ids in self.allocations.values() for g in ids}
        return [g for g in self.gpu_ids if g not in used]


@dataclass
class SimTask:
    arn: str
    node: SimNode
    definition: TaskDefinition
    group: str
    started_by: str
    overrides: dict[str, Any]
    tags: list[dict[str, str]]
    gpu_ids: list[str]
    created_at: float
    health_check: bool
    container_arn: str
    last_status: str = "PENDING"
    desired_status: str = "RUNNING"
    started_at: float | None = None
    stopping_at: float | None = None
    stopped_at: float | None = None
    stop_code: str | None = None
    stopped_reason: str | None = None
    exit_code: int | None = None
    version: int = 1
    updated_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.last_status == "STOPPED"

    @property
    def tag_values(self) -> dict[str, str]:
        return {t["key"]: t["value"] for t in self.tags}


class EcsCluster:
    """One ECS cluster in simulated time (see the module docstring)."""

    def __init__(self, sim: Simulation, account: Account, bus: EventBus, *, name: str = "gpu-cluster",
                 pending_delay: float = 1.0, run_delay: float = 5.0, stop_delay: float = 10.0,
                 dcgm_seconds: float = 120.0, reboot_seconds: float = 180.0, kill_delay: float = 5.0,
                 disconnect_delay: float = 15.0, instance_events: bool = True,
                 health_check_family: str = C.DEFAULT_HEALTH_CHECK_FAMILY, health_check_gpus: int = 8,
                 dcgm_level: int = 2) -> None:
        self.sim = sim
        self.account = account
        self.bus = bus
        self.name = name
        self.arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:cluster/{name}"
        self.pending_delay = pending_delay
        self.run_delay = run_delay
        self.stop_delay = stop_delay
        self.dcgm_seconds = dcgm_seconds
        self.reboot_seconds = reboot_seconds
        self.kill_delay = kill_delay
        self.disconnect_delay = disconnect_delay
        self.instance_events = instance_events
        self.dcgm_level = dcgm_level
        self.nodes: dict[str, SimNode] = {}  # by name
        self._by_ref: dict[str, SimNode] = {}  # by ARN, container-instance id, instance id
        self.tasks: dict[str, SimTask] = {}
        self._started_by: dict[str, list[str]] = defaultdict(list)
        self.definitions: dict[str, TaskDefinition] = {}
        self.logs = LogStore()
        self.counters: Counter[str] = Counter()
        self.health_checks: Counter[str] = Counter()  # node name -> DCGM tasks started
        self.reboots: Counter[str] = Counter()  # node name -> reboots requested
        #: called with a task after each of its state changes (scenario bookkeeping)
        self.observers: list[Callable[[SimTask], None]] = []
        self.health_check_task = self.register_task_definition(
            health_check_family, gpus=health_check_gpus, container=C.HEALTH_CHECK_CONTAINER_NAME,
            image="nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04")

    # ================================================================ setup
    def register_task_definition(self, family: str, *, gpus: int, container: str = "trainer",
                                 image: str = "trainer:latest") -> str:
        revision = 1 + sum(1 for d in self.definitions.values() if d.family == family)
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:task-definition/{family}:{revision}"
        definition = TaskDefinition(arn, family, revision, gpus, container, image)
        self.definitions[arn] = definition
        return arn

    def add_node(self, name: str, *, gpus: int = 8, kind: str = "ec2", health: str = "healthy") -> SimNode:
        if name in self.nodes:
            raise ValueError(f"node {name} exists")
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        if kind == "ec2":
            instance_id = f"i-{self.sim.token(9)[:17]}"
        elif kind == "anywhere":
            instance_id = f"mi-{self.sim.token(9)[:17]}"
        else:
            raise ValueError("kind is 'ec2' or 'anywhere'")
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:container-instance/{self.name}/{self.sim.token()}"
        gpu_ids = [f"GPU-{self.sim.token(4)}-{i:04d}-{self.sim.token(2)}" for i in range(gpus)]
        node = SimNode(name, kind, instance_id, arn, gpu_ids, self.sim.now, self.sim.now)
        node.health = health
        self.nodes[name] = node
        for ref in (arn, node.id, instance_id, name):
            self._by_ref[ref] = node
        self._emit_instance(node)
        return node

    def node(self, ref: str) -> SimNode:
        node = self._by_ref.get(ref)
        if node is None:
            raise KeyError(ref)
        return node

    def client(self) -> EcsClient:
        """A new client (one per Lambda container: its own botocore retry quota)."""
        return EcsClient(self)

    def launch(self, task_definition: str, node: SimNode | str, *, tags: list[dict[str, str]] | None = None,
               started_by: str = "", group: str | None = None,
               overrides: dict[str, Any] | None = None) -> SimTask:
        """Start a task directly in the data plane (an external launcher: no API call,
        no rate limit); raises when it cannot be placed."""
        target = node if isinstance(node, SimNode) else self.node(node)
        definition = self._definition(task_definition)
        failure = self._placement_failure(target, definition)
        if failure:
            raise RuntimeError(f"cannot place {definition.family} on {target.name}: {failure}")
        return self._place(definition, target, tags or [], started_by, group, dict(overrides or {}))

    # ================================================================ control plane
    def _definition(self, ref: str) -> TaskDefinition:
        if ref in self.definitions:
            return self.definitions[ref]
        family, _, revision = ref.rsplit("/", 1)[-1].partition(":")
        candidates = [d for d in self.definitions.values() if d.family == family
                      and (not revision or str(d.revision) == revision)]
        if not candidates:
            raise _ClientFailure("ClientException", "TaskDefinition not found.")
        return max(candidates, key=lambda d: d.revision)

    def _check_cluster(self, params: dict[str, Any]) -> None:
        cluster = params.get("cluster") or "default"
        if cluster not in (self.name, self.arn):
            raise _ClientFailure("ClusterNotFoundException", "Cluster not found.")

    def _placement_failure(self, node: SimNode, definition: TaskDefinition) -> str:
        if not node.agent_connected:
            return "AGENT"
        if node.status != "ACTIVE" or node.rebooting or len(node.free_gpus()) < definition.gpus:
            return "RESOURCE:GPU"
        return ""

    def start_task(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["containerInstances"])
        if not 1 <= len(refs) <= MAX_START_INSTANCES:
            raise _ClientFailure("InvalidParameterException",
                                 f"containerInstances can have at most {MAX_START_INSTANCES} items.")
        tags = list(p.get("tags") or [])
        if any(str(t.get("key", "")).lower().startswith("aws:") for t in tags):
            raise _ClientFailure("InvalidParameterException",
                                 "Tag keys beginning with 'aws:' are reserved for AWS use.")
        definition = self._definition(p["taskDefinition"])
        started_by = str(p.get("startedBy") or "")
        if len(started_by) > 36:
            raise _ClientFailure("InvalidParameterException", "startedBy can have at most 36 characters.")
        tasks, failures = [], []
        for ref in refs:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": "MISSING"})
                continue
            failure = self._placement_failure(node, definition)
            if failure:
                failures.append({"arn": node.arn, "reason": failure})
                self.counters[f"start_failure:{failure}"] += 1
                continue
            overrides = dict(p.get("overrides") or {})
            task = self._place(definition, node, tags, started_by, p.get("group"), overrides)
            tasks.append(self.describe(task, tags=False))
        return {"tasks": tasks, "failures": failures}

    def stop_task(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        task = self._task(p["task"])
        if task is None:
            raise _ClientFailure("InvalidParameterException", "The referenced task was not found.")
        self.counters["stop_requests"] += 1
        if not task.done and task.desired_status != "STOPPED":
            reason = str(p.get("reason") or "Task stopped by user")
            task.desired_status = "STOPPED"
            task.stopping_at = self.sim.now
            task.stop_code = "UserInitiated"
            task.stopped_reason = reason
            self._emit_task(task)
            self.sim.after(self.stop_delay, lambda: self._finish(
                task, 143 if task.last_status == "RUNNING" else None, "UserInitiated", reason),
                "task stopped")
        return {"task": self.describe(task, tags=False)}

    def describe_tasks(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["tasks"])
        if len(refs) > 100:
            raise _ClientFailure("InvalidParameterException", "Tasks cannot be more than 100.")
        with_tags = "TAGS" in (p.get("include") or [])
        tasks, failures = [], []
        for ref in refs:
            task = self._task(ref)
            if task is None:
                failures.append({"arn": ref, "reason": "MISSING"})
            else:
                tasks.append(self.describe(task, tags=with_tags))
        return {"tasks": tasks, "failures": failures}

    def list_tasks(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        desired = p.get("desiredStatus") or "RUNNING"
        if p.get("startedBy"):
            candidates: Iterable[SimTask] = (self.tasks[a] for a in self._started_by.get(p["startedBy"], []))
        else:
            candidates = self.tasks.values()
        node = self._by_ref.get(p["containerInstance"]) if p.get("containerInstance") else None
        family = p.get("family")
        arns = [t.arn for t in candidates
                if t.desired_status == desired or (desired == "STOPPED" and t.done)
                if (node is None or t.node is node) and (family is None or t.definition.family == family)]
        return _page(arns, p, "taskArns")

    def describe_container_instances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        refs = list(p["containerInstances"])
        if len(refs) > 100:
            raise _ClientFailure("InvalidParameterException", "Container instances cannot be more than 100.")
        found, failures = [], []
        for ref in refs:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": "MISSING"})
            else:
                found.append(self.describe_instance(node))
        return {"containerInstances": found, "failures": failures}

    def list_container_instances(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        status = p.get("status")
        arns = [n.arn for n in self.nodes.values() if status is None or n.status == status]
        return _page(arns, p, "containerInstanceArns")

    def update_container_instances_state(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        status = p["status"]
        if status not in ("ACTIVE", "DRAINING"):
            raise _ClientFailure("InvalidParameterException", "Container instance status must be ACTIVE or "
                                                              "DRAINING.")
        changed, failures = [], []
        for ref in p["containerInstances"]:
            node = self._by_ref.get(ref)
            if node is None:
                failures.append({"arn": ref, "reason": "MISSING"})
                continue
            if node.status != status:
                node.status = status
                self.counters[f"instances_{status.lower()}"] += 1
                self._emit_instance(node)
            changed.append(self.describe_instance(node))
        return {"containerInstances": changed, "failures": failures}

    def put_attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        """Custom attributes on container instances (the stack's cordon), by ARN or by id
        with ``targetType``; an unknown target fails the call as ECS does."""
        self._check_cluster(p)
        nodes = [self._attribute_target(a) for a in p["attributes"]]
        for node, attribute in zip(nodes, p["attributes"], strict=True):
            node.attributes[attribute["name"]] = attribute.get("value")
        return {"attributes": list(p["attributes"])}

    def delete_attributes(self, p: dict[str, Any]) -> dict[str, Any]:
        self._check_cluster(p)
        nodes = [self._attribute_target(a) for a in p["attributes"]]
        for node, attribute in zip(nodes, p["attributes"], strict=True):
            node.attributes.pop(attribute["name"], None)
        return {"attributes": list(p["attributes"])}

    def _attribute_target(self, attribute: dict[str, Any]) -> SimNode:
        ref = str(attribute.get("targetId") or "")
        node = self._by_ref.get(ref)
        if node is None:
            raise _ClientFailure("TargetNotFoundException", f"Could not find {ref}.")
        return node

    def _task(self, ref: str) -> SimTask | None:
        task = self.tasks.get(ref)
        if task is None and "/" not in ref:
            task = next((t for a, t in self.tasks.items() if a.endswith("/" + ref)), None)
        return task

    # ================================================================ descriptions
    def describe(self, task: SimTask, *, tags: bool) -> dict[str, Any]:
        stopped = task.done
        container = {"containerArn": task.container_arn, "lastStatus": task.last_status,
                     "name": task.definition.container, "image": task.definition.image, "taskArn": task.arn,
                     "networkInterfaces": [], "cpu": "0", "memory": str(task.definition.memory),
                     "gpuIds": list(task.gpu_ids)}
        if stopped and task.exit_code is not None:
            container["exitCode"] = task.exit_code
        out: dict[str, Any] = {
            "attachments": [], "availabilityZone": f"{REGION}a", "clusterArn": self.arn,
            "containerInstanceArn": task.node.arn, "containers": [container], "cpu": "0",
            "createdAt": task.created_at, "desiredStatus": task.desired_status, "group": task.group,
            "launchType": "EC2" if task.node.kind == "ec2" else "EXTERNAL", "lastStatus": task.last_status,
            "memory": str(task.definition.memory), "overrides": task.overrides or {"containerOverrides": []},
            "startedAt": task.started_at, "startedBy": task.started_by or None,
            "stoppingAt": task.stopping_at,
            "stoppedAt": task.stopped_at, "stoppedReason": task.stopped_reason, "stopCode": task.stop_code,
            "taskArn": task.arn, "taskDefinitionArn": task.definition.arn, "updatedAt": task.updated_at,
            "version": task.version}
        if tags:
            out["tags"] = [dict(t) for t in task.tags]
        return {k: v for k, v in out.items() if v is not None}

    def describe_instance(self, node: SimNode) -> dict[str, Any]:
        return {
            "agentConnected": node.agent_connected, "attributes": [], "clusterArn": self.arn,
            "containerInstanceArn": node.arn, "ec2InstanceId": node.instance_id,
            "registeredResources": [ev.gpu_resource(node.gpu_ids)],
            "remainingResources": [ev.gpu_resource(node.free_gpus())],
            "status": node.status, "version": node.version, "versionInfo": {},
            "registeredAt": node.registered_at, "updatedAt": self.sim.now, "accountType": "ec2_instance",
            "runningTasksCount": sum(1 for _ in node.allocations),
            "pendingTasksCount": 0}

    # ================================================================ data plane
    def _emit_task(self, task: SimTask) -> None:
        task.version += 1
        task.updated_at = self.sim.now
        for observe in self.observers:
            observe(task)
        self.bus.put(ev.task_state_change(self.describe(task, tags=False), time=self.sim.now,
                                          account=ACCOUNT_ID, region=REGION, event_id=self._event_id()))

    def _emit_instance(self, node: SimNode) -> None:
        node.version += 1
        self.bus.put(ev.container_instance_state_change(self.describe_instance(node), time=self.sim.now,
                                                        account=ACCOUNT_ID, region=REGION,
                                                        event_id=self._event_id()))

    def _event_id(self) -> str:
        t = self.sim.token()
        return f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:32]}"

    def _place(self, definition: TaskDefinition, node: SimNode, tags: list[dict[str, str]], started_by: str,
               group: str | None, overrides: dict[str, Any]) -> SimTask:
        task_id = self.sim.token()
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:task/{self.name}/{task_id}"
        health_check = definition.arn == self.health_check_task or \
            str(group or "").startswith(C.HEALTH_CHECK_GROUP)
        gpu_ids = node.free_gpus()[:definition.gpus]
        task = SimTask(arn, node, definition, group or f"family:{definition.family}", started_by, overrides,
                       [dict(t) for t in tags], gpu_ids, self.sim.now, health_check,
                       f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:container/{self.name}/{task_id}/{self.sim.token(8)}",
                       updated_at=self.sim.now)
        node.allocations[arn] = gpu_ids
        self.tasks[arn] = task
        if started_by:
            self._started_by[started_by].append(arn)
        self.counters["tasks_started"] += 1
        if health_check:
            self.counters["health_checks_started"] += 1
            self.health_checks[node.name] += 1
        self.sim.after(self.pending_delay, lambda: self._pending(task), "task pending")
        self.sim.after(self.run_delay, lambda: self._running(task), "task running")
        if self.instance_events:
            self.sim.after(self.pending_delay, lambda: self._emit_instance(node), "instance resources")
        return task

    def _pending(self, task: SimTask) -> None:
        if task.last_status == "PENDING" and task.desired_status == "RUNNING":
            self._emit_task(task)

    def _running(self, task: SimTask) -> None:
        if task.done or task.desired_status != "RUNNING":
            return
        task.last_status = "RUNNING"
        task.started_at = self.sim.now
        self._emit_task(task)
        if task.health_check:
            self.sim.after(self.dcgm_seconds, lambda: self._verdict(task), "dcgm verdict")

    def _verdict(self, task: SimTask) -> None:
        if task.done:
            return
        code = VERDICT_EXIT[task.node.health]
        task_id = task.arn.rsplit("/", 1)[-1]
        stream = f"{C.HEALTH_CHECK_LOG_STREAM_PREFIX}/{task.definition.container}/{task_id}"
        self.logs.put(HEALTH_CHECK_LOG_GROUP, stream, self.sim.now,
                      verdict_line(code, self.dcgm_level, task.gpu_ids, task.node.name))
        self._finish(task, code, "EssentialContainerExited", "Essential container in task exited")

    def _finish(self, task: SimTask, exit_code: int | None, stop_code: str, reason: str) -> None:
        if task.done:
            return
        was_started = task.started_at is not None
        task.last_status = "STOPPED"
        task.desired_status = "STOPPED"
        task.stopping_at = task.stopping_at or self.sim.now
        task.stopped_at = self.sim.now
        if task.stop_code != "UserInitiated":
            task.stop_code = stop_code if was_started else "TaskFailedToStart"
            task.stopped_reason = reason
        task.exit_code = exit_code if was_started else None
        task.node.allocations.pop(task.arn, None)
        self.counters["tasks_stopped"] += 1
        self._emit_task(task)
        if self.instance_events:
            self._emit_instance(task.node)

    def exit_task(self, task: SimTask, exit_code: int, *, after: float = 0.0, why: str = "") -> None:
        """The task's essential container exits with ``exit_code`` (``after`` seconds from now)."""
        def go() -> None:
            self._finish(task, exit_code, "EssentialContainerExited", "Essential container in task exited")
            if why:
                self.counters[f"exit:{why}"] += 1

        self.sim.after(after, go, "task exit")

    def fail_gpu(self, node: SimNode | str, *, health: str = "reboot_fixable",
                 exit_code: int = 1) -> list[SimTask]:
        """A GPU of ``node`` fails now: its health becomes ``health`` (what the next DCGM
        check finds) and every training task on it exits ``exit_code``."""
        target = node if isinstance(node, SimNode) else self.node(node)
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        target.health = health
        victims = [self.tasks[a] for a in list(target.allocations) if not self.tasks[a].health_check]
        for task in victims:
            self._finish(task, exit_code, "EssentialContainerExited", "Essential container in task exited")
        self.counters["gpu_faults"] += 1
        return victims

    def reboot(self, node: SimNode) -> None:
        """A reboot request (RebootInstances, or the reboot document through SSM)."""
        self.counters["reboots"] += 1
        self.reboots[node.name] += 1
        node.reboots += 1
        if node.rebooting:
            return
        node.rebooting = True
        host = "EC2" if node.kind == "ec2" else "ECS Anywhere"

        def kill() -> None:
            for arn in list(node.allocations):
                self._finish(self.tasks[arn], 137, "EssentialContainerExited",
                             f"Host {host} (instance {node.instance_id}) rebooted")

        def down() -> None:
            node.agent_connected = False
            self._emit_instance(node)

        def up() -> None:
            node.agent_connected = True
            node.rebooting = False
            node.boot_time = self.sim.now
            if node.health == "reboot_fixable":
                node.health = "healthy"
            self._emit_instance(node)

        self.sim.after(self.kill_delay, kill, "reboot kills tasks")
        self.sim.after(self.disconnect_delay, down, "agent disconnected")
        self.sim.after(self.reboot_seconds, up, "agent back")

    def running(self, predicate: Callable[[SimTask], bool] | None = None) -> list[SimTask]:
        return [t for t in self.tasks.values()
                if t.last_status == "RUNNING" and (predicate is None or predicate(t))]


def _page(items: list[str], p: dict[str, Any], key: str) -> dict[str, Any]:
    size = int(p.get("maxResults") or PAGE_SIZE)
    if not 1 <= size <= PAGE_SIZE:
        raise _ClientFailure("InvalidParameterException", f"maxResults must be between 1 and {PAGE_SIZE}.")
    start = int(p.get("nextToken") or 0)
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["nextToken"] = str(start + size)
    return out


class _ClientFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _StandIn(SimClient):
    """A stand-in client whose operations raise :class:`_ClientFailure` for API errors."""

    def _run(self, operation: str, params: dict[str, Any], fn: Callable[[dict[str, Any]], dict[str, Any]]
             ) -> dict[str, Any]:
        def execute(p: dict[str, Any]) -> dict[str, Any]:
            try:
                return fn(p)
            except _ClientFailure as failure:
                raise self.error(operation, failure.code, failure.message) from None

        return self._call(operation, params, execute)


class EcsClient(_StandIn):
    service = "ecs"

    def __init__(self, cluster: EcsCluster) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster

    def _latency(self, operation: str) -> float:
        latencies = self.account.latencies
        return latencies.ecs_control if operation in self.account.ECS_CONTROL else latencies.ecs_read

    def start_task(self, **params: Any) -> dict[str, Any]:
        return self._run("StartTask", params, self.cluster.start_task)

    def stop_task(self, **params: Any) -> dict[str, Any]:
        return self._run("StopTask", params, self.cluster.stop_task)

    def describe_tasks(self, **params: Any) -> dict[str, Any]:
        return self._run("DescribeTasks", params, self.cluster.describe_tasks)

    def list_tasks(self, **params: Any) -> dict[str, Any]:
        return self._run("ListTasks", params, self.cluster.list_tasks)

    def describe_container_instances(self, **params: Any) -> dict[str, Any]:
        return self._run("DescribeContainerInstances", params, self.cluster.describe_container_instances)

    def list_container_instances(self, **params: Any) -> dict[str, Any]:
        return self._run("ListContainerInstances", params, self.cluster.list_container_instances)

    def update_container_instances_state(self, **params: Any) -> dict[str, Any]:
        return self._run("UpdateContainerInstancesState", params,
                         self.cluster.update_container_instances_state)

    def put_attributes(self, **params: Any) -> dict[str, Any]:
        return self._run("PutAttributes", params, self.cluster.put_attributes)

    def delete_attributes(self, **params: Any) -> dict[str, Any]:
        return self._run("DeleteAttributes", params, self.cluster.delete_attributes)


class Ec2Client(_StandIn):
    """RebootInstances (the RebootAdapter's EC2 path)."""

    service = "ec2"
    modeled = False

    def __init__(self, cluster: EcsCluster) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster

    def reboot_instances(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if set(p) - {"InstanceIds", "DryRun"} or not isinstance(p.get("InstanceIds"), list):
                raise _ClientFailure("InvalidParameterValue",
                                     f"RebootInstances: invalid parameters {sorted(p)}")
            nodes = []
            for instance_id in p["InstanceIds"]:
                node = self.cluster._by_ref.get(instance_id)
                if node is None or node.kind != "ec2":
                    raise _ClientFailure("InvalidInstanceID.NotFound",
                                         f"The instance ID '{instance_id}' does not exist")
                nodes.append(node)
            for node in nodes:
                self.cluster.reboot(node)
            return {}

        return self._run("RebootInstances", params, run)


class SsmClient(_StandIn):
    """SendCommand of the reboot-only document (the RebootAdapter's ECS Anywhere path)."""

    service = "ssm"

    def __init__(self, cluster: EcsCluster, reboot_document: str = C.DEFAULT_REBOOT_DOCUMENT_NAME) -> None:
        super().__init__(cluster.account)
        self.cluster = cluster
        self.reboot_document = reboot_document

    def send_command(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if p["DocumentName"] != self.reboot_document:
                raise _ClientFailure("InvalidDocument", f"Document {p['DocumentName']} does not exist")
            nodes = []
            for instance_id in p.get("InstanceIds") or []:
                node = self.cluster._by_ref.get(instance_id)
                if node is None or node.kind != "anywhere":
                    raise _ClientFailure("InvalidInstanceId", "Instances not in a valid state for account")
                nodes.append(node)
            for node in nodes:
                self.cluster.reboot(node)
            return {"Command": {"CommandId": self.sim.token(), "DocumentName": p["DocumentName"],
                                "InstanceIds": list(p.get("InstanceIds") or []), "Status": "Pending"}}

        return self._run("SendCommand", params, run)


class LogStore:
    """CloudWatch Logs: lines by (group, stream)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def put(self, group: str, stream: str, at: float, message: str) -> None:
        self.streams.setdefault((group, stream), []).append(
            {"timestamp": int(at * 1000), "message": message, "ingestionTime": int(at * 1000)})


class LogsClient(_StandIn):
    """GetLogEvents (the VerdictLogReader)."""

    service = "logs"

    def __init__(self, account: Account, store: LogStore) -> None:
        super().__init__(account)
        self.store = store

    def get_log_events(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            events = self.store.streams.get((p["logGroupName"], p["logStreamName"]))
            if events is None:
                raise _ClientFailure("ResourceNotFoundException", "The specified log stream does not exist.")
            limit = int(p.get("limit") or 10_000)
            chosen = events[:limit] if p.get("startFromHead") else events[-limit:]
            return {"events": [dict(e) for e in chosen], "nextForwardToken": f"f/{len(events)}",
                    "nextBackwardToken": "b/0"}

        return self._run("GetLogEvents", params, run)


@dataclass
class Notification:
    at: float
    subject: str
    message: str
    attributes: dict[str, str]
    size: int
    label: str


@dataclass
class SnsTopic:
    """The operators' topic: what was published, and what SNS refused."""

    arn: str = f"arn:aws:sns:{REGION}:{ACCOUNT_ID}:gpu-training-notifications"
    published: list[Notification] = field(default_factory=list)
    refused: list[Notification] = field(default_factory=list)


class SnsClient(_StandIn):
    """Publish to the topic; a message over 256 KB is refused as SNS does."""

    service = "sns"

    def __init__(self, account: Account, topic: SnsTopic) -> None:
        super().__init__(account)
        self.topic = topic

    def publish(self, **params: Any) -> dict[str, Any]:
        def run(p: dict[str, Any]) -> dict[str, Any]:
            if p.get("TopicArn") != self.topic.arn:
                raise _ClientFailure("NotFound", "Topic does not exist")
            raw = p.get("MessageAttributes") or {}
            attributes = {k: str(v.get("StringValue", "")) for k, v in raw.items()}
            # SNS counts the body and every attribute's name, type and value.
            size = len(p["Message"].encode()) + sum(
                len(k.encode()) + len(str(v.get("DataType", "")).encode())
                + len(str(v.get("StringValue", "")).encode()) for k, v in raw.items())
            note = Notification(self.sim.now, str(p.get("Subject") or ""), p["Message"], attributes, size,
                                self.account.label())
            if size > SNS_MAX_MESSAGE_BYTES:
                self.topic.refused.append(note)
                raise _ClientFailure("InvalidParameter", "Invalid parameter: Message too long")
            self.topic.published.append(note)
            t = self.sim.token()
            return {"MessageId": f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:32]}"}

        return self._run("Publish", params, run)
