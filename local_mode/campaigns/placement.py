"""Crash campaigns of placement (issue 41): the stack shares a full cluster with another
scheduler that places onto every node the documented constraint allows the moment it frees
(``local_mode.sim.eager_scheduler``), broken at each of its AWS calls.

The flows (``FLOWS``):

* ``full_cluster`` — a relocatable 2-node job on node-a/node-b, ``spare_nodes=1`` (node-c the
  spare), node-d and node-e kept busy by the other scheduler. node-b's GPU dies (DCGM:
  replace). The stack reserves the job's nodes and decides its spare in the invocation that
  sees the fault, marks the next spare among the busy nodes, moves rank 1 to node-c once its
  old ranks stopped, and quarantines node-b (cordoned from its verdict's commit). Right when:
  the job completes on node-a/node-c, attempt 2, one recovery; node-b QUARANTINED and
  DRAINING; the other scheduler never placed on node-a or node-c while the job recovered,
  nor on node-b after its verdict; the stack never placed a training task on a faulted node;
  the pool has its spare again (marked while busy);
* ``placement_race`` — a relocatable job on node-a/node-b waits for a healthy node (node-b
  dead, the cluster full: node-c runs another job, node-d another workload for a few more
  minutes). Once calls are counted, node-c's GPU dies under its rank while the sweep is
  placing: that rank's STOPPED event is 90 s late (the container-instance event and a sweep
  come first). Right when: the waiting job is never placed on node-c (ECS shows it free, but
  the stack still records a rank there), moves to node-d once it frees and completes; node-c
  is checked and quarantined; its own job (not relocatable) fails with its ``quarantined``
  e-mail; no job fails for a placement race;
* ``taken_target`` — a relocatable job on node-a/node-b, node-c and node-d free. node-b's GPU
  dies (DCGM: replace) and the job is relocated; another team's scheduler that ignores the
  placement constraint starts its task on the relocation's target just before the stack's
  StartTask of the moved rank (``TargetTaker``), which ECS refuses (RESOURCE:GPU). Right when:
  the moved rank goes to the other free node instead of waiting for the taken one, and the job
  completes there with node-a, attempt 2, one recovery; node-b QUARANTINED and DRAINING; no
  job fails.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain import placement
from gpu_recovery.domain.models import Job

from ..sim.eager_scheduler import STARTED_BY, EagerScheduler
from ..sim.ecs import SimulatedEcs
from ..world import World
from .runner import DYNAMODB, MIN, CampaignResult, Scenario, ecs_status, known_flow, run_flow

FLOWS = ("full_cluster", "placement_race", "taken_target")
JOB_ID, OTHER_JOB = "placed", "victim"
TRAIN_SECONDS = 2 * MIN  # the restarted ranks' training (each simulated minute costs a sweep)
RUN_LIMIT_SECONDS = 60 * MIN
EAGER_SECONDS = 15 * MIN  # the other scheduler's work: it outlives an unbroken run
RACE_LATE_SECONDS = 90.0  # how late node-c's rank's STOPPED event is (placement_race)
TAKEN_TARGET_BOUND_SECONDS = 6 * MIN  # taken_target, unbroken: the check, the move, a resend
OTHER_WORKLOAD_SECONDS = 3 * MIN  # placement_race: node-d frees this long after calls are counted
#: who started a task on its own (the job's first start, the other scheduler, another team)
NOT_THE_STACK = ("gpujobs", STARTED_BY, "other-team")


@dataclass(kw_only=True)
class PlacementResult(CampaignResult):
    flow: str
    jobs: dict[str, tuple[str, int, int]]  # job -> (state, attempt, recoveries used)
    final_nodes: list[str]  # where the job's last attempt ran
    instance_states: dict[str, str]
    ecs_status: dict[str, str]
    fault_to_running: float | None  # seconds from the fault to every rank RUNNING again
    #: the stack's training tasks placed on a node whose GPU was bad then (time, node)
    stack_on_faulted: list[tuple[float, str]] = field(default_factory=list)
    #: the other scheduler's tasks placed on a node the stack held or had judged bad (why)
    eager_on_held: list[str] = field(default_factory=list)
    spares: list[str] = field(default_factory=list)  # nodes held spare at the end
    spare_at_fault: str = ""  # full_cluster: the spare when the fault came
    facts: dict[str, Any] = field(default_factory=dict)

    def expectations(self) -> list[str]:
        problems = []
        state, attempt, used = self.jobs[JOB_ID]
        if (state, attempt, used) != (JobState.COMPLETE.value, 2, 1):
            problems.append(f"job {(state, attempt, used)} (want COMPLETE, 2, 1)")
        dead = "node-c" if self.flow == "placement_race" else "node-b"
        want_nodes = {"full_cluster": sorted(["node-a", self.spare_at_fault]),
                      "placement_race": ["node-a", "node-d"]}.get(self.flow) \
            or sorted(["node-a", *(n for n in ("node-c", "node-d") if n not in self.facts.get("taken", ()))])
        # A job's nodes are held from its fault seen: a fault whose handling failed (a broken
        # call, calls failing at random) is unknown meanwhile, and the other scheduler may take
        # them first; the job then restarts on other healthy nodes.
        excused = self.fault is not None or self.failing is not None
        taken = [e.split()[0] for e in self.eager_on_held if "after its bad verdict" not in e]
        if self.final_nodes != want_nodes and not (
                excused and taken and len(self.final_nodes) == 2 and dead not in self.final_nodes):
            problems.append(f"ranks ended on {self.final_nodes} (want {want_nodes})")
        if self.instance_states.get(dead) != InstanceState.QUARANTINED.value:
            problems.append(f"{dead} is {self.instance_states.get(dead)} (want QUARANTINED)")
        if self.ecs_status.get(dead) != "DRAINING":
            problems.append(f"{dead} is {self.ecs_status.get(dead)} in ECS (want DRAINING)")
        if self.stack_on_faulted:
            problems.append(f"the stack placed training tasks on faulted nodes: {self.stack_on_faulted}")
        # A node judged bad is kept off every scheduler whatever call failed; a recovering job's
        # nodes are held from its fault seen (a broken call may leave a reservation's attribute
        # to the sweep's next run).
        judged = [e for e in self.eager_on_held if "after its bad verdict" in e]
        if judged or (not excused and self.eager_on_held):
            problems.append(f"the other scheduler took held or judged nodes: {self.eager_on_held}")
        want_mails: dict[tuple[str, str], tuple[int, int]] = {("recovered", JOB_ID): (1, 2),
                                                              ("failed", JOB_ID): (0, 0)}
        if self.flow == "taken_target":
            # Its task landed on the target once (the premise), whatever call was broken after.
            if len(self.facts.get("taken", ())) != 1:
                problems.append(f"the other team took {self.facts.get('taken')} (want the target alone)")
            # Unbroken, the moved rank does not wait for the taken node (its task runs 15 minutes).
            if self.fault is None and self.failing is None and (
                    self.fault_to_running is None or self.fault_to_running > TAKEN_TARGET_BOUND_SECONDS):
                problems.append(f"fault to every rank RUNNING: {self.fault_to_running} s "
                                f"(want at most {TAKEN_TARGET_BOUND_SECONDS})")
        elif self.flow == "placement_race":
            other = self.jobs.get(OTHER_JOB, ("?", 0, 0))
            if other[0] != JobState.FAILED.value:
                problems.append(f"{OTHER_JOB} is {other[0]} (want FAILED: its node is dead, it may not move)")
            want_mails[("quarantined", OTHER_JOB)] = (1, 2)
        else:
            if len(self.spares) != 1 or dead in self.spares:
                problems.append(f"spares at the end {self.spares} (want one, not {dead})")
            # Marked while busy, unbroken and with one call broken; with calls failing at random
            # the refresh that marks it may fail until a node frees and is the spare itself.
            if not self.facts.get("marked_busy") and self.failing is None:
                problems.append("the pool was never refilled by marking a busy node")
            # Issue 41's bound, unbroken: a broken call costs a retry (a minute or two), and a
            # fault whose own handling failed lets the other scheduler take node-b meanwhile. Not
            # with calls failing at random either (seeds 3-22 at 1 %: 128-330 s in 7 of 20).
            if self.fault is None and self.failing is None and (
                    self.fault_to_running is None or self.fault_to_running > 90):
                problems.append(f"fault to every rank RUNNING: {self.fault_to_running} s (want at most 90)")
            elif self.fault_to_running is None:
                problems.append("the job never ran again after its fault")
        problems += self.mail_problems(want_mails)
        return problems


class PlacementScenario(Scenario[PlacementResult]):
    """One flow of ``FLOWS`` (see the module docstring)."""

    run_limit_seconds = RUN_LIMIT_SECONDS

    def __init__(self, flow: str) -> None:
        self.flow = known_flow(flow, FLOWS)
        self.eager: EagerScheduler | None = None
        self.fault_at = 0.0
        self.other_task = ""
        self.spare = ""  # full_cluster: the spare when the fault comes
        self.held_from: dict[str, float] = {}  # node -> since when the stack holds it for the job
        self.facts: dict[str, Any] = {}
        self.taker: TargetTaker | None = None  # taken_target: the other team's scheduler

    def world_options(self) -> dict[str, Any]:
        env = {C.ENV_RELOCATION_WAIT_SECONDS: "1800"}
        if self.flow == "full_cluster":
            env[C.ENV_SPARE_NODES] = "1"
        else:  # two dead nodes of four within minutes: the breaker lets both be quarantined
            env[C.ENV_REMEDIATION_SETTINGS] = json.dumps({"breaker_max_percent": 50})
        return {"extra_env": env}

    def set_up(self, world: World) -> list[str]:
        sim = world.ecs
        extra = ("node-e",) if self.flow == "full_cluster" else ()
        for node in ("node-a", "node-b", "node-c", "node-d", *extra):
            sim.add_node(node, gpus=8)
        td = sim.register_training_task_definition("train", gpus=8)
        sim.plan_family("train", run_seconds=None)
        sim.start_job(JOB_ID, td, ["node-a", "node-b"], extra_tags={C.TAG_RELOCATABLE: "true"})
        if self.flow == "taken_target":
            sim.run_for(MIN)
            sim.plan_family("train", run_seconds=TRAIN_SECONDS)
            self.taker = TargetTaker(sim, kept=("node-a", "node-b")).attach()
            return [JOB_ID]
        if self.flow == "full_cluster":
            sim.run_for(MIN)  # the sweep marks the spare before the other scheduler fills the rest
            self.eager = EagerScheduler(sim, run_seconds=EAGER_SECONDS).attach()
            sim.run_for(MIN)
            sim.plan_family("train", run_seconds=TRAIN_SECONDS)
            return [JOB_ID]
        sim.start_job(OTHER_JOB, td, ["node-c"])
        other = sim.register_training_task_definition("other", gpus=8)
        sim.plan_family("other", run_seconds=None)
        self.other_task = sim.start_job("other", other, ["node-d"], started_by="other-team")[0]
        sim.inject_gpu_fault("node-b", after=MIN, health="replace", nccl_cascade=True)
        sim.run_until_true(lambda: _waiting(world), max_seconds=8 * MIN)
        sim.plan_family("train", run_seconds=TRAIN_SECONDS)
        return [JOB_ID, OTHER_JOB]

    def start(self, world: World) -> None:
        sim = world.ecs
        if self.flow == "taken_target":
            self.fault_at = sim.now() + 30
            sim.inject_gpu_fault("node-b", after=30, health="replace", nccl_cascade=True)
            return
        if self.flow == "full_cluster":
            self.spare = ",".join(sorted(world.node_name(n) for n in placement.spares_of(
                world.repo.cordons.worklist().holds)))
            self.fault_at = sim.now() + 30
            sim.inject_gpu_fault("node-b", after=30, health="replace", nccl_cascade=True)
            return
        sim.plan_task(self.other_task, run_seconds=OTHER_WORKLOAD_SECONDS, exit_code=0)
        arn = sim.node("node-c").container_instance_arn

        def late(event: dict[str, Any]) -> float:
            detail = event.get("detail") or {}
            training = not str(detail.get("group", "")).startswith(C.HEALTH_CHECK_GROUP)
            stopped = event.get("detail-type") == "ECS Task State Change" \
                and detail.get("lastStatus") == "STOPPED"
            on_c = detail.get("containerInstanceArn") == arn
            return RACE_LATE_SECONDS if stopped and training and on_c else 0.0

        sim.delivery_delay = late
        # Half a minute before a sweep (the world's sweeps run at whole minutes of its start).
        self.fault_at = sim.now() + 30
        sim.inject_gpu_fault("node-c", after=30, health="replace")

    def each_minute(self, world: World, jobs: Mapping[str, Job | None]) -> None:
        if self.flow == "placement_race" and world.ecs.now() > self.fault_at + 3 * RACE_LATE_SECONDS:
            world.ecs.delivery_delay = None
        holds = world.repo.cordons.worklist().holds
        for node_id, hold in holds.items():
            if hold.get("job") == JOB_ID:
                self.held_from.setdefault(world.node_name(node_id), world.ecs.now())
        if placement.next_spares_of(holds):
            self.facts["marked_busy"] = True

    def result(self, world: World, common: dict[str, Any]) -> PlacementResult:
        repo, sim = world.repo, world.ecs
        job = repo.jobs.get_job(JOB_ID)
        assert job is not None
        jobs = {}
        for job_id in (JOB_ID, OTHER_JOB):
            found = repo.jobs.get_job(job_id)
            if found is not None:
                jobs[job_id] = (found.state.value, found.attempt, found.recoveries_used)
        names = sorted(sim.nodes)
        item = repo.jobs.get_job_item(JOB_ID) or {}
        # RUNNING again, or a restart confirmed by its completion (its confirmation's writes all
        # met failures while it trained): the ledger's mark says when its gang ran.
        running = [float(h["at"]) if h.get("to") == "RUNNING" else float(h["gp"]["running_at"])
                   for h in item.get("history") or []
                   if (h.get("to") == "RUNNING" or (h.get("gp") or {}).get("running_at"))
                   and float(h["at"]) >= self.fault_at]
        dead = "node-b" if self.flow == "full_cluster" else "node-c"
        dead_item = repo.instances.get_instance_item(sim.node(dead).container_instance_id) or {}
        judged = float((dead_item.get("last_fault") or {}).get("at") or 0) or None
        # The job's own nodes are held from the fault (first effect of seeing it) until its
        # restart is placed; the node judged bad from its verdict on.
        restarted = min(running) if running else None
        eager_on_held = []
        for at, node, _ in (self.eager.started if self.eager is not None else []):
            if node == dead and judged is not None and at >= judged:
                eager_on_held.append(f"{node} at +{at - self.fault_at:.0f} s, after its bad verdict")
            if self.flow == "full_cluster" and node in ("node-a", self.spare) and at >= self.fault_at \
                    and (restarted is None or at < restarted):
                eager_on_held.append(f"{node} at +{at - self.fault_at:.0f} s, held for {JOB_ID}'s recovery")
        stack_on_faulted = [(p.time, p.node) for p in sim.placements
                            if p.training and p.started_by not in NOT_THE_STACK and p.health != "healthy"]
        holds = repo.cordons.worklist().holds
        return PlacementResult(
            **common, flow=self.flow, jobs=jobs,
            final_nodes=sorted(world.node_name(r.container_inst_id) for r in repo.jobs.get_ranks(job)
                               if r.attempt == job.attempt),
            instance_states={n: (i.state.value
                                 if (i := repo.instances.get_instance(sim.node(n).container_instance_id))
                                 else "MISSING") for n in names},
            ecs_status=ecs_status(world, names),
            fault_to_running=(restarted - self.fault_at) if restarted else None,
            stack_on_faulted=stack_on_faulted, eager_on_held=eager_on_held,
            spares=sorted(world.node_name(n) for n in placement.spares_of(holds)), spare_at_fault=self.spare,
            facts={**self.facts, "held_from": dict(self.held_from),
                   **({"taken": list(self.taker.taken)} if self.taker is not None else {})})


@dataclass
class TargetTaker:
    """Another team's scheduler that ignores the placement constraint and, once, starts its task
    on the node the stack's StartTask of a moved rank names (a node of none of ``kept``, the
    job's own), just before that call meets ECS: the race a reservation cannot close. Its call
    goes through the handlers' session with the campaigns' counting paused (not the stack's)."""

    sim: SimulatedEcs
    kept: tuple[str, ...]
    taken: list[str] = field(default_factory=list)  # the node it took (once)
    _task_definition: str = ""

    def attach(self) -> TargetTaker:
        with self.sim.local.call_faults.paused():
            self._task_definition = self.sim.register_training_task_definition("other-team", gpus=8)
            self.sim.plan_family("other-team", run_seconds=EAGER_SECONDS, exit_code=0)
        self.sim.local.hooks.on_before_call("ecs", "StartTask", self._before_start_task, first=True)
        return self

    def _before_start_task(self, params: dict[str, Any], context: dict[str, Any]) -> None:
        if self.taken or not str(params.get("startedBy", "")).startswith("gpurec-"):
            return
        names = [self.sim.node(str(ref)).name for ref in params.get("containerInstances") or []]
        target = next((n for n in names if n not in self.kept), None)
        if target is None:
            return
        self.taken.append(target)
        with self.sim.local.call_faults.paused():
            self.sim.start_job("other-team", self._task_definition, [target], started_by="other-team")


def _waiting(world: World) -> bool:
    job = world.repo.jobs.get_job(JOB_ID)
    return job is not None and job.relocation_wait is not None


def run(flow: str, fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> PlacementResult:
    """The flow, with ``fault`` (n-th call once armed, mode) broken once (None: unbroken)."""
    return run_flow(PlacementScenario(flow), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)
