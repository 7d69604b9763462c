"""The core of the simulated ECS data plane: its state, the node registry (container
instances and their events), the action queue and the driver that runs it in simulated time.

The task lifecycle (``ecs_tasks``), GPU faults (``ecs_faults``) and the ECS/EC2/SSM/Auto
Scaling API hooks (``ecs``) build on it; ``local_mode.sim.ecs.SimulatedEcs`` is the whole.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from moto.ecs.models import ecs_backends

from gpu_recovery import clock as gr_clock

from .. import events as ev
from ..emulator import LocalAws
from ..health_verdicts import HEALTH_VALUES
from .bus import EventBus
from .clock import DEFAULT_START, SimClock, TimedActions
from .ecs_data_plane import DataPlane
from .ecs_model import Node, Placement, Task, describe_container_instance


class EcsCore(DataPlane):
    """The moto world's data plane: its state, nodes and driver (see ``local_mode.sim.ecs``);
    the task lifecycle and reboots are :class:`~local_mode.sim.ecs_data_plane.DataPlane`'s."""

    def __init__(
        self,
        local: LocalAws,
        bus: EventBus,
        *,
        start: float = DEFAULT_START,
        train_seconds: float | None = 3600,
        dcgm_seconds: float = 120,
        reboot_seconds: float = 180,
        reset_seconds: float = 30,
        stop_delay_seconds: float = 10,
        run_delay_seconds: float = 5,
        disconnect_delay_seconds: float = 15,
        replacement_seconds: float = 240,
        instance_events_on_placement: bool = True,
        install_clock: bool = True,
        node_tag_key: str = "gpu-recovery:cluster",
    ) -> None:
        super().__init__(
            train_seconds=train_seconds,
            dcgm_seconds=dcgm_seconds,
            reboot_seconds=reboot_seconds,
            reset_seconds=reset_seconds,
            stop_delay_seconds=stop_delay_seconds,
            run_delay_seconds=run_delay_seconds,
            disconnect_delay_seconds=disconnect_delay_seconds,
            instance_events_on_placement=instance_events_on_placement,
        )
        self.local = local
        self.bus = bus
        self.clock = SimClock(start)
        self.replacement_seconds = replacement_seconds
        self.auto_scaling_groups: dict[str, str] = {}  # node name -> group name
        self.gpu_reports: list[tuple[float, str, int]] = []  # (time, node, xid) accepted
        self.node_tag_key = node_tag_key
        self._moto_stopped: set[str] = set()  # tasks moto already counts as stopped
        self.counters: dict[str, int] = {
            "tasks_started": 0,
            "health_checks_started": 0,
            "gpu_resets_started": 0,
            "start_failures": 0,
            "stop_requests": 0,
            "reboots": 0,
            "reboots_ec2": 0,
            "reboots_ssm": 0,
            "terminations": 0,
            "events_emitted": 0,
        }
        self._actions = TimedActions(self.clock)  # each returns the events it emits
        #: EventBridge's delivery latency: event -> seconds before its rules see it (None: at
        #: once). A scenario holds an event back to race the stack against its own sweep.
        self.delivery_delay: Callable[[dict[str, Any]], float] | None = None
        #: called after each action's events were delivered, with them (another scheduler
        #: on the cluster reacting to what ECS just did: ``sim.eager_scheduler``)
        self.step_listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        #: called with a task as its containers start, before its RUNNING event is sent (what a
        #: container does at start: the awslogs driver makes its stream, a program begins)
        self.container_start_listeners: list[Callable[[Task], None]] = []
        self._held_back: set[int] = set()  # events delivered late once already
        #: every task placed, with its node's health then (``ecs_model.Placement``)
        self.placements: list[Placement] = []
        self._reservation_ids = itertools.count(1)
        self._drive_lock = threading.Lock()
        bus.clock = self.clock.now
        if install_clock:
            gr_clock.set_clock(self.clock.now, self.clock.advance)

    # ================================================================ helpers
    @property
    def _backend(self) -> Any:
        return ecs_backends[self.local.account_id][self.local.region]

    def now(self) -> float:
        return self.clock.now()

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
    ) -> None:  # the driver (``_step``) delivers the events the action returns
        """Queue ``action`` at sim time ``at``; it may return events to deliver."""

        def run() -> list[dict[str, Any]]:
            return action() or []

        with self._lock:
            self._actions.push(at, run, label)

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
        self, name: str, gpus: int = 8, kind: str = "ec2", health: str = "healthy",
        instance_id: str | None = None,
    ) -> Node:
        """Launch (EC2 p5.48xlarge: 8 x H100, as the simulated fabric) or register (ECS Anywhere
        ``mi-``) a GPU node (``instance_id``: on an EC2 instance launched already, e.g. by an Auto
        Scaling group)."""
        if kind not in ("ec2", "anywhere"):
            raise ValueError("kind is 'ec2' or 'anywhere'")
        if health not in HEALTH_VALUES:
            raise ValueError(f"health is one of {HEALTH_VALUES}")
        ec2, ecs = self.local.client("ec2"), self.local.client("ecs")
        tags = [
            {"Key": "Name", "Value": name},
            {"Key": self.node_tag_key, "Value": self.local.cluster_name},
        ]
        if instance_id is not None:
            ec2.create_tags(Resources=[instance_id], Tags=tags)
            inst = {"InstanceId": instance_id}
        else:
            inst = ec2.run_instances(
                ImageId="ami-12c6146b",
                MinCount=1,
                MaxCount=1,
                InstanceType="p5.48xlarge",
                TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            )["Instances"][0]
        gpu_ids = [f"GPU-{secrets.token_hex(4)}-{i:04d}-{secrets.token_hex(2)}" for i in range(gpus)]
        ci = ecs.register_container_instance(
            cluster=self.local.cluster_name,
            instanceIdentityDocument=json.dumps({"instanceId": inst["InstanceId"]}),
            totalResources=[{"name": "GPU", "type": "STRINGSET", "stringSetValue": gpu_ids}],
        )["containerInstance"]
        # moto keeps no GPU of the registration: its record gets them, so every reader sees the
        # node's GPUs (the in-process hooks answer free GPUs too; the playground's HTTP endpoint
        # serves moto's record as it is, to gpu-recovery-admin doctor).
        ci_id = ci["containerInstanceArn"].rsplit("/", 1)[-1]
        record = self._backend.container_instances[self.local.cluster_name][ci_id]
        record.registered_resources = [r for r in record.registered_resources if r.get("name") != "GPU"] + [
            {"doubleValue": 0.0, "integerValue": 0, "longValue": 0, "name": "GPU", "type": "STRINGSET",
             "stringSetValue": list(gpu_ids)}]
        instance_id = inst["InstanceId"]
        if kind == "anywhere":
            # moto needs an EC2 instance to register; ECS Anywhere hosts are "mi-" ids.
            instance_id = "mi-" + secrets.token_hex(9)[:17]
            self._backend.container_instances[self.local.cluster_name][
                ci["containerInstanceArn"].rsplit("/", 1)[-1]
            ].ec2_instance_id = instance_id
            ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
            # Its managed instance carries the node's tags, as the EC2 hosts do (the stack
            # sends the reboot document only to managed instances tagged with the cluster tag).
            # moto's AddTagsToResource refuses a ManagedInstance (it models none): its tag store.
            from moto.ssm.models import ssm_backends

            ssm_backends[self.local.account_id][self.local.region]._resource_tags["ManagedInstance"][
                instance_id].update({t["Key"]: t["Value"] for t in tags})
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

    def container_instance_status(self, name: str) -> str:
        """ECS's status of node ``name`` (ACTIVE, DRAINING...; INACTIVE once deregistered)."""
        return self._ci_status(self.node(name))

    def ci_description(self, node: Node) -> dict[str, Any]:
        """The ContainerInstance object as ECS would describe it now."""
        moto_ci = self._moto_ci(node)
        return describe_container_instance(
            node,
            self.local.cluster_arn,
            self.now(),
            status=self._ci_status(node),
            attributes=[{"name": k, **({"value": v} if v else {})}
                        for k, v in ((moto_ci.attributes if moto_ci else {}) or {}).items()],
            registered=[dict(r) for r in (moto_ci.registered_resources if moto_ci else [])],
            remaining=[dict(r) for r in (moto_ci.remaining_resources if moto_ci else [])],
            version_info=moto_ci.version_info if moto_ci else None,
        )

    def _instance_state_change(self, node: Node) -> dict[str, Any]:
        return ev.container_instance_state_change(self.ci_description(node), time=self.now())

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

    def update_agent(self, node: str, at: float | None = None, after: float | None = None,
                     outage_seconds: float = 10, version: str | None = None) -> None:
        """An ECS agent update (UpdateContainerAgent, or ecs-init's): the agent goes away
        while it restarts and comes back with another ``versionInfo.agentVersion``, the host
        never rebooting; ``agentUpdateStatus`` UPDATING, then UPDATED."""
        n = self.node(node)
        t = self._when(at, after)
        new_version = version or _next_agent_version(n.agent_version)

        def down() -> list[dict[str, Any]]:
            n.agent_connected, n.agent_update_status = False, "UPDATING"
            self._log("agent", f"agent updating ({n.agent_version} -> {new_version})", n.name)
            return [self._ci_event(n)]

        def up() -> list[dict[str, Any]]:
            n.agent_connected, n.agent_update_status, n.agent_version = True, "UPDATED", new_version
            self._log("agent", f"agent updated to {new_version}, reconnected (no reboot)", n.name)
            return [self._ci_event(n)]

        self.schedule(t, down, f"agent-update-down {node}")
        self.schedule(t + outage_seconds, up, f"agent-update-up {node}")

    def running_tasks(self, node: str | None = None) -> list[Task]:
        with self._lock:
            return [
                t
                for t in self.tasks.values()
                if not t.done and (node is None or t.node == self.node(node).name)
            ]

    # ================================================================ driver
    def pending_actions(self) -> int:
        with self._lock:
            return len(self._actions)

    def _next_time(self) -> float | None:
        with self._lock:
            q = self._actions.next_time()
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
            action = self._actions.pop()[1] if self._actions.due_by(t) else None
        if action is not None:
            events = action()
            for event in events:
                late = id(event) in self._held_back
                self._held_back.discard(id(event))
                delay = self.delivery_delay(event) if self.delivery_delay is not None and not late else 0.0
                if delay > 0:  # delivered late, as it was made (its time unchanged)
                    self._held_back.add(id(event))
                    self.schedule(t + delay, partial(_deliver, event), "delayed delivery")
                    continue
                self.counters["events_emitted"] += 1
                self.bus.put_events(event)
            for listener in list(self.step_listeners):
                listener(events)
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


def _next_agent_version(version: str) -> str:
    """``1.89.3`` -> ``1.89.4``."""
    head, _, last = version.rpartition(".")
    return f"{head}.{int(last) + 1}" if last.isdigit() else f"{version}.1"


def _deliver(event: dict[str, Any]) -> list[dict[str, Any]]:
    """A held-back event's action: the event, delivered now."""
    return [event]
