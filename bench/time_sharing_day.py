"""Time sharing, (b) a simulated day of mixed-priority load (``bench.time_sharing_bench``).

**A simulated day** on 64 nodes of 8 GPUs: a pure discrete-event simulation in which
every scheduling decision is made by the scheduler's own policy code: ``TickPlanner``
(``queue/planner.py``: quota, gang admission, victims via ``choose_victims``),
``QuotaBook`` and ``demotion_due``, one tick per simulated minute with the scan limits
of ``SchedulerConfig``. No DynamoDB: the emulator tests cover the persistence (quota
charges in the launch transaction, releases, crash consistency). Workload (seeded):
several users with per-level node quotas, Poisson arrivals per priority, 1..16 nodes,
minutes to hours of work; a preempted job is told within a poll and either saves a
checkpoint and calls ``go_suspend()`` (most) or is stopped by force at the end of its
grace (its work since its last periodic checkpoint is lost); it goes back to the queue
at its original position and resumes its remaining work. At every tick the simulation
asserts that no user holds more nodes at a level than their quota, and that no node
holds more GPUs than it has.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.stats import quantiles
from gpu_recovery.constants import queue_order
from gpu_recovery.domain.time_sharing import (
    DEFAULT_DEMOTE_AFTER_SECONDS,
    DEFAULT_SUSPEND_GRACE_SECONDS,
    Priority,
    QuotaBook,
    QuotaEntry,
    RunningGang,
    demotion_due,
    priority_name,
)
from gpu_recovery.queue.admission import Node
from gpu_recovery.queue.planner import QueuedJob, StepKind, TickPlanner
from gpu_recovery.settings import SchedulerConfig

MIN = 60
HOUR = 3600
LOW, NORMAL, ABOVE, HIGH = (int(p) for p in (Priority.LOW, Priority.NORMAL, Priority.ABOVE_NORMAL,
                                               Priority.HIGH))
STOP_SECONDS = 10.0  # StopTask -> STOPPED (SIGTERM; the training process exits), as in the emulator
POLL_SECONDS = 2.0  # the client's poll: rank 0 is told within one


@dataclass(frozen=True)
class DayConfig:
    nodes: int = 64
    gpus_per_node: int = 8
    hours: float = 24.0
    seed: int = 20261120
    users: tuple[str, ...] = ("ana", "ben", "chen", "dev", "eli", "fay")
    # Node quota per user at each level (levels absent: unlimited).
    quotas: tuple[tuple[int, int], ...] = ((HIGH, 8), (ABOVE, 16), (NORMAL, 32), (LOW, 48))
    # Poisson arrivals per hour at each level.
    arrivals_per_hour: tuple[tuple[int, float], ...] = ((HIGH, 1.0), (ABOVE, 1.5), (NORMAL, 4.0),
                                                        (LOW, 4.5))
    # Job sizes (nodes) and their weights; a job never asks more than its user's quota.
    sizes: tuple[tuple[int, float], ...] = ((1, 0.30), (2, 0.20), (4, 0.20), (8, 0.20), (16, 0.10))
    median_work_minutes: float = 60.0
    min_work_minutes: float = 5.0
    max_work_minutes: float = 8 * 60.0
    quick_share: float = 0.75  # victims that checkpoint and call go_suspend(); the rest are forced
    checkpoint_seconds: tuple[float, float] = (5.0, 45.0)  # a quick victim's checkpoint, uniform
    periodic_checkpoint_seconds: float = 15 * MIN  # what a forced victim keeps: its last periodic save
    grace_seconds: int = DEFAULT_SUSPEND_GRACE_SECONDS
    demote_after_seconds: int = DEFAULT_DEMOTE_AFTER_SECONDS
    drain_hours: float = 48.0  # after the day: no arrivals, run until every job ended


@dataclass
class DayJob:
    job_id: str
    user: str
    priority: int  # current (ABOVE_NORMAL drops to NORMAL)
    submitted_priority: int
    nnodes: int
    work: float  # seconds of work in all
    submitted_at: float
    quick: bool  # answers a suspend with a checkpoint and go_suspend()
    state: str = "QUEUED"  # QUEUED RUNNING SUSPENDING SUSPENDED COMPLETE
    done: float = 0.0  # seconds of work saved (checkpoints)
    nodes: tuple[str, ...] = ()
    charged: tuple[str, int, int] | None = None  # (user, level, nodes) of its quota charge
    started_at: float = 0.0  # of the current attempt
    first_start: float | None = None
    end_at: float = math.inf  # when its current attempt finishes its work
    stop_at: float = math.inf  # SUSPENDING: when its ranks have stopped
    saved_at_stop: float = 0.0  # SUSPENDING: work it will have saved when stopped
    decided_at: float = 0.0
    preempted_for: str = ""
    suspends: int = 0
    forced: int = 0
    resumes: int = 0
    demoted: bool = False
    forced_now: bool = False  # SUSPENDING: will be stopped by force
    quota_waits: int = 0
    suspended_seconds: float = 0.0  # SUSPENDED, waiting to be resumed
    suspended_since: float = 0.0
    completed_at: float | None = None

    @property
    def order(self) -> str:
        return queue_order(self.priority, self.submitted_at, self.job_id)


@dataclass
class DayResult:
    config: DayConfig
    jobs: list[DayJob]
    refused: int
    ticks: int
    quota_checks: int
    preemptions: int  # PREEMPT steps (a blocked job asked victims to suspend)
    suspends: int  # victims suspended (every rank stopped)
    forced: int  # of which stopped by force at the end of the grace
    resumes: int
    demotions: int
    quota_steps: int  # QUOTA steps (a job's offer refused by its user's quota)
    held_node_seconds: float  # within the day
    useful_node_seconds: float  # work kept: finished, or saved by a checkpoint before a suspend
    lost_node_seconds: float  # work done since the last save of forced victims
    preemptor_wait: list[float] = field(default_factory=list)  # decision -> preemptor started
    max_held: dict[str, int] = field(default_factory=dict)
    wall_seconds: float = 0.0

    @property
    def available_node_seconds(self) -> float:
        return self.config.nodes * self.config.hours * HOUR

    def waits(self) -> dict[str, dict[str, float | None]]:
        """Minutes from submit to first start, per submitted priority."""
        out: dict[str, dict[str, float | None]] = {}
        for level in sorted({j.submitted_priority for j in self.jobs}, reverse=True):
            waits = [(j.first_start - j.submitted_at) / MIN for j in self.jobs
                     if j.submitted_priority == level and j.first_start is not None]
            out[priority_name(level)] = quantiles(waits)
        return out


class QuotaExceeded(AssertionError):
    pass


def _workload(config: DayConfig, rng: random.Random) -> list[DayJob]:
    limits = dict(config.quotas)
    sizes, weights = zip(*config.sizes, strict=True)
    sigma = 1.0
    jobs: list[DayJob] = []
    for level, rate in config.arrivals_per_hour:
        t = 0.0
        while True:
            t += rng.expovariate(rate / HOUR)
            if t >= config.hours * HOUR:
                break
            nnodes = rng.choices(sizes, weights)[0]
            cap = limits.get(level)
            if cap is not None:
                nnodes = min(nnodes, cap)  # users ask for what their quota allows
            minutes = rng.lognormvariate(math.log(config.median_work_minutes), sigma)
            minutes = min(config.max_work_minutes, max(config.min_work_minutes, minutes))
            jobs.append(DayJob(job_id="", user=rng.choice(config.users), priority=level,
                               submitted_priority=level, nnodes=min(nnodes, config.nodes),
                               work=round(minutes * MIN), submitted_at=round(t, 3),
                               quick=rng.random() < config.quick_share))
    jobs.sort(key=lambda j: (j.submitted_at, -j.priority))
    for i, job in enumerate(jobs):
        job.job_id = f"j{i:05d}"
    return jobs


class DaySimulation:
    """The cluster, the queue and the quota table of the day, driven tick by tick."""

    def __init__(self, config: DayConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.node_ids = [f"n{i:03d}" for i in range(config.nodes)]
        self.free = {n: config.gpus_per_node for n in self.node_ids}
        self.limits = {(u, level): nodes for u in config.users for level, nodes in config.quotas}
        self.used: dict[tuple[str, int], int] = {}
        self.jobs = _workload(config, self.rng)
        self.by_id = {j.job_id: j for j in self.jobs}
        self.arrivals = list(self.jobs)
        self.arrivals.reverse()  # popped from the end, earliest first
        self.waiting: list[tuple[str, str]] = []  # heap of (queue order, job id)
        self.holding: dict[str, DayJob] = {}  # RUNNING and SUSPENDING
        self.released: list[DayJob] = []  # stopped holding since the last tick (charge to release)
        self.counters = {"preemptions": 0, "suspends": 0, "forced": 0, "resumes": 0, "demotions": 0,
                         "quota_steps": 0, "ticks": 0, "quota_checks": 0, "refused": 0}
        self.held_seconds = 0.0
        self.useful_seconds = 0.0
        self.lost_seconds = 0.0
        self.preemptor_wait: list[float] = []
        self._preempted_at: dict[str, float] = {}  # preemptor -> its first decision
        self.max_held: dict[str, int] = {}
        scheduler = SchedulerConfig()
        self.max_admissions = scheduler.max_admissions
        self.max_unplaced = scheduler.max_unplaced

    # ----------------------------------------------------------- accounting
    def _within_day(self, start: float, end: float) -> float:
        return max(0.0, min(end, self.config.hours * HOUR) - max(0.0, start))

    def _stop_holding(self, job: DayJob, at: float, *, useful_until: float) -> None:
        """``useful_until``: the end of the work this attempt contributed (saved or finished)."""
        self.held_seconds += job.nnodes * self._within_day(job.started_at, at)
        self.useful_seconds += job.nnodes * self._within_day(job.started_at, useful_until)
        for node in job.nodes:
            self.free[node] += self.config.gpus_per_node
        job.nodes = ()
        del self.holding[job.job_id]
        self.released.append(job)

    # ----------------------------------------------------------- events
    def advance(self, until: float) -> None:
        """Jobs that end or finish suspending before ``until``, in time order."""
        while True:
            due = [(min(j.end_at, j.stop_at), j.job_id) for j in self.holding.values()]
            if not due:
                return
            at, job_id = min(due)
            if at > until:
                return
            job = self.holding[job_id]
            if job.end_at <= job.stop_at:  # the work ended first (during a grace too)
                job.state = "COMPLETE"
                job.completed_at = job.end_at
                job.done = job.work
                self._stop_holding(job, job.end_at, useful_until=job.end_at)
            else:
                self._suspended(job)

    def _suspended(self, job: DayJob) -> None:
        at = job.stop_at
        saved = job.saved_at_stop
        saved_until = job.started_at + (saved - job.done)
        if job.forced_now:  # it trained on until stopped: what it did since its last save is lost
            self.lost_seconds += job.nnodes * self._within_day(saved_until, at)
        self._stop_holding(job, at, useful_until=saved_until)
        job.done = saved
        job.forced_now = False
        job.state = "SUSPENDED"
        job.suspends += 1
        job.suspended_since = at
        job.stop_at = math.inf
        job.end_at = math.inf
        job.preempted_for = ""
        self.counters["suspends"] += 1
        heapq.heappush(self.waiting, (job.order, job.job_id))  # its original position

    # ------------------------------------------------------------- tick
    def tick(self, now: float) -> None:
        self.counters["ticks"] += 1
        # Housekeeping, as the scheduler's: release the charges of jobs that stopped
        # holding nodes; demote ABOVE_NORMAL jobs that ran long enough.
        for job in self.released:
            if job.charged is not None:
                user, level, nodes = job.charged
                self.used[(user, level)] -= nodes
                job.charged = None
        self.released = []
        for job in self.holding.values():
            if job.state == "RUNNING" and demotion_due(job.priority, job.started_at, now,
                                                       self.config.demote_after_seconds):
                job.priority = NORMAL
                job.demoted = True
                self.counters["demotions"] += 1
        while self.arrivals and self.arrivals[-1].submitted_at <= now:
            self._submit(self.arrivals.pop())
        self._plan(now)
        self._check(now)

    def _submit(self, job: DayJob) -> None:
        book = self._book()
        if book.never_fits(job.user, job.priority, job.nnodes):
            job.state = "REFUSED"  # the jobs API answers 400
            self.counters["refused"] += 1
            return
        heapq.heappush(self.waiting, (job.order, job.job_id))

    def _book(self) -> QuotaBook:
        def load(user: str, level: int) -> QuotaEntry | None:
            return QuotaEntry(self.limits.get((user, level)), self.used.get((user, level), 0))
        return QuotaBook({}, load)

    def _running(self, below: int) -> list[RunningGang]:
        """What ``queue.time_sharing.TimeSharing.running_gangs`` returns."""
        gangs = []
        for job in self.holding.values():
            if job.state == "RUNNING" and job.priority < below:
                preempted_for = ""
            elif job.state == "SUSPENDING" and job.preempted_for:
                preempted_for = job.preempted_for
            else:
                continue
            footprint = {n: self.config.gpus_per_node for n in job.nodes}
            gangs.append(RunningGang(job.job_id, job.user, job.priority, job.started_at, footprint,
                                     preempted_for))
        return gangs

    def _plan(self, now: float) -> None:
        nodes = {n: Node(n, self.free[n], self.config.gpus_per_node) for n in self.node_ids}
        planner = TickPlanner(nodes, self._book(), self._running, preemption=True)
        admitted: list[DayJob] = []
        unplaced = 0
        kept: list[tuple[str, str]] = []
        while self.waiting:
            _, job_id = heapq.heappop(self.waiting)
            job = self.by_id[job_id]
            kept.append((job.order, job_id))
            step = planner.offer(QueuedJob(job_id, job.user, job.priority, job.nnodes,
                                           self.config.gpus_per_node))
            if step.kind is StepKind.ADMIT:
                kept.pop()
                admitted.append(job)
                self._start(job, step.nodes, now)
            else:
                unplaced += 1
                if step.kind is StepKind.QUOTA:
                    self.counters["quota_steps"] += 1
                    job.quota_waits += 1
                elif step.kind is StepKind.PREEMPT:
                    self.counters["preemptions"] += 1
                    self._preempted_at.setdefault(job_id, now)
                    for victim in step.victims:
                        self._suspend(self.holding[victim], job_id, now)
            # The scheduler's scan limits (QueueScheduler._should_stop).
            if planner.exhausted or unplaced >= self.max_unplaced or len(admitted) >= self.max_admissions:
                break
        for entry in kept:
            heapq.heappush(self.waiting, entry)

    def _start(self, job: DayJob, nodes: Sequence[str], now: float) -> None:
        for node in nodes:
            self.free[node] -= self.config.gpus_per_node
            if self.free[node] < 0:
                raise AssertionError(f"node {node} over-allocated at {now}")
        if job.state == "SUSPENDED":
            job.resumes += 1
            job.suspended_seconds += now - job.suspended_since
            self.counters["resumes"] += 1
        job.state = "RUNNING"
        job.nodes = tuple(nodes)
        job.started_at = now
        job.decided_at = 0.0
        job.end_at = now + (job.work - job.done)
        job.charged = (job.user, job.priority, job.nnodes)
        self.used[(job.user, job.priority)] = self.used.get((job.user, job.priority), 0) + job.nnodes
        if job.first_start is None:
            job.first_start = now
        if job.job_id in self._preempted_at:
            self.preemptor_wait.append(now - self._preempted_at.pop(job.job_id))
        self.holding[job.job_id] = job

    def _suspend(self, job: DayJob, preemptor: str, now: float) -> None:
        """RUNNING -> SUSPENDING: rank 0 is told within a poll; a quick job checkpoints and
        calls go_suspend(); the others are stopped by the recovery sweep (every minute)
        once their grace is over."""
        job.state = "SUSPENDING"
        job.preempted_for = preemptor
        job.decided_at = now
        told = now + self.rng.uniform(0, POLL_SECONDS)
        if job.quick:
            checkpoint = told + self.rng.uniform(*self.config.checkpoint_seconds)
            job.saved_at_stop = min(job.work, job.done + (checkpoint - job.started_at))
            job.stop_at = checkpoint + STOP_SECONDS
        else:
            deadline = now + self.config.grace_seconds
            sweep = math.ceil(deadline / MIN) * MIN
            period = self.config.periodic_checkpoint_seconds
            job.stop_at = sweep + STOP_SECONDS
            progress = job.done + (job.stop_at - job.started_at)
            job.saved_at_stop = min(job.work, max(job.done, math.floor(progress / period) * period))
            job.forced += 1
            job.forced_now = True
            self.counters["forced"] += 1

    # ------------------------------------------------------------ invariants
    def _check(self, now: float) -> None:
        """No user holds more nodes at a level than their quota; no node over-allocated."""
        held: dict[tuple[str, int], int] = {}
        for job in self.holding.values():
            assert job.charged is not None
            user, level, nodes = job.charged
            held[(user, level)] = held.get((user, level), 0) + nodes
        for (user, level), nodes in held.items():
            limit = self.limits.get((user, level))
            key = f"{user} {priority_name(level)}"
            self.max_held[key] = max(self.max_held.get(key, 0), nodes)
            if limit is not None and nodes > limit:
                raise QuotaExceeded(f"at {now / HOUR:.2f} h {user} holds {nodes} node(s) at "
                                    f"{priority_name(level)} (quota {limit})")
        if any(gpus < 0 for gpus in self.free.values()):
            raise AssertionError(f"a node is over-allocated at {now}")
        self.counters["quota_checks"] += 1

    # ---------------------------------------------------------------- run
    def run(self) -> DayResult:
        started = time.perf_counter()
        end = (self.config.hours + self.config.drain_hours) * HOUR
        now = 0.0
        while now <= end:
            self.advance(now)
            self.tick(now)
            if now >= self.config.hours * HOUR and not (self.holding or self.waiting or self.arrivals):
                break
            now += MIN
        c = self.counters
        return DayResult(
            config=self.config, jobs=self.jobs, refused=c["refused"], ticks=c["ticks"],
            quota_checks=c["quota_checks"], preemptions=c["preemptions"], suspends=c["suspends"],
            forced=c["forced"], resumes=c["resumes"], demotions=c["demotions"], quota_steps=c["quota_steps"],
            held_node_seconds=self.held_seconds, useful_node_seconds=self.useful_seconds,
            lost_node_seconds=self.lost_seconds, preemptor_wait=self.preemptor_wait,
            max_held=dict(sorted(self.max_held.items())), wall_seconds=time.perf_counter() - started)


def simulate_day(config: DayConfig | None = None) -> DayResult:
    return DaySimulation(config or DayConfig()).run()


def day_summary(result: DayResult) -> dict[str, Any]:
    jobs = [j for j in result.jobs if j.state != "REFUSED"]
    by_level: dict[str, int] = {}
    for job in jobs:
        name = priority_name(job.submitted_priority)
        by_level[name] = by_level.get(name, 0) + 1
    suspended = [j for j in jobs if j.suspends]
    return {
        "nodes": result.config.nodes, "hours": result.config.hours, "seed": result.config.seed,
        "jobs": len(jobs), "jobs_by_priority": by_level, "refused_at_submit": result.refused,
        "completed": sum(1 for j in jobs if j.state == "COMPLETE"),
        "utilisation_held": round(result.held_node_seconds / result.available_node_seconds, 4),
        "utilisation_useful": round(result.useful_node_seconds / result.available_node_seconds, 4),
        "lost_node_hours": round(result.lost_node_seconds / HOUR, 1),
        "wait_minutes": result.waits(),
        "preemptions": result.preemptions, "suspends": result.suspends, "forced_suspends": result.forced,
        "resumes": result.resumes, "jobs_suspended": len(suspended),
        "suspended_minutes": quantiles([j.suspended_seconds / MIN for j in suspended]),
        "preemptor_wait_minutes": quantiles([w / MIN for w in result.preemptor_wait]),
        "demotions": result.demotions, "quota_steps": result.quota_steps,
        "jobs_that_waited_on_quota": sum(1 for j in jobs if j.quota_waits),
        "ticks": result.ticks, "quota_checks": result.quota_checks,
        # Every tick asserted it (QuotaExceeded otherwise): true once at least one tick ran.
        "quota_never_exceeded": result.quota_checks > 0,
        "max_nodes_held_per_user_level": result.max_held, "wall_seconds": round(result.wall_seconds, 1),
    }


def print_day(summary: dict[str, Any], config: DayConfig) -> None:
    def minutes(q: dict[str, Any], key: str) -> str:
        return "-" if q[key] is None else f"{q[key]:.0f}"

    print("\n(b) A simulated day: the scheduler's policy code (TickPlanner + QuotaBook + choose_victims,")
    print("    demotion_due) makes every decision, one tick per simulated minute, without DynamoDB")
    print("    (the emulator tests cover the persistence: charges in the launch transaction, releases,")
    print("    crash consistency)")
    quotas = ", ".join(f"{priority_name(level)} {nodes}" for level, nodes in config.quotas)
    rates = ", ".join(f"{priority_name(level)} {rate}/h" for level, rate in config.arrivals_per_hour)
    print(f"  {config.nodes} nodes x {config.gpus_per_node} GPUs, {config.hours:.0f} h, seed {config.seed}; "
          f"{len(config.users)} users, node quota per user: {quotas}")
    print(f"  arrivals (Poisson): {rates}; sizes 1..16 nodes; work {config.min_work_minutes:.0f} min.."
          f"{config.max_work_minutes / 60:.0f} h (lognormal, median {config.median_work_minutes:.0f} min)")
    print(f"  victims: {config.quick_share:.0%} checkpoint and call go_suspend() within "
          f"{config.checkpoint_seconds[0]:.0f}..{config.checkpoint_seconds[1]:.0f} s, the rest are forced "
          f"after their {config.grace_seconds} s grace (work since their last "
          f"{config.periodic_checkpoint_seconds / 60:.0f}-min checkpoint lost)")
    print(f"  jobs: {summary['jobs']} {summary['jobs_by_priority']}, refused at submit (larger than a "
          f"quota): {summary['refused_at_submit']}, completed: {summary['completed']}")
    print(f"  utilisation: {summary['utilisation_held']:.1%} of node-hours held by jobs; "
          f"{summary['utilisation_useful']:.1%} useful (work finished or saved); "
          f"{summary['lost_node_hours']} node-hours of work lost to forced suspends")
    print("  wait from submit to first start (minutes; a submit waits for the next minute's tick here, the "
          "API's immediate trigger is not modelled):")
    for level, q in summary["wait_minutes"].items():
        print(f"    {level:<13} n={q['n']:<4} p50 {minutes(q, 'p50'):>5}  p95 {minutes(q, 'p95'):>5}  "
              f"mean {minutes(q, 'mean'):>5}")
    pw, sm = summary["preemptor_wait_minutes"], summary["suspended_minutes"]
    print(f"  preemptions: {summary['preemptions']} (preemption decision -> preemptor started: p50 "
          f"{minutes(pw, 'p50')} min, max {minutes(pw, 'max')} min)")
    print(f"  suspends: {summary['suspends']} ({summary['forced_suspends']} forced at the grace) of "
          f"{summary['jobs_suspended']} jobs; resumes: {summary['resumes']}; time suspended before "
          f"resuming: p50 {minutes(sm, 'p50')} min, p95 {minutes(sm, 'p95')} min")
    print(f"  ABOVE_NORMAL demotions after {config.demote_after_seconds // 60} min: {summary['demotions']}")
    print(f"  offers refused by a quota: {summary['quota_steps']} ({summary['jobs_that_waited_on_quota']} "
          "jobs waited on their quota at least once)")
    if summary["quota_checks"]:  # _check raised (the day did not finish) if any tick found one
        most = max(summary["max_nodes_held_per_user_level"].values(), default=0)
        print(f"  quota never exceeded: yes (asserted at each of {summary['quota_checks']} ticks; the most "
              f"one user held at one level: {most} nodes)")
    print(f"  [{summary['wall_seconds']} s wall]")
