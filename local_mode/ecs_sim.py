"""``SimulatedEcs``: the ECS data plane (GPU nodes, agents, tasks) in simulated time.

moto provides the ECS *control plane* API; this module plays the part AWS runs
behind it, driven by the API calls it observes through ``LocalAws.hooks``:

* **StartTask** — placement is checked first (free GPUs, agent connected, status
  ACTIVE); failing instances come back as ``failures [{"arn", "reason":
  "RESOURCE:GPU"}]`` with HTTP 200, like ECS. Placed tasks get GPU ids, a PENDING
  event (+1 s) and a RUNNING event (+``run_delay_seconds``), then run to their plan:
  training tasks exit 0 after ``train_seconds`` (None: run until stopped), health-
  check tasks exit with the node's DCGM verdict after ``dcgm_seconds``.
* **StopTask** — a "stopping" event now, STOPPED (stopCode UserInitiated, the given
  reason) after ``stop_delay_seconds``; GPUs are freed at STOPPED.
* **RebootInstances** (EC2) / **SendCommand** (the stack's reboot-only SSM document,
  or AWS-RunShellScript with a reboot command, ``mi-`` ids) — running tasks die (exit
  137), the agent disconnects (+15 s) and reconnects after ``reboot_seconds`` with a new boot time; health
  ``reboot_fixable`` heals, the others stay bad.
* **DescribeContainerInstances** — answers carry GPU registered/remaining
  resources and the simulated agentConnected.
* **UpdateContainerInstancesState** — emits the container-instance event.
* **TerminateInstanceInAutoScalingGroup** (nodes put in a group with
  ``put_in_auto_scaling_group``) — the node's tasks die, its agent disconnects and its
  container instance is deregistered; ``replacement_seconds`` later a new node (``<name>-r1``)
  registers, as the group's new instance would.

GPU faults with XIDs (``inject_xid``) reach the stack the way the node agent reports them:
``POST /v1/report_gpu`` through the heartbeat service (``gpu_reporter``, by default the
service itself; the demo's node agents send it over HTTP), then the training tasks on the
node die. Health-check verdicts follow the node's ``health`` (exit codes 0-3 of the DCGM
health check, and its JSON verdict line in the log group).

Time never passes by itself: ``run_for`` / ``run_until`` / ``run_until_idle`` pop the
action queue in time order, deliver each emitted event to the ``LocalEventBus`` and
fire its schedules. Events caused while a handler runs are queued, never delivered
re-entrantly. All hooks are guarded by one lock: handlers may run on many threads.

Example::

    with build_world(train_seconds=3600) as world:  # local_mode.world
        sim = world.ecs
        a, b = sim.add_node("node-a"), sim.add_node("node-b")
        td = sim.register_training_task_definition("llama", gpus=8)
        sim.start_job("llama", td, ["node-a", "node-b"])
        sim.inject_gpu_fault("node-b", after=600, health="reboot_fixable")
        sim.run_for(3600)
        print("\\n".join(sim.format_timeline()))
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from moto.ecs.models import ecs_backends

from gpu_recovery import clock as gr_clock
from gpu_recovery import constants as C

from . import cluster_query
from . import events as ev
from .emulator import HEALTH_CHECK_LOG_GROUP, LocalAws
from .event_bus import LocalEventBus
from .health_verdicts import HEALTH_VALUES, VERDICT_EXIT, verdict_line

DEFAULT_START = datetime(2026, 11, 20, 14, 0, 0, tzinfo=UTC).timestamp()
REBOOT_WORDS = ("reboot", "shutdown -r", "systemctl reboot")


class SimClock:
    """Simulated wall clock (epoch seconds); only moves when the driver moves it."""

    def __init__(self, start: float = DEFAULT_START) -> None:
        self.start = float(start)
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += max(0.0, float(seconds))
            return self._now

    def set(self, t: float) -> None:
        """Move to ``t`` (never backwards)."""
        with self._lock:
            self._now = max(self._now, float(t))

    def offset(self, seconds: float) -> float:
        """Absolute time ``seconds`` after the simulation start."""
        return self.start + seconds

    def hms(self, t: float | None = None) -> str:
        t = self.now() if t is None else t
        return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


class TimelineEntry(NamedTuple):
    time: float
    kind: str
    text: str


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
    allocations: dict[str, list[str]] = field(default_factory=dict)  # task arn -> gpu ids
    reservations: dict[int, list[str]] = field(default_factory=dict)  # pending StartTask
    version: int = 1
    reboots: int = 0
    rebooting: bool = False
    reboot_requested_at: float | None = None

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


@dataclass
class SimTask:
    """A task the data plane runs (mirrors, and keeps in sync, moto's Task)."""

    arn: str
    node: str
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
    health_check: bool = False
    moto_stopped: bool = False

    @property
    def label(self) -> str:
        if self.health_check:
            return "health check"
        job, rank = self.tags.get(C.TAG_JOB_ID), self.tags.get(C.TAG_RANK)
        if job is not None:
            return f"rank {rank} of job {job}" if rank is not None else f"job {job}"
        return f"task {self.arn.rsplit('/', 1)[-1][:8]} ({self.family})"

    @property
    def done(self) -> bool:
        return self.last_status == "STOPPED"


@dataclass
class _Plan:
    run_seconds: float | None
    exit_code: int = 0


class SimulatedEcs:
    """The simulated ECS data plane; see the module docstring."""

    def __init__(
        self,
        local: LocalAws,
        bus: LocalEventBus,
        *,
        start: float = DEFAULT_START,
        train_seconds: float | None = 3600,
        dcgm_seconds: float = 120,
        reboot_seconds: float = 180,
        stop_delay_seconds: float = 10,
        run_delay_seconds: float = 5,
        disconnect_delay_seconds: float = 15,
        replacement_seconds: float = 240,
        instance_events_on_placement: bool = True,
        install_clock: bool = True,
        node_tag_key: str = "gpu-recovery:cluster",
    ) -> None:
        self.local = local
        self.bus = bus
        self.clock = SimClock(start)
        self.train_seconds = train_seconds
        self.dcgm_seconds = dcgm_seconds
        self.reboot_seconds = reboot_seconds
        self.stop_delay_seconds = stop_delay_seconds
        self.run_delay_seconds = run_delay_seconds
        self.disconnect_delay_seconds = disconnect_delay_seconds
        self.replacement_seconds = replacement_seconds
        #: how an XID reaches the stack: (node name, report body) -> None; raises on failure
        self.gpu_reporter: Callable[[str, dict[str, Any]], Any] = self._report_gpu_to_service
        self.auto_scaling_groups: dict[str, str] = {}  # node name -> group name
        self.gpu_reports: list[tuple[float, str, int]] = []  # (time, node, xid) accepted
        self.instance_events_on_placement = instance_events_on_placement
        self.node_tag_key = node_tag_key
        self.nodes: dict[str, Node] = {}
        self.tasks: dict[str, SimTask] = {}
        self.timeline: list[TimelineEntry] = []
        self.counters: dict[str, int] = {
            "tasks_started": 0,
            "health_checks_started": 0,
            "start_failures": 0,
            "stop_requests": 0,
            "reboots": 0,
            "reboots_ec2": 0,
            "reboots_ssm": 0,
            "terminations": 0,
            "events_emitted": 0,
        }
        self._family_plans: dict[str, _Plan] = {}
        self._task_plans: dict[str, _Plan] = {}
        self._queue: list[tuple[float, int, str, Callable[[], list[dict[str, Any]]]]] = []
        self._seq = itertools.count()
        self._reservation_ids = itertools.count(1)
        self._lock = threading.RLock()
        self._drive_lock = threading.Lock()
        bus.clock = self.clock.now
        if install_clock:
            gr_clock.set_clock(self.clock.now, self.clock.advance)
        hooks = local.hooks
        hooks.on_before_call("ecs", "StartTask", self._before_start_task)
        hooks.on_after_call("ecs", "StartTask", self._after_start_task)
        hooks.on_after_call("ecs", "StopTask", self._after_stop_task)
        hooks.on_after_call("ecs", "DescribeContainerInstances", self._after_describe_cis)
        hooks.on_before_call("ecs", "ListContainerInstances", self._before_list_cis)
        hooks.on_before_call("ecs", "DeleteAttributes", self._before_delete_attributes)
        hooks.on_after_call(
            "ecs", "UpdateContainerInstancesState", self._after_update_ci_state
        )
        hooks.on_after_call("ec2", "RebootInstances", self._after_reboot_instances)
        hooks.on_after_call("ssm", "SendCommand", self._after_send_command)
        hooks.on_after_call("auto-scaling", "TerminateInstanceInAutoScalingGroup",
                            self._after_terminate_in_asg)

    # ================================================================ helpers
    @property
    def _backend(self) -> Any:
        return ecs_backends[self.local.account_id][self.local.region]

    def now(self) -> float:
        return self.clock.now()

    def _log(self, kind: str, text: str, node: str | None = None) -> None:
        with self._lock:
            self.timeline.append(TimelineEntry(self.now(), kind, f"{node or '-':<8}  {text}"))

    def format_timeline(self, kinds: set[str] | None = None) -> list[str]:
        """``"14:03:10  node-b    rank 1 of job llama exited 1 (GPU fault injected)"``."""
        with self._lock:
            entries = list(self.timeline)
        return [
            f"{self.clock.hms(e.time)}  {e.text}" for e in entries if not kinds or e.kind in kinds
        ]

    def _when(self, at: float | datetime | None, after: float | None) -> float:
        if at is not None:
            return at.timestamp() if isinstance(at, datetime) else float(at)
        return self.now() + (after or 0.0)

    def schedule(
        self, at: float, action: Callable[[], list[dict[str, Any]] | None], label: str = ""
    ) -> None:
        """Queue ``action`` at sim time ``at``; it may return events to deliver."""

        def run() -> list[dict[str, Any]]:
            return action() or []

        with self._lock:
            heapq.heappush(self._queue, (max(at, self.now()), next(self._seq), label, run))

    def node(self, name_or_id: str) -> Node:
        """A node by name, EC2/mi- instance id or container instance ARN/id."""
        with self._lock:
            if name_or_id in self.nodes:
                return self.nodes[name_or_id]
            for n in self.nodes.values():
                if name_or_id in (n.instance_id, n.container_instance_arn, n.container_instance_id):
                    return n
        raise KeyError(name_or_id)

    def _node_or_none(self, ref: str) -> Node | None:
        try:
            return self.node(ref)
        except KeyError:
            return None

    # ================================================================ nodes
    def add_node(
        self, name: str, gpus: int = 8, kind: str = "ec2", health: str = "healthy"
    ) -> Node:
        """Launch (EC2 p4d.24xlarge) or register (ECS Anywhere ``mi-``) a GPU node."""
        if kind not in ("ec2", "anywhere"):
            raise ValueError("kind is 'ec2' or 'anywhere'")
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        ec2, ecs = self.local.client("ec2"), self.local.client("ecs")
        tags = [
            {"Key": "Name", "Value": name},
            {"Key": self.node_tag_key, "Value": self.local.cluster_name},
        ]
        inst = ec2.run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            InstanceType="p4d.24xlarge",
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]
        gpu_ids = [f"GPU-{secrets.token_hex(4)}-{i:04d}-{secrets.token_hex(2)}" for i in range(gpus)]
        ci = ecs.register_container_instance(
            cluster=self.local.cluster_name,
            instanceIdentityDocument=json.dumps({"instanceId": inst["InstanceId"]}),
            totalResources=[{"name": "GPU", "type": "STRINGSET", "stringSetValue": gpu_ids}],
        )["containerInstance"]
        instance_id = inst["InstanceId"]
        if kind == "anywhere":
            # moto needs an EC2 instance to register; ECS Anywhere hosts are "mi-" ids.
            instance_id = "mi-" + secrets.token_hex(9)[:17]
            self._backend.container_instances[self.local.cluster_name][
                ci["containerInstanceArn"].rsplit("/", 1)[-1]
            ].ec2_instance_id = instance_id
            ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
        now = self.now()
        node = Node(
            name=name,
            kind=kind,
            instance_id=instance_id,
            container_instance_arn=ci["containerInstanceArn"],
            gpu_ids=gpu_ids,
            boot_time=now,
            registered_at=now,
            health=health,
        )
        with self._lock:
            if name in self.nodes:
                raise ValueError(f"node {name} exists")
            self.nodes[name] = node
        self._log("node", f"registered ({kind} {instance_id}, {gpus} GPUs)", name)
        self.schedule(now, lambda: [self._ci_event(node)], f"register {name}")
        return node

    def set_health(self, node: str, health: str) -> None:
        """What the next health check on ``node`` will find."""
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        with self._lock:
            self.node(node).health = health

    def _moto_ci(self, node: Node) -> Any:
        return self._backend.container_instances[self.local.cluster_name].get(
            node.container_instance_id
        )

    def _ci_status(self, node: Node) -> str:
        moto_ci = self._moto_ci(node)
        return moto_ci.status if moto_ci is not None else "INACTIVE"

    def ci_description(self, node: Node) -> dict[str, Any]:
        """The ContainerInstance object as ECS would describe it now."""
        moto_ci = self._moto_ci(node)
        registered = [dict(r) for r in (moto_ci.registered_resources if moto_ci else [])]
        remaining = [dict(r) for r in (moto_ci.remaining_resources if moto_ci else [])]
        registered.append(ev.gpu_resource(node.gpu_ids))
        remaining.append(ev.gpu_resource(node.free_gpu_ids))
        attributes = [
            {"name": k, "value": v} for k, v in ((moto_ci.attributes if moto_ci else {}) or {}).items()
        ]
        return {
            "agentConnected": node.agent_connected,
            "attributes": attributes,
            "clusterArn": self.local.cluster_arn,
            "containerInstanceArn": node.container_instance_arn,
            "ec2InstanceId": node.instance_id,
            "registeredResources": registered,
            "remainingResources": remaining,
            "status": self._ci_status(node),
            "version": node.version,
            "versionInfo": dict(moto_ci.version_info) if moto_ci else {},
            "registeredAt": node.registered_at,
            "updatedAt": self.now(),
            "accountType": "ec2_instance",
        }

    def _ci_event(self, node: Node) -> dict[str, Any]:
        with self._lock:
            node.version += 1
            desc = self.ci_description(node)
        return ev.container_instance_state_change(desc, time=self.now())

    def emit_instance_change(self, node: str, at: float | None = None, after: float | None = None):
        """A plain container-instance event (ECS emits these for many reasons)."""
        n = self.node(node)
        self.schedule(self._when(at, after), lambda: [self._ci_event(n)], f"ci {node}")

    def disconnect_agent(
        self,
        node: str,
        at: float | None = None,
        after: float | None = None,
        for_seconds: float = 60,
    ) -> None:
        """A plain agent flap: disconnected event, then reconnected, no reboot."""
        n = self.node(node)
        t = self._when(at, after)

        def down() -> list[dict[str, Any]]:
            n.agent_connected = False
            self._log("agent", "agent disconnected (flap)", n.name)
            return [self._ci_event(n)]

        def up() -> list[dict[str, Any]]:
            n.agent_connected = True
            self._log("agent", "agent reconnected (flap)", n.name)
            return [self._ci_event(n)]

        self.schedule(t, down, f"flap-down {node}")
        self.schedule(t + for_seconds, up, f"flap-up {node}")

    # ================================================================ faults
    def inject_gpu_fault(
        self,
        node: str,
        at: float | None = None,
        after: float | None = None,
        health: str = "reboot_fixable",
        exit_code: int = 1,
        nccl_cascade: bool = False,
        cascade_delay_seconds: float = 5,
    ) -> None:
        """At ``at`` (abs) / ``after`` (rel): node's health becomes ``health`` and every
        training task on it exits ``exit_code``; with ``nccl_cascade`` the other ranks
        of the same jobs exit 1 ``cascade_delay_seconds`` later (NCCL errors)."""
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        n = self.node(node)
        t = self._when(at, after)

        def fault() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            with self._lock:
                n.health = health
                victims = [
                    task
                    for task in self.tasks.values()
                    if task.node == n.name and not task.done and not task.health_check
                ]
            self._log("fault", f"GPU fault injected (health: {health})", n.name)
            jobs = set()
            for task in victims:
                out += self._container_exit(task, exit_code, "GPU fault injected")
                if C.TAG_JOB_ID in task.tags:
                    jobs.add(task.tags[C.TAG_JOB_ID])
            if nccl_cascade and jobs:
                self.schedule(
                    self.now() + cascade_delay_seconds,
                    lambda: self._cascade(jobs, n.name),
                    "nccl cascade",
                )
            return out

        self.schedule(t, fault, f"gpu fault {node}")

    def _cascade(self, jobs: set[str], origin: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with self._lock:
            others = [
                t
                for t in self.tasks.values()
                if not t.done
                and not t.health_check
                and t.tags.get(C.TAG_JOB_ID) in jobs
                and t.node != origin
                and t.desired_status == "RUNNING"
            ]
        for task in others:
            out += self._container_exit(task, 1, "NCCL error")
        return out

    def inject_xid(
        self,
        node: str,
        xid: int,
        at: float | None = None,
        after: float | None = None,
        *,
        gpu: int = 0,
        health: str = "reboot_fixable",
        exit_code: int | None = 1,
        nccl_cascade: bool = False,
        report_delay_seconds: float = 1,
        crash_delay_seconds: float = 3,
    ) -> None:
        """The driver logs ``XID <xid>`` on GPU ``gpu`` of ``node``: the node agent reports
        it (``report_delay_seconds`` later, through ``gpu_reporter``: the heartbeat service's
        ``report_gpu``, retried as the agent retries), and ``crash_delay_seconds`` after the
        XID every training task on the node exits ``exit_code`` (None: the XID kills no task;
        the node's health still becomes ``health`` for a later health check)."""
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        n = self.node(node)
        t = self._when(at, after)

        def logged() -> list[dict[str, Any]]:
            with self._lock:
                n.health = health
            self._log("fault", f"XID {xid} on GPU {gpu} (driver log; health: {health})", n.name)
            return []

        self.schedule(t, logged, f"xid {xid} {node}")
        self.schedule(t + report_delay_seconds, lambda: self._report_xid(n, xid, gpu, attempt=1),
                      f"agent reports xid {xid}")
        if exit_code is not None:
            self.schedule(t + crash_delay_seconds, lambda: self._xid_crash(n, xid, exit_code, nccl_cascade),
                          f"xid {xid} crash")

    def _xid_crash(self, n: Node, xid: int, exit_code: int, nccl_cascade: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        with self._lock:
            victims = [task for task in self.tasks.values()
                       if task.node == n.name and not task.done and not task.health_check]
        jobs = set()
        for task in victims:
            out += self._container_exit(task, exit_code, f"CUDA error after XID {xid}")
            if C.TAG_JOB_ID in task.tags:
                jobs.add(task.tags[C.TAG_JOB_ID])
        if nccl_cascade and jobs:
            self.schedule(self.now() + 5, lambda: self._cascade(jobs, n.name), "nccl cascade")
        return out

    def gpu_report_body(self, n: Node, xids: dict[int, list[int]] | None = None) -> dict[str, Any]:
        """The node agent's ``/v1/report_gpu`` body (agent/README.md) for this node now."""
        xids = xids or {}
        gpus = [{"index": i, "uuid": uuid, "pci_bus_id": f"00000000:{16 + i:02X}:00.0",
                 "utilization_gpu": 0, "memory_used_mib": 0, "memory_total_mib": 81920,
                 "temperature_c": 40, "ecc_uncorrected_volatile": 0, "remapped_rows_pending": False,
                 "remapped_rows_failure": False, "xids": list(xids.get(i, []))}
                for i, uuid in enumerate(n.gpu_ids)]
        return {"node_id": n.container_instance_id, "timestamp": self.now(), "gpus": gpus}

    def _report_xid(self, n: Node, xid: int, gpu: int, attempt: int) -> list[dict[str, Any]]:
        body = self.gpu_report_body(n, {gpu: [xid]})
        try:
            self.gpu_reporter(n.name, body)
        except Exception as error:  # the agent retries a failed report (and keeps the XID)
            if attempt >= 5:
                self._log("agent", f"report_gpu failed {attempt} times, XID {xid} lost: {error}", n.name)
                return []
            self.schedule(self.now() + 2, lambda: self._report_xid(n, xid, gpu, attempt + 1), "report retry")
            return []
        with self._lock:
            self.gpu_reports.append((self.now(), n.name, xid))
        self._log("agent", f"node agent reported XID {xid} on GPU {gpu} (POST /v1/report_gpu)", n.name)
        return []

    def _report_gpu_to_service(self, node: str, body: dict[str, Any]) -> Any:
        """What the node API does with a GPU report: the heartbeat service's report_gpu."""
        from gpu_recovery import runtime

        return runtime.heartbeat_service().report_gpu(body["node_id"], body["timestamp"], body["gpus"],
                                                      body.get("unmapped_xids") or [], body.get("error"))

    def inject_task_exit(
        self,
        task_arn: str,
        exit_code: int,
        at: float | None = None,
        after: float | None = None,
        why: str = "injected",
    ) -> None:
        """The task's essential container exits with ``exit_code`` at that time."""

        def go() -> list[dict[str, Any]]:
            task = self.tasks.get(task_arn)
            return self._container_exit(task, exit_code, why) if task else []

        self.schedule(self._when(at, after), go, f"exit {task_arn}")

    def plan_family(
        self, family: str, run_seconds: float | None, exit_code: int = 0
    ) -> None:
        """Tasks of ``family`` started from now on run ``run_seconds`` (None: until
        stopped) after RUNNING, then exit ``exit_code``."""
        with self._lock:
            self._family_plans[family] = _Plan(run_seconds, exit_code)

    def plan_task(self, task_arn: str, run_seconds: float | None, exit_code: int = 0) -> None:
        """Re-plan one task: exit ``exit_code`` ``run_seconds`` from now (None: never)."""
        with self._lock:
            task = self.tasks.get(task_arn)
            if task is None:
                self._task_plans[task_arn] = _Plan(run_seconds, exit_code)
                return
            task.plan_token += 1
            token = task.plan_token
        if run_seconds is not None:
            self.schedule(
                self.now() + run_seconds,
                lambda: self._planned_exit(task_arn, token, exit_code),
                f"planned exit {task_arn}",
            )

    # ================================================================ jobs (helpers)
    def register_training_task_definition(
        self, family: str, gpus: int = 8, image: str = "trainer:latest"
    ) -> str:
        """Register a training task definition with a GPU requirement; returns its ARN."""
        return self.local.client("ecs").register_task_definition(
            family=family,
            requiresCompatibilities=["EC2"],
            networkMode="host",
            containerDefinitions=[
                {
                    "name": "trainer",
                    "image": image,
                    "memory": 4096,
                    "essential": True,
                    "resourceRequirements": [{"type": "GPU", "value": str(gpus)}],
                }
            ],
        )["taskDefinition"]["taskDefinitionArn"]

    def start_job(
        self,
        job_id: str,
        task_definition: str,
        nodes: list[str],
        *,
        attempt: int | None = None,
        started_by: str = "gpujobs",
        overrides: dict[str, Any] | None = None,
        extra_tags: dict[str, str] | None = None,
    ) -> list[str]:
        """Start one rank per node through the *handler-side* ECS client (hooks see
        it), tagged with job id / rank / world size. Returns task ARNs by rank;
        raises RuntimeError on placement failures."""
        from gpu_recovery.adapters import aws

        ecs = aws.client("ecs")
        arns = []
        for rank, name in enumerate(nodes):
            tags = {C.TAG_JOB_ID: job_id, C.TAG_RANK: str(rank), C.TAG_WORLD_SIZE: str(len(nodes))}
            if attempt is not None:
                tags[C.TAG_ATTEMPT] = str(attempt)
            tags.update(extra_tags or {})
            kwargs: dict[str, Any] = {
                "cluster": self.local.cluster_name,
                "taskDefinition": task_definition,
                "containerInstances": [self.node(name).container_instance_arn],
                "startedBy": started_by,
                "tags": [{"key": k, "value": v} for k, v in tags.items()],
            }
            if overrides:
                kwargs["overrides"] = overrides
            resp = ecs.start_task(**kwargs)
            if resp.get("failures"):
                raise RuntimeError(f"start of {job_id} rank {rank} failed: {resp['failures']}")
            arns.append(resp["tasks"][0]["taskArn"])
        return arns

    def running_tasks(self, node: str | None = None) -> list[SimTask]:
        with self._lock:
            return [
                t
                for t in self.tasks.values()
                if not t.done and (node is None or t.node == self.node(node).name)
            ]

    # ================================================================ API hooks
    def _gpus_needed(self, task_def_ref: str, overrides: dict[str, Any] | None) -> tuple[Any, int]:
        td = self._backend.describe_task_definition(task_def_ref)
        per_container: dict[str, int] = {}
        for cdef in td.container_definitions:
            gpus = sum(
                int(r.get("value", 0))
                for r in cdef.get("resourceRequirements") or []
                if r.get("type") == "GPU"
            )
            per_container[cdef.get("name", "")] = gpus
        for co in (overrides or {}).get("containerOverrides") or []:
            reqs = [r for r in co.get("resourceRequirements") or [] if r.get("type") == "GPU"]
            if reqs and co.get("name") in per_container:
                per_container[co["name"]] = sum(int(r.get("value", 0)) for r in reqs)
        return td, sum(per_container.values())

    def _before_list_cis(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """ListContainerInstances with a ``filter`` (cluster query language): evaluated
        here on the instances' attributes (moto ignores it). No filter: moto answers."""
        expression = params.get("filter")
        if not expression:
            return None
        status = params.get("status")
        cis = self._backend.container_instances.get(self.local.cluster_name, {}).values()
        arns = sorted(ci.container_instance_arn for ci in cis
                      if (status is None or ci.status == status)
                      and cluster_query.matches(str(expression), dict(ci.attributes or {})))
        return self._short_circuit({"containerInstanceArns": arns})

    def _before_delete_attributes(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        """DeleteAttributes of custom attributes by name and target, without their value, as
        ECS documents it (moto deletes only an attribute whose value matches the one given)."""
        attributes = list(params.get("attributes") or [])
        if any(a.get("value") is not None or not a.get("targetId") for a in attributes):
            return None  # moto answers
        cis = self._backend.container_instances.get(self.local.cluster_name, {})
        for attribute in attributes:
            ci = cis.get(str(attribute["targetId"]).rsplit("/", 1)[-1])
            if ci is None:
                return None  # moto answers TargetNotFoundException
        for attribute in attributes:
            cis[str(attribute["targetId"]).rsplit("/", 1)[-1]].attributes.pop(attribute["name"], None)
        return self._short_circuit({"attributes": attributes})

    def _before_start_task(self, params: dict[str, Any], context: dict[str, Any]) -> Any:
        try:
            _, needed = self._gpus_needed(params["taskDefinition"], params.get("overrides"))
        except Exception:
            return None  # let moto produce its own error
        cis = list(params.get("containerInstances") or [])
        placed: list[str] = []
        failures: list[dict[str, str]] = []
        rid = next(self._reservation_ids)
        with self._lock:
            for ref in cis:
                node = self._node_or_none(ref)
                if node is None:
                    placed.append(ref)
                    continue
                ok = (
                    node.agent_connected
                    and not node.rebooting
                    and self._ci_status(node) == "ACTIVE"
                    and len(node.free_gpu_ids) >= needed
                )
                if not ok:
                    failures.append({"arn": node.container_instance_arn, "reason": "RESOURCE:GPU"})
                    continue
                node.reservations[rid] = node.reservations.get(rid, []) + node.free_gpu_ids[:needed]
                placed.append(ref)
            context["local_mode_reservation"] = rid
            context["local_mode_failures"] = failures
            self.counters["start_failures"] += len(failures)
        for f in failures:
            n = self.node(f["arn"])
            self._log("placement", f"StartTask refused: RESOURCE:GPU ({len(n.free_gpu_ids)} "
                      f"free, agent {'up' if n.agent_connected else 'down'})", n.name)
        if not placed:
            context["local_mode_short_circuit"] = True
            return self._short_circuit({"tasks": [], "failures": failures})
        if failures:  # start on the instances that fit, as ECS does
            request = context.get("local_mode_request") or {}
            body = json.loads(request.get("body") or b"{}")
            body["containerInstances"] = placed
            request["body"] = json.dumps(body).encode()
        return None

    @staticmethod
    def short_circuit_response(parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        """A 200 answer for a before-call hook to return instead of calling the emulator."""
        return SimulatedEcs._short_circuit(parsed)

    @staticmethod
    def _short_circuit(parsed: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        headers = HTTPHeaders()
        http = AWSResponse("https://ecs.us-east-1.amazonaws.com/", 200, headers, None)  # type: ignore[arg-type]
        parsed = dict(parsed)
        parsed["ResponseMetadata"] = {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}
        return http, parsed

    def _release_reservation(self, rid: int | None) -> None:
        if rid is None:
            return
        with self._lock:
            for node in self.nodes.values():
                node.reservations.pop(rid, None)

    def _after_start_task(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        rid = context.get("local_mode_reservation")
        failures = context.get("local_mode_failures") or []
        if status >= 300:
            self._release_reservation(rid)
            return
        tags = {t["key"]: t["value"] for t in params.get("tags") or []}
        now = self.now()
        new: list[SimTask] = []
        with self._lock:
            for task_desc in parsed.get("tasks") or []:
                node = self._node_or_none(task_desc.get("containerInstanceArn", ""))
                if node is None or task_desc["taskArn"] in self.tasks:
                    continue
                gpu_ids = (node.reservations.get(rid) or [])
                td, needed = self._gpus_needed(params["taskDefinition"], params.get("overrides"))
                gpu_ids, rest = gpu_ids[:needed], gpu_ids[needed:]
                if rid in node.reservations:
                    if rest:
                        node.reservations[rid] = rest
                    else:
                        node.reservations.pop(rid)
                node.allocations[task_desc["taskArn"]] = gpu_ids
                group = task_desc.get("group") or f"family:{td.family}"
                hc = group.startswith(C.HEALTH_CHECK_GROUP) or td.family == C.DEFAULT_HEALTH_CHECK_FAMILY
                task = SimTask(
                    arn=task_desc["taskArn"],
                    node=node.name,
                    task_definition_arn=td.arn,
                    family=td.family,
                    group=group,
                    started_by=task_desc.get("startedBy") or "",
                    overrides=params.get("overrides") or {"containerOverrides": []},
                    tags=tags,
                    gpu_ids=gpu_ids,
                    containers=[
                        {
                            "containerArn": (
                                f"arn:aws:ecs:{self.local.region}:{self.local.account_id}:"
                                f"container/{self.local.cluster_name}/"
                                f"{task_desc['taskArn'].rsplit('/', 1)[-1]}/{secrets.token_hex(8)}"
                            ),
                            "lastStatus": "PENDING",
                            "name": c.get("name", ""),
                            "image": c.get("image", ""),
                            "taskArn": task_desc["taskArn"],
                            "networkInterfaces": [],
                            "cpu": str(c.get("cpu", 0)),
                            "memory": str(c.get("memory", 0)),
                            "gpuIds": gpu_ids if i == 0 else [],
                        }
                        for i, c in enumerate(td.container_definitions)
                    ],
                    created_at=now,
                    updated_at=now,
                    memory=str(sum(int(c.get("memory", 0) or 0) for c in td.container_definitions)),
                    health_check=hc,
                )
                self.tasks[task.arn] = task
                new.append(task)
                self.counters["tasks_started"] += 1
                if hc:
                    self.counters["health_checks_started"] += 1
                self._sync_moto(task)
            self._release_reservation(rid)
        if failures and not context.get("local_mode_short_circuit"):
            parsed.setdefault("failures", []).extend(failures)
        for task in new:
            self._log("task", f"{task.label} placed ({len(task.gpu_ids)} GPUs)", task.node)
            self.schedule(now + 1, lambda t=task: self._to_pending(t), "pending")
            self.schedule(now + self.run_delay_seconds, lambda t=task: self._to_running(t), "run")
            if self.instance_events_on_placement:
                n = self.nodes[task.node]
                self.schedule(now + 1, lambda n=n: [self._ci_event(n)], "ci placement")

    def _after_stop_task(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        arn = (parsed.get("task") or {}).get("taskArn") or params.get("task", "")
        reason = params.get("reason") or "Task stopped by user"
        with self._lock:
            task = self.tasks.get(arn) or next(
                (t for a, t in self.tasks.items() if a.endswith("/" + arn)), None
            )
            if task is None:
                return
            task.moto_stopped = True
            self.counters["stop_requests"] += 1
            if task.done:
                self._sync_moto(task)
                self._patch_task_response(task, parsed.get("task"))
                return
            already = task.desired_status == "STOPPED"
            task.desired_status = "STOPPED"
            if not already:
                task.stopping_at = self.now()
                task.stop_code = "UserInitiated"
                task.stopped_reason = reason
            self._sync_moto(task)
            self._patch_task_response(task, parsed.get("task"))
        if already:
            return
        self._log("stop", f"StopTask {task.label}: {reason}", task.node)

        def stopping() -> list[dict[str, Any]]:
            return [self._task_event(task)] if not task.done else []

        def stopped() -> list[dict[str, Any]]:
            return self._finish(task, exit_code=143 if task.last_status == "RUNNING" else None,
                                stop_code="UserInitiated", reason=reason, why="stopped")

        self.schedule(self.now(), stopping, "stopping")
        self.schedule(self.now() + self.stop_delay_seconds, stopped, "stopped")

    def _patch_task_response(self, task: SimTask, resp: dict[str, Any] | None) -> None:
        if resp is not None:
            resp["lastStatus"] = task.last_status
            resp["desiredStatus"] = task.desired_status
            if task.stop_code:
                resp["stopCode"] = task.stop_code

    def _after_describe_cis(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        for ci in parsed.get("containerInstances") or []:
            node = self._node_or_none(ci.get("containerInstanceArn", ""))
            if node is None:
                continue
            with self._lock:
                ci["agentConnected"] = node.agent_connected
                ci["ec2InstanceId"] = node.instance_id
                for key, ids in (
                    ("registeredResources", node.gpu_ids),
                    ("remainingResources", node.free_gpu_ids),
                ):
                    res = [r for r in ci.get(key) or [] if r.get("name") != "GPU"]
                    res.append(ev.gpu_resource(ids))
                    ci[key] = res
                ci["runningTasksCount"] = len(
                    [t for t in self.tasks.values() if t.node == node.name and not t.done]
                )

    def _after_update_ci_state(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        for ci in parsed.get("containerInstances") or []:
            node = self._node_or_none(ci.get("containerInstanceArn", ""))
            if node is None:
                continue
            self._log("node", f"container instance -> {ci.get('status')}", node.name)
            self.schedule(self.now(), lambda n=node: [self._ci_event(n)], "ci state")

    def _after_reboot_instances(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        for iid in params.get("InstanceIds") or []:
            node = self._node_or_none(iid)
            if node is not None:
                self._reboot(node, "EC2 RebootInstances")

    def _after_send_command(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        document = params.get("DocumentName")
        if status >= 300:
            return
        if document == "AWS-RunShellScript":
            commands = " ; ".join((params.get("Parameters") or {}).get("commands") or [])
            if not any(word in commands for word in REBOOT_WORDS):
                return
        elif document != (os.environ.get(C.ENV_REBOOT_DOCUMENT) or C.DEFAULT_REBOOT_DOCUMENT_NAME):
            return  # the stack's reboot-only document: every send is a reboot
        for iid in params.get("InstanceIds") or []:
            node = self._node_or_none(iid)
            if node is not None:
                self._reboot(node, f"SSM {document}")

    # ================================================================ Auto Scaling
    def put_in_auto_scaling_group(self, nodes: list[str], group: str = "gpu-nodes") -> str:
        """Create an Auto Scaling group (tagged with the cluster tag) holding ``nodes``."""
        asg, ec2 = self.local.client("autoscaling"), self.local.client("ec2")
        if group not in set(self.auto_scaling_groups.values()):
            template = ec2.create_launch_template(
                LaunchTemplateName=f"{group}-lt",
                LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p4d.24xlarge"})
            asg.create_auto_scaling_group(
                AutoScalingGroupName=group, MinSize=0, MaxSize=64, DesiredCapacity=0,
                LaunchTemplate={"LaunchTemplateId": template["LaunchTemplate"]["LaunchTemplateId"]},
                AvailabilityZones=[f"{self.local.region}a"],
                Tags=[{"Key": self.node_tag_key, "Value": self.local.cluster_name, "PropagateAtLaunch": True,
                       "ResourceId": group, "ResourceType": "auto-scaling-group"}])
        ids = [self.node(n).instance_id for n in nodes]
        asg.attach_instances(AutoScalingGroupName=group, InstanceIds=ids)
        for n in nodes:
            self.auto_scaling_groups[self.node(n).name] = group
        return group

    def _after_terminate_in_asg(
        self, params: dict[str, Any], status: int, parsed: dict[str, Any], context: dict[str, Any]
    ) -> None:
        if status >= 300:
            return
        node = self._node_or_none(params.get("InstanceId", ""))
        if node is None:
            return
        with self._lock:
            self.counters["terminations"] += 1
        self._log("node", "terminated in its Auto Scaling group (desired capacity kept)", node.name)
        host = node.instance_id

        def gone() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for task in self.running_tasks(node.name):
                out += self._finish(task, exit_code=137, stop_code="EssentialContainerExited",
                                    reason=f"Host EC2 (instance {host}) terminated", why="host terminated")
            node.agent_connected = False
            with contextlib.suppress(Exception):
                self.local.client("ecs").deregister_container_instance(
                    cluster=self.local.cluster_name, containerInstance=node.container_instance_arn,
                    force=True)
            return [*out, self._ci_event(node)]

        def replacement() -> list[dict[str, Any]]:
            count = sum(1 for name in self.nodes if name.startswith(f"{node.name}-r")) + 1
            new = self.add_node(f"{node.name}-r{count}", gpus=len(node.gpu_ids))
            self._log("node", f"replacement for {node.name} launched by the Auto Scaling group", new.name)
            return []

        self.schedule(self.now() + 5, gone, "terminated")
        self.schedule(self.now() + self.replacement_seconds, replacement, "asg replacement")

    # ================================================================ reboot
    def reboot(self, node: str) -> None:
        """Reboot a node as if the API had been called (no API call)."""
        self._reboot(self.node(node), "direct")

    def _reboot(self, node: Node, via: str) -> None:
        requested = self.now()
        with self._lock:
            self.counters["reboots"] += 1
            if via.startswith("EC2"):
                self.counters["reboots_ec2"] += 1
            elif via.startswith("SSM"):
                self.counters["reboots_ssm"] += 1
            node.reboots += 1
            node.reboot_requested_at = requested
            if node.rebooting:
                self._log("reboot", f"reboot requested again via {via} (already rebooting)",
                          node.name)
                return
            node.rebooting = True
        self._log("reboot", f"reboot requested via {via}", node.name)
        host = "EC2" if node.kind == "ec2" else "ECS Anywhere"

        def kill() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for task in self.running_tasks(node.name):
                out += self._finish(
                    task,
                    exit_code=137,
                    stop_code="EssentialContainerExited",
                    reason=f"Host {host} (instance {node.instance_id}) rebooted",
                    why="host rebooted",
                )
            return out

        def down() -> list[dict[str, Any]]:
            node.agent_connected = False
            self._log("agent", "agent disconnected (rebooting)", node.name)
            return [self._ci_event(node)]

        def up() -> list[dict[str, Any]]:
            with self._lock:
                node.agent_connected = True
                node.rebooting = False
                node.boot_time = self.now()
                before = node.health
                if node.health == "reboot_fixable":
                    node.health = "healthy"
            self._log("agent", f"back after reboot, agent connected (health {before} -> "
                      f"{node.health})", node.name)
            return [self._ci_event(node)]

        self.schedule(requested + 5, kill, "reboot kill")
        self.schedule(requested + self.disconnect_delay_seconds, down, "reboot down")
        self.schedule(requested + self.reboot_seconds, up, "reboot up")

    # ================================================================ task lifecycle
    def _task_description(self, task: SimTask) -> dict[str, Any]:
        return {
            "attachments": [],
            "availabilityZone": "us-east-1a",
            "clusterArn": self.local.cluster_arn,
            "containerInstanceArn": self.nodes[task.node].container_instance_arn,
            "containers": [dict(c) for c in task.containers],
            "cpu": task.cpu,
            "createdAt": task.created_at,
            "desiredStatus": task.desired_status,
            "group": task.group,
            "launchType": "EC2" if self.nodes[task.node].kind == "ec2" else "EXTERNAL",
            "lastStatus": task.last_status,
            "memory": task.memory,
            "overrides": task.overrides,
            "startedAt": task.started_at,
            "startedBy": task.started_by,
            "stoppingAt": task.stopping_at,
            "stoppedAt": task.stopped_at,
            "stoppedReason": task.stopped_reason,
            "stopCode": task.stop_code,
            "taskArn": task.arn,
            "taskDefinitionArn": task.task_definition_arn,
            "updatedAt": task.updated_at,
            "version": task.version,
        }

    def _task_event(self, task: SimTask) -> dict[str, Any]:
        with self._lock:
            task.version += 1
            task.updated_at = self.now()
            desc = self._task_description(task)
        return ev.task_state_change(desc, time=self.now())

    def _sync_moto(self, task: SimTask) -> None:
        moto_task = self._backend.tasks.get(self.local.cluster_name, {}).get(task.arn)
        if moto_task is None:
            return
        moto_task.last_status = task.last_status
        moto_task.desired_status = task.desired_status
        moto_task.stopped_reason = task.stopped_reason or ""
        moto_task.stop_code = task.stop_code
        for attr, value in (
            ("started_at", task.started_at),
            ("stopping_at", task.stopping_at),
            ("stopped_at", task.stopped_at),
            ("created_at", task.created_at),
        ):
            setattr(moto_task, attr, datetime.fromtimestamp(value, tz=UTC) if value else None)
        for mc, sc in zip(moto_task.containers, task.containers, strict=False):
            mc.last_status = sc["lastStatus"]
            mc.exitCode = sc.get("exitCode")

    def _to_pending(self, task: SimTask) -> list[dict[str, Any]]:
        if task.done or task.last_status != "PENDING":
            return []
        return [self._task_event(task)]

    def _to_running(self, task: SimTask) -> list[dict[str, Any]]:
        with self._lock:
            if task.done or task.desired_status != "RUNNING":
                return []
            task.last_status = "RUNNING"
            task.started_at = self.now()
            for c in task.containers:
                c["lastStatus"] = "RUNNING"
            self._sync_moto(task)
            plan = self._task_plans.pop(task.arn, None) or self._family_plans.get(task.family)
            if task.health_check:
                plan = plan or _Plan(self.dcgm_seconds, -1)  # -1: node verdict
            else:
                plan = plan or _Plan(self.train_seconds, 0)
            token = task.plan_token
        self._log("task", f"{task.label} RUNNING", task.node)
        if plan.run_seconds is not None:
            self.schedule(
                self.now() + plan.run_seconds,
                lambda: self._planned_exit(task.arn, token, plan.exit_code),
                "planned exit",
            )
        return [self._task_event(task)]

    def _planned_exit(self, arn: str, token: int, exit_code: int) -> list[dict[str, Any]]:
        task = self.tasks.get(arn)
        if task is None or task.done or task.plan_token != token:
            return []
        if task.health_check and exit_code == -1:
            node = self.nodes[task.node]
            verdict = VERDICT_EXIT[node.health]
            self._write_verdict_log(task, node, verdict)
            return self._container_exit(task, verdict, f"DCGM verdict {node.health}")
        return self._container_exit(task, exit_code, "finished" if exit_code == 0 else "planned")

    def _container_exit(self, task: SimTask, exit_code: int, why: str) -> list[dict[str, Any]]:
        """The essential container exited: STOPPED (EssentialContainerExited)."""
        if task.done:
            return []
        return self._finish(
            task,
            exit_code=exit_code,
            stop_code="EssentialContainerExited",
            reason="Essential container in task exited",
            why=why,
        )

    def _finish(
        self,
        task: SimTask,
        *,
        exit_code: int | None,
        stop_code: str,
        reason: str,
        why: str,
    ) -> list[dict[str, Any]]:
        with self._lock:
            if task.done:
                return []
            now = self.now()
            was_started = task.started_at is not None
            task.last_status = "STOPPED"
            task.desired_status = "STOPPED"
            task.stopping_at = task.stopping_at or now
            task.stopped_at = now
            if task.stop_code != "UserInitiated":
                task.stop_code = stop_code
                task.stopped_reason = reason
            if not was_started and task.stop_code != "UserInitiated":
                task.stop_code = "TaskFailedToStart"
            task.exit_code = exit_code if was_started else None
            for i, c in enumerate(task.containers):
                c["lastStatus"] = "STOPPED"
                if was_started:
                    c["exitCode"] = exit_code if i == 0 else 0
            node = self.nodes[task.node]
            node.allocations.pop(task.arn, None)
            if not task.moto_stopped:
                with contextlib.suppress(Exception):  # moto bookkeeping only
                    self._backend.stop_task(self.local.cluster_name, task.arn, task.stopped_reason)
                task.moto_stopped = True
            self._sync_moto(task)
        code = "" if task.exit_code is None else f" exited {task.exit_code}"
        self._log("task", f"{task.label}{code or ' stopped'} ({why})", task.node)
        out = [self._task_event(task)]
        if self.instance_events_on_placement:
            out.append(self._ci_event(node))
        return out

    def _write_verdict_log(self, task: SimTask, node: Node, verdict: int) -> None:
        line = verdict_line(verdict, int(self.local.env.get(C.ENV_DCGM_LEVEL, "2")), task.gpu_ids, node.name)
        try:
            logs = self.local.client("logs")
            stream = (f"{C.HEALTH_CHECK_LOG_STREAM_PREFIX}/{task.containers[0]['name']}/"
                      f"{task.arn.rsplit('/', 1)[-1]}")
            logs.create_log_stream(logGroupName=HEALTH_CHECK_LOG_GROUP, logStreamName=stream)
            logs.put_log_events(
                logGroupName=HEALTH_CHECK_LOG_GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": int(self.now() * 1000), "message": line}],
            )
        except Exception:  # noqa: S110 - optional nicety
            pass

    # ================================================================ driver
    def pending_actions(self) -> int:
        with self._lock:
            return len(self._queue)

    def _next_time(self) -> float | None:
        with self._lock:
            q = self._queue[0][0] if self._queue else None
        s = self.bus.next_schedule_due()
        if q is None:
            return s
        return q if s is None else min(q, s)

    def _step(self, limit: float) -> bool:
        """Run the earliest action or schedule at or before ``limit``."""
        t = self._next_time()
        if t is None or t > limit:
            return False
        self.clock.set(t)
        with self._lock:
            run_action = bool(self._queue) and self._queue[0][0] <= t
            item = heapq.heappop(self._queue) if run_action else None
        if item is not None:
            events = item[3]()
            for event in events:
                self.counters["events_emitted"] += 1
                self.bus.put_events(event)
        else:
            self.bus.fire_due(t)
        return True

    def run_until(self, t: float | datetime) -> float:
        """Advance simulated time to ``t`` (absolute), running everything due."""
        limit = t.timestamp() if isinstance(t, datetime) else float(t)
        with self._drive_lock:
            while self._step(limit):
                pass
            self.clock.set(limit)
        return self.now()

    def run_for(self, seconds: float) -> float:
        """Advance simulated time by ``seconds``."""
        return self.run_until(self.now() + seconds)

    def run_until_idle(self, max_seconds: float = 24 * 3600) -> float:
        """Run until no data-plane action is queued (schedules alone don't count),
        or ``max_seconds`` of simulated time passed. Returns the time reached."""
        limit = self.now() + max_seconds
        with self._drive_lock:
            while self.pending_actions() and self._step(limit):
                pass
        return self.now()

    def run_until_true(
        self, predicate: Callable[[], bool], max_seconds: float = 24 * 3600
    ) -> bool:
        """Run step by step until ``predicate()`` holds (checked after every step)."""
        limit = self.now() + max_seconds
        with self._drive_lock:
            while not predicate():
                if not self._step(limit):
                    self.clock.set(limit)
                    return predicate()
        return True

    # ================================================================ summary
    def summary(self) -> dict[str, int]:
        """Counters for the demo: reboots, health checks, tasks, notifications..."""
        with self._lock:
            out = dict(self.counters)
        out["notifications"] = len(self.local.notifications())
        out["dead_letters"] = len(self.bus.dead_letters)
        return out
