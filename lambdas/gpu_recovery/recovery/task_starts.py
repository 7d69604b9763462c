"""Starting a task exactly once: the one way every start of the stack's takes (a rank of a
queue launch, a call of identical ranks of a gang restart, a node task), :func:`start_once`.

Every start carries a ``startedBy`` deterministic per start (``domain.started_by``). A start
that may repeat one already made (its answer was lost, its claim or lease was taken over, its
launch is resumed) looks that startedBy up first (:func:`started_already`) and starts only on
the nodes that have no task of it (:func:`start_on`). ECS lists tasks by startedBy with no
other filter, so the tasks of a start on several nodes are described to tell which node each
is on; the one task of a start on one node is on that node.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpu_recovery.adapters.ecs import EcsActionFailed, StartResult
from gpu_recovery.adapters.errors import not_sent, refused
from gpu_recovery.domain.models import container_instance_id, task_time


class StartsTasks(Protocol):
    """The ECS calls of a start (``adapters.ecs.EcsAdapter``)."""

    def start_task(self, *, task_definition: str, container_instance_arn: str = "",
                   overrides: dict[str, Any] | None = None,
                   tags: list[dict[str, str]] | None = None, started_by: str = "",
                   group: str | None = None, container_instance_arns: Sequence[str] = (),
                   network_configuration: dict[str, Any] | None = None) -> StartResult: ...
    def tasks_started_by(self, started_by: str) -> list[str]: ...
    def stopped_task_started_by(self, container_instance: str, started_by: str) -> dict[str, Any] | None: ...
    def describe_tasks(self, task_arns: Sequence[str]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class TaskRequest:
    """What one StartTask starts, the same on each of its nodes."""

    task_definition: str
    started_by: str
    overrides: dict[str, Any] | None = None
    tags: list[dict[str, str]] | None = None
    group: str | None = None
    network: dict[str, Any] | None = None  # an awsvpc task's (``domain.task_network``)


def started_already(ecs: StartsTasks, started_by: str, nodes: Collection[str], *,
                    shared: bool = False, started_at: dict[str, float] | None = None) -> dict[str, str]:
    """Node id -> the task of ``started_by`` on it, for a start that may have been made
    already. ``nodes``: every node that start is made on, not only those whose task is still
    to be found (with one node, the task listed is that node's, unless the startedBy is
    ``shared`` by a call on several nodes; with several, any of them may be listed). A listed
    task ECS cannot describe yet (MISSING: not caught up) raises
    :class:`EcsActionFailed`: where it runs is not known, and starting again could start a
    second one; the caller tries again later, as after a failed lookup. ``started_at``, if
    given, is told when each task described started (node id -> epoch seconds)."""
    arns = ecs.tasks_started_by(started_by)
    if arns and len(nodes) == 1 and not shared:
        return {next(iter(nodes)): arns[0]}
    by_node: dict[str, Mapping[str, Any]]
    if arns:
        described = ecs.describe_tasks(arns)
        unseen = set(arns) - {str(task.get("taskArn")) for task in described}
        if unseen:
            raise EcsActionFailed.missing("DescribeTasks", sorted(unseen))
        by_node = {container_instance_id(str(task.get("containerInstanceArn", ""))): task
                   for task in described}
        if shared:
            by_node = {node: task for node, task in by_node.items() if node in nodes}
    else:
        by_node = {}
    # ECS lists only live tasks by startedBy: a task that already ran to its end (its start's
    # answer lost) is looked for among its node's stopped tasks, so it is not started twice.
    for node in sorted(set(nodes) - set(by_node)):
        stopped = ecs.stopped_task_started_by(node, started_by)
        if stopped:
            by_node[node] = stopped
    if started_at is not None:
        started_at.update({node: at for node, task in by_node.items()
                           if (at := task_time(task, "startedAt", "createdAt")) is not None})
    return {node: str(task["taskArn"]) for node, task in by_node.items()}


def start_on(ecs: StartsTasks, request: TaskRequest,
             nodes: Mapping[str, str]) -> tuple[dict[str, str], StartResult]:
    """StartTask of ``request`` on ``nodes`` (node id -> container instance ARN, up to 10):
    node id -> the task placed there, and ECS's answer (its failures, node by node)."""
    ids = list(nodes)
    result = ecs.start_task(task_definition=request.task_definition,
                            container_instance_arns=[nodes[node] for node in ids],
                            overrides=request.overrides, tags=request.tags, started_by=request.started_by,
                            group=request.group, network_configuration=request.network)
    if len(ids) == 1:  # a start on one node has its task, if any, there
        return ({ids[0]: result.task_arns[0]} if len(result.task_arns) == 1 else {}), result
    return {container_instance_id(arn): task for arn, task in result.placed.items()}, result


def reasons_on(failures: Sequence[Mapping[str, Any]], node: str, nodes: int) -> list[str]:
    """Why ECS placed nothing on ``node`` in a StartTask on ``nodes`` nodes: its failures' reasons
    (all of them, for a call on one node)."""
    mine = failures if nodes == 1 else [
        f for f in failures if container_instance_id(str(f.get("arn") or "")) == node]
    return [str(f.get("reason") or "") for f in mine]


def start_once(ecs: StartsTasks, request: TaskRequest, nodes: Mapping[str, str],
               keep: Callable[[str, str], object], *, look_up: Collection[str] = (), tries: int = 1,
               network: Callable[[Collection[str]], dict[str, Any] | None] | None = None,
               found: Callable[[str, str, float | None], object] | None = None,
               not_started: Callable[[], object] | None = None) -> dict[str, list[str]]:
    """Start ``request`` exactly once on each of ``nodes`` (node id -> container instance ARN;
    up to 10, one task each). ``look_up``: a start that may have been made already (a resumed
    launch, a restart's lease taken over) names every node it was made on, and the tasks of its
    startedBy are looked up first. ``keep(node, task)`` is told each node's task as soon as it is
    known (found, or placed), before the next StartTask, so that a crash after it loses no task;
    the nodes still without one are started again, ``tries`` StartTasks at the most
    (``network``: the request's network for the nodes left). ``found``, if given, is told a task
    the look-up found instead of ``keep`` (one started before this call), with when it started
    when ECS described it. ``not_started``, if given, is told when the call raises having started
    nothing more: its look-up failed, or a StartTask was refused or never sent (its turn in
    the ECS budget not had); not when a StartTask's answer was lost. Returns the nodes left
    without a task, each with ECS's reasons (none: ECS gave no failure for it); the caller says
    what that leads to, and logs it."""
    started_at: dict[str, float] = {}
    try:
        earlier = started_already(ecs, request.started_by, look_up, started_at=started_at) if look_up else {}
    except Exception:
        if not_started is not None:
            not_started()
        raise
    rest = dict(nodes)
    for node in [node for node in rest if node in earlier]:
        if found is not None:
            found(node, earlier[node], started_at.get(node))
        else:
            keep(node, earlier[node])
        del rest[node]
    reasons: dict[str, list[str]] = {}
    for _ in range(max(1, tries)):
        if not rest:
            break
        call = replace(request, network=network(rest)) if network else request
        try:
            placed, result = start_on(ecs, call, rest)
        except Exception as error:
            if not_started is not None and (refused(error) or not_sent(error)):
                not_started()
            raise
        for node, task in placed.items():
            keep(node, task)
        reasons = {node: reasons_on(result.failures, node, len(rest)) for node in rest if node not in placed}
        rest = {node: arn for node, arn in rest.items() if node not in placed}
    return {node: reasons.get(node, []) for node in rest}
