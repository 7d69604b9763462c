"""Fault campaign: one GPU-fault recovery, broken at each of its AWS calls in turn.

The scenario: a 2-node job whose node-b GPU faults; NCCL kills rank 0 five seconds
later (the cascade); DCGM says node-b needs a reboot; the reboot fixes it; the job is
restarted as a gang and completes. Every event is delivered as EventBridge and
Lambda's asynchronous invocation would (a failed invocation retried twice, a minute
and two minutes later) and the sweep runs every minute.

``run_recovery(fault=(n, mode))`` breaks the n-th AWS call the handlers make after the
fault was injected, once: ``throttle`` (refused, not executed) or ``lost_response``
(executed, the caller never hears back). ``check(result)`` lists what ended wrong.
Used by the crash-consistency tests and by ``make bench``.

Three more scenarios break other flows the same way (``scenario=``):

* ``fast_path`` — node-b's GPU logs XID 79; the node agent reports it (``/v1/report_gpu``
  through the heartbeat service: its calls are in the flow, and a failed report is
  retried as the agent does) and the rank dies 10 s later: node-b is rebooted without a
  DCGM diag, exactly once, and the job restarts and completes;
* ``relocation`` — node-b's GPU dies (DCGM says replace): node-b is quarantined, never
  rebooted, and rank 1 of the relocatable job moves to the spare node-c, exactly once;
* ``spare_first`` — the same with a spare pool (``spare_nodes=1``): rank 1 moves to
  node-c before node-b's verdict, and node-b is still checked and quarantined;
* ``large`` — the GPU fault of ``gpu_fault`` in a 64-rank job (one rank per node): the gang
  is stopped and restarted through the fan-out queue (batches run by the gang worker),
  so the campaign breaks the batches' calls too.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.repository import Repository

from .ecs_sim import SimulatedEcs
from .emulator import LocalAws
from .event_bus import SWEEP_SCHEDULE, LambdaContext, LocalEventBus, wire_recovery_handlers
from .faults import FAULT_MODES, ApiCall

MIN = 60
JOB_ID = "campaign"
FAULTY, HEALTHY, SPARE = "node-b", "node-a", "node-c"
SCENARIOS = ("gpu_fault", "fast_path", "relocation", "spare_first", "large")
# Scenarios whose job moves rank 1 to the spare node-c (node-b quarantined).
RELOCATING = ("relocation", "spare_first")
LARGE_RANKS = 64
TRAIN_SECONDS = 8 * MIN
RUN_LIMIT_SECONDS = 90 * MIN


@dataclass
class RunResult:
    fault: tuple[int, str] | None
    fired: ApiCall | None
    calls: list[ApiCall]
    job_state: str
    attempt: int
    recoveries_used: int
    suspects: dict[str, str]
    health_checks: dict[str, int]  # node -> health-check tasks started on it
    reboots: dict[str, int]
    instance_states: dict[str, str]
    stuck: list[str]  # items still holding a deadline after the job ended
    dead_letters: int
    recovered_mails: int
    timeline: list[str] = field(default_factory=list)
    scenario: str = "gpu_fault"
    final_nodes: list[str] = field(default_factory=list)  # where the last attempt's ranks ran
    ecs_status: dict[str, str] = field(default_factory=dict)


def check(result: RunResult) -> list[str]:
    """Everything that ended wrong (empty: the run recovered exactly as it should)."""
    problems = []
    if result.job_state != JobState.COMPLETE.value or result.attempt != 2 or result.recoveries_used != 1:
        problems.append(f"job {result.job_state} attempt {result.attempt} "
                        f"recoveries {result.recoveries_used} (want COMPLETE, 2, 1)")
    relocation = result.scenario in RELOCATING
    want_reboots = {n: (1 if n == FAULTY and not relocation else 0) for n in result.reboots}
    if result.reboots != want_reboots:
        problems.append(f"reboots {result.reboots} (want {want_reboots})")
    for node, count in result.health_checks.items():
        suspect = node in result.suspects
        want = 1 if suspect and not (result.scenario == "fast_path" and node == FAULTY) else 0
        if count != want:
            problems.append(f"{count} health check(s) on {node} (suspect: {suspect}, want {want})")
    if FAULTY not in result.suspects:
        problems.append("the faulty node was never a suspect")
    want_states = {n: InstanceState.AVAILABLE.value for n in result.instance_states}
    if relocation:
        want_states[FAULTY] = InstanceState.QUARANTINED.value
        if result.ecs_status.get(FAULTY) != "DRAINING":
            problems.append(f"node-b is {result.ecs_status.get(FAULTY)} in ECS (want DRAINING)")
        if result.final_nodes != [HEALTHY, SPARE]:
            problems.append(f"ranks ended on {result.final_nodes} (want rank 1 moved to {SPARE})")
    if result.instance_states != want_states:
        problems.append(f"instances {result.instance_states} (want {want_states})")
    if result.stuck:
        problems.append(f"still pending: {result.stuck}")
    if result.dead_letters:
        problems.append(f"{result.dead_letters} event(s) in a DLQ")
    if result.recovered_mails > 1:
        problems.append(f"{result.recovered_mails} 'recovered' e-mails")
    return problems


@contextmanager
def _cluster(scenario: str = "gpu_fault") -> Iterator[tuple[LocalAws, LocalEventBus, SimulatedEcs]]:
    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.CRITICAL)
    env = {C.ENV_SPARE_NODES: "1"} if scenario == "spare_first" else {}
    with LocalAws(metrics_disabled=True, extra_env=env) as local:
        runtime.reset(clients=False)
        bus = LocalEventBus(duplicate_delivery=False)
        # A large gang's placements need no container-instance events (nothing reads them).
        sim = SimulatedEcs(local, bus, train_seconds=None,
                           instance_events_on_placement=scenario != "large")
        wire_recovery_handlers(bus, local.cluster_arn, sweep_every_seconds=60)
        try:
            yield local, bus, sim
        finally:
            runtime.reset(clients=False)


def run_recovery(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
                 scenario: str = "gpu_fault") -> RunResult:
    """The scenario, with ``fault`` (n-th call, mode) broken once (None: unbroken)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario is one of {SCENARIOS}")
    with _cluster(scenario) as (local, bus, sim):
        _start_job(sim, scenario)
        calls = local.call_faults
        if fault is None:
            calls.arm(None, record_sites=True)
        else:
            calls.arm(fault[0], fault[1])
        if scenario == "fast_path":
            sim.inject_xid(FAULTY, 79, after=MIN, health="reboot_fixable", nccl_cascade=True,
                           crash_delay_seconds=10)
        elif scenario in RELOCATING:
            sim.inject_gpu_fault(FAULTY, after=MIN, health="replace", nccl_cascade=True)
        else:
            sim.inject_gpu_fault(FAULTY, after=MIN, health="reboot_fixable", nccl_cascade=True)
        return _finish(local, bus, sim, fault, keep_timeline, scenario)


def run_reordered(order: tuple[str, ...], *, keep_timeline: bool = False) -> RunResult:
    """The scenario with the two ranks' STOPPED events held back, then delivered in
    ``order`` ("faulty" = rank 1's own GPU-fault exit, "peer" = rank 0's NCCL exit;
    repeat a name to deliver a duplicate)."""
    with _cluster() as (local, bus, sim):
        _start_job(sim)
        local.call_faults.arm(None)
        rule = next(r for r in bus.rules if r.name == "training-task-state")
        handler = rule.target
        held: dict[str, dict[str, Any]] = {}

        def hold(event: dict[str, Any], context: Any) -> dict[str, Any]:
            if event["detail"]["lastStatus"] != "STOPPED":
                return handler(event, context)
            node = sim.node(event["detail"]["containerInstanceArn"]).name
            held["faulty" if node == FAULTY else "peer"] = event
            return {"held": node}

        rule.target = hold
        sim.inject_gpu_fault(FAULTY, after=MIN, health="reboot_fixable", nccl_cascade=True)
        sim.run_until_true(lambda: len(held) == 2, max_seconds=5 * MIN)
        rule.target = handler
        for name in order:
            handler(copy.deepcopy(held[name]), LambdaContext(function_name="ecs_task_handler"))
        return _finish(local, bus, sim, None, keep_timeline)


def _start_job(sim: SimulatedEcs, scenario: str = "gpu_fault") -> None:
    for node in _nodes(scenario):
        sim.add_node(node, gpus=8)
    td = sim.register_training_task_definition("train", gpus=8)
    sim.plan_family("train", run_seconds=TRAIN_SECONDS, exit_code=0)
    tags = {C.TAG_RELOCATABLE: "true"} if scenario in RELOCATING else None
    ranks = list(_nodes(scenario)) if scenario == "large" else [HEALTHY, FAULTY]
    sim.start_job(JOB_ID, td, ranks, extra_tags=tags)
    sim.run_for(MIN)


def _nodes(scenario: str) -> tuple[str, ...]:
    if scenario == "large":
        return (HEALTHY, FAULTY, *(f"node-x{i:02d}" for i in range(LARGE_RANKS - 2)))
    return (HEALTHY, FAULTY, SPARE) if scenario in RELOCATING else (HEALTHY, FAULTY)


def _finish(local: LocalAws, bus: LocalEventBus, sim: SimulatedEcs, fault: tuple[int, str] | None,
            keep_timeline: bool, scenario: str = "gpu_fault") -> RunResult:
    # Inspect through the emulator's own client: these reads are not the flow's calls.
    repo = Repository(local.resource("dynamodb"), local.job_table, local.instance_table)

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
    sim.run_for(3 * MIN)  # let retries and the sweep settle
    job = repo.get_job(JOB_ID)
    assert job is not None
    nodes = _nodes(scenario)
    node_of = {sim.node(n).container_instance_id: n for n in nodes}
    final = sorted(node_of.get(r.container_inst_id, r.container_inst_id) for r in repo.get_ranks(job)
                   if r.attempt == job.attempt)
    described = local.client("ecs").describe_container_instances(
        cluster=local.cluster_name, containerInstances=[sim.node(n).container_instance_arn for n in nodes])
    ecs_status = {node_of.get(ci["containerInstanceArn"].rsplit("/", 1)[-1], "?"): ci["status"]
                  for ci in described["containerInstances"]}
    far = sim.now() + 10**7
    stuck = [f"instance {node_of.get(i.container_inst_id, i.container_inst_id)} {i.state.value}"
             for i in repo.due_instances(far)]
    stuck += [f"job {it.get('job_id')} {it.get('job_state')}" for it in repo.due_job_items(far)]
    return RunResult(
        fault=fault,
        fired=calls.fired,
        calls=list(calls.calls),
        job_state=job.state.value,
        attempt=job.attempt,
        recoveries_used=job.recoveries_used,
        suspects={node_of.get(i, i): v for i, v in repo.faults.labels(job, attempt=1).items()},
        health_checks={n: sum(1 for t in sim.tasks.values() if t.health_check and t.node == n)
                       for n in nodes},
        reboots={n: sim.node(n).reboots for n in nodes},
        instance_states={n: _state(repo.get_instance(sim.node(n).container_instance_id))
                         for n in nodes},
        stuck=stuck,
        # A failed sweep is not retried (the next minute's sweep is its retry): only
        # events that exhausted their retries are lost work.
        dead_letters=sum(1 for d in bus.dead_letters if d.rule != SWEEP_SCHEDULE),
        recovered_mails=sum(1 for n in local.notifications()
                            if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "recovered"),
        timeline=sim.format_timeline() if keep_timeline else [],
        scenario=scenario, final_nodes=final, ecs_status=ecs_status,
    )


def _state(instance: Any) -> str:
    return instance.state.value if instance is not None else "MISSING"


def sample_positions(baseline: RunResult, *, sites: str = "", by: str = "site") -> list[int]:
    """The first call of each distinct call site (and API operation) of the flow: every
    place the loop talks to AWS is broken at least once (``sites``: only call sites whose
    name contains it, e.g. ``recovery/gang.py``).

    ``by="stage"`` is coarser (``make test``'s quick tier): the first call of each stage
    module and of each API operation, so every stage and every kind of AWS call is broken
    at least once (the GPU-fault flow: 24 of its 81 call sites)."""
    if by not in ("site", "stage"):
        raise ValueError(f"by must be 'site' or 'stage', not {by!r}")
    seen: set[tuple[str, ...]] = set()
    positions = []
    for call in baseline.calls:
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
    calls: int
    runs: int
    recovered: int
    failures: list[tuple[tuple[int, str], ApiCall | None, list[str]]]


def campaign(positions: list[int] | None = None, modes: tuple[str, ...] = FAULT_MODES,
             scenario: str = "gpu_fault") -> CampaignSummary:
    """Break each position (default: every call of the baseline run) in each mode."""
    baseline = run_recovery(scenario=scenario)
    problems = check(baseline)
    if problems:
        raise AssertionError(f"the unbroken run itself failed: {problems}")
    chosen = positions if positions is not None else [c.index for c in baseline.calls]
    failures = []
    runs = 0
    for index in chosen:
        for mode in modes:
            result = run_recovery((index, mode), scenario=scenario)
            runs += 1
            wrong = check(result) + ([] if result.fired else ["the fault never fired"])
            if wrong:
                failures.append(((index, mode), result.fired, wrong))
    return CampaignSummary(len(baseline.calls), runs, runs - len(failures), failures)
