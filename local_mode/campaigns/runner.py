"""The one crash-campaign runner every flow plugs into.

A flow is a :class:`Scenario`: the world it needs, its set-up, what it starts once the
flow's calls are counted (the fault, the lost node, the preemption) and its own
expectations (a :class:`CampaignResult` subclass, whose ``expectations()`` lists what ended
wrong for that flow). :func:`run_flow` runs it with ``fault`` (``(n, mode)``: the n-th AWS
call the handlers make once the flow is armed, broken once as a throttle, a lost response
or, where its operation takes one, its documented failure shape; None: unbroken, every call
counted with its site) and checks what every flow owes: the
backstop invariant after every event (:class:`InvariantWatch`), nothing left pending, no
event in a DLQ, and **no false repair** (issue 49): no reboot, GPU reset, replacement,
quarantine or cordon longer than a check of a node whose simulated hardware was healthy
(``sim.repair_ledger``). Under :func:`calls_failing` every AWS call of the flow fails with a
chance instead (a throttle or a lost response, seeded), as ``make soak`` breaks them.
:func:`campaign` runs a flow unbroken, lists its positions and runs every broken position,
each forked from the unbroken run at the call it breaks
(``forked_runs.broken_runs``). ``catalog.RUNS`` names the flows.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from gpu_recovery import constants as C
from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import Job
from gpu_recovery.recovery.notices import RETRY_SECONDS as OUTBOX_RETRY_SECONDS
from gpu_recovery.repository import Repository

from ..emulator import LocalAws
from ..invariants import forgotten_jobs, forgotten_validations, started_twice
from ..runbook import redrive_lost_stops
from ..sim.broken_calls import FAULT_MODES, ApiCall, CallFaults, modes_of
from ..sim.bus import Delivery, EventBus
from ..sim.wiring import SWEEP_SCHEDULE
from ..world import HEARTBEAT_SWEEP_SCHEDULE, QUEUE_SCHEDULER_SCHEDULE, World, build_world

MIN = 60
#: the campaigns' DynamoDB (``LocalAws(dynamodb=...)``): the in-memory store, a run's calls and
#: outcome the same as on moto (tests/crash_consistency/test_fault_injection.py compares them)
DYNAMODB = "memory"
#: the deployed schedules: a scheduled run that still fails after its retries (the recovery
#: sweep's: Lambda's async retries, 1 and 2 minutes later) is redone by the next tick anyway,
#: so only the other dead letters are lost work
SCHEDULES = (SWEEP_SCHEDULE, HEARTBEAT_SWEEP_SCHEDULE, QUEUE_SCHEDULER_SCHEDULE)
#: after a flow ended: retries, the sweeps, the scheduler and the outbox settle this long
SETTLE_SECONDS = 3 * MIN


@dataclass(kw_only=True)
class CampaignResult:
    """What every flow's run gives; a flow's subclass adds what its expectations read."""

    fault: tuple[int, str] | None
    fired: ApiCall | None  # the call the fault broke (None: it never fired)
    calls: list[ApiCall]  # every call counted while armed
    stuck: list[str]  # items still holding a deadline after the flow ended
    dead_letters: int  # events that exhausted their retries (scheduled runs not counted)
    mails: list[tuple[str, str]]  # (event_kind, job or '-') of every e-mail sent
    forgotten: list[str]  # the backstop invariant broken after an event
    timeline: list[str] = field(default_factory=list)
    #: calls a function's role does not grant (the grants guard: what AWS would refuse)
    denied: list[str] = field(default_factory=list)
    #: repairs and holds of nodes whose simulated hardware was healthy (``sim.repair_ledger``)
    false_repairs: list[str] = field(default_factory=list)
    #: every repair and hold of the flow (for the figures)
    repairs: list[str] = field(default_factory=list)
    #: (rate, seed) when every call failed with that chance (``calls_failing``)
    failing: tuple[float, int] | None = None
    #: the calls ``calls_failing`` broke: "service.operation mode at site"
    broken: list[str] = field(default_factory=list)
    #: the second call broken (``then_breaking``), once it fired
    then_fired: ApiCall | None = None
    #: a second task of one startedBy on one node (``invariants.started_twice``)
    started_twice: list[str] = field(default_factory=list)
    #: the lost STOPPED events the DLQ runbook redrove (``redrive_lost_stops``)
    redriven: list[str] = field(default_factory=list)
    #: the e-mails that repeat an earlier one's notice (:func:`resent`)
    resent: list[tuple[str, str]] = field(default_factory=list)

    def expectations(self) -> list[str]:
        """What ended wrong for this flow (its own checks)."""
        return []

    def mail_problems(self, want: dict[tuple[str, str], tuple[int, int]]) -> list[str]:
        """``want``: (kind, job) -> (at least, at most) e-mails of that kind about that job. An
        e-mail is at least once: published, then its confirmation lost, it is sent again (once
        in a run that breaks one call: the bounds allow for it). With calls failing at random
        a notice can lose its confirmation more than once: its repeats (``resent``, by notice
        id) are not counted then, its distinct notices are."""
        problems = []
        for (kind, job), (low, high) in want.items():
            count = self.mails.count((kind, job))
            if self.failing is not None:
                count -= self.resent.count((kind, job))
            if not low <= count <= high:
                problems.append(f"{count} '{kind}' e-mail(s) about {job} (want {low}..{high})")
        return problems

    def problems(self) -> list[str]:
        """Everything that ended wrong (empty: the run ended exactly as it should)."""
        problems = self.expectations()
        if self.stuck:
            problems.append(f"still pending: {self.stuck}")
        if self.dead_letters:
            problems.append(f"{self.dead_letters} event(s) in a DLQ")
        if self.forgotten:
            problems.append(f"backstop invariant broken: {self.forgotten}")
        if self.denied:
            problems.append(f"calls their function's role does not grant: {sorted(set(self.denied))}")
        if self.started_twice:
            problems.append(f"tasks started twice: {self.started_twice}")
        if self.false_repairs:
            problems.append(f"{len(self.false_repairs)} false repair(s) of healthy nodes: "
                            f"{self.false_repairs}")
        return problems


R = TypeVar("R", bound=CampaignResult)


def known_flow(flow: str, flows: Collection[str]) -> str:
    """``flow``, one of a campaign's ``flows`` (a ValueError otherwise)."""
    if flow not in flows:
        raise ValueError(f"flow is one of {flows}")
    return flow


class Scenario(ABC, Generic[R]):
    """One flow: a scenario object per run (it may keep what its ``result`` reads)."""

    #: simulated seconds the flow has to end (its jobs terminal) before it is judged as it is
    run_limit_seconds: float = 60 * MIN
    #: once it ended, calls no longer broken: how long retries, sweeps and the outbox settle
    settle_seconds: float = SETTLE_SECONDS

    def world_options(self) -> dict[str, Any]:
        """``build_world`` options (``extra_env`` merged over the handlers' quiet logs)."""
        return {}

    def validating_nodes(self, world: World) -> list[str]:
        """Container instance ids the invariant watch also checks after every event: a node
        in validation after repair always has something due (none: not checked)."""
        return []

    @abstractmethod
    def set_up(self, world: World) -> list[str]:
        """The world before the flow (calls not counted); the jobs whose end ends the flow."""

    def start(self, world: World) -> None:
        """Once calls are counted: what the flow does (inject the fault, lose the node...)."""

    def each_minute(self, world: World, jobs: Mapping[str, Job | None]) -> None:
        """Once a simulated minute while the flow runs, with its jobs as they are."""

    def settled(self, world: World) -> bool:
        """Besides its jobs terminal, what else the flow waits for before it ends (a node's
        own check after its job failed: its calls counted and broken too)."""
        return True

    @abstractmethod
    def result(self, world: World, common: dict[str, Any]) -> R:
        """The flow's result: ``common`` holds :class:`CampaignResult`'s fields."""


#: (rate, seed) of :func:`calls_failing` while it is on (None: off)
_failing: list[tuple[float, int] | None] = [None]


@contextlib.contextmanager
def calls_failing(rate: float, seed: int) -> Iterator[None]:
    """Every flow run meanwhile without a ``fault`` has each of its AWS calls fail with chance
    ``rate`` (a throttle or a lost response, seeded: the same seed breaks the same calls), as
    AWS does under load (``CallFaults.arm_random``). Any flow: ``with calls_failing(0.01, 1):
    RUNS[flow](None)``."""
    if not 0 < rate <= 1:
        raise ValueError("rate is a chance, 0 < rate <= 1")
    before, _failing[0] = _failing[0], (rate, seed)
    try:
        yield
    finally:
        _failing[0] = before


#: the second fault of :func:`then_breaking` while it is on (a list: on, its one entry)
_then: list[tuple[int, str] | None] = []


@contextlib.contextmanager
def then_breaking(then: tuple[int, str] | None) -> Iterator[None]:
    """Every flow run meanwhile with a ``fault`` records its calls' sites and has ``then``
    (its index in that run, its mode) broken too: a call the recovery from the first fault
    makes, which an unbroken run never makes (None: the sites only, to choose it)."""
    before, _then[:] = list(_then), [then]
    try:
        yield
    finally:
        _then[:] = before


def after_first(run: Callable[[tuple[int, str] | None], Any], first: tuple[int, str],
                then: tuple[int, str] | None) -> Any:
    """``run(first)`` with ``then`` broken too (:func:`then_breaking`; None: only ``first``,
    every call's site recorded): a run from the start, or (then None) the driver that
    :func:`second_faults` forks."""
    with then_breaking(then):
        return run(first)


def second_faults(run: Callable[[tuple[int, str] | None], Any], first: tuple[int, str],
                  thens: Iterable[tuple[int, str]], *,
                  warm_up: Callable[[], Any] | None = None) -> dict[tuple[int, str], Any]:
    """``{then: after_first(run, first, then)}`` for every ``then`` (a later call, a mode) of
    ``thens``, each forked (``forked_runs.broken_runs``) from the run that breaks only ``first``
    at the call it breaks: up to that call the two runs are the same run (the first fault
    fired, the same calls counted, their sites recorded). The child breaks it as ``then`` from
    the start would have (``CallFaults.before_call``), so each run pays for its suffix; a
    position not forked is run from the start (``broken_runs``). ``run`` is picklable."""
    from .forked_runs import broken_runs

    chosen = sorted(set(thens))
    if any(n <= first[0] for n, _ in chosen):
        raise ValueError("the second broken call comes after the first")
    return broken_runs(partial(after_first, run, first), chosen, warm_up=warm_up)


def broken_after(run: Callable[[tuple[int, str] | None], Any], first: tuple[int, str],
                 calls: Iterable[ApiCall], *, warm_up: Callable[[], Any] | None = None) -> list[str]:
    """Each of ``calls`` (of the run that ``first`` broke) broken in turn in every mode its
    operation takes, after ``first`` (:func:`then_breaking`; each run forked at that call from
    the run that breaks only ``first``: :func:`second_faults`): what ended wrong, a line per
    call and mode (none: every run ended right). A run that raised or died ended wrong."""
    from .forked_runs import BrokenRunFailed

    calls = list(calls)
    runs = second_faults(run, first, ((call.index, then) for call in calls
                                      for then in modes_of(call.service, call.operation)), warm_up=warm_up)
    failures = []
    for call in calls:
        for then in modes_of(call.service, call.operation):
            result = runs[(call.index, then)]
            broke = f"{call.service}.{call.operation} ({call.index}, {call.site}) {then}"
            if isinstance(result, BrokenRunFailed):
                failures.append(f"{broke}: the run raised or died: {str(result)[-2000:]}")
            elif result.fired is None or result.then_fired is None:
                failures.append(f"{broke}: a fault never fired")
            elif (result.fault, result.fired.index, result.then_fired.index) != (first, first[0], call.index):
                failures.append(f"{broke}: broke {result.fault}, calls {result.fired.index} and "
                                f"{result.then_fired.index}")
            elif result.problems():
                failures.append(f"{broke}: {result.problems()}")
    return failures


def arm_fault(calls: CallFaults, fault: tuple[int, str] | None) -> None:
    """Count a flow's calls: unbroken (None), every call with its site; or ``fault`` broken
    and, within :func:`then_breaking`, its second call too, every call with its site."""
    if fault is None:
        calls.arm(None, record_sites=True)
    else:
        calls.arm(fault[0], fault[1], record_sites=bool(_then), then=_then[0] if _then else None)


def run_flow(scenario: Scenario[R], fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
             dynamodb: str = DYNAMODB) -> R:
    """``scenario`` with ``fault`` (n-th call once armed, mode) broken once (None: unbroken, or
    every call failing with a chance under :func:`calls_failing`)."""
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.CRITICAL)
    options = scenario.world_options()
    options["extra_env"] = {"POWERTOOLS_LOG_LEVEL": "CRITICAL", **options.get("extra_env", {})}
    with build_world(dynamodb=dynamodb, **options) as world:
        sim = world.ecs
        job_ids = scenario.set_up(world)
        repo = world.repo  # the emulator's own client: these reads are not the flow's calls
        watch = InvariantWatch(world.bus, repo, sim.now, job_ids, scenario.validating_nodes(world))
        calls = world.aws.call_faults
        failing = _failing[0] if fault is None else None
        if failing is not None:
            calls.arm_random(failing[0], failing[1], record_sites=True)
        else:
            arm_fault(calls, fault)
        sim.repairs.mark()  # what the set-up did is not the flow's
        placed_before = len(sim.placements)
        scenario.start(world)
        checked = [0.0]
        redriven: list[str] = []

        def ended() -> bool:  # read the jobs at most once a simulated minute
            if sim.now() < checked[0] + MIN:
                return False
            checked[0] = sim.now()
            jobs = {job_id: repo.jobs.get_job(job_id) for job_id in job_ids}
            if failing is not None:
                redriven.extend(redrive_lost_stops(world, jobs))
            scenario.each_minute(world, jobs)
            return (all(job is not None and job.state.is_terminal for job in jobs.values())
                    and scenario.settled(world))

        sim.run_until_true(ended, max_seconds=scenario.run_limit_seconds)
        calls.disarm()
        # With calls failing at random, a lost Publish leaves its e-mail owed for the outbox's
        # next try, RETRY_SECONDS later: the settle covers it.
        sim.run_for(scenario.settle_seconds if failing is None
                    else max(scenario.settle_seconds, OUTBOX_RETRY_SECONDS + MIN))
        common = {
            "fault": fault, "fired": calls.fired, "then_fired": calls.then_fired, "calls": list(calls.calls),
            "stuck": stuck_items(world, repo),
            "dead_letters": _dead_letters(world, failing),
            "mails": mails(world.aws), "resent": resent(world.aws), "forgotten": list(watch.broken),
            "timeline": sim.format_timeline() if keep_timeline else [],
            "denied": [str(d) for d in world.aws.grants.denials] if world.aws.grants is not None else [],
            "false_repairs": [str(r) for r in sim.repairs.false_repairs()],
            "started_twice": started_twice(sim.placements[placed_before:]),
            "repairs": [str(r) for r in sim.repairs.repairs()],
            "failing": failing,
            "broken": [f"{c.service}.{c.operation} {mode} at {c.site}" for c, mode in calls.broken],
            "redriven": redriven,
        }
        return scenario.result(world, common)


def _dead_letters(world: World, failing: tuple[float, int] | None) -> int:
    """Events that exhausted their retries (scheduled runs not counted). With calls failing at
    random, each of an event's three deliveries can meet an injected failure: AWS's DLQ is there
    for that, and the sweep finishes the event's work (a RUNNING job's STOPPED event: the
    runbook's redrive, ``runbook.redrive_lost_stops``), which the flow's own checks hold. Then
    only a dead letter whose last delivery failed otherwise (a defect, not the dice) counts."""
    letters = [d for d in world.bus.dead_letters if d.rule not in SCHEDULES]
    if failing is not None:
        letters = [d for d in letters if "(injected" not in str(d.error)]
    return len(letters)


def unfinished(job: Mapping[str, Any], label: str = "job") -> list[str]:
    """The problem of a job item that did not COMPLETE: its state and last error."""
    if job.get("job_state") == JobState.COMPLETE.value:
        return []
    return [f"{label} {job.get('job_state')}: {str(job.get('last_error'))[:200]}"]


def stuck_items(world: World, repo: Repository) -> list[str]:
    """Every instance and job item still holding a deadline (nodes by their simulated name)."""
    far = world.ecs.now() + 10**7
    stuck = [f"instance {world.node_name(i.container_inst_id)} {i.state.value}"
             for i in repo.deadlines.due_instances(far)]
    stuck += [f"job item {it.get('job_id_rank')} {it.get('job_state') or it.get('item_type')}"
              for it in repo.deadlines.due_job_items(far)]
    return stuck


def ecs_status(world: World, nodes: Iterable[str]) -> dict[str, str]:
    """ECS's status of each node (ACTIVE, DRAINING...), from the emulator's own record (not a
    DescribeContainerInstances: its serialization was a third of a large flow's result, paid
    by every broken run)."""
    return {name: world.ecs.container_instance_status(name) for name in nodes}


class InvariantWatch:
    """The backstop invariant (docs/recovery-loop.md), checked after every event the bus
    delivers: every job of ``job_ids`` that is neither RUNNING nor terminal has something
    due in the deadline index (or, queue-owned, is in the queue index). Reads through the
    emulator's own client: not the flow's calls, never broken."""

    def __init__(self, bus: EventBus, repo: Repository, clock: Callable[[], float],
                 job_ids: Iterable[str] = (), nodes: Iterable[str] = ()) -> None:
        self.repo = repo
        self.clock = clock
        self.job_ids = set(job_ids)
        self.nodes = set(nodes)  # also: each node in validation after repair has something due
        self.broken: list[str] = []
        self.checks = 0
        bus.observers.append(self._after)

    def watch(self, job_id: str) -> None:
        self.job_ids.add(job_id)

    def _after(self, delivery: Delivery) -> None:
        if not self.job_ids:
            return
        self.checks += 1
        now = self.clock()
        found = forgotten_jobs(self.repo, now, job_ids=self.job_ids)
        if self.nodes:
            found.update(forgotten_validations(self.repo, now, self.nodes))
        for job_id, why in sorted(found.items()):
            note = f"{job_id}: {why} (after {delivery.target} at t+{now % 86400:.0f})"
            if not any(b.startswith(f"{job_id}: {why}") for b in self.broken):
                self.broken.append(note)


def mails(local: LocalAws) -> list[tuple[str, str]]:
    """(event_kind, job id or '-') of every e-mail sent so far."""
    return [_mail(n) for n in local.notifications()]


def resent(local: LocalAws) -> list[tuple[str, str]]:
    """(event_kind, job id or '-') of every e-mail that repeats an earlier one's notice id:
    the same notice sent again after its confirmation was lost."""
    seen: set[str] = set()
    again = []
    for notification in local.notifications():
        notice_id = str(notification["attributes"].get(C.NOTICE_ID_ATTRIBUTE))
        if notice_id in seen:
            again.append(_mail(notification))
        seen.add(notice_id)
    return again


def _mail(notification: dict[str, Any]) -> tuple[str, str]:
    attributes = notification["attributes"]
    return str(attributes.get(C.NOTIFICATION_KIND_ATTRIBUTE)), str(attributes.get("job_id", "-"))


def sample_positions(calls: Sequence[ApiCall], *, sites: str = "", by: str = "site") -> list[int]:
    """The first call of each distinct call site (and API operation) of the flow: every
    place the loop talks to AWS is broken at least once (``sites``: only call sites whose
    name contains it). ``by="stage"``: the first call of each stage module and of each API
    operation (coarser: ``make test``'s quick tier)."""
    if by not in ("site", "stage"):
        raise ValueError(f"by must be 'site' or 'stage', not {by!r}")
    seen: set[tuple[str, ...]] = set()
    positions = []
    for call in calls:
        if sites not in call.site:
            continue
        if by == "site":
            keys: tuple[tuple[str, ...], ...] = ((call.site, call.service, call.operation),)
        else:
            keys = ((call.site.split(":")[0],), (call.service, call.operation))
        if any(key not in seen for key in keys):
            seen.update(keys)
            positions.append(call.index)
    return positions


@dataclass
class CampaignSummary:
    flow: str
    calls: int
    positions: int
    runs: int
    ended_right: int
    failures: list[tuple[tuple[int, str], ApiCall | None, list[str]]]
    #: false repairs (``CampaignResult.false_repairs``) of the unbroken run, and of all its runs
    false_repairs: int = 0
    false_repairs_broken: int = 0

    def as_dict(self) -> dict[str, Any]:
        failures = [{"fault": list(f), "call": f"{c.service}.{c.operation} at {c.site}" if c else None,
                     "problems": p} for f, c, p in self.failures]
        return {"flow": self.flow, "calls": self.calls, "positions": self.positions, "runs": self.runs,
                "ended_right": self.ended_right, "false_repairs": self.false_repairs,
                "false_repairs_broken_runs": self.false_repairs_broken, "failures": failures}


def positions_of(calls: Sequence[ApiCall], *, every_call: bool, by: str = "site") -> list[int]:
    """The positions to break: every call, or the sample (:func:`sample_positions`)."""
    return [call.index for call in calls] if every_call else sample_positions(calls, by=by)


def faults_at(calls: Sequence[ApiCall], positions: Iterable[int],
              modes: tuple[str, ...] | None = None) -> list[tuple[int, str]]:
    """Each position broken in each of ``modes``; by default throttled and its response lost,
    and, at the first call of each call site whose operation documents a failure shape, in
    that shape too (``broken_calls.modes_of``). A shape is read in one place per operation
    (the repository's batch reads and transactions, the ECS adapter, the log reader) and
    acted on by its call site: every call site meets it; the two fault models, every call."""
    by_index = {call.index: call for call in calls}
    first = frozenset(sample_positions(calls))  # the first call of each call site
    return [(n, mode) for n in positions for mode in (modes or _modes_at(by_index[n], first))]


def _modes_at(call: ApiCall, first_of_site: frozenset[int]) -> tuple[str, ...]:
    every = modes_of(call.service, call.operation)
    return every if call.index in first_of_site else every[:len(FAULT_MODES)]


def campaign(flow: str, run: Callable[[tuple[int, str] | None], Any], *, every_call: bool = False,
             positions: Sequence[int] | None = None, modes: tuple[str, ...] | None = None) -> CampaignSummary:
    """Run ``flow`` unbroken, list its positions (``positions``, else every call or the sample
    of ``every_call``) and break each in each mode (``modes``, by default every mode its call
    takes: ``faults_at``), each run forked from the unbroken one at the call it breaks. A run
    that raised, died, or whose fault never fired ended wrong."""
    from .forked_runs import BrokenRunFailed, broken_runs

    baseline = run(None)
    problems = baseline.problems()
    if problems:
        raise AssertionError(f"{flow}: the unbroken run itself failed: {problems}")
    chosen = list(positions) if positions is not None else positions_of(baseline.calls, every_call=every_call)
    runs = broken_runs(run, faults_at(baseline.calls, chosen, modes))
    failures: list[tuple[tuple[int, str], ApiCall | None, list[str]]] = []
    false_repairs = 0
    for fault, result in sorted(runs.items()):
        if isinstance(result, BrokenRunFailed):
            failures.append((fault, None, [str(result)[-2000:]]))
            continue
        false_repairs += len(result.false_repairs)
        wrong = result.problems() + ([] if result.fired else ["the fault never fired"])
        if wrong:
            failures.append((fault, result.fired, wrong))
    return CampaignSummary(flow, len(baseline.calls), len(chosen), len(runs), len(runs) - len(failures),
                           failures, false_repairs=len(baseline.false_repairs),
                           false_repairs_broken=false_repairs)
