"""Fault campaign for AWS's notices (issue 51, docs/aws-notices.md): a queue job moved off
capacity AWS announced it takes, at its checkpoint and before the deadline, broken at each of
its AWS calls in turn.

The scenario: four 8-GPU nodes. Alice's 2-node queue job runs (its rank 0 polls the control
channel every ``POLL_SECONDS``, as ``gpu_recovery_client`` does). Then AWS announces that rank
1's node goes away, with one of three leads (calls are counted from the event):

* ``notice_spot``: a Spot Instance Interruption Warning, two minutes ahead (the job's
  ``suspend_grace_seconds``, 60, plus 60 s: the least notice the guarantee covers);
* ``notice_capacity_block``: a Capacity Block Expiration Warning, 40 minutes before the block's
  end (its instances terminate 10 minutes after it); the block holds rank 1's node and an idle
  one, mapped to nodes from the reservation's instances;
* ``notice_scheduled``: an AWS Health instance retirement two days ahead;
* ``notice_spot_tag``: the Spot warning for a tag-registered relocatable job (Bob's: started
  by his own scheduler, no control channel): two minutes leave no time to wait, its ranks are
  stopped at once and it moves to a free node, spending no recovery.

The notice is delivered as EventBridge and Lambda's asynchronous invocation would (a broken
call's delivery retried); at the deadline AWS takes the node (what still runs there ends).

``check(result)`` lists what ended wrong: the job complete on attempt 2, moved once at its
checkpoint before the deadline (one checkpoint, suspended and resumed once, no recovery spent,
never crashed; the tag-registered job: stopped before the deadline, relocated once, no
recovery spent), no task placed on an announced node after its notice, each announced node
cordoned (``aws-notice``), its ``capacity_notice`` e-mails sent, nothing stuck, nothing in a DLQ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C

from ..sim import aws_notices as notices
from ..world import World
from .moved_jobs import moved_once, one_move, relaunches, saved_once
from .runner import DYNAMODB, MIN, CampaignResult, Scenario, ecs_status, run_flow, unfinished
from .time_sharing import Rank0ControlPoller, polled_queue_job

NODES = ("node-a", "node-b", "node-c", "node-d")
RUN_LIMIT_SECONDS = 40 * MIN
RESUMED_RUN_SECONDS = 2 * MIN
#: flow -> (the notice, its lead: None for the notice's own)
FLOWS: dict[str, tuple[str, float | None]] = {
    "notice_spot": ("spot_interruption", None),
    "notice_capacity_block": ("capacity_block_expiry", None),
    "notice_scheduled": ("scheduled_retirement", 2 * 24 * 3600.0),
    "notice_spot_tag": ("spot_interruption", None),
}
TAGGED_FLOWS = frozenset({"notice_spot_tag"})


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    flow: str
    job: dict[str, Any]
    tasks_started: list[int]  # training tasks started per attempt
    announced: list[str]  # the nodes AWS announced it takes
    announced_items: dict[str, dict[str, Any]]  # their instance items
    announced_status: dict[str, str]  # their ECS status (a Capacity Block's: DRAINING)
    placed_after: list[str]  # tasks started on an announced node after the notice
    noticed_at: float
    deadline: float
    left_at: float | None  # when the job's last rank on the announced node stopped
    checkpoints: int

    def expectations(self) -> list[str]:
        return expectations(self)



def expectations(result: RunResult) -> list[str]:
    job = result.job
    job_id = str(job.get("job_id"))
    problems = unfinished(job)
    if int(job.get("recoveries_used") or 0) or int(job.get("app_restarts_used") or 0):
        problems.append("the move spent a recovery (it must not: the job never crashed)")
    if not 2 <= int(job.get("attempt") or 0) <= 2 + relaunches(result, job):
        problems.append(f"job at attempt {job.get('attempt')} (want 2)")
    if any(count > 2 for count in result.tasks_started):
        problems.append(f"training tasks started per attempt {result.tasks_started} (want 2 at most)")
    if result.flow in TAGGED_FLOWS:
        # Moved at once (a Spot warning leaves no time to be told first: its one e-mail says it
        # moved); restarted by the recovery (its recovered e-mail).
        never = ("failed", "application_error", "quarantined")
        return problems + _node_expectations(result) + result.mail_problems(
            {**{(kind, job_id): (0, 0) for kind in never}, ("capacity_notice", job_id): (1, 2)})
    problems += moved_once(job)
    problems += one_move(job)
    problems += saved_once(result.checkpoints)
    problems += result.mail_problems({**{(kind, job_id): (0, 0) for kind in
                                         ("failed", "application_error", "quarantined", "recovered")},
                                      ("capacity_notice", job_id): (1, 2)})
    return problems + _node_expectations(result)


def _node_expectations(result: RunResult) -> list[str]:
    """Off the announced node before the deadline, never placed there again, the node
    cordoned (and a Capacity Block's drained), its e-mails sent."""
    problems = []
    if result.left_at is None or result.left_at >= result.deadline:
        problems.append(f"the job left the announced node at {result.left_at} (deadline {result.deadline})")
    if result.placed_after:
        problems.append(f"tasks placed on an announced node after its notice: {result.placed_after}")
    for name, item in result.announced_items.items():
        cordon = item.get("cordon") or {}
        if not item.get("notice") or not cordon.get("notice"):
            problems.append(f"{name}: notice {item.get('notice')}, cordon {cordon} "
                            "(want its aws-notice cordon)")
    want = "DRAINING" if result.flow == "notice_capacity_block" else "ACTIVE"
    wrong = {n: status for n, status in result.announced_status.items() if status != want}
    if wrong:
        problems.append(f"announced nodes in ECS {wrong} (want {want})")
    node_mails = sum(1 for kind, job in result.mails if kind == "capacity_notice" and job == "-")
    if node_mails < len(result.announced):
        problems.append(f"{node_mails} node capacity_notice e-mail(s) for {len(result.announced)} node(s)")
    return problems


class AwsNotice(Scenario[RunResult]):
    """Alice's job runs; once AWS's notice is sent, calls are counted."""

    run_limit_seconds = RUN_LIMIT_SECONDS

    def __init__(self, flow: str) -> None:
        self.flow = flow
        self.kind, self.lead = FLOWS[flow]
        self.job_id = ""
        self.target = ""
        self.program: Rank0ControlPoller | None = None
        self.announced: dict[str, Any] = {}
        self.noticed_at = 0.0

    def world_options(self) -> dict[str, Any]:
        return {"extra_env": {C.ENV_CONTROL_API_URL: "https://control.invalid/prod"}}

    def set_up(self, world: World) -> list[str]:
        sim = world.ecs
        task_definition = world.queue_cluster(NODES)
        sim.plan_family("train", run_seconds=RUN_LIMIT_SECONDS, exit_code=0)
        if self.flow in TAGGED_FLOWS:  # Bob's own scheduler starts it: tagged, relocatable
            self.job_id = "bob-train"
            sim.start_job(self.job_id, task_definition, list(NODES[:2]),
                          extra_tags={C.TAG_RELOCATABLE: "true"})
            sim.run_for(2 * MIN + 5)
        else:
            self.job_id, self.program = polled_queue_job(world, task_definition)
        rank1 = world.repo.jobs.get_rank(self.job_id, 1)
        assert rank1 is not None
        self.target = world.node_name(rank1.container_inst_id)
        if self.kind == "capacity_block_expiry":  # the block: rank 1's node and an idle one
            job = world.repo.jobs.get_job(self.job_id)
            assert job is not None
            busy = {world.node_name(r.container_inst_id) for r in world.repo.jobs.get_ranks(job)}
            idle = next(n for n in NODES if n not in busy)
            for name in (self.target, idle):
                sim.node(name).capacity_reservation_id = "cr-0123456789abcdef0"
        sim.plan_family("train", run_seconds=RESUMED_RUN_SECONDS, exit_code=0)
        return [self.job_id]

    def start(self, world: World) -> None:
        self.noticed_at = world.ecs.now()
        self.announced = notices.announce(world.ecs, self.kind, self.target, lead_seconds=self.lead)

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        repo, sim, program = world.repo, world.ecs, self.program
        job = repo.jobs.get_job_item(self.job_id) or {}
        attempts = int(job.get("attempt") or 0)
        ours = [t for t in sim.tasks.values()
                if not t.health_check and t.tags.get(C.TAG_JOB_ID) == self.job_id]
        started = [sum(1 for t in ours if t.tags.get(C.TAG_ATTEMPT) == str(a))
                   for a in range(1, attempts + 1)]
        names = list(self.announced.get("nodes") or [])
        placed_after = [f"{t.label} on {t.node}" for t in sim.tasks.values()
                        if t.node in names and t.created_at > self.noticed_at]
        stops = [float(t.stopped_at) for t in ours if t.node == self.target and t.stopped_at is not None]
        items = {n: repo.instances.get_instance_item(sim.node(n).container_instance_id) or {} for n in names}
        return RunResult(**common, flow=self.flow, job=job, tasks_started=started, announced=names,
                         announced_items=items, announced_status=ecs_status(world, names),
                         placed_after=placed_after, noticed_at=self.noticed_at,
                         deadline=float(self.announced.get("deadline") or 0),
                         left_at=max(stops) if stops else None,
                         checkpoints=program.checkpoints if program is not None else 0)


def run(flow: str, fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The flow with ``fault`` (n-th call after the notice, mode) broken once."""
    return run_flow(AwsNotice(flow), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)
