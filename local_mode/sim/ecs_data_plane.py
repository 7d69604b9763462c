"""The ECS data plane both worlds run: a placed task goes PENDING (+``pending_delay_seconds``)
and RUNNING (+``run_delay_seconds``), then ends by its plan (a health check with the node's
DCGM verdict after ``dcgm_seconds``, a GPU reset with its result after ``reset_seconds``, a
training task after ``train_seconds``, None: never) or when made to (an injected exit, a
stop: STOPPED ``stop_delay_seconds`` after the request); a reboot kills the node's tasks
(+``kill_delay_seconds``), disconnects its agent (+``disconnect_delay_seconds``) and brings
it back (+``reboot_seconds``). Each change emits the AWS-shaped event.

:class:`DataPlane` holds that sequence once. A world supplies the rest through a few hooks:
its clock and driver (``now``, ``schedule``), the events as its control plane describes
the task and the container instance (``_task_state_change``, ``_instance_state_change``),
keeping its control plane in step (``_control_plane_running``, ``_control_plane_stopped``),
where the verdict line goes (``_write_verdict_log``), how a reboot is counted
(``_count_reboot``) and how an event of the current instant goes out (``_emit_now``). The
behaviours both control planes share are here once: StopTask (``_request_stop``), no PENDING
event after a stop, a GPU fault's victims and its NCCL cascade (``_gpu_fault``); StartTask's
failure reasons are ``ecs_model.placement_failure``. The moto world is
:class:`~local_mode.sim.ecs.SimulatedEcs` (its driver delivers the events an action returns
to the ``EventBus``, after the action); the scale world is
:class:`~local_mode.sim.ecs_cluster.EcsCluster` (its hooks put each event on its
``EventBus`` as it is made, in the order its random draws were always made). The
records and their transitions are :mod:`~local_mode.sim.ecs_model`'s.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any

from ..health_verdicts import RESET_FIXES
from .ecs_model import Node, Plan, Task, TimelineEntry, gang_of, health_check_verdict, rendezvous_of
from .fabric import Fabric
from .repair_ledger import RepairLedger

Events = list[dict[str, Any]]
# A level-1 DCGM diag (deployment checks: NVIDIA says seconds): a validation's first part.
LEVEL_1_SECONDS = 15.0


class DataPlane(ABC):
    """Tasks from placement to STOPPED and reboots, in one world's simulated time (see the
    module docstring)."""

    def __init__(
        self,
        *,
        train_seconds: float | None,
        dcgm_seconds: float,
        reboot_seconds: float,
        reset_seconds: float = 30,
        stop_delay_seconds: float = 10,
        run_delay_seconds: float = 5,
        pending_delay_seconds: float = 1,
        kill_delay_seconds: float = 5,
        disconnect_delay_seconds: float = 15,
        instance_events_on_placement: bool = True,
    ) -> None:
        self.train_seconds = train_seconds
        self.dcgm_seconds = dcgm_seconds
        self.reboot_seconds = reboot_seconds
        self.reset_seconds = reset_seconds  # nvidia-smi -r and a short dcgmi diag
        self.stop_delay_seconds = stop_delay_seconds
        self.run_delay_seconds = run_delay_seconds
        self.pending_delay_seconds = pending_delay_seconds
        self.kill_delay_seconds = kill_delay_seconds
        self.disconnect_delay_seconds = disconnect_delay_seconds
        #: a container-instance event when a task is placed and when one stops (its GPUs)
        self.instance_events_on_placement = instance_events_on_placement
        self.nodes: dict[str, Node] = {}  # by name
        self.fabric = Fabric()  # NVLink and network paths: what a preflight's all-reduce measures
        #: every repair and hold carried out, with the node's true health then (issue 49)
        self.repairs = RepairLedger(now=lambda: self.now(), fabric=lambda: self.fabric,
                                    check_seconds=dcgm_seconds)
        self.tasks: dict[str, Task] = {}  # by ARN
        self.timeline: list[TimelineEntry] = []
        self._family_plans: dict[str, Plan] = {}
        self._task_plans: dict[str, Plan] = {}
        self._lock = threading.RLock()

    # ================================================================ the world's hooks
    @abstractmethod
    def now(self) -> float:
        ...

    @abstractmethod
    def schedule(self, at: float, action: Callable[[], Events | None], label: str = "") -> None:
        """Run ``action`` at ``at``; the events it returns are emitted then."""
        ...

    @abstractmethod
    def _task_state_change(self, task: Task) -> dict[str, Any]:
        """The task state-change event of ``task`` as it is now (a world whose bus takes
        events as they happen puts it there too)."""
        ...

    @abstractmethod
    def _instance_state_change(self, node: Node) -> dict[str, Any]:
        """The container-instance state-change event of ``node`` as it is now."""
        ...

    def _control_plane_running(self, task: Task) -> None:  # noqa: B027 - optional hook, no-op by default
        """``task`` went RUNNING: keep the control plane's record in step."""

    def _control_plane_stopped(self, task: Task) -> None:  # noqa: B027 - optional hook, no-op by default
        """``task`` went STOPPED: keep the control plane's record in step."""

    @abstractmethod
    def _write_verdict_log(self, stream: str, line: str) -> None:
        ...

    @abstractmethod
    def _dcgm_level(self) -> int:
        ...

    def _count_reboot(self, node: Node, via: str) -> None:  # noqa: B027 - optional hook, no-op by default
        """A reboot of ``node`` was asked for through ``via``."""

    def _emit_now(self, action: Callable[[], Events], label: str) -> None:
        """Emit what ``action`` makes at the current time. By default it is queued at now (a
        driver that delivers synchronously must not deliver inside the API call that caused
        it); a world whose bus times each delivery itself runs it at once."""
        self.schedule(self.now(), action, label)

    # ================================================================ timeline
    def _log(self, kind: str, text: str, node: str | None = None) -> None:
        with self._lock:
            self.timeline.append(TimelineEntry(self.now(), kind, f"{node or '-':<8}  {text}"))

    # ================================================================ events
    def _task_event(self, task: Task) -> dict[str, Any]:
        with self._lock:
            task.version += 1
            task.updated_at = self.now()
            return self._task_state_change(task)

    def _ci_event(self, node: Node) -> dict[str, Any]:
        with self._lock:
            node.version += 1
            return self._instance_state_change(node)

    def _ci_events(self, node: Node) -> list[dict[str, Any]]:
        """A scheduled action's answer: the instance's state-change event."""
        return [self._ci_event(node)]

    # ================================================================ plans
    def plan_family(self, family: str, run_seconds: float | None, exit_code: int = 0, *,
                    gang: bool = False) -> None:
        """Tasks of ``family`` started from now on run ``run_seconds`` (None: until
        stopped) after RUNNING, then exit ``exit_code``; ``gang``: after their gang's
        rendezvous instead, every rank of the attempt RUNNING (``Plan``)."""
        with self._lock:
            self._family_plans[family] = Plan(run_seconds, exit_code, gang)

    def plan_task(self, task_arn: str, run_seconds: float | None, exit_code: int = 0) -> None:
        """Re-plan one task: exit ``exit_code`` ``run_seconds`` from now (None: never)."""
        with self._lock:
            task = self.tasks.get(task_arn)
            if task is None:
                self._task_plans[task_arn] = Plan(run_seconds, exit_code)
                return
            task.plan_token += 1
            task.held_plan = None
            token = task.plan_token
        self._schedule_exit(task, Plan(run_seconds, exit_code), token, f"planned exit {task_arn}")

    # ================================================================ task lifecycle
    def _schedule_placement(self, task: Task, now: float) -> None:
        """A task was placed at ``now``: its PENDING and RUNNING (and the node's resources event)."""
        self.schedule(now + self.pending_delay_seconds, lambda: self._to_pending(task), "pending")
        self.schedule(now + self.run_delay_seconds, lambda: self._to_running(task), "run")
        if self.instance_events_on_placement:
            node = self.nodes[task.node]
            self.schedule(now + self.pending_delay_seconds, lambda: [self._ci_event(node)],
                          "ci placement")

    def _to_pending(self, task: Task) -> Events:
        # ECS sends a task event when lastStatus or desiredStatus changes: once a stop was
        # asked for, its event reported lastStatus PENDING already, so none follows here
        # (docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs_task_events.html).
        if task.done or task.last_status != "PENDING" or task.desired_status != "RUNNING":
            return []
        return [self._task_event(task)]

    def _to_running(self, task: Task) -> Events:
        with self._lock:
            if task.done or task.desired_status != "RUNNING":
                return []
            task.mark_running(self.now())
            self._control_plane_running(task)
            plan = self._task_plans.pop(task.arn, None) or self._family_plans.get(task.family)
            if task.gpu_reset:
                plan = plan or Plan(self.reset_seconds, -2)  # -2: the reset's result on this node
            elif task.health_check:
                plan = plan or Plan(self._check_seconds(task), -1)  # -1: node verdict
            else:
                plan = plan or Plan(self.train_seconds, 0)
            token = task.plan_token
            node = self.nodes[task.node]
            if not task.health_check and node.latent is not None:
                # A repair that did not hold: the fault comes back minutes into the work.
                self.schedule(self.now() + node.latent_after_seconds, partial(self._latent_fault, node),
                              "latent fault")
        self._log("task", f"{task.label} RUNNING", task.node)
        for ready, its_plan, its_token in self._after_rendezvous(task, plan, token):
            self._schedule_exit(ready, its_plan, its_token)
        return [self._task_event(task)]

    def _after_rendezvous(self, task: Task, plan: Plan, token: int) -> list[tuple[Task, Plan, int]]:
        """The ranks whose planned runs start now: ``task`` alone, or, for a gang's plan, none
        until its attempt's last rank is RUNNING, then every rank held for it."""
        gang = rendezvous_of(task) if plan.gang and plan.run_seconds is not None else None
        if gang is None:
            return [(task, plan, token)]
        with self._lock:
            task.held_plan = plan
            ranks = [t for t in self.tasks.values()
                     if not t.done and t.last_status == "RUNNING" and rendezvous_of(t) == gang]
            if len(ranks) < gang[2]:
                return []
            held = [(t, p, t.plan_token) for t in ranks if (p := t.held_plan) is not None]
            for t in ranks:
                t.held_plan = None
        return held

    def _schedule_exit(self, task: Task, plan: Plan, token: int, label: str = "planned exit") -> None:
        if plan.run_seconds is not None:
            self.schedule(self.now() + plan.run_seconds,
                          lambda: self._planned_exit(task.arn, token, plan.exit_code), label)

    def _planned_exit(self, arn: str, token: int, exit_code: int) -> Events:
        task = self.tasks.get(arn)
        if task is None or task.done or task.plan_token != token:
            return []
        if task.gpu_reset and exit_code == -2:
            return self._reset_result(task)
        if task.health_check and exit_code == -1:
            node = self.nodes[task.node]
            verdict, stream, line = health_check_verdict(task, node, self._dcgm_level())
            self._write_verdict_log(stream, line)
            return self._container_exit(task, verdict, f"DCGM verdict {node.health}")
        return self._container_exit(task, exit_code, "finished" if exit_code == 0 else "planned")

    def _check_seconds(self, task: Task) -> float:
        """How long a health check runs: the world's ``dcgm_seconds`` (a level-2 diag); a
        validation, its level's diag (level 1 a few seconds) plus its GPU load."""
        if not task.validation:
            return self.dcgm_seconds
        level = task.environment().get("DCGM_LEVEL", "2")
        diag = {"1": LEVEL_1_SECONDS, "3": 900.0, "4": 1800.0}.get(level, self.dcgm_seconds)
        return diag + task.load_seconds

    def _latent_fault(self, node: Node) -> Events:
        """A latent fault comes back under a training task's load: as a GPU fault (its ranks
        exit 1, NCCL takes their peers down)."""
        with self._lock:
            health = node.latent
            busy = [t for t in self._tasks_on(node) if not t.health_check]
        if health is None or not busy:
            return []
        self._log("fault", f"GPU fails again under load (its repair did not hold; health: {health})",
                  node.name)
        with self._lock:
            node.latent = None
        return self._gpu_fault(node, health=health, exit_code=1, nccl_cascade=True,
                               why="GPU fault under load (repair did not hold)")[1]

    def _reset_result(self, task: Task) -> Events:
        """The reset task's exit: 0 when a reset clears the node's health (it is healthy
        after), 1 when not (the fault stays for the reboot)."""
        node = self.nodes[task.node]
        with self._lock:
            before = node.health
            if before in RESET_FIXES:
                node.health = "healthy"
                node.gpu_state = {}  # the reset applied the remap, cleared what the driver asked
                node.repaired(before)
        self._log("task", f"GPU reset: health {before} -> {node.health}", node.name)
        if before in RESET_FIXES:
            return self._container_exit(task, 0, "GPUs reset, diag passed")
        return self._container_exit(task, 1, f"GPU reset failed ({before})")

    def _container_exit(self, task: Task, exit_code: int, why: str) -> Events:
        """The essential container exited: STOPPED (EssentialContainerExited)."""
        if task.done:
            return []
        return self._finish(task, exit_code=exit_code, stop_code="EssentialContainerExited",
                            reason="Essential container in task exited", why=why)

    # ================================================================ StopTask
    def _request_stop(self, task: Task, reason: str) -> bool:
        """StopTask on ``task``: desiredStatus STOPPED and its event at once, STOPPED
        ``stop_delay_seconds`` later (ECS sends the stop to the containers, docker stop's
        SIGTERM, and the task is STOPPED when they have exited: StopTask in the ECS API
        reference). A task still PENDING never runs and has no exit code. False (nothing
        changed) when it is stopped or stopping already."""
        with self._lock:
            if not task.request_stop(self.now(), reason):
                return False
        self._emit_now(lambda: [] if task.done else [self._task_event(task)], "stopping")
        self._schedule_stopped(task, reason, self.now())
        return True

    def _schedule_stopped(self, task: Task, reason: str, now: float) -> None:
        """A stop was requested at ``now``: STOPPED (exit 143 if it ran) ``stop_delay_seconds``
        later."""

        def stopped() -> Events:
            return self._finish(task, exit_code=143 if task.last_status == "RUNNING" else None,
                                stop_code="UserInitiated", reason=reason, why="stopped")

        self.schedule(now + self.stop_delay_seconds, stopped, "stopped")

    def _finish(self, task: Task, *, exit_code: int | None, stop_code: str, reason: str,
                why: str) -> Events:
        with self._lock:
            if task.done:
                return []
            task.mark_stopped(self.now(), exit_code, stop_code, reason)
            node = self.nodes[task.node]
            node.allocations.pop(task.arn, None)
            self._control_plane_stopped(task)
        code = "" if task.exit_code is None else f" exited {task.exit_code}"
        self._log("task", f"{task.label}{code or ' stopped'} ({why})", task.node)
        out = [self._task_event(task)]
        if self.instance_events_on_placement:
            out.append(self._ci_event(node))
        return out

    def _tasks_on(self, node: Node) -> list[Task]:
        """The tasks placed on ``node`` and not STOPPED, in the order they were placed."""
        with self._lock:
            return [self.tasks[arn] for arn in list(node.allocations)]

    # ================================================================ GPU faults
    def _gpu_fault(self, node: Node, *, health: str | None, exit_code: int, why: str,
                   nccl_cascade: bool = False,
                   cascade_delay: float | Callable[[], float] = 5.0) -> tuple[list[Task], Events]:
        """A GPU of ``node`` fails now: its health becomes ``health`` (None: unchanged; what
        the next DCGM check finds) and every task on it but the health checks and GPU resets
        (PENDING or RUNNING, stopping or not: the fault is under all of them) exits
        ``exit_code``. With ``nccl_cascade`` each other rank of their jobs
        (:func:`~local_mode.sim.ecs_model.gang_of`), on other nodes and not stopped at the
        fault, exits 1 ``cascade_delay`` seconds later (a callable: drawn per rank) with an
        NCCL error, unless it was stopped or asked to stop by then (its stop ends it).
        Returns the tasks on the node it killed and their events."""
        with self._lock:
            if health is not None:
                node.health = health
            victims = [t for t in self._tasks_on(node) if not t.health_check]
        out: Events = []
        for task in victims:
            out += self._container_exit(task, exit_code, why)
        if nccl_cascade:
            self._schedule_cascade(victims, node, cascade_delay)
        return victims, out

    def _schedule_cascade(self, victims: list[Task], origin: Node,
                          delay: float | Callable[[], float]) -> None:
        gangs = {g for g in map(gang_of, victims) if g is not None}
        if not gangs:
            return
        with self._lock:
            peers = [t for t in self.tasks.values()
                     if not t.done and t.node != origin.name and gang_of(t) in gangs]
        by_delay: dict[float, list[Task]] = {}  # ranks erroring at one time: one action
        for task in peers:
            by_delay.setdefault(delay() if callable(delay) else delay, []).append(task)
        now = self.now()
        for after, ranks in by_delay.items():
            self.schedule(now + max(0.0, after), partial(self._nccl_error, ranks), "nccl cascade")

    def _nccl_error(self, ranks: list[Task]) -> Events:
        out: Events = []
        for task in ranks:
            if not task.done and task.desired_status == "RUNNING":
                out += self._container_exit(task, 1, "NCCL error")
        return out

    # ================================================================ reboot
    def _reboot(self, node: Node, via: str) -> None:
        requested = self.now()
        with self._lock:
            self._count_reboot(node, via)
            if not node.request_reboot(requested):
                self._log("reboot", f"reboot requested again via {via} (already rebooting)",
                          node.name)
                return
            self.repairs.record(node, "reboot", via)
        self._log("reboot", f"reboot requested via {via}", node.name)

        def kill() -> Events:
            out: Events = []
            for task in self._tasks_on(node):
                out += self._finish(task, exit_code=137, stop_code="EssentialContainerExited",
                                    reason=node.reboot_stop_reason, why="host rebooted")
            return out

        def down() -> Events:
            node.agent_connected = False
            self._log("agent", "agent disconnected (rebooting)", node.name)
            return [self._ci_event(node)]

        def up() -> Events:
            with self._lock:
                before = node.back_from_reboot(self.now())
                healed = self.fabric.rebooted(node.name)
            self._log("agent", f"back after reboot, agent connected (health {before} -> "
                      f"{node.health})" + (f"; {len(healed)} fabric fault(s) healed" if healed else ""),
                      node.name)
            return [self._ci_event(node)]

        self.schedule(requested + self.kill_delay_seconds, kill, "reboot kill")
        self.schedule(requested + self.disconnect_delay_seconds, down, "reboot down")
        self.schedule(requested + self.reboot_seconds, up, "reboot up")
