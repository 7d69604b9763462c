"""The scale simulator's ECS data plane (the base of
:class:`~local_mode.sim.ecs_cluster.EcsCluster`): the lifecycle both worlds share
(:class:`~local_mode.sim.ecs_data_plane.DataPlane`) on this cluster's own state. GPU nodes
and their GPU ids as ECS reports them; tasks go PENDING (+``pending_delay``) and RUNNING
(+``run_delay``); a stop requested through the API emits the ``desiredStatus`` STOPPED event
at once and STOPPED (exit 143, stopCode UserInitiated and the given reason) after
``stop_delay``; a task exits on its own when the scenario says (``exit_task``, ``fail_gpu``
and its NCCL cascade: the data plane's, as in the moto world);
training tasks run until then. A reboot (RebootInstances, or the reboot document through SSM
for ``mi-`` nodes) kills the node's tasks (exit 137) after ``kill_delay``, disconnects the
agent after ``disconnect_delay`` and reconnects it after ``reboot_seconds`` with a new boot
time (a fault a reboot clears is gone). DCGM health-check tasks (the health-check family or
group) exit after ``dcgm_seconds`` with the node's verdict code (0 healthy, 1 reboot, 2
replace, 3 operator action) and print the verdict JSON line to the log group. Every change
is an EventBridge event shaped by ``local_mode/events.py``, put on the bus as it is made
(task events carry no tags; container-instance events on registration, placement, stop,
drain, disconnect and reconnect).

Not modelled: placement strategies, CPU/memory, ENIs, the ~1 h retention of stopped tasks
(kept forever).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from gpu_recovery import constants as C

from .. import events as ev
from ..events import ACCOUNT_ID, REGION
from ..health_verdicts import HEALTH_CHECK_LOG_GROUP, HEALTH_VALUES
from .aws_calls import Account, ClientFailure
from .bus import EventBus
from .ecs_data_plane import DataPlane
from .ecs_model import (
    Node,
    Task,
    TaskDefinition,
    describe_container_instance,
    describe_task,
    placement_failure,
)
from .engine import Simulation
from .log_store import LogStore


class ClusterDataPlane(DataPlane):
    """One ECS cluster's state and its data plane (:class:`~local_mode.sim.ecs_data_plane.DataPlane`)
    in the scale world's simulated time (see the module docstring);
    :class:`~local_mode.sim.ecs_cluster.EcsCluster` adds the control-plane API. Its bus takes
    events as they happen: the data plane's are put on it as they are made."""

    def __init__(self, sim: Simulation, account: Account, bus: EventBus, *, name: str = "gpu-cluster",
                 pending_delay: float = 1.0, run_delay: float = 5.0, stop_delay: float = 10.0,
                 dcgm_seconds: float = 120.0, reboot_seconds: float = 180.0, kill_delay: float = 5.0,
                 disconnect_delay: float = 15.0, instance_events: bool = True,
                 health_check_family: str = C.DEFAULT_HEALTH_CHECK_FAMILY, health_check_gpus: int = 8,
                 dcgm_level: int = 2) -> None:
        super().__init__(train_seconds=None, dcgm_seconds=dcgm_seconds, reboot_seconds=reboot_seconds,
                         stop_delay_seconds=stop_delay, run_delay_seconds=run_delay,
                         pending_delay_seconds=pending_delay, kill_delay_seconds=kill_delay,
                         disconnect_delay_seconds=disconnect_delay,
                         instance_events_on_placement=instance_events)
        self.sim = sim
        self.account = account
        self.bus = bus
        self.name = name
        self.arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:cluster/{name}"
        self.dcgm_level = dcgm_level
        self._by_ref: dict[str, Node] = {}  # by ARN, container-instance id, instance id
        self._started_by: dict[str, list[str]] = defaultdict(list)
        self.definitions: dict[str, TaskDefinition] = {}
        self.logs = LogStore()
        self.counters: Counter[str] = Counter()
        self.health_checks: Counter[str] = Counter()  # node name -> DCGM tasks started
        self.reboots: Counter[str] = Counter()  # node name -> reboots requested
        #: called with a task after each of its state changes (scenario bookkeeping)
        self.observers: list[Callable[[Task], None]] = []
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

    def add_node(self, name: str, *, gpus: int = 8, kind: str = "ec2",
                 health: str = "healthy") -> Node:
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
        node = Node(name, kind, instance_id, arn, gpu_ids, boot_time=self.sim.now, registered_at=self.sim.now,
                    health=health)
        self.nodes[name] = node
        for ref in (arn, node.container_instance_id, instance_id, name):
            self._by_ref[ref] = node
        self._emit_instance(node)
        return node

    def node(self, ref: str) -> Node:
        node = self._by_ref.get(ref)
        if node is None:
            raise KeyError(ref)
        return node

    def launch(self, task_definition: str, node: Node | str, *,
               tags: list[dict[str, str]] | None = None, started_by: str = "", group: str | None = None,
               overrides: dict[str, Any] | None = None) -> Task:
        """Start a task directly in the data plane (an external launcher: no API call,
        no rate limit); raises when it cannot be placed."""
        target = node if isinstance(node, Node) else self.node(node)
        definition = self._definition(task_definition)
        failure = self._placement_failure(target, definition)
        if failure:
            raise RuntimeError(f"cannot place {definition.family} on {target.name}: {failure}")
        return self._place(definition, target, tags or [], started_by, group, dict(overrides or {}))

    def _definition(self, ref: str) -> TaskDefinition:
        if ref in self.definitions:
            return self.definitions[ref]
        family, _, revision = ref.rsplit("/", 1)[-1].partition(":")
        candidates = [d for d in self.definitions.values() if d.family == family
                      and (not revision or str(d.revision) == revision)]
        if not candidates:
            raise ClientFailure("ClientException", "TaskDefinition not found.")
        return max(candidates, key=lambda d: d.revision)

    def _check_cluster(self, params: dict[str, Any]) -> None:
        cluster = params.get("cluster") or "default"
        if cluster not in (self.name, self.arn):
            raise ClientFailure("ClusterNotFoundException", "Cluster not found.")

    def _placement_failure(self, node: Node, definition: TaskDefinition) -> str:
        return placement_failure(node, definition.gpus, node.status)

    # ================================================================ descriptions
    def describe(self, task: Task, *, tags: bool) -> dict[str, Any]:
        """The task as this control plane's API answers (no null fields, no empty startedBy)."""
        out = describe_task(task, self.nodes[task.node], self.arn, REGION)
        out["overrides"] = task.overrides or {"containerOverrides": []}
        out["startedBy"] = task.started_by or None
        if tags:
            out["tags"] = task.tag_list
        return {k: v for k, v in out.items() if v is not None}

    def describe_instance(self, node: Node) -> dict[str, Any]:
        out = describe_container_instance(node, self.arn, self.sim.now, status=node.status,
                                          attributes=[{"name": k, **({"value": v} if v else {})}
                                                      for k, v in sorted(node.attributes.items())])
        out["runningTasksCount"] = len(node.allocations)
        out["pendingTasksCount"] = 0
        return out

    # ================================================================ the data plane's hooks
    def now(self) -> float:
        return self.sim.now

    def schedule(self, at: float, action: Callable[[], list[dict[str, Any]] | None],
                 label: str = "") -> None:
        """Run ``action`` at ``at`` (the events it returns are on the bus already)."""

        def run() -> None:
            action()

        self.sim.at(at, run, label)

    def _task_state_change(self, task: Task) -> dict[str, Any]:
        for observe in self.observers:
            observe(task)
        event = ev.task_state_change(self.describe(task, tags=False), time=self.sim.now,
                                     account=ACCOUNT_ID, region=REGION, event_id=self._event_id())
        self.bus.put_events(event)
        return event

    def _instance_state_change(self, node: Node) -> dict[str, Any]:
        event = ev.container_instance_state_change(self.describe_instance(node), time=self.sim.now,
                                                   account=ACCOUNT_ID, region=REGION,
                                                   event_id=self._event_id())
        self.bus.put_events(event)
        return event

    def _control_plane_stopped(self, task: Task) -> None:
        self.counters["tasks_stopped"] += 1

    def _write_verdict_log(self, stream: str, line: str) -> None:
        self.logs.put(HEALTH_CHECK_LOG_GROUP, stream, self.sim.now, line)

    def _dcgm_level(self) -> int:
        return self.dcgm_level

    def _count_reboot(self, node: Node, via: str) -> None:
        self.counters["reboots"] += 1
        self.reboots[node.name] += 1

    def _emit_now(self, action: Callable[[], list[dict[str, Any]]], label: str) -> None:
        action()  # its events are on the bus, each delivery timed by the bus

    def _emit_instance(self, node: Node) -> None:
        self._ci_event(node)

    def _event_id(self) -> str:
        t = self.sim.token()
        return f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:32]}"

    def _place(self, definition: TaskDefinition, node: Node, tags: list[dict[str, str]],
               started_by: str, group: str | None, overrides: dict[str, Any]) -> Task:
        task_id = self.sim.token()
        arn = f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:task/{self.name}/{task_id}"
        health_check = definition.arn == self.health_check_task or \
            str(group or "").startswith(C.HEALTH_CHECK_GROUP)
        gpu_ids = node.free_gpu_ids[:definition.gpus]
        container_id = f"{self.name}/{task_id}/{self.sim.token(8)}"
        container = {
            "containerArn": f"arn:aws:ecs:{REGION}:{ACCOUNT_ID}:container/{container_id}",
            "lastStatus": "PENDING", "name": definition.container, "image": definition.image, "taskArn": arn,
            "networkInterfaces": [], "cpu": "0", "memory": str(definition.memory), "gpuIds": list(gpu_ids)}
        task = Task(arn, node.name, definition.arn, definition.family, group or f"family:{definition.family}",
                    started_by, overrides, {t["key"]: t["value"] for t in tags}, gpu_ids, [container],
                    self.sim.now, memory=str(definition.memory), updated_at=self.sim.now, version=1,
                    health_check=health_check,
                    validation=str(group or "").startswith(C.GPU_VALIDATION_GROUP))
        node.allocations[arn] = gpu_ids
        self.tasks[arn] = task
        if started_by:
            self._started_by[started_by].append(arn)
        self.counters["tasks_started"] += 1
        if health_check:
            self.counters["health_checks_started"] += 1
            self.health_checks[node.name] += 1
        self._schedule_placement(task, self.sim.now)
        return task

    def exit_task(self, task: Task, exit_code: int, *, after: float = 0.0, why: str = "") -> None:
        """The task's essential container exits with ``exit_code`` (``after`` seconds from now)."""
        def go() -> list[dict[str, Any]]:
            events = self._container_exit(task, exit_code, why or "exit")
            if why:
                self.counters[f"exit:{why}"] += 1
            return events

        self.schedule(self.sim.now + max(0.0, after), go, "task exit")

    def fail_gpu(self, node: Node | str, *, health: str = "reboot_fixable", exit_code: int = 1,
                 nccl_cascade: bool = False,
                 cascade_delay: float | Callable[[], float] = 5.0) -> list[Task]:
        """A GPU of ``node`` fails now (:meth:`~local_mode.sim.ecs_data_plane.DataPlane._gpu_fault`:
        its health becomes ``health``, its tasks exit ``exit_code``, with ``nccl_cascade`` the
        other ranks of their jobs ``cascade_delay`` later); returns the tasks on it it killed."""
        target = node if isinstance(node, Node) else self.node(node)
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        victims, _ = self._gpu_fault(target, health=health, exit_code=exit_code, why="GPU fault",
                                     nccl_cascade=nccl_cascade, cascade_delay=cascade_delay)
        self.counters["gpu_faults"] += 1
        return victims

    def reboot(self, node: Node, via: str = "API") -> None:
        """A reboot request (RebootInstances, or the reboot document through SSM)."""
        self._reboot(node, via)

    def running(self, predicate: Callable[[Task], bool] | None = None) -> list[Task]:
        return [t for t in self.tasks.values()
                if t.last_status == "RUNNING" and (predicate is None or predicate(t))]

