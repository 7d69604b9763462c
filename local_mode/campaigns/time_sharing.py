"""Fault campaign for time sharing: one preemption broken at each of its AWS calls in turn.

The scenario: two 8-GPU nodes. Alice's LOW 2-node job (her LOW quota: 2 nodes) runs. Bob
queues a HIGH 2-node job. The scheduler (every minute) preempts alice's job; its rank 0 (a
simulated training program asking the control channel every ``POLL_SECONDS``, as
``gpu_recovery_client`` does, through the same service the control API runs) checkpoints
and calls ``go_suspend()``; every rank is stopped, the job is SUSPENDED and queued again;
bob's job starts, runs three minutes and completes; alice's job resumes (``RESUME_COUNT=1``)
and completes. Task events are delivered as EventBridge and Lambda's asynchronous
invocation would (a failed invocation retried twice); the recovery sweep and the scheduler
run every minute; the rank-0 program retries a failed call at its next poll.

``run(fault=(n, mode))`` breaks the n-th AWS call made after bob's job was queued, once:
``throttle`` (refused, not executed) or ``lost_response`` (executed, the caller never
hears back). ``check(result)`` lists what ended wrong: both jobs must complete, alice's
suspended and resumed exactly once, bob's started exactly once, every rank started once
per attempt, no recovery spent, both users' quota usage back to zero, no task of an earlier
attempt left running (a suspended attempt's, or a launch's that ECS failed to place: each
stopped by the stack), nothing stuck and nothing in a DLQ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.domain.time_sharing import Priority
from gpu_recovery.repository import Repository
from gpu_recovery.repository.time_sharing import QuotaRepository

from ..sim.ecs import SimulatedEcs
from ..world import World
from .moved_jobs import moved_once, ran_on, relaunches, saved_once
from .runner import DYNAMODB, MIN, CampaignResult, R, Scenario, run_flow, unfinished

NODES = ("node-a", "node-b")
POLL_SECONDS = 10
LOW_RUN_SECONDS = 2 * MIN
HIGH_RUN_SECONDS = 3 * MIN
RUN_LIMIT_SECONDS = 40 * MIN


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    jobs: dict[str, dict[str, Any]]  # "low" / "high" -> job item
    tasks_started: dict[str, list[int]]  # "low" / "high" -> training tasks started per attempt
    usage: dict[str, int]  # quota usage left per user
    checkpoints: int  # times alice's rank 0 saved a checkpoint after being told to suspend
    #: training tasks of an attempt before their job's last that the stack never stopped (a
    #: suspended attempt's, an aborted launch's): they ran on, holding their GPUs
    left_running: list[str]

    def expectations(self) -> list[str]:
        return expectations(self)


def expectations(result: RunResult) -> list[str]:
    """What ended wrong for this flow (what every flow owes is ``CampaignResult.problems``)."""
    problems = []
    low, high = result.jobs.get("low", {}), result.jobs.get("high", {})
    for name, job in (("low", low), ("high", high)):
        problems += unfinished(job, f"{name} job")
        if int(job.get("recoveries_used") or 0):
            problems.append(f"{name} job spent {job.get('recoveries_used')} recoveries")
    problems += moved_once(low, "low job")
    problems += launch_problems(result, result.jobs, result.tasks_started)
    if result.usage != {"alice": 0, "bob": 0}:
        problems.append(f"quota usage left {result.usage} (want 0)")
    problems += saved_once(result.checkpoints)
    if result.left_running:
        problems.append(f"tasks of an earlier attempt not stopped by the stack: {result.left_running}")
    # A preemption fails nobody: no job-failure e-mail may be sent.
    jobs = [str(j.get("job_id")) for j in (low, high)]
    problems += result.mail_problems({(kind, job): (0, 0) for job in jobs
                                      for kind in ("failed", "application_error", "quarantined")})
    return problems


def launch_problems(result: CampaignResult, jobs: dict[str, dict[str, Any]],
                    tasks_started: dict[str, list[int]]) -> list[str]:
    """Bob's job launched once (attempt 1) and every job's 2 training tasks started once per
    attempt (``relaunches``: one attempt more each, the aborted one short)."""
    problems, high = [], jobs.get("high", {})
    if not 1 <= int(high.get("attempt") or 0) <= 1 + relaunches(result, high):
        problems.append(f"high job at attempt {high.get('attempt')} (want 1)")
    for name, per_attempt in tasks_started.items():
        whole = per_attempt[-1:] if relaunches(result, jobs.get(name, {})) else per_attempt
        if any(count != 2 for count in whole) or any(count > 2 for count in per_attempt):
            problems.append(f"{name} job: training tasks started per attempt {per_attempt} (want 2 each)")
    return problems


class Rank0ControlPoller:
    """Alice's rank 0: every ``POLL_SECONDS`` while it runs, asks the control channel; told
    to suspend, it saves a checkpoint once and calls go_suspend() until that is accepted.
    A call that fails (throttled, answer lost) is made again at the next poll."""

    def __init__(self, sim: SimulatedEcs, repo: Repository, job_id: str) -> None:
        self.sim = sim
        self.repo = repo
        self.job_id = job_id
        self.checkpoints = 0
        self.errors = 0
        self._suspending_attempt = 0
        self._accepted_attempt = 0

    def start(self) -> None:
        self.sim.schedule(self.sim.now() + POLL_SECONDS, self.poll, "rank 0 polls the control API")

    def poll(self) -> None:
        job = self.repo.jobs.get_job(self.job_id)
        if job is None or job.state.is_terminal:
            return
        rank0 = self.repo.jobs.get_rank(self.job_id, 0)
        task = self.sim.tasks.get(rank0.task_arn) if rank0 is not None and rank0.attempt == job.attempt \
            else None
        if task is not None and task.last_status == "RUNNING" and task.desired_status == "RUNNING":
            self._step(job.attempt)
        self.start()

    def _step(self, attempt: int) -> None:
        control = runtime.job_control_service()
        try:
            if self._accepted_attempt == attempt:
                return  # go_suspend() does not return: the process waits to be stopped
            if self._suspending_attempt != attempt:
                if not control.status(self.job_id, 0, attempt)["suspend"]:
                    return
                self.checkpoints += 1  # torch.save(...) of the seed's example
                self._suspending_attempt = attempt
            control.go_suspend(self.job_id, 0, attempt)
            self._accepted_attempt = attempt
        except Exception:  # the client retries at its next poll
            self.errors += 1


def polled_queue_job(world: World, task_definition: str) -> tuple[str, Rank0ControlPoller]:
    """Alice's 2-node queue job started (the scheduler's tick), its rank 0 polling the control
    channel for a minute: the job's id and rank 0's program."""
    sim = world.ecs
    job_id = world.submit_queue_job({
        "name": "alice-train", "task_definition": task_definition, "nnodes": 2, "gpus_per_node": 8},
        "alice")
    sim.run_for(MIN + 5)  # the scheduler's tick starts it
    program = Rank0ControlPoller(sim, world.repo, job_id)
    program.start()
    sim.run_for(MIN)
    return job_id, program


class Preempting(Scenario[R]):
    """Alice's LOW job runs; once bob's HIGH job is queued, calls are counted (a flow's result
    reads both jobs with :meth:`read_jobs`)."""

    run_limit_seconds = RUN_LIMIT_SECONDS
    #: the cluster's nodes, and the seconds alice's job has to checkpoint once told to suspend
    nodes: tuple[str, ...] = NODES
    low_grace_seconds = 120
    high_run_seconds = HIGH_RUN_SECONDS  # bob's job, once it runs
    low_alone_seconds = MIN  # alice's job runs this long before bob's is queued

    def __init__(self) -> None:
        self.low = self.high = ""
        self.program: Rank0ControlPoller | None = None
        self.quotas: QuotaRepository | None = None

    def low_running(self, world: World) -> None:
        """Alice's job just started (calls not counted yet)."""

    def world_options(self) -> dict[str, Any]:
        return {"extra_env": {C.ENV_CONTROL_API_URL: "https://control.invalid/prod"}}

    def set_up(self, world: World) -> list[str]:
        local, sim = world.aws, world.ecs
        world.schedule_queue_scheduler(60)
        for node in self.nodes:
            sim.add_node(node, gpus=8)
        self.quotas = QuotaRepository(local.resource("dynamodb"), local.quota_table)
        self.quotas.set_limit("alice", int(Priority.LOW), 2, by="campaign", now=sim.now())
        low_td = sim.register_training_task_definition("low", gpus=8)
        sim.plan_family("low", run_seconds=RUN_LIMIT_SECONDS, exit_code=0)  # far longer than the test
        high_td = sim.register_training_task_definition("high", gpus=8)
        sim.plan_family("high", run_seconds=self.high_run_seconds, exit_code=0)
        self.low = world.submit_queue_job({
            "name": "alice-low", "task_definition": low_td, "nnodes": 2, "gpus_per_node": 8,
            "priority": "LOW", "suspend_grace_seconds": self.low_grace_seconds}, "alice")
        sim.run_for(MIN + 5)  # the scheduler's tick starts it
        self.low_running(world)
        sim.run_for(self.low_alone_seconds)
        # Resumed from its checkpoint, alice's job needs only what was left.
        sim.plan_family("low", run_seconds=LOW_RUN_SECONDS, exit_code=0)
        self.high = world.submit_queue_job({
            "name": "bob-high", "task_definition": high_td, "nnodes": 2, "gpus_per_node": 8,
            "priority": "HIGH"}, "bob")
        # Calls are counted (and broken) from here: the submit is the jobs API's own flow
        # (made retry-safe by its Idempotency-Key), the preemption is this one.
        return [self.low, self.high]

    def read_jobs(self, world: World, common: dict[str, Any]) -> dict[str, Any]:
        """Both jobs as they ended: their items (``jobs``), training tasks started per attempt,
        quota usage left per user and tasks of an earlier attempt the stack never stopped; a
        job still holding its charge is stuck (added to ``common``)."""
        repo, sim, quotas = world.repo, world.ecs, self.quotas
        assert quotas is not None
        jobs = {"low": repo.jobs.get_job_item(self.low) or {},
                "high": repo.jobs.get_job_item(self.high) or {}}
        started: dict[str, list[int]] = {}
        left_running: list[str] = []
        for name, job_id in (("low", self.low), ("high", self.high)):
            attempts = int(jobs[name].get("attempt") or 0)
            tasks = [t for t in sim.tasks.values()
                     if not t.health_check and t.tags.get(C.TAG_JOB_ID) == job_id]
            started[name] = [sum(1 for t in tasks if t.tags.get(C.TAG_ATTEMPT) == str(a))
                             for a in range(1, attempts + 1)]
            left_running += [f"{name} attempt {t.tags.get(C.TAG_ATTEMPT)} on {t.node}" for t in tasks
                             if t.tags.get(C.TAG_ATTEMPT) != str(attempts) and ran_on(t, jobs[name])]
        usage = {user: int((quotas.get(user, level) or {}).get("used_nodes") or 0)
                 for user, level in (("alice", int(Priority.LOW)), ("bob", int(Priority.HIGH)))}
        common["stuck"] = common["stuck"] + [f"charge of {j.get('job_id')}" for j in jobs.values()
                                             if j.get("quota_charge")]
        return {"jobs": jobs, "tasks_started": started, "usage": usage, "left_running": left_running}


class Preemption(Preempting[RunResult]):
    """The preemption: alice's rank 0 checkpoints and calls go_suspend()."""

    def low_running(self, world: World) -> None:
        """Alice's job just started (calls not counted yet): its rank 0's program polls."""
        self.program = Rank0ControlPoller(world.ecs, world.repo, self.low)
        self.program.start()

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        assert self.program is not None
        return RunResult(**common, **self.read_jobs(world, common), checkpoints=self.program.checkpoints)


def run(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The scenario with ``fault`` (n-th call after bob's submit, mode) broken once."""
    return run_flow(Preemption(), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)
