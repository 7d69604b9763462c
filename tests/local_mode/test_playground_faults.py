"""The playground's fault injection refuses, with a sentence, what would silently do nothing:
a lost node none of whose ranks was seen alive yet, a job that does not exist (the
playground's ``FaultInjector`` over a stand-in cluster and tables; tests/local_mode/
test_playground.py drives the real one with the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpu_recovery import constants as C
from local_mode.playground.config import PlaygroundError
from local_mode.playground.fault_injection import FaultInjector


@dataclass
class Task:
    node: str
    tags: dict[str, str]
    health_check: bool = False
    arn: str = "arn:aws:ecs:us-east-1:123456789012:task/gpu/abc"
    label: str = "task abc"


@dataclass
class Node:
    name: str
    container_instance_id: str = "ci-1"
    gpu_ids: list[str] = field(default_factory=lambda: ["0", "1"])


class Cluster:
    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks
        self.nodes = {"node-1": Node("node-1"), "node-2": Node("node-2")}

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def running_tasks(self, node: str | None = None) -> list[Task]:
        return [t for t in self.tasks if node is None or t.node == node]

    def now(self) -> float:
        return 1_795_185_121.0


@dataclass
class Rank:
    last_heartbeat_at: float | None


class Tables:
    """The stack's repository as the injector reads it: its jobs aggregate's two reads."""

    def __init__(self, jobs: set[str], heartbeats: dict[tuple[str, int], float | None]) -> None:
        self.job_ids, self.heartbeats = jobs, heartbeats

    @property
    def jobs(self) -> Tables:
        return self

    def get_job(self, job_id: str) -> Any:
        return object() if job_id in self.job_ids else None

    def get_rank(self, job_id: str, rank: int) -> Rank | None:
        if (job_id, rank) not in self.heartbeats:
            return None
        return Rank(self.heartbeats[(job_id, rank)])


class Agents:
    interval = 30.0

    def __init__(self) -> None:
        self.silenced: list[tuple[str, float, float]] = []

    def silence(self, node: str, start: float, end: float) -> None:
        self.silenced.append((node, start, end))


def rank_task(job: str, rank: int, node: str) -> Task:
    return Task(node, {C.TAG_JOB_ID: job, C.TAG_RANK: str(rank)})


def injector(tasks: list[Task], tables: Tables) -> tuple[FaultInjector, Agents, list[str]]:
    agents, notes = Agents(), []
    return (FaultInjector(Cluster(tasks), programs=None, agents=agents,  # type: ignore[arg-type]
                          note=lambda _n, text: notes.append(text), repo=tables), agents, notes)


def test_a_lost_node_whose_ranks_sent_no_heartbeat_yet_is_refused_saying_why() -> None:
    """Given a job just started on node-2 (the node agent has not reported its rank yet)
    When lost-node is injected on the rank's node
    Then it is refused (409) saying nothing would notice and what to wait for, not accepted
    and silently without effect; once the rank has a heartbeat it is injected."""
    tasks = [rank_task("llama-1", 1, "node-2")]
    faults, agents, _ = injector(tasks, Tables({"llama-1"}, {("llama-1", 1): None}))
    with pytest.raises(PlaygroundError) as refused:
        faults.inject({"kind": "lost_node", "job_id": "llama-1", "rank": 1})
    assert refused.value.status == 409 and refused.value.field == "node"
    assert str(refused.value).startswith("the ranks on node-2 (llama-1 rank 1) have sent no heartbeat yet "
                                         "(the node agent reports every 30 s)")
    assert agents.silenced == []

    faults, agents, notes = injector(tasks, Tables({"llama-1"}, {("llama-1", 1): 1_795_185_100.0}))
    done = faults.inject({"kind": "lost_node", "job_id": "llama-1", "rank": 1, "seconds": 300})
    assert done["node"] == "node-2" and agents.silenced == [("node-2", 1_795_185_121.0, 1_795_185_421.0)]
    assert "sends nothing for 300 s" in notes[0]


def test_a_lost_node_that_runs_nothing_is_refused() -> None:
    faults, agents, _ = injector([], Tables(set(), {}))
    with pytest.raises(PlaygroundError, match="nothing runs on node-1: a lost node is noticed through the "
                                              "heartbeats of the ranks it runs"):
        faults.inject({"kind": "lost-node", "node": "node-1"})
    assert agents.silenced == []


@pytest.mark.parametrize("kind", ["lost_node", "xid", "app_error"])
def test_a_fault_aimed_at_a_job_that_does_not_exist_says_not_found(kind: str) -> None:
    faults, _, _ = injector([rank_task("llama-1", 0, "node-1")], Tables({"llama-1"}, {}))
    with pytest.raises(PlaygroundError) as refused:
        faults.inject({"kind": kind, "job_id": "nope-20261120-000000-0000", "rank": 1, "xid": 79})
    assert (refused.value.status, refused.value.field) == (404, "job_id")
    assert str(refused.value) == "job nope-20261120-000000-0000 not found (gpujobs list shows the jobs)"


class WarnedCluster(Cluster):
    """The stand-in cluster, recording the driver warnings the injector gives it."""

    def __init__(self, tasks: list[Task]) -> None:
        super().__init__(tasks)
        self.warned: list[tuple[str, dict[str, Any]]] = []

    def warn_gpu(self, node: str, **warning: Any) -> None:
        self.warned.append((node, warning))


@pytest.mark.parametrize(("doc", "warning"), [
    ({"kind": "recovery-action", "action": "reset"}, {"gpu": 0, "recovery_action": "gpu_reset"}),
    ({"kind": "recovery_action", "action": "drain-and-reset", "gpu": 1},
     {"gpu": 1, "recovery_action": "drain_and_reset"}),
    ({"kind": "recovery_action", "action": "reboot"}, {"gpu": 0, "recovery_action": "node_reboot"}),
    ({"kind": "remap-pending"}, {"gpu": 0, "remap_pending": True}),
    ({"kind": "rising-counter", "counter": "nvlink_replay_errors", "per_hour": 600},
     {"gpu": 0, "counter": "nvlink_replay_errors", "per_hour": 600.0}),
])
def test_each_driver_warning_is_injected_on_a_gpu_that_still_runs(doc: dict[str, Any],
                                                                  warning: dict[str, Any]) -> None:
    """`inject-fault recovery-action reset | remap-pending | rising-counter ...`: the warning on
    the node's GPU (its agent reports it next round), nothing crashed."""
    cluster = WarnedCluster([rank_task("llama-1", 1, "node-2")])
    notes: list[str] = []
    faults = FaultInjector(cluster, programs=None, agents=Agents(),  # type: ignore[arg-type]
                           note=lambda _n, text: notes.append(text), repo=Tables({"llama-1"}, {}))
    done = faults.inject({**doc, "job_id": "llama-1", "rank": 1})
    assert done["node"] == "node-2" and cluster.warned == [("node-2", warning)]
    assert "the node agent reports it within 30 s" in notes[0]


@pytest.mark.parametrize(("doc", "field"), [
    ({"kind": "recovery_action", "action": "explode"}, "action"),
    ({"kind": "rising_counter", "counter": "fan_speed"}, "counter"),
    ({"kind": "rising_counter", "counter": "nvlink_crc_errors", "per_hour": -1}, "per_hour"),
])
def test_a_bad_warning_is_refused_naming_the_field(doc: dict[str, Any], field: str) -> None:
    faults = FaultInjector(WarnedCluster([]), programs=None, agents=Agents(),  # type: ignore[arg-type]
                           note=lambda _n, _t: None, repo=Tables(set(), {}))
    with pytest.raises(PlaygroundError) as refused:
        faults.inject({**doc, "node": "node-1"})
    assert refused.value.field == field
