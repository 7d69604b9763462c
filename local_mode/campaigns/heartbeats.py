"""Crash campaign of the heartbeats: a node lost, broken at each of its AWS calls.

The flow: a 2-node tagged job; each node's agent reports its tasks every 30 s
(``/v1/report_tasks``, through the heartbeat service in process: a failed report is made
again at the next interval, as the agent does). Node-b loses power: its agent goes
silent and its ECS agent disconnects (its task is still RUNNING for ECS). After
``heartbeat_stale_seconds`` the rank is NODE_LOST (the job too); after
``node_lost_fail_seconds`` the heartbeat sweep reads the ECS agent disconnected (stored, nothing
decided) and, 3 minutes later, disconnected again with the node agent still silent: the
node cannot be reached, so the recovery loop quarantines it (drained) for a person, the job
FAILED and e-mailed (``node_lost``), and its other rank stopped.

``run(fault)`` breaks the n-th AWS call made once the job runs (the agents' reports, both
sweeps and the handlers), once, as a throttle or a lost response; ``problems()`` lists
what ended wrong, the backstop invariant after every event included.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gpu_recovery import runtime
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.heartbeat_policy import ReportedTask

from ..sim.ecs import SimulatedEcs
from ..world import World
from .runner import (
    DYNAMODB,
    MIN,
    SETTLE_SECONDS,
    CampaignResult,
    Scenario,
    ecs_status,
    mail_problems,
    run_flow,
)

JOB_ID = "lost-node-job"
LOST, PEER = "node-b", "node-a"
AGENT_INTERVAL_SECONDS = 30
STALE_SECONDS = 60
FAIL_SECONDS = 120
RUN_LIMIT_SECONDS = 60 * MIN


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    job_state: str
    attempt: int
    rank_states: list[str]
    instance_states: dict[str, str]
    ecs_status: dict[str, str]
    peer_stopped: bool  # rank 0 (on the healthy node) was stopped

    def expectations(self) -> list[str]:
        problems = []
        if (self.job_state, self.attempt) != (JobState.FAILED.value, 1):
            problems.append(f"job {self.job_state} attempt {self.attempt} (want FAILED, 1)")
        want = {PEER: InstanceState.AVAILABLE.value, LOST: InstanceState.QUARANTINED.value}
        if self.instance_states != want:
            problems.append(f"instances {self.instance_states} (want {want})")
        if self.ecs_status.get(LOST) != "DRAINING":
            problems.append(f"{LOST} is {self.ecs_status.get(LOST)} in ECS (want DRAINING)")
        if not self.peer_stopped:
            problems.append("rank 0 on the healthy node was never stopped")
        problems += mail_problems(self.mails, {("node_lost", JOB_ID): (1, 2)})
        return problems


class NodeAgents:
    """Every node's agent, in process: each interval, the node's RUNNING tasks to the
    heartbeat service (the node API's ``report_tasks``); a silent node sends nothing."""

    def __init__(self, sim: SimulatedEcs) -> None:
        self.sim = sim
        self.silent: set[str] = set()

    def start(self) -> None:
        self.sim.schedule(self.sim.now() + AGENT_INTERVAL_SECONDS, self._round, "node agents")

    def _round(self) -> list[dict[str, Any]]:
        for name in sorted(self.sim.nodes):
            node = self.sim.nodes[name]
            if name in self.silent or node.rebooting:
                continue
            tasks = [ReportedTask(task_arn=t.arn) for t in self.sim.running_tasks(name)
                     if t.last_status == "RUNNING"]
            with contextlib.suppress(Exception):  # the agent reports again at its next interval
                runtime.heartbeat_service().report_tasks(node.container_instance_id, self.sim.now(), tasks)
        self.start()
        return []


class NodeLost(Scenario[RunResult]):
    """Node-b loses power once calls are counted: its agent silent, its ECS agent disconnected."""

    run_limit_seconds = RUN_LIMIT_SECONDS
    # The lost node's rank is stopped by the gang's stop intent; with its stop mark broken, its
    # stop is asked again at the paced round 2 minutes after the send, at a sweep's minute:
    # a minute more than the flows' settle, so a round one sweep later still ends in the flow.
    settle_seconds = SETTLE_SECONDS + MIN

    def __init__(self) -> None:
        self.agents: NodeAgents | None = None
        self.peer_task = ""

    def world_options(self) -> dict[str, Any]:
        return {"heartbeat_stale_seconds": STALE_SECONDS, "node_lost_fail_seconds": FAIL_SECONDS}

    def set_up(self, world: World) -> list[str]:
        sim = world.ecs
        world.schedule_heartbeat_sweep(60)
        for node in (PEER, LOST):
            sim.add_node(node, gpus=8)
        td = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=RUN_LIMIT_SECONDS * 2, exit_code=0)
        sim.start_job(JOB_ID, td, [PEER, LOST])
        self.agents = NodeAgents(sim)
        self.agents.start()
        sim.run_for(MIN)  # registered, heartbeats flowing
        return [JOB_ID]

    def start(self, world: World) -> None:
        sim, agents = world.ecs, self.agents
        assert agents is not None
        self.peer_task = sim.running_tasks(PEER)[0].arn

        def power_off() -> list[dict[str, Any]]:
            agents.silent.add(LOST)
            sim.node(LOST).powered = False  # the truth the false-repair figure judges by
            return []

        sim.schedule(sim.now() + 30, power_off, "node-b loses power")
        sim.disconnect_agent(LOST, after=30, for_seconds=RUN_LIMIT_SECONDS * 2)

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        repo, sim = world.repo, world.ecs
        job = repo.get_job(JOB_ID)
        assert job is not None
        nodes = {sim.node(n).container_instance_id: n for n in (PEER, LOST)}
        peer = sim.tasks.get(self.peer_task)

        def instance_state(instance_id: str) -> str:
            instance = repo.get_instance(instance_id)
            return instance.state.value if instance else "MISSING"

        return RunResult(
            **common, job_state=job.state.value, attempt=job.attempt,
            rank_states=[r.state.value for r in repo.get_ranks(job)],
            instance_states={n: instance_state(i) for i, n in nodes.items()},
            ecs_status=ecs_status(world, (PEER, LOST)),
            peer_stopped=peer is not None and peer.stop_code == "UserInitiated",
        )


def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The flow with ``fault`` (n-th call once the job runs, mode) broken once."""
    return run_flow(NodeLost(), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)


__all__ = ["run"]
