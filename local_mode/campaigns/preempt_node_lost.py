"""Crash campaign of a node lost in a preemption's grace: the suspension that cannot complete.

The flow: ``time_sharing``'s preemption (``Preempting``) on three 8-GPU nodes, every node's
agent reporting its tasks to the heartbeat service (``heartbeats.NodeAgents``) and the
heartbeat sweep every minute. Alice's LOW 2-node job runs; bob's HIGH 2-node job is queued
(one node free: it needs one of hers) and the scheduler preempts hers with a long grace
(``GRACE_SECONDS``: rank 0 is told, and its program never calls ``go_suspend()``, so nothing
is stopped before the grace ends; a go_suspend() would stop every rank at once, the lost one
moved to STOP_REQUESTED but kept in the heartbeat index by its suspension's stop, and decided
as soon by the same readings: ``tests/heartbeat/test_suspension_node_lost``'s).
Early in the grace, the node of her rank 1 loses power: its agent silent, its ECS agent
disconnected for good (its task RUNNING for ECS). The rank goes NODE_LOST (the job stays
SUSPENDING); past ``node_lost_fail_seconds`` the heartbeat sweep reads the ECS agent
disconnected (stored) and, 3 minutes later, disconnected again with the node agent silent: no
stop of that rank can ever be confirmed, so the suspension cannot complete, and the lost-node
decision fails the job (SUSPENDING -> FAILED, same attempt, its
reason naming the suspension, a ``node_lost`` e-mail), quarantines the node (drained) and
stops her rank 0. FAILED holds no nodes: the scheduler's tick releases her quota charge and
admits bob's job on the two healthy nodes; it runs 30 s and completes (at attempt 2 when ECS
answered its StartTask with a failure: that launch aborted, as in ``time_sharing``).

``run(fault)`` breaks the n-th AWS call made after bob's job was queued, once (a throttle, a
lost response, or the operation's documented failure shape); ``problems()`` lists what ended
wrong, the backstop invariant after every event included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import InstanceState, JobState

from ..world import World
from .heartbeats import SMALL_HEARTBEAT_INDEX, NodeAgents
from .runner import DYNAMODB, MIN, SETTLE_SECONDS, CampaignResult, ecs_status, run_flow
from .time_sharing import Preempting, launch_problems

NODES = ("node-a", "node-b", "node-c")
#: alice's grace: far longer than the lost-node decision (NODE_LOST after the 60 s of
#: staleness, escalated after 60 s more, its ECS agent read disconnected twice 3 minutes apart)
GRACE_SECONDS = 30 * MIN
POWER_OFF_SECONDS = 1  # into the grace (once read SUSPENDING)
STALE_SECONDS = 60
FAIL_SECONDS = 60
HIGH_RUN_SECONDS = 30  # bob's job, once it runs: the flow ends with it
WATCH_SECONDS = 10


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    jobs: dict[str, dict[str, Any]]  # "low" / "high" -> job item
    tasks_started: dict[str, list[int]]  # "low" / "high" -> training tasks started per attempt
    usage: dict[str, int]  # quota usage left per user
    left_running: list[str]  # tasks of an earlier attempt the stack never stopped
    lost: str  # the node that lost power (alice's rank 1's)
    lost_instance: str  # its container instance id
    instance_states: dict[str, str]  # node -> its instance state
    ecs_status: dict[str, str]  # node -> ECS's status of it
    peer_stopped: bool  # alice's rank 0 (on a healthy node) was stopped by the stack

    def expectations(self) -> list[str]:
        problems = []
        low, high = self.jobs.get("low", {}), self.jobs.get("high", {})
        error = str(low.get("last_error") or "")
        if (low.get("job_state"), int(low.get("attempt") or 0)) != (JobState.FAILED.value, 1):
            problems.append(f"low job {low.get('job_state')} attempt {low.get('attempt')} (want FAILED, 1): "
                            f"{error[:200]}")
        elif "suspension could not be completed" not in error or self.lost_instance not in error:
            problems.append(f"low job's reason does not name its suspension and {self.lost} "
                            f"({self.lost_instance}): {error[:300]}")
        if high.get("job_state") != JobState.COMPLETE.value:
            problems.append(f"high job {high.get('job_state')} (want COMPLETE): "
                            f"{str(high.get('last_error'))[:200]}")
        for name, job in (("low", low), ("high", high)):
            if int(job.get("recoveries_used") or 0):
                problems.append(f"{name} job spent {job.get('recoveries_used')} recoveries")
        problems += launch_problems(self, self.jobs, self.tasks_started)
        if self.usage != {"alice": 0, "bob": 0}:
            problems.append(f"quota usage left {self.usage} (want 0)")
        if self.left_running:
            problems.append(f"tasks of an earlier attempt not stopped by the stack: {self.left_running}")
        want = {n: (InstanceState.QUARANTINED if n == self.lost else InstanceState.AVAILABLE).value
                for n in NODES}
        if self.instance_states != want:
            problems.append(f"instances {self.instance_states} (want {want})")
        if self.ecs_status.get(self.lost) != "DRAINING":
            problems.append(f"{self.lost} is {self.ecs_status.get(self.lost)} in ECS (want DRAINING)")
        if not self.peer_stopped:
            problems.append("low job's rank 0 on a healthy node was never stopped")
        # Her job failed by the lost node (one e-mail, at least once); bob's failed nobody.
        low_id, high_id = str(low.get("job_id")), str(high.get("job_id"))
        failures = ("failed", "application_error", "quarantined")
        problems += self.mail_problems({
            ("node_lost", low_id): (1, 2), **{(kind, low_id): (0, 0) for kind in failures},
            **{(kind, high_id): (0, 0) for kind in (*failures, "node_lost")}})
        return problems


class PreemptNodeLost(Preempting[RunResult]):
    """The preemption, its rank 0 silent, a node of alice's job lost in the grace."""

    nodes = NODES
    low_grace_seconds = GRACE_SECONDS
    high_run_seconds = HIGH_RUN_SECONDS
    # Bob's job queued just before the scheduler's next tick (its calls are the flow's).
    low_alone_seconds = MIN + 45
    # Her lost rank's stop is asked again at its paced rounds (as ``heartbeats.NodeLost``'s).
    settle_seconds = SETTLE_SECONDS + MIN

    def __init__(self) -> None:
        super().__init__()
        self.agents: NodeAgents | None = None
        self.lost = self.peer_task = ""

    def world_options(self) -> dict[str, Any]:
        options = super().world_options()
        return {**options, "heartbeat_stale_seconds": STALE_SECONDS, "node_lost_fail_seconds": FAIL_SECONDS,
                "extra_env": {**options.get("extra_env", {}), **SMALL_HEARTBEAT_INDEX}}

    def low_running(self, world: World) -> None:
        """Every node's agent reports (her rank 0 runs no program: it never calls go_suspend())."""
        world.schedule_heartbeat_sweep(60)
        self.agents = NodeAgents(world.ecs)
        self.agents.start()

    def start(self, world: World) -> None:
        """Once her job is SUSPENDING (read by the emulator's own client, not a flow's call), the
        node of her rank 1 loses power ``POWER_OFF_SECONDS`` later."""
        sim, repo, agents = world.ecs, world.repo, self.agents
        assert agents is not None
        ranks = {t.tags.get(C.TAG_RANK): t for t in sim.tasks.values()
                 if t.tags.get(C.TAG_JOB_ID) == self.low and t.last_status == "RUNNING"}
        self.lost, self.peer_task = ranks["1"].node, ranks["0"].arn

        def power_off() -> list[dict[str, Any]]:
            agents.silent.add(self.lost)
            sim.node(self.lost).powered = False  # the truth the false-repair figure judges by
            return []

        def watch() -> list[dict[str, Any]]:
            job = repo.jobs.get_job(self.low)
            if job is not None and job.state is JobState.SUSPENDING:
                sim.schedule(sim.now() + POWER_OFF_SECONDS, power_off, f"{self.lost} loses power")
                sim.disconnect_agent(self.lost, after=POWER_OFF_SECONDS,
                                     for_seconds=self.run_limit_seconds * 2)
            elif job is not None and not job.state.is_terminal:
                sim.schedule(sim.now() + WATCH_SECONDS, watch, "the preemption awaited")
            return []

        sim.schedule(sim.now() + WATCH_SECONDS, watch, "the preemption awaited")

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        repo, sim = world.repo, world.ecs
        instances = {}
        for node in NODES:
            instance = repo.instances.get_instance(sim.node(node).container_instance_id)
            instances[node] = instance.state.value if instance else "MISSING"
        peer = sim.tasks.get(self.peer_task)
        return RunResult(**common, **self.read_jobs(world, common), lost=self.lost,
                         lost_instance=sim.node(self.lost).container_instance_id,
                         instance_states=instances, ecs_status=ecs_status(world, NODES),
                         peer_stopped=peer is not None and peer.stop_code == "UserInitiated")

def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The flow with ``fault`` (n-th call after bob's submit, mode) broken once."""
    return run_flow(PreemptNodeLost(), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)


__all__ = ["run"]
