"""Soak: a busy cluster for hours with a share of every AWS call failing at random.

The crash campaigns break one call of one flow at a time; this breaks calls the way AWS
fails under load (a small share of them, throttled past botocore's retries or executed
with the answer lost), over many jobs and faults at once, for hours of simulated time:

* ``nodes`` GPU nodes; ``jobs`` tagged jobs of 1-4 ranks (one per node), launched by a
  user's own scheduler (StartTask with the ``gpu-recovery:*`` tags, on ACTIVE nodes
  without the placement attribute gpu-recovery.unavailable), each training for 20-80 minutes;
* faults during a share of the jobs: a GPU a reboot fixes (DCGM says reboot), a dead GPU
  (DCGM says replace), an application error (DCGM says healthy), XID 79 reported by the
  node agent (the fast path), each with the NCCL cascade; some jobs relocatable;
* every AWS call the handlers make broken with chance ``rate`` (seeded).

Once the calls stop failing, the soak settles; a STOPPED event of a RUNNING job's rank that
met an injected failure at each delivery (in the DLQ, its alarm fired) is redriven as the
runbook says (``runbook.redrive_lost_stops``, counted in ``redriven``).

Checked: every job ends (COMPLETE or FAILED) once faults stop (but one still in its first
training, started too late to finish by the end: ``still_training``); every FAILED job got an
e-mail naming it; the backstop invariant (every job neither RUNNING nor terminal is in
the deadline index) after every simulated minute; no job waits past its due time for long;
the breaker, if random faults tripped it, closed by itself by the end. ``python -m local_mode.soak --seed 3``.

A job that ended wrong is explained on stderr (its history, its nodes' timeline, the calls
broken meanwhile); ``--explain JOB`` explains any job so, with the stack's own log records
that name the job or one of its nodes (``--explain soak-017 --seed 6944 --rate 0.06``).
``--against 0`` runs each seed without failing calls first and lists (``failed_beyond_baseline``)
and explains the jobs the stack failed only with them: leads to read, as placement differs.

The tables are the in-memory DynamoDB (``LocalAws(dynamodb="memory")``, as in the crash
campaigns); ``--dynamodb moto`` runs the same soak on moto.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import random
import re
import sys
import warnings
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain.escalation import EscalationPolicy
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from gpu_recovery.repository import Repository

from .emulator import DYNAMODB_BACKENDS, LocalAws
from .invariants import forgotten_jobs, started_twice
from .runbook import redrive_lost_stops
from .sim.bus import EventBus
from .sim.ecs import SimulatedEcs
from .sim.wiring import SWEEP_SCHEDULE
from .world import World, build_world

MIN = 60
HOUR = 3600
FAULTS = ("reboot", "dead_gpu", "app_error", "xid79")
_INSTANCE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # the sim's


@dataclass
class SoakJob:
    job_id: str
    ranks: int
    train_seconds: float
    relocatable: bool
    app_restarts: int
    fault: str | None
    fault_after: float
    started_at: float | None = None


@dataclass
class SoakResult:
    seed: int
    rate: float
    jobs: int
    states: dict[str, int]
    calls: int
    broken: int
    problems: list[str] = field(default_factory=list)
    failed_without_email: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    # Jobs that failed on their own (a rank exited with a code that is not a suspected GPU
    # fault: no recovery, no e-mail), and which of those a reboot of their node killed (a node
    # the stack rebooted after the user's scheduler placed them on it: issue 29's placement
    # attribute keeps schedulers off such nodes).
    failed_on_their_own: list[str] = field(default_factory=list)
    killed_by_a_reboot: list[str] = field(default_factory=list)
    breaker_trips: int = 0
    dead_letters: int = 0
    redriven: int = 0  # lost STOPPED events of RUNNING jobs the DLQ runbook redrove
    still_training: list[str] = field(default_factory=list)  # started too late to finish by the end
    failed_by_the_stack: list[str] = field(default_factory=list)  # FAILED by a decision of the stack's
    #: with ``--against RATE``: those the same seed's run at RATE did not fail (None: not compared)
    failed_beyond_baseline: list[str] | None = None
    #: of the jobs failed beyond the baseline, those whose node the soak itself gave more
    #: reboot-fixable faults than the escalation's limit: replacing it was the policy, not a
    #: defect (the baseline placed the faults elsewhere); listed, not explained
    failed_by_repeat_faults: list[str] = field(default_factory=list)
    ended_wrong: list[str] = field(default_factory=list)  # explained on stderr (verbose)

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "rate": self.rate, "jobs": self.jobs, "states": self.states,
                "calls": self.calls, "broken": self.broken, "problems": self.problems,
                "breaker_trips": self.breaker_trips, "dead_letters": self.dead_letters,
                "redriven": self.redriven, "still_training": self.still_training,
                "failed_on_their_own": len(self.failed_on_their_own),
                "killed_by_a_reboot": self.killed_by_a_reboot,
                "failed_by_the_stack": len(self.failed_by_the_stack),
                **({} if self.failed_beyond_baseline is None
                   else {"failed_beyond_baseline": self.failed_beyond_baseline,
                         "failed_by_repeat_faults": self.failed_by_repeat_faults})}


@contextmanager
def _world(nodes: int, dynamodb: str) -> Iterator[World]:
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.CRITICAL)
    env = {C.ENV_RELOCATION_WAIT_SECONDS: "1800", "POWERTOOLS_LOG_LEVEL": "CRITICAL"}
    with build_world(duplicate_delivery=True, max_recovery_attempts=3, extra_env=env,
                     dynamodb=dynamodb) as world:
        for i in range(nodes):
            world.ecs.add_node(f"node-{i:02d}", gpus=8)
        yield world


def plan_jobs(rng: random.Random, count: int, hours: float, fault_share: float) -> list[SoakJob]:
    jobs = []
    for i in range(count):
        fault = rng.choice(FAULTS) if rng.random() < fault_share else None
        train = rng.uniform(20, 80) * MIN
        jobs.append(SoakJob(job_id=f"soak-{i:03d}", ranks=rng.choice((1, 2, 2, 3, 4)), train_seconds=train,
                            relocatable=rng.random() < 0.4, app_restarts=rng.choice((0, 1)), fault=fault,
                            fault_after=rng.uniform(2 * MIN, max(3 * MIN, train - 2 * MIN))))
    return jobs


class _UserScheduler:
    """The user's own scheduler: starts each job, in order, once enough nodes are free."""

    def __init__(self, local: LocalAws, sim: SimulatedEcs, jobs: list[SoakJob], rng: random.Random) -> None:
        self.local, self.sim, self.jobs, self.rng = local, sim, jobs, rng
        self.queue = list(jobs)

    def free_nodes(self) -> list[str]:
        ecs = self.local.client("ecs")
        arns = [n.container_instance_arn for n in self.sim.nodes.values()]
        described = ecs.describe_container_instances(cluster=self.local.cluster_name, containerInstances=arns)
        usable = set()
        for ci in described["containerInstances"]:
            # The documented constraint: attribute:gpu-recovery.unavailable !exists.
            unavailable = any(a.get("name") == UNAVAILABLE_ATTRIBUTE for a in ci.get("attributes") or [])
            if ci["status"] == "ACTIVE" and ci.get("agentConnected") and not unavailable:
                usable.add(ci["containerInstanceArn"])
        busy = {t.node for t in self.sim.running_tasks()}
        return [n.name for n in self.sim.nodes.values()
                if n.container_instance_arn in usable and n.name not in busy and n.agent_connected]

    def tick(self) -> None:
        while self.queue:
            job = self.queue[0]
            free = self.free_nodes()
            if len(free) < job.ranks:
                return
            nodes = self.rng.sample(free, job.ranks)
            tags = {C.TAG_MAX_APP_RESTARTS: str(job.app_restarts)}
            if job.relocatable:
                tags[C.TAG_RELOCATABLE] = "true"
            with self.local.call_faults.paused():
                # A family per job: its gang restarts train as long as its first start.
                family = f"train-{job.job_id}"
                task_definition = self.sim.register_training_task_definition(family, gpus=8)
                self.sim.plan_family(family, run_seconds=job.train_seconds, exit_code=0)
                try:
                    self.sim.start_job(job.job_id, task_definition, nodes, extra_tags=tags)
                except RuntimeError:
                    return  # placement refused: try again next minute
            self.queue.pop(0)
            job.started_at = self.sim.now()
            if job.fault is not None:
                self._plan_fault(job, nodes)

    def _plan_fault(self, job: SoakJob, nodes: list[str]) -> None:
        node = self.rng.choice(nodes)
        after = job.fault_after
        if job.fault == "reboot":
            self.sim.inject_gpu_fault(node, after=after, health="reboot_fixable", nccl_cascade=True)
        elif job.fault == "dead_gpu":
            self.sim.inject_gpu_fault(node, after=after, health="replace", nccl_cascade=True)
        elif job.fault == "app_error":
            self.sim.inject_gpu_fault(node, after=after, health="healthy", nccl_cascade=True)
        else:
            self.sim.inject_xid(node, 79, after=after, health="reboot_fixable", nccl_cascade=True,
                                crash_delay_seconds=10)


class _StackLog(logging.Handler):
    """The stack's log records (the ``gpu_recovery`` package's), each with its simulated time
    and its structured fields, kept to explain a job afterwards."""

    _STANDARD = {*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime"}

    def __init__(self, sim: SimulatedEcs) -> None:
        super().__init__(logging.INFO)
        self.sim, self.lines = sim, list[tuple[float, str]]()

    def emit(self, record: logging.LogRecord) -> None:
        fields = {k: v for k, v in record.__dict__.items() if k not in self._STANDARD}
        self.lines.append((self.sim.now(), f"{self.sim.clock.hms()} {record.levelname[0]} "
                           f"{record.name.rsplit('.', 1)[-1]}: {record.getMessage()} "
                           f"{json.dumps(fields, default=str)}"))


@contextmanager
def _stack_log(sim: SimulatedEcs, wanted: bool) -> Iterator[_StackLog | None]:
    if not wanted:
        yield None
        return
    handler, logger = _StackLog(sim), logging.getLogger("gpu_recovery")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root logger's handlers stay quiet, as without it
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def run_soak(*, seed: int = 1, nodes: int = 16, jobs: int = 40, hours: float = 9.0, rate: float = 0.01,
             fault_share: float = 0.35, settle_hours: float = 3.0, flaps_per_minute: float = 0.1,
             verbose: bool = False, dynamodb: str = "memory", explain: Sequence[str] = (),
             baseline_failed: Collection[str] | None = None) -> SoakResult:
    """``explain``: jobs explained on stderr at the end, with the stack's log records;
    ``baseline_failed``: the jobs the stack failed in a run of the same seed at another rate;
    those it fails here beyond them are listed (``failed_beyond_baseline``) and explained too."""
    rng = random.Random(seed)
    planned = plan_jobs(rng, jobs, hours, fault_share)
    keep_log = bool(explain) or baseline_failed is not None
    with _world(nodes, dynamodb) as world, _stack_log(world.ecs, keep_log) as stack_log:
        local, bus, sim = world.aws, world.bus, world.ecs
        scheduler = _UserScheduler(local, sim, planned, rng)
        repo = Repository(local.resource("dynamodb"), local.job_table, local.instance_table)
        local.call_faults.arm_random(rate, seed, record_sites=verbose)
        forgotten: dict[str, str] = {}
        end = sim.now() + hours * HOUR
        while sim.now() < end:
            if rng.random() < flaps_per_minute:  # an ECS agent reconnects, as it does several times an hour
                sim.disconnect_agent(rng.choice(sorted(sim.nodes)), after=rng.uniform(0, MIN),
                                     for_seconds=rng.uniform(5, 90))
            scheduler.tick()
            sim.run_for(MIN)
            for job_id, why in forgotten_jobs(repo, sim.now()).items():
                forgotten.setdefault(job_id, f"{sim.clock.hms()}: {why}")
        calls, broken = len(local.call_faults.calls), len(local.call_faults.broken)
        local.call_faults.disarm()
        settle_end = sim.now() + settle_hours * HOUR
        redriven: list[str] = []
        while sim.now() < settle_end:
            scheduler.tick()
            sim.run_for(MIN)
            if bus.dead_letters:  # the DLQ's alarm fired: the runbook's redrive
                jobs_now = {j.job_id: repo.jobs.get_job(j.job_id) for j in planned}
                redriven += redrive_lost_stops(world, jobs_now)
            for job_id, why in forgotten_jobs(repo, sim.now()).items():
                forgotten.setdefault(job_id, f"{sim.clock.hms()}: {why}")
            if not scheduler.queue and all(_terminal(repo, j.job_id) for j in planned):
                break
        result = _judge(local, bus, sim, repo, planned, seed, rate, calls, broken, forgotten, verbose)
        result.redriven = len(redriven)
        if baseline_failed is not None:
            beyond = [j for j in result.failed_by_the_stack if j not in baseline_failed]
            result.failed_by_repeat_faults = [j for j in beyond if _failed_by_repeat_faults(repo, sim, j)]
            result.failed_beyond_baseline = [j for j in beyond if j not in result.failed_by_repeat_faults]
        # Each job once: one that ended wrong, one asked for, one failed beyond the baseline.
        for job_id in dict.fromkeys([*result.ended_wrong, *explain, *(result.failed_beyond_baseline or ())]):
            _explain(local, sim, repo, job_id, stack_log.lines if stack_log else [])
        return result


def _still_training(planned: SoakJob, job: Job | None, now: float) -> bool:
    """Started so late that its first attempt's training has not had its time by the end (the
    cluster had no room for it sooner): running on, not stuck."""
    return (job is not None and job.state is JobState.RUNNING and job.attempt == 1
            and planned.started_at is not None and planned.started_at + planned.train_seconds > now)


def _failed_on_its_own(last_error: str) -> bool:
    """Failed by a rank's own exit with a code that is not a suspected GPU fault: the job's
    own failure, which the stack does not recover nor e-mail about (docs/recovery-loop.md)."""
    return bool(re.match(r"rank \d+ failed: exit code \d+", last_error or ""))


_CANNOT_FIX = re.compile(r"(\S+) has a GPU fault a reboot cannot fix")


def _failed_by_repeat_faults(repo: Repository, sim: SimulatedEcs, job_id: str) -> bool:
    """Failed because its node needed replacing, after the soak itself had given that node
    more reboot-fixable faults within the reboot window than the escalation allows reboots
    for (``domain.escalation``: a reboot does not fix it): the policy working, not a defect."""
    item = repo.jobs.get_job_item(job_id) or {}
    found = _CANNOT_FIX.match(str(item.get("last_error") or ""))
    name = next((n.name for n in sim.nodes.values() if found and n.container_instance_id == found[1]), None)
    if name is None or not item.get("history"):
        return False
    policy = EscalationPolicy()
    until = max(float(entry["at"]) for entry in item["history"])
    injected = [e for e in sim.timeline
                if e.kind == "fault" and e.text.split()[0] == name and "health: reboot_fixable)" in e.text
                and until - policy.reboot_window_seconds <= e.time <= until]
    return len(injected) > policy.reboots_before_replace


def _terminal(repo: Repository, job_id: str) -> bool:
    job = repo.jobs.get_job(job_id)
    return job is not None and job.state.is_terminal


def _judge(local: LocalAws, bus: EventBus, sim: SimulatedEcs, repo: Repository, planned: list[SoakJob],
           seed: int,
           rate: float, calls: int, broken: int, forgotten: dict[str, str], verbose: bool) -> SoakResult:
    states: dict[str, int] = {}
    unfinished, failed, own, killed, training = [], [], [], [], []
    for planned_job in planned:
        job = repo.jobs.get_job(planned_job.job_id)
        state = job.state.value if job is not None else "NEVER_STARTED"
        states[state] = states.get(state, 0) + 1
        if _still_training(planned_job, job, sim.now()):
            training.append(planned_job.job_id)
        elif job is None or not job.state.is_terminal:
            unfinished.append(f"{planned_job.job_id} {state} (fault {planned_job.fault})")
        elif job.state is JobState.FAILED and _failed_on_its_own(job.last_error):
            own.append(planned_job.job_id)
            if "rebooted" in job.last_error:
                killed.append(f"{planned_job.job_id}: {job.last_error[:120]}")
        elif job.state is JobState.FAILED:
            failed.append(planned_job.job_id)
    mailed = {n["attributes"].get("job_id") for n in local.notifications()}
    no_mail = [j for j in failed if j not in mailed]
    tripped = C.NotificationKind.BREAKER_TRIPPED.value
    trips = sum(1 for n in local.notifications()
                if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == tripped)
    dead = [d for d in bus.dead_letters if d.rule != SWEEP_SCHEDULE]
    result = SoakResult(seed=seed, rate=rate, jobs=len(planned), states=states, calls=calls, broken=broken,
                        failed_without_email=no_mail,
                        forgotten=sorted(f"{k} {v}" for k, v in forgotten.items()),
                        unfinished=unfinished, breaker_trips=trips, dead_letters=len(dead),
                        failed_on_their_own=own, killed_by_a_reboot=killed, still_training=training,
                        failed_by_the_stack=failed)
    if unfinished:
        result.problems.append(f"jobs never ended: {unfinished}")
    if no_mail:
        result.problems.append(f"FAILED without an e-mail: {no_mail}")
    if forgotten:
        result.problems.append(f"forgotten (neither RUNNING nor terminal, nothing due): {result.forgotten}")
    twice = started_twice(sim.placements)
    if twice:
        result.problems.append(f"tasks started twice (one startedBy, one node): {twice}")
    # Faults at random can put more nodes than the limit in one window (a small storm, by the
    # breaker's own rule): a trip is fine, a breaker still open once the faults stopped is not.
    breaker = repo.breaker.read() or {}
    if breaker.get("state", "closed") != "closed":
        why = breaker.get("needs_operator") or breaker.get("trip_reason")
        result.problems.append(f"the breaker tripped {trips} time(s) and is still {breaker.get('state')} "
                               f"at the end: {why}")
    if verbose:
        for d in dead:
            print(f"dead letter: {d.rule} {d.error}", file=sys.stderr)
        bad = {j.split()[0] for j in unfinished} | set(no_mail) | set(forgotten)
        result.ended_wrong = sorted(bad | {k.split(":")[0] for k in killed})
    return result


def _explain(local: LocalAws, sim: SimulatedEcs, repo: Repository, job_id: str,
             stack_log: Sequence[tuple[float, str]] = ()) -> None:
    """What happened to a job: its history, and from ten minutes before it to ten after, its
    nodes' timeline, the calls broken and the stack's log records (``stack_log``: when, what)
    that name it or one of its nodes."""
    item = repo.jobs.get_job_item(job_id) or {}
    out = sys.stderr
    if not item:
        print(f"=== {job_id}: no such job (the soak's jobs are soak-000 ...)", file=out)
        return
    print(f"=== {job_id}: {item.get('job_state')} attempt {item.get('attempt')} "
          f"error {str(item.get('last_error'))[:300]!r}", file=out)
    times = []
    for entry in item.get("history") or []:
        times.append(float(entry["at"]))
        print(f"  {sim.clock.hms(float(entry['at']))} {entry.get('from')} -> {entry.get('to')}: "
              f"{str(entry.get('reason'))[:200]}", file=out)
    job = repo.jobs.get_job(job_id)
    instances = {r.container_inst_id for r in repo.jobs.get_ranks(job)} if job else set()
    # and the nodes its history names (a relocation's target, a node its restart waited for)
    known = {n.container_instance_id for n in sim.nodes.values()}
    instances |= set(_INSTANCE_ID.findall(str(item.get("history") or ""))) & known
    nodes = {sim.node(i).name for i in instances}
    if times:
        first, last = min(times) - 600, max(times) + 600
        for entry in sim.timeline:
            if first <= entry.time <= last and entry.text.split()[0] in nodes:
                print(f"  {sim.clock.hms(entry.time)} {entry.text}", file=out)
        for call, mode in local.call_faults.broken:
            at = getattr(call, "at", None)
            if at is None or first <= at <= last:
                print(f"  broken {mode}: {call.service}.{call.operation} at {call.site} "
                      f"(t={at})", file=out)
        for at, line in stack_log:
            if first <= at <= last and (job_id in line or any(i in line for i in instances)):
                print(f"  log {line[:700]}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--hours", type=float, default=9.0)
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--dynamodb", choices=DYNAMODB_BACKENDS, default="memory",
                        help="the tables' backend (default: the in-memory store)")
    parser.add_argument("--explain", action="append", default=[], metavar="JOB",
                        help="explain this job on stderr at the end, with the stack's log records "
                             "that name it or its nodes (repeatable)")
    parser.add_argument("--against", type=float, metavar="RATE",
                        help="run each seed at RATE first (0: no call failing) and list and explain the "
                             "jobs the stack failed only at --rate (placement differs between the two runs: "
                             "a lead to read, not a verdict)")
    args = parser.parse_args(argv)
    bad = 0
    report = sys.stdout
    shape = {"nodes": args.nodes, "jobs": args.jobs, "hours": args.hours, "dynamodb": args.dynamodb}
    for seed in range(args.seed, args.seed + args.seeds):
        with contextlib.redirect_stdout(io.StringIO()):  # the handlers' structured logs and metrics
            baseline = None if args.against is None else run_soak(seed=seed, rate=args.against, **shape)
            result = run_soak(seed=seed, rate=args.rate, verbose=True, explain=args.explain,
                              baseline_failed=None if baseline is None else baseline.failed_by_the_stack,
                              **shape)
        print(json.dumps(result.as_dict()), file=report, flush=True)
        bad += bool(result.problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
