"""``recovery.task_starts``: a start that may repeat one finds the tasks already started, node
by node, and a StartTask's answer is read node by node; ``start_once``, the one way a queue
launch and a gang restart start ranks, keeps each task before its next StartTask and starts a
node no more than once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery.adapters.ecs import EcsActionFailed, StartResult
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.recovery.task_starts import TaskRequest, start_on, start_once, started_already
from tests.recovery.fakes import FakeEcs, LostResponse, ci_arn


class CountedEcs(FakeEcs):
    """The fake ECS, counting DescribeTasks calls."""

    def __init__(self) -> None:
        super().__init__()
        self.describes = 0

    def describe_tasks(self, task_arns: Sequence[str]) -> list[dict[str, Any]]:
        self.describes += 1
        return super().describe_tasks(task_arns)


REQUEST = TaskRequest("train:3", "gpurec-0123456789-a2-g0", {"containerOverrides": []},
                      [{"key": "k", "value": "v"}], "job:abc")
NODES = {"node-a": ci_arn("node-a"), "node-b": ci_arn("node-b"), "node-c": ci_arn("node-c")}


def test_a_start_on_several_nodes_tells_each_node_s_task_and_what_was_not_placed() -> None:
    ecs = FakeEcs()
    placed, result = start_on(ecs, REQUEST, NODES)
    assert sorted(placed) == sorted(NODES) and len(set(placed.values())) == 3
    assert {ecs.tasks[t].node for t in placed.values()} == set(NODES)
    assert ecs.start_calls == [3] and not result.failures
    ecs.failures["start_task"] = ["place_nothing"]
    placed, result = start_on(ecs, REQUEST, {"node-d": ci_arn("node-d")})
    assert placed == {} and [f["reason"] for f in result.failures] == ["RESOURCE:GPU"]


def test_a_start_on_one_node_has_its_task_there_even_where_the_answer_names_no_node() -> None:
    class Anonymous(FakeEcs):
        def start_task(self, **params: Any) -> StartResult:
            started = super().start_task(**params)
            return StartResult(started.task_arns, started.failures, {})

    placed, _ = start_on(Anonymous(), REQUEST, {"node-a": ci_arn("node-a")})
    assert list(placed) == ["node-a"]
    placed, _ = start_on(Anonymous(), REQUEST, {"node-a": ci_arn("node-a"), "node-b": ci_arn("node-b")})
    assert placed == {}  # several nodes: which task is where is not guessed


def test_a_repeated_start_finds_each_node_s_task_and_describes_only_a_start_on_several_nodes() -> None:
    ecs = CountedEcs()
    assert started_already(ecs, REQUEST.started_by, NODES) == {} and ecs.describes == 0
    placed, _ = start_on(ecs, REQUEST, {n: NODES[n] for n in ("node-a", "node-b")})
    assert started_already(ecs, REQUEST.started_by, NODES) == placed and ecs.describes == 1
    single = TaskRequest("check:1", "gpu-recovery-hc-0123456789abcdef")
    [(node, task)] = start_on(ecs, single, {"node-c": ci_arn("node-c")})[0].items()
    assert started_already(ecs, single.started_by, [node]) == {node: task} and ecs.describes == 1


def test_a_listed_task_ecs_cannot_describe_yet_is_never_guessed_at() -> None:
    ecs = FakeEcs()
    placed, _ = start_on(ecs, REQUEST, NODES)
    ecs.missing_tasks.add(placed["node-b"])
    with pytest.raises(EcsActionFailed):
        started_already(ecs, REQUEST.started_by, NODES)


def test_start_ranks_keeps_what_a_lost_answer_started_and_starts_only_the_other_nodes() -> None:
    ecs = FakeEcs()
    first, _ = start_on(ecs, REQUEST, {"node-a": NODES["node-a"]})  # the answer a crash lost
    kept: list[tuple[str, str, int]] = []
    unplaced = start_once(ecs, REQUEST, NODES, look_up=list(NODES),
                           keep=lambda node, task: kept.append((node, task, len(ecs.start_calls))))
    assert unplaced == {}
    assert kept[0] == ("node-a", first["node-a"], 1)  # kept before the StartTask of the others
    assert ecs.start_calls == [1, 2] and sorted(node for node, _, _ in kept) == sorted(NODES)
    assert sum(1 for task in ecs.tasks.values() if task.node == "node-a") == 1


class LiveListing(FakeEcs):
    """ListTasks by startedBy as ECS answers it: the live tasks only."""

    def tasks_started_by(self, started_by: str) -> list[str]:
        return [t.arn for t in self.tasks.values()
                if t.started_by == started_by and t.last_status != "STOPPED"]


@pytest.mark.parametrize("stopped", [("node-a",), ("node-a", "node-b")], ids=["one", "every"])
def test_a_start_whose_task_already_ended_finds_it_among_its_node_s_stopped_tasks(
        stopped: tuple[str, ...]) -> None:
    """Given a start whose answer was lost on node-a and node-b, and whose task on ``stopped``
    ran to its end before the start was resumed (ECS lists only live tasks by startedBy), When
    the start is resumed, Then each task is found (the stopped one among its node's stopped
    tasks) and only node-c is started: no node gets its task twice."""
    ecs = LiveListing()
    first, _ = start_on(ecs, REQUEST, {n: NODES[n] for n in ("node-a", "node-b")})  # the answer lost
    for node in stopped:
        ecs.tasks[first[node]].last_status = "STOPPED"
    found: list[tuple[str, str]] = []
    started: dict[str, float | None] = {}

    def tell(node: str, task: str, at: float | None) -> None:
        found.append((node, task))
        started[node] = at

    unplaced = start_once(ecs, REQUEST, NODES, look_up=list(NODES), keep=lambda node, task: None, found=tell)
    assert unplaced == {} and sorted(found) == sorted(first.items())
    # When each started, as ECS described it (the goodput ledger's restart ends there).
    assert started == pytest.approx({n: ecs.tasks[first[n]].started_at for n in first})
    assert ecs.start_calls == [2, 1]  # the lost start, then node-c's alone


def test_start_ranks_tries_the_nodes_left_again_on_their_network_and_says_why_the_last_failed() -> None:
    ecs = FakeEcs()
    ecs.failures["start_task"] = ["place_nothing", "place_nothing"]
    networks: list[list[str]] = []

    def network(nodes: Any) -> dict[str, Any]:
        networks.append(sorted(nodes))
        return {"awsvpcConfiguration": {"subnets": sorted(nodes)}}

    kept: dict[str, str] = {}
    one = {"node-a": NODES["node-a"]}
    unplaced = start_once(ecs, REQUEST, one, kept.__setitem__, tries=2, network=network)
    assert unplaced == {"node-a": ["RESOURCE:GPU"]} and kept == {} and ecs.start_calls == [1, 1]
    assert start_once(ecs, REQUEST, NODES, kept.__setitem__, tries=3, network=network) == {}
    assert sorted(kept) == sorted(NODES) and ecs.start_calls == [1, 1, 3]
    assert networks[-1] == sorted(NODES)
    assert ecs.networks[-1] == {"awsvpcConfiguration": {"subnets": sorted(NODES)}}


def test_a_failed_look_up_is_told_as_not_started_and_a_failed_start_task_is_not() -> None:
    """A look-up that fails (ListTasks throttled) started nothing: ``not_started`` is told before
    the call raises on, with no StartTask made; a StartTask whose answer was lost may have started
    its task: not told."""
    told: list[str] = []
    ecs = FakeEcs()
    ecs.failures["tasks_started_by"] = ["refuse"]
    with pytest.raises(ClientError, match="ThrottlingException"):
        start_once(ecs, REQUEST, NODES, lambda node, task: None, look_up=list(NODES),
                   not_started=lambda: told.append("look-up"))
    assert told == ["look-up"] and ecs.start_calls == []
    ecs.failures["start_task"] = ["lose"]
    with pytest.raises(LostResponse):
        start_once(ecs, REQUEST, NODES, lambda node, task: None, look_up=list(NODES),
                   not_started=lambda: told.append("start"))
    assert told == ["look-up"] and ecs.start_calls == [3]


class _NoTurn(FakeEcs):
    """The ECS budget's turn not had: the adapter raises before it sends StartTask."""

    def start_task(self, **_: Any) -> StartResult:
        raise RateLimited(2.0)


@pytest.mark.parametrize("refusal", ["throttled by ECS", "never sent"])
def test_a_start_task_refused_or_never_sent_is_told_as_not_started(refusal: str) -> None:
    """A StartTask that ECS refused, or that never reached ECS, started nothing: ``not_started``
    is told before the call raises on (a lost answer is not: the test above)."""
    told: list[str] = []
    ecs = _NoTurn() if refusal == "never sent" else FakeEcs()
    if refusal == "throttled by ECS":
        ecs.failures["start_task"] = ["refuse"]
    with pytest.raises((ClientError, RateLimited)):
        start_once(ecs, REQUEST, NODES, lambda node, task: None, not_started=lambda: told.append("x"))
    assert told == ["x"] and not ecs.tasks
