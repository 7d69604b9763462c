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

``node_wedged`` (``run(fault, wedged=True)``): node-b keeps its power and its node agent
keeps reporting every 30 s, but lists no running task (a tenant's container wedged dockerd:
the agent cannot see the task), while its ECS agent disconnects. At the two readings the
node agent still reports: the job FAILED and e-mailed (``node_lost``), rank 0 stopped, node-b
only flagged SUSPECT (no quarantine, no drain, nothing in its fault history) and marked
``gpu-recovery.lost-node``. Its ECS agent reconnects (dockerd back) ``RECONNECT_AFTER_SECONDS``
after it went: the stack's own check (the validation task, ``Repair.RECONNECT``) runs on
node-b (cordoned ``validating`` meanwhile), healthy, and passes: node-b AVAILABLE, no check,
cordon or placement attribute left. The flow runs, its calls
counted, until then (``NodeWedged.settled``).

``run(fault)`` breaks the n-th AWS call made once the job runs (the agents' reports, both
sweeps and the handlers), once, as a throttle or a lost response; ``problems()`` lists
what ended wrong, the backstop invariant after every event included.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain import placement
from gpu_recovery.domain.heartbeat_policy import ReportedTask
from gpu_recovery.domain.validation import Result, judge

from ..sim.ecs import SimulatedEcs
from ..world import World
from .runner import (
    DYNAMODB,
    MIN,
    SETTLE_SECONDS,
    CampaignResult,
    Scenario,
    ecs_status,
    run_flow,
)

JOB_ID = "lost-node-job"
LOST, PEER = "node-b", "node-a"
AGENT_INTERVAL_SECONDS = 30
STALE_SECONDS = 60
FAIL_SECONDS = 120
RUN_LIMIT_SECONDS = 60 * MIN
# The heartbeat index of a two- or three-node world: 2 partition keys, not the 32 the stack
# deploys for 10,000 nodes (settings.heartbeat_index_shards). The same writes and sweep (every
# shard read, a rank's entry in one of them), but 2 Queries a sweep instead of 32: those were most
# of a heartbeat flow's calls, each broken twice, and a third and fourth shard's Query (4 before)
# broke nothing the first two do not.
SMALL_HEARTBEAT_INDEX = {C.ENV_HEARTBEAT_INDEX_SHARDS: "2"}
#: node_wedged: node-b's ECS agent comes back this long after it went (the escalation's two
#: readings are ~6 minutes after it went: the job failed and the node flagged well before)
RECONNECT_AFTER_SECONDS = 15 * MIN


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    job_state: str
    attempt: int
    rank_states: list[str]
    instance_states: dict[str, str]
    ecs_status: dict[str, str]
    peer_stopped: bool  # rank 0 (on the healthy node) was stopped

    def expectations(self) -> list[str]:
        problems = self.job_failed(lost_node=InstanceState.QUARANTINED)
        if self.ecs_status.get(LOST) != "DRAINING":
            problems.append(f"{LOST} is {self.ecs_status.get(LOST)} in ECS (want DRAINING)")
        problems += self.mail_problems({("node_lost", JOB_ID): (1, 2)})
        return problems

    def job_failed(self, *, lost_node: InstanceState) -> list[str]:
        """The job FAILED on its first attempt, its rank on the healthy node stopped, the healthy
        node AVAILABLE and the lost one ``lost_node``."""
        problems = []
        if (self.job_state, self.attempt) != (JobState.FAILED.value, 1):
            problems.append(f"job {self.job_state} attempt {self.attempt} (want FAILED, 1)")
        want = {PEER: InstanceState.AVAILABLE.value, LOST: lost_node.value}
        if self.instance_states != want:
            problems.append(f"instances {self.instance_states} (want {want})")
        if not self.peer_stopped:
            problems.append("rank 0 on the healthy node was never stopped")
        return problems


@dataclass(kw_only=True)
class WedgedResult(RunResult):
    """node_wedged: node-b flagged SUSPECT, then its own check after its ECS agent's reconnect."""

    checks: list[int | None]  # the exit code of each check (validation task) run on node-b
    validation_open: bool  # node-b still holds a check
    suspect_origin: str  # node-b's suspect origin at the end ("" once AVAILABLE)
    fault_history: int  # node-b's fault records
    no_verdict_retries: int  # checks the stack ran again because one ended with no verdict
    # node-b's cordon (the check's) or placement attributes left at the end (want none: its pass
    # cleared them)
    out_of_placement: list[str]

    def expectations(self) -> list[str]:
        problems = self.job_failed(lost_node=InstanceState.AVAILABLE)
        if self.ecs_status.get(LOST) == "DRAINING":
            problems.append(f"{LOST} is DRAINING in ECS (want it never quarantined)")
        # Exactly one check, passed; another only after a check the stack judged no verdict.
        passes = sum(1 for code in self.checks if code == 0)
        if passes != 1 or len(self.checks) != 1 + self.no_verdict_retries:
            problems.append(f"checks on {LOST} exited {self.checks} with {self.no_verdict_retries} "
                            "no-verdict retries (want one pass, a second only after no verdict)")
        if self.validation_open:
            problems.append(f"{LOST} still holds a check")
        if self.out_of_placement:
            problems.append(f"{LOST} is still kept out of placement: {self.out_of_placement}")
        if self.fault_history:
            problems.append(f"{LOST} has {self.fault_history} fault record(s) (a missing answer is none)")
        problems += self.mail_problems({("node_lost", JOB_ID): (1, 2),
                                        ("validation_failed", "-"): (0, 0)})
        others = sorted({m for m in self.mails if m[0] not in ("node_lost", "validation_failed")})
        if others:
            problems.append(f"e-mails besides the job's node_lost: {others}")
        return problems


class NodeAgents:
    """Every node's agent, in process: each interval, the node's RUNNING tasks to the
    heartbeat service (the node API's ``report_tasks``); a silent node sends nothing, a
    wedged one (its dockerd wedged: the agent cannot list its containers) no task."""

    def __init__(self, sim: SimulatedEcs) -> None:
        self.sim = sim
        self.silent: set[str] = set()
        self.wedged: set[str] = set()

    def start(self) -> None:
        self.sim.schedule(self.sim.now() + AGENT_INTERVAL_SECONDS, self._round, "node agents")

    def _round(self) -> list[dict[str, Any]]:
        for name in sorted(self.sim.nodes):
            node = self.sim.nodes[name]
            if name in self.silent or node.rebooting:
                continue
            running = [] if name in self.wedged else self.sim.running_tasks(name)
            tasks = [ReportedTask(task_arn=t.arn) for t in running if t.last_status == "RUNNING"]
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
        return {"heartbeat_stale_seconds": STALE_SECONDS, "node_lost_fail_seconds": FAIL_SECONDS,
                "extra_env": dict(SMALL_HEARTBEAT_INDEX)}

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
        job = repo.jobs.get_job(JOB_ID)
        assert job is not None
        nodes = {sim.node(n).container_instance_id: n for n in (PEER, LOST)}
        peer = sim.tasks.get(self.peer_task)

        def instance_state(instance_id: str) -> str:
            instance = repo.instances.get_instance(instance_id)
            return instance.state.value if instance else "MISSING"

        return RunResult(
            **common, job_state=job.state.value, attempt=job.attempt,
            rank_states=[r.state.value for r in repo.jobs.get_ranks(job)],
            instance_states={n: instance_state(i) for i, n in nodes.items()},
            ecs_status=ecs_status(world, (PEER, LOST)),
            peer_stopped=peer is not None and peer.stop_code == "UserInitiated",
        )


class NodeWedged(NodeLost):
    """Node-b's dockerd wedged once calls are counted: its node agent reports no task, its ECS
    agent disconnected until ``RECONNECT_AFTER_SECONDS`` later; the host keeps its power."""

    # The flow ends once node-b's check passed (``settled``), not at the job's failure. The
    # limit leaves room for the sweep's 5-minute look (a lost mark or reconnect event), the
    # check's start retried each minute and a check run again after no verdict.
    run_limit_seconds = RUN_LIMIT_SECONDS

    def validating_nodes(self, world: World) -> list[str]:
        return [world.ecs.node(LOST).container_instance_id]

    def settled(self, world: World) -> bool:
        instance = world.repo.instances.get_instance(world.ecs.node(LOST).container_instance_id)
        return instance is not None and instance.state is InstanceState.AVAILABLE and not instance.validation

    def start(self, world: World) -> None:
        sim, agents = world.ecs, self.agents
        assert agents is not None
        self.peer_task = sim.running_tasks(PEER)[0].arn

        def wedge() -> list[dict[str, Any]]:
            agents.wedged.add(LOST)
            return []

        def unwedge() -> list[dict[str, Any]]:
            agents.wedged.discard(LOST)
            return []

        sim.schedule(sim.now() + 30, wedge, "node-b's dockerd wedged")
        sim.disconnect_agent(LOST, after=30, for_seconds=RECONNECT_AFTER_SECONDS)
        sim.schedule(sim.now() + 30 + RECONNECT_AFTER_SECONDS, unwedge, "node-b's dockerd back")

    def result(self, world: World, common: dict[str, Any]) -> WedgedResult:
        base = super().result(world, common)
        node = world.ecs.node(LOST)
        instance = world.repo.instances.get_instance(node.container_instance_id)
        checks = [t.exit_code for t in sorted(world.ecs.tasks.values(), key=lambda t: t.created_at)
                  if t.validation and t.node == LOST]
        history = world.repo.instances.get_instance_item(node.container_instance_id) or {}
        left = sorted({str(a["name"]) for a in world.ecs.ci_description(node)["attributes"]}
                      & {placement.UNAVAILABLE_ATTRIBUTE, placement.DEPRECATED_CORDON_ATTRIBUTE})
        return WedgedResult(
            **vars(base), checks=checks,
            validation_open=instance is None or bool(instance.validation),
            suspect_origin=instance.suspect_origin if instance else "",
            fault_history=len(history.get("fault_history") or []),
            no_verdict_retries=sum(1 for code in checks if judge(code) is Result.NO_VERDICT),
            out_of_placement=[*([f"cordon {instance.cordon}"] if instance is not None and instance.cordoned
                                else []), *left],
        )


def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB, wedged: bool = False) -> RunResult:
    """The flow with ``fault`` (n-th call once the job runs, mode) broken once; ``wedged``:
    ``node_wedged`` (node-b's host keeps reporting, its ECS agent back later)."""
    scenario = NodeWedged() if wedged else NodeLost()
    return run_flow(scenario, fault, keep_timeline=keep_timeline, dynamodb=dynamodb)


__all__ = ["run"]
