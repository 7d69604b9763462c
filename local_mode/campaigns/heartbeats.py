"""Crash campaign of the heartbeats: a node lost, broken at each of its AWS calls.

The flow: a 2-node tagged job; each node's agent reports its tasks every 30 s
(``/v1/report_tasks``, through the heartbeat service in process: a failed report is made
again at the next interval, as the agent does). Node-b loses power: its agent goes
silent and its ECS agent disconnects (its task is still RUNNING for ECS). After
``heartbeat_stale_seconds`` the rank is NODE_LOST (the job too); after
``node_lost_fail_seconds`` the heartbeat sweep hands it to the recovery loop: the node
cannot be reached, so it is quarantined (drained) for a person, the job FAILED and
e-mailed (``node_lost``), and its other rank stopped.

``run(fault)`` breaks the n-th AWS call made once the job runs (the agents' reports, both
sweeps and the handlers), once, as a throttle or a lost response; ``problems()`` lists
what ended wrong, the backstop invariant after every event included.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import runtime
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.heartbeat_policy import ReportedTask
from gpu_recovery.repository import Repository

from ..emulator import LocalAws
from ..faults import ApiCall
from ..sim.bus import LocalEventBus
from ..sim.ecs import SimulatedEcs
from ..sim.wiring import SWEEP_SCHEDULE
from ..world import HEARTBEAT_SWEEP_SCHEDULE, build_world
from .base import DYNAMODB, MIN, InvariantWatch, mail_problems, mails

JOB_ID = "lost-node-job"
LOST, PEER = "node-b", "node-a"
AGENT_INTERVAL_SECONDS = 30
STALE_SECONDS = 60
FAIL_SECONDS = 120
RUN_LIMIT_SECONDS = 60 * MIN


@dataclass
class RunResult:
    fault: tuple[int, str] | None
    fired: ApiCall | None
    calls: list[ApiCall]
    job_state: str
    attempt: int
    rank_states: list[str]
    instance_states: dict[str, str]
    ecs_status: dict[str, str]
    peer_stopped: bool  # rank 0 (on the healthy node) was stopped
    stuck: list[str]
    dead_letters: int
    mails: list[tuple[str, str]]
    forgotten: list[str]
    timeline: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
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
        if self.stuck:
            problems.append(f"still pending: {self.stuck}")
        if self.dead_letters:
            problems.append(f"{self.dead_letters} event(s) in a DLQ")
        if self.forgotten:
            problems.append(f"backstop invariant broken: {self.forgotten}")
        return problems


class _Agents:
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


def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The flow with ``fault`` (n-th call once the job runs, mode) broken once."""
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.CRITICAL)
    with build_world(heartbeat_stale_seconds=STALE_SECONDS, node_lost_fail_seconds=FAIL_SECONDS,
                     extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL"}, dynamodb=dynamodb) as world:
        local, bus, sim = world.aws, world.bus, world.ecs
        world.schedule_heartbeat_sweep(60)
        for node in (PEER, LOST):
            sim.add_node(node, gpus=8)
        td = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=RUN_LIMIT_SECONDS * 2, exit_code=0)
        sim.start_job(JOB_ID, td, [PEER, LOST])
        agents = _Agents(sim)
        agents.start()
        sim.run_for(MIN)  # registered, heartbeats flowing
        repo = Repository(local.resource("dynamodb"), local.job_table, local.instance_table)
        watch = InvariantWatch(bus, repo, sim.now, [JOB_ID])
        calls = local.call_faults
        if fault is None:
            calls.arm(None, record_sites=True)
        else:
            calls.arm(fault[0], fault[1])
        peer_task = sim.running_tasks(PEER)[0].arn

        def power_off() -> list[dict[str, Any]]:
            agents.silent.add(LOST)
            return []

        sim.schedule(sim.now() + 30, power_off, "node-b loses power")
        sim.disconnect_agent(LOST, after=30, for_seconds=RUN_LIMIT_SECONDS * 2)
        return _finish(local, bus, sim, repo, watch, fault, peer_task, keep_timeline)


def _finish(local: LocalAws, bus: LocalEventBus, sim: SimulatedEcs, repo: Repository, watch: InvariantWatch,
            fault: tuple[int, str] | None, peer_task: str, keep_timeline: bool) -> RunResult:
    checked = [0.0]

    def ended() -> bool:  # read the job at most once a simulated minute
        if sim.now() < checked[0] + MIN:
            return False
        checked[0] = sim.now()
        job = repo.get_job(JOB_ID)
        return job is not None and job.state.is_terminal

    calls = local.call_faults
    sim.run_until_true(ended, max_seconds=RUN_LIMIT_SECONDS)
    calls.disarm()
    sim.run_for(3 * MIN)  # retries, the sweeps and the outbox settle
    job = repo.get_job(JOB_ID)
    assert job is not None
    nodes = {sim.node(n).container_instance_id: n for n in (PEER, LOST)}
    arns = [sim.node(n).container_instance_arn for n in nodes.values()]
    described = local.client("ecs").describe_container_instances(cluster=local.cluster_name,
                                                                 containerInstances=arns)
    far = sim.now() + 10**7
    stuck = [f"instance {nodes.get(i.container_inst_id, i.container_inst_id)} {i.state.value}"
             for i in repo.due_instances(far)]
    stuck += [f"job item {it.get('job_id_rank')} {it.get('job_state') or it.get('item_type')}"
              for it in repo.due_job_items(far)]
    peer = sim.tasks.get(peer_task)
    return RunResult(
        fault=fault, fired=calls.fired, calls=list(calls.calls), job_state=job.state.value,
        attempt=job.attempt,
        rank_states=[r.state.value for r in repo.get_ranks(job)],
        instance_states={n: (repo.get_instance(i).state.value if repo.get_instance(i) else "MISSING")
                         for i, n in nodes.items()},
        ecs_status={nodes.get(ci["containerInstanceArn"].rsplit("/", 1)[-1], "?"): ci["status"]
                    for ci in described["containerInstances"]},
        peer_stopped=peer is not None and peer.stop_code == "UserInitiated",
        stuck=stuck,
        dead_letters=sum(1 for d in bus.dead_letters
                         if d.rule not in (SWEEP_SCHEDULE, HEARTBEAT_SWEEP_SCHEDULE)),
        mails=mails(local), forgotten=list(watch.broken),
        timeline=sim.format_timeline() if keep_timeline else [],
    )


__all__ = ["run"]
