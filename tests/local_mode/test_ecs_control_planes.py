"""The two ECS control planes on the one data plane behave alike: the moto world's
(``SimulatedEcs``, moto answering the API) and the scale world's (``EcsCluster``). Each
behaviour runs on both backends and must come out the same, and as ECS documents it:

* StopTask: the desiredStatus=STOPPED event at the request, STOPPED (exit 143, UserInitiated)
  ``stop_delay`` later;
* a task stopped while PENDING: no PENDING or RUNNING event after the stop, STOPPED without
  an exit code;
* a GPU fault: which tasks die (not the health checks; PENDING, stopping or running), the NCCL
  cascade to the job's other ranks (not a rank already asked to stop: its stop ends it);
* StartTask's ``failures[].reason``: AGENT, RESOURCE:GPU, MISSING.
"""

from __future__ import annotations

import logging
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.adapters import aws
from local_mode.sim.ecs_model import Node, Task
from local_mode.world import build_world

BACKENDS = ("moto", "scale")


class Harness:
    """One world of ``backend`` with nothing reacting to its events: the same few verbs on
    either control plane, and each task state-change event recorded as it is made."""

    def __init__(self, backend: str, world: Any) -> None:
        self.backend = backend
        self.world = world
        self.events: list[tuple[float, str, str, str, str | None, int | None]] = []
        self.names: dict[str, str] = {}  # task arn -> the test's name for it
        if backend == "moto":
            self.plane: Any = world.ecs
            self.td = world.ecs.register_training_task_definition("train", gpus=4)
        else:
            self.plane = world.cluster
            self.td = world.cluster.register_task_definition("train", gpus=4)
            world.bus.rules.clear()  # no recovery stack reacting: the data plane alone
        made = self.plane._task_state_change

        def record(task: Task) -> dict[str, Any]:
            exit_code = task.containers[0].get("exitCode") if task.done else None
            self.events.append((self.now(), self.names.get(task.arn, "?"), task.last_status,
                                task.desired_status, task.stop_code, exit_code))
            return made(task)

        self.plane._task_state_change = record

    def now(self) -> float:
        return float(self.world.ecs.now() if self.backend == "moto" else self.world.sim.now)

    def run_for(self, seconds: float) -> None:
        if self.backend == "moto":
            self.world.ecs.run_for(seconds)
        else:
            self.world.sim.run(until=self.world.sim.now + seconds)

    def add_node(self, name: str) -> Node:
        node: Node = self.plane.add_node(name)
        return node

    def start_task(self, refs: list[str], *, name: str = "", job: str | None = None,
                   group: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"taskDefinition": self.td, "containerInstances": refs, "startedBy": "test"}
        if job is not None:
            params["tags"] = [{"key": C.TAG_JOB_ID, "value": job}]
        if group is not None:
            params["group"] = group
        if self.backend == "moto":
            params["cluster"] = self.world.aws.cluster_name
            answer: dict[str, Any] = aws.client("ecs").start_task(**params)
        else:
            params["cluster"] = self.plane.name
            answer = self.plane.start_task(params)
        for task in answer["tasks"]:
            self.names[task["taskArn"]] = name
        return answer

    def start(self, node: Node, name: str, **options: Any) -> str:
        answer = self.start_task([node.container_instance_arn], name=name, **options)
        assert answer["failures"] == [], answer
        return str(answer["tasks"][0]["taskArn"])

    def stop(self, arn: str, reason: str = "by the test") -> None:
        if self.backend == "moto":
            aws.client("ecs").stop_task(cluster=self.world.aws.cluster_name, task=arn, reason=reason)
        else:
            self.plane.stop_task({"cluster": self.plane.name, "task": arn, "reason": reason})

    def gpu_fault(self, node: Node) -> None:
        if self.backend == "moto":
            self.plane.inject_gpu_fault(node.name, after=0, nccl_cascade=True, cascade_delay_seconds=5)
        else:
            self.plane.fail_gpu(node, nccl_cascade=True, cascade_delay=5.0)

    def outcome(self, arn: str) -> tuple[str, str, str | None, int | None]:
        task = self.plane.tasks[arn]
        exit_code = task.containers[0].get("exitCode") if task.done else None
        return task.last_status, task.desired_status, task.stop_code, exit_code

    def since(self, t0: float) -> list[tuple[float, str, str, str, str | None, int | None]]:
        """The events from ``t0`` on, their times relative to it, in time order (by name)."""
        return sorted((round(t - t0, 3), *rest) for t, *rest in self.events if t >= t0)


def _both(run: Any) -> list[Any]:
    """``run(harness)`` on each backend; the results, moto's first."""
    out = []
    for backend in BACKENDS:
        logging.disable(logging.CRITICAL)
        try:
            if backend == "moto":
                with build_world(handlers=False) as world:
                    out.append(run(Harness("moto", world)))
            else:
                with build_world(backend="scale", seed=7, sweep_every_seconds=None) as world:
                    out.append(run(Harness("scale", world)))
        finally:
            logging.disable(logging.NOTSET)
    return out


def test_stop_task_emits_the_stopping_event_at_the_request_and_stopped_later() -> None:
    """Given a RUNNING task on either backend
    When StopTask is called
    Then its desiredStatus=STOPPED event comes at the request, STOPPED (exit 143, stopCode
    UserInitiated) ten seconds later, nothing else; both backends alike."""

    def run(h: Harness) -> list[Any]:
        node = h.add_node("n0")
        arn = h.start(node, "t")
        h.run_for(30)
        t0 = h.now()
        h.stop(arn)
        h.run_for(60)
        return h.since(t0)

    moto, scale = _both(run)
    assert moto == scale == [
        (0.0, "t", "RUNNING", "STOPPED", "UserInitiated", None),
        (10.0, "t", "STOPPED", "STOPPED", "UserInitiated", 143),
    ]


def test_a_task_stopped_while_pending_has_no_pending_or_running_event_after_the_stop() -> None:
    """Given a task just placed (PENDING, its first event not out yet) on either backend
    When StopTask is called at once
    Then the stop's event (lastStatus PENDING) is the only one before STOPPED: no PENDING or
    RUNNING event follows; STOPPED has no exit code (it never ran); both backends alike."""

    def run(h: Harness) -> list[Any]:
        node = h.add_node("n0")
        t0 = h.now()
        arn = h.start(node, "t")
        h.stop(arn)
        h.run_for(60)
        return h.since(t0)

    moto, scale = _both(run)
    assert moto == scale == [
        (0.0, "t", "PENDING", "STOPPED", "UserInitiated", None),
        (10.0, "t", "STOPPED", "STOPPED", "UserInitiated", None),
    ]


def test_a_gpu_fault_kills_the_same_tasks_and_cascades_alike() -> None:
    """Given job j's ranks on n0, n1, n2 and n3 (r3 asked to stop just before the fault), a
    health check on n0 and a task of no job on n1, on either backend
    When a GPU of n0 fails with the NCCL cascade
    Then r0 exits 1 at once, r1 and r2 exit 1 five seconds later (NCCL error), r3 ends by its
    stop (143), the health check and the other task keep running; both backends alike."""

    def run(h: Harness) -> tuple[dict[str, Any], list[Any]]:
        nodes = [h.add_node(f"n{i}") for i in range(4)]
        arns = {f"r{i}": h.start(node, f"r{i}", job="j") for i, node in enumerate(nodes)}
        arns["hc"] = h.start(nodes[0], "hc", group=C.HEALTH_CHECK_GROUP)
        arns["other"] = h.start(nodes[1], "other")
        h.run_for(30)
        h.stop(arns["r3"])
        h.run_for(1)
        t0 = h.now()
        h.gpu_fault(nodes[0])
        h.run_for(60)
        return {name: h.outcome(arn) for name, arn in arns.items()}, h.since(t0)

    (moto_outcomes, moto_events), (scale_outcomes, scale_events) = _both(run)
    assert moto_outcomes == scale_outcomes == {
        "r0": ("STOPPED", "STOPPED", "EssentialContainerExited", 1),
        "r1": ("STOPPED", "STOPPED", "EssentialContainerExited", 1),
        "r2": ("STOPPED", "STOPPED", "EssentialContainerExited", 1),
        "r3": ("STOPPED", "STOPPED", "UserInitiated", 143),
        "hc": ("RUNNING", "RUNNING", None, None),
        "other": ("RUNNING", "RUNNING", None, None),
    }
    assert moto_events == scale_events
    assert [(t, name, code) for t, name, last, _, _, code in moto_events if last == "STOPPED"] == [
        (0.0, "r0", 1), (5.0, "r1", 1), (5.0, "r2", 1), (9.0, "r3", 143)]


def test_start_task_failure_reasons_are_ecs_s_on_both_backends() -> None:
    """Given a node whose agent is disconnected, a node whose GPUs are taken and a container
    instance the cluster does not know, on either backend
    When one StartTask names all three and a free node
    Then the free node gets the task and the failures say AGENT, RESOURCE:GPU and MISSING (the
    ECS "API failure reasons"), with HTTP 200; both backends alike."""

    def run(h: Harness) -> tuple[int, list[tuple[str, str]]]:
        down, full, free = h.add_node("down"), h.add_node("full"), h.add_node("free")
        h.start(full, "a")
        h.start(full, "b")
        h.run_for(10)
        down.agent_connected = False
        unknown = full.container_instance_arn.rsplit("/", 1)[0] + "/00000000000000000000000000000000"
        answer = h.start_task([down.container_instance_arn, full.container_instance_arn, unknown,
                               free.container_instance_arn], name="c")
        by_arn = {down.container_instance_arn: "down", full.container_instance_arn: "full",
                  unknown: "unknown"}
        return len(answer["tasks"]), sorted((by_arn[f["arn"]], f["reason"]) for f in answer["failures"])

    moto, scale = _both(run)
    assert moto == scale == (1, [("down", "AGENT"), ("full", "RESOURCE:GPU"), ("unknown", "MISSING")])
