"""Steps the remediation and cordon stage tests share (over the recovery fakes' World)."""

from __future__ import annotations

import json
import uuid

from gpu_recovery import constants as C
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.repository import Update
from tests.recovery.fakes import ACCOUNT, CLUSTER, CLUSTER_ARN, EVENTS, REGION, FakeTask, World, ci_arn

FAULTY = "node-b"
# Someone else's task definition (not the stack's health-check, validation or reset one).
FOREIGN_DEFINITION = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/not-the-stacks:1"


def impostor(w: World, task: FakeTask) -> FakeTask:
    """A task someone with ecs:StartTask started on ``task``'s node with its group and its
    startedBy (ListTasks shows it) but a task definition of their own."""
    arn = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{CLUSTER}/{uuid.uuid4().hex}"
    foreign = FakeTask(arn, task.node, task.started_by, task.group, task_definition=FOREIGN_DEFINITION)
    w.ecs.tasks[arn] = foreign
    return foreign


def fault_with_reboot_verdict(w: World, arns: list[str]) -> None:
    """Rank 1 exits 1 (suspect); its DCGM check says reboot (the fake verdict line)."""
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(FAULTY)
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1))


def report_xid(w: World, node: str, xid: int) -> None:
    """What the heartbeat service keeps when the node agent reports an XID."""
    w.repo.tables.db.apply(Update(table="instances", key={C.INSTANCE_PK: node},
                                  set_fields={"gpu_events": [{"t": w.now[0], "g": "GPU-0", "x": xid}]}))


def trip_with_backlog(w: World, backlog: list[str], window: tuple[str, ...] = ()) -> None:
    """The breaker tripped, ``backlog`` held back (oldest first), whatever it stored before."""
    stored = w.repo.breaker.read()
    version = int(stored["version"]) if stored else None
    state = breaker.new_state()
    state.update(state="tripped", version=(version or 0) + 1, tripped_at=w.now[0], trip_reason="test",
                 cluster_gpu_nodes=(stored or {}).get("cluster_gpu_nodes", 10),
                 trips=1, window=[{"node": n, "action": "reboot", "at": w.now[0]} for n in window],
                 backlog=[{"node": n, "action": "reboot", "at": w.now[0] + i, "job_id": "", "reason": "held"}
                          for i, n in enumerate(backlog)])
    assert w.repo.breaker.save(state, version)


def rebooting(w: World, job: str, nodes: list[str]) -> None:
    """``job`` on ``nodes``; the rank on nodes[1] exits 1, its diag says reboot: REBOOTING."""
    arns = w.register_job(job, nodes)
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(nodes[1])
    w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
    assert w.repo.instances.get_instance(nodes[1]).state is C.InstanceState.REBOOTING


def resets_on(w: World, node: str) -> list[FakeTask]:
    return [t for t in w.ecs.tasks.values() if t.node == node and t.group == C.GPU_RESET_GROUP]


def reset_stopped(task: FakeTask, exit_code: int | None) -> EcsTaskDetail:
    """The reset task's STOPPED event (the health-check fixture's shape, its own group)."""
    task.last_status, task.exit_code = "STOPPED", exit_code
    detail = json.loads((EVENTS / "health_check_task_stopped.json").read_text())["detail"]
    detail.update(taskArn=task.arn, clusterArn=CLUSTER_ARN, containerInstanceArn=ci_arn(task.node),
                  startedBy=task.started_by, group=task.group, taskDefinitionArn=task.task_definition_arn)
    detail["containers"][0]["exitCode"] = exit_code
    return EcsTaskDetail.model_validate(detail)


def sweeps(w: World, times: int, every: float = 60) -> None:
    for _ in range(times):
        w.advance(every)
        w.service.sweep()
