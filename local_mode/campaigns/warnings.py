"""Fault campaign for the driver's warnings (issue 44): a checkpointed move off a node whose
driver announces a reset, and the node's repair, broken at each of its AWS calls in turn.

The scenario: three 8-GPU nodes. Alice's 2-node queue job runs (its rank 0 a simulated
training program asking the control channel every ``POLL_SECONDS``, as ``gpu_recovery_client``
does). Then the driver of rank 1's node says its GPU 0 needs a reset (nvidia-smi's GPU Recovery
Action: Reset); the node agent reports it once (``/v1/report_gpu`` through the node API's
checks and the heartbeat service). Calls are counted from that report: it records the warning,
cordons the node and asks the job to checkpoint and stop (a move); rank 0 saves a checkpoint
and calls ``go_suspend()``; every rank is stopped, the job goes back to the queue ahead of its
priority and the scheduler restarts it on healthy nodes, from that checkpoint; the warned
node's GPUs are reset (the reset task) and it returns to service. Task events are delivered
as EventBridge and Lambda's asynchronous invocation would; the sweeps and the scheduler run
every minute; rank 0 retries a failed call at its next poll.

``check(result)`` lists what ended wrong: the job complete on attempt 2, moved once at its
checkpoint (one checkpoint, suspended and resumed once, no recovery spent, never crashed), the
warned node reset once and never rebooted, back in service uncordoned, no job left suspended
with nothing due (the backstop invariant, after every event), nothing stuck, nothing in a DLQ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

from ..world import World
from .moved_jobs import moved_once, one_move, relaunches, saved_once
from .runner import DYNAMODB, MIN, CampaignResult, Scenario, run_flow, unfinished
from .time_sharing import Rank0ControlPoller, polled_queue_job

NODES = ("node-a", "node-b", "node-c")
RUN_LIMIT_SECONDS = 40 * MIN
RESUMED_RUN_SECONDS = 2 * MIN


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    job: dict[str, Any]
    tasks_started: list[int]  # training tasks started per attempt
    warned: str  # the node whose driver asked for a reset
    warned_node: dict[str, Any]  # its instance item
    resets: int  # GPU reset tasks started on it
    reboots: int  # reboots of it
    checkpoints: int  # times rank 0 saved a checkpoint after being told

    def expectations(self) -> list[str]:
        return expectations(self)



def expectations(result: RunResult) -> list[str]:
    job = result.job
    problems = unfinished(job)
    if int(job.get("recoveries_used") or 0) or int(job.get("app_restarts_used") or 0):
        problems.append("the move spent a recovery (it must not: the job never crashed)")
    problems += moved_once(job)
    problems += one_move(job)
    unplaced = relaunches(result, job)
    if not 2 <= int(job.get("attempt") or 0) <= 2 + unplaced:
        problems.append(f"job at attempt {job.get('attempt')} (want 2)")
    whole = result.tasks_started[-1:] if unplaced else result.tasks_started
    if any(count != 2 for count in whole) or any(count > 2 for count in result.tasks_started):
        problems.append(f"training tasks started per attempt {result.tasks_started} (want 2 each)")
    node = result.warned_node
    if result.reboots or result.resets != 1:
        problems.append(f"{result.warned}: {result.resets} reset(s), {result.reboots} reboot(s) (want 1, 0)")
    back = node.get("instance_state") == C.InstanceState.AVAILABLE.value
    if not back or node.get("cordon") or node.get("warning"):
        problems.append(f"{result.warned} not back in service: {node.get('instance_state')}, cordon "
                        f"{node.get('cordon')}, warning {node.get('warning')}")
    problems += saved_once(result.checkpoints)
    job_id = str(job.get("job_id"))
    problems += result.mail_problems({**{(kind, job_id): (0, 0) for kind in
                                         ("failed", "application_error", "quarantined", "recovered")},
                                      ("gpu_warning", job_id): (1, 2)})
    return problems


class DriverWarning(Scenario[RunResult]):
    """Alice's job runs; once rank 1's node reported its driver's reset request, calls are counted."""

    run_limit_seconds = RUN_LIMIT_SECONDS

    def __init__(self) -> None:
        self.job_id = ""
        self.warned = ""
        self.program: Rank0ControlPoller | None = None

    def world_options(self) -> dict[str, Any]:
        return {"extra_env": {C.ENV_CONTROL_API_URL: "https://control.invalid/prod"}}

    def set_up(self, world: World) -> list[str]:
        sim = world.ecs
        task_definition = world.queue_cluster(NODES)
        sim.plan_family("train", run_seconds=RUN_LIMIT_SECONDS, exit_code=0)  # far longer than the test
        self.job_id, self.program = polled_queue_job(world, task_definition)
        rank1 = world.repo.jobs.get_rank(self.job_id, 1)
        assert rank1 is not None
        self.warned = world.node_name(rank1.container_inst_id)
        # Resumed from its checkpoint, the job needs only what was left.
        sim.plan_family("train", run_seconds=RESUMED_RUN_SECONDS, exit_code=0)
        sim.warn_gpu(self.warned, gpu=0, recovery_action="gpu_reset")
        return [self.job_id]

    def start(self, world: World) -> None:
        """The node agent's report (counted: the node API records the warning, cordons the node
        and asks the job to move)."""
        world.ecs.report_gpu_state(self.warned)

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        repo, sim, program = world.repo, world.ecs, self.program
        assert program is not None
        job = repo.jobs.get_job_item(self.job_id) or {}
        attempts = int(job.get("attempt") or 0)
        ours = [t.tags.get(C.TAG_ATTEMPT) for t in sim.tasks.values()
                if not t.health_check and t.tags.get(C.TAG_JOB_ID) == self.job_id]
        started = [ours.count(str(a)) for a in range(1, attempts + 1)]
        node = sim.node(self.warned)
        resets = sum(1 for t in sim.tasks.values() if t.node == node.name and t.group == C.GPU_RESET_GROUP)
        return RunResult(**common, job=job, tasks_started=started, warned=self.warned,
                         warned_node=repo.instances.get_instance_item(node.container_instance_id) or {},
                         resets=resets, reboots=node.reboots, checkpoints=program.checkpoints)


def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The scenario with ``fault`` (n-th call after the warning's report, mode) broken once."""
    return run_flow(DriverWarning(), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)
