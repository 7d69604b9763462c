"""Crash campaigns of the recovery loop: one job's fault, broken at each of its AWS calls.

Each flow runs one fault of one job in its own simulated cluster; every event is delivered
as EventBridge and Lambda's asynchronous invocation would (a failed invocation retried
twice, a minute and two minutes later), the sweep runs every minute, and the backstop
invariant is checked after every event (``runner.InvariantWatch``). ``run(flow, fault)``
breaks the n-th AWS call the handlers make after the fault was injected, once:
``throttle`` (refused, not executed) or ``lost_response`` (executed, the caller never
hears back). ``RunResult.problems()`` lists what ended wrong.

The flows (``FLOWS``):

* ``gpu_fault`` — a 2-node job; node-b's GPU faults, NCCL kills rank 0 five seconds later
  (the cascade); DCGM says node-b needs a reboot (node-a, not a suspect, is not checked); the
  reboot fixes it; the job restarts as a gang and completes;
* ``gpu_reset`` — node-b's GPU faults with a row remap pending: DCGM's check exits 4 (reset),
  the reset task resets node-b's GPUs (no reboot), the job restarts on the same nodes and
  completes;
* ``fast_path`` — XID 79 reported by the node agent (``/v1/report_gpu`` through the
  heartbeat service, retried as the agent does) and the rank dies: node-b rebooted without
  a DCGM diag;
* ``dead_gpu`` — DCGM says replace and the job may not move: node-b quarantined (drained),
  the job FAILED, e-mailed;
* ``app_error`` / ``app_error_fails`` — DCGM finds both nodes healthy: the job restarts on
  the same nodes (one application-error restart allowed) / fails, e-mailed (none allowed);
* ``relocation`` — DCGM says replace: node-b quarantined, rank 1 of the relocatable job
  moves to the spare node-c;
* ``spare_first`` — the same with ``spare_nodes=1``: rank 1 moves before node-b's verdict;
* ``relocation_wait`` — the same, but node-c is busy with another workload for five more
  minutes: the job waits PENDING_RESTART, then moves once node-c is free;
* ``held_reset`` — the blast-radius breaker has another node in its window, so node-b's
  reboot trips it: the job (not relocatable) waits HELD, e-mailed; an operator resets the
  breaker with ``--resume-backlog`` (``breaker_auto_close`` false: only the operator closes
  it); node-b is rebooted and the job restarts;
* ``held_autoclose`` — the same trip, with nobody to reset it: node-z, the node the breaker
  had acted on (rebooted a minute before the fault), is back healthy, so a window after the
  trip the breaker closes by itself (e-mailed), releases node-b's reboot and the job restarts;
* ``large`` — the GPU fault of ``gpu_fault`` in a 3-rank job (one rank per node) above the
  deployment's inline fan-out (``gang_inline_max_ranks`` 2 here: the default's 16 would take
  17 ranks, each rank's events a dozen calls more for every broken run): the gang is stopped
  and restarted in batches through the gang queue and its worker, whose calls are broken too;
  every node is checked (``health_check_all_nodes``) and the peers do not exit on their own
  (no NCCL cascade): the stack stops them, so their two checks are grouped (issue 50) and
  start in one StartTask once every rank has ended (3 ranks, not 4 as before: every broken
  run replays the flow, so its calls cost their square);
* ``validation`` — the GPU fault of ``gpu_fault`` with validation after repair on, on a node
  whose first repair does not hold (issue 43): back from its reboot it passes an idle check
  but fails its validation under load, so it is rebooted again (escalation, under the
  fault's cause), validated again and passes; the job waits for it, restarts on it once it
  passed and completes, never placed on it while the fault was latent;
* ``lost_verdict`` — issue 49: ``app_error`` (rank 1 exits 1, the diag passes) with every
  delivery of the DCGM check's STOPPED event failing (dead-lettered): the sweep reads the
  verdict from the stopped task and its log line, the job restarts (one application-error
  restart), no node is quarantined or rebooted, the job is not failed for a health check
  timeout. ``run_lost_verdict_with_failing_calls(seed)``: the same with 1 % of every AWS call
  failing at random;
* ``coupled_app_error`` — issue 50: three ranks exit 1 on their own within seconds, no GPU
  fault: the first two exits are checked, the third is coupled and checked once both checks
  find nothing;
* ``two_faults`` — issue 50: two independent faults a second apart in a 3-node job (node-b's
  GPU, then node-d's; both need a reboot), node-a's rank exiting 3 s after node-b's (the NCCL
  error): both faulty nodes are checked and rebooted before the job's second attempt starts on
  them, whatever a broken call does to the order the three stops are handled in; no training
  task is ever placed on a node whose fault is not judged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.constants import InstanceState, JobState
from gpu_recovery.domain.breaker import breaker as breaker_policy
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.remediation_settings import parse_remediation_settings
from gpu_recovery.domain.validation import ValidationPolicy
from gpu_recovery.repository import Repository

from ..sim.ecs import SimulatedEcs
from ..world import World
from . import goodput_truth
from .runner import DYNAMODB, MIN, CampaignResult, Scenario, ecs_status, known_flow, run_flow

JOB_ID = "campaign"
FAULTY, HEALTHY, SPARE = "node-b", "node-a", "node-c"
# Flows that move rank 1 to the spare node-c (node-b quarantined).
RELOCATING = ("relocation", "spare_first", "relocation_wait")
# Flows whose job completes on its second attempt after one infrastructure recovery.
HELD = ("held_reset", "held_autoclose")
RECOVERED = ("gpu_fault", "gpu_reset", "fast_path", "large", "validation", "two_faults", *HELD, *RELOCATING)
# Flows where node-b is rebooted (once) and comes back.
REBOOTED = ("gpu_fault", "fast_path", "large", "two_faults", *HELD)
QUARANTINED = ("dead_gpu", *RELOCATING)
FLOWS = ("gpu_fault", "gpu_reset", "fast_path", "dead_gpu", "app_error", "app_error_fails", "relocation",
         "spare_first", "relocation_wait", "held_reset", "held_autoclose", "large", "validation",
         "lost_verdict", "coupled_app_error", "two_faults")
# Flows whose job restarts once for its application's error (the diag passed).
APP_ERROR = ("app_error", "lost_verdict", "coupled_app_error")
# coupled_app_error (issue 50): three ranks exit 1 on their own within seconds (every task's
# STOPPED event reaches the stack COUPLED_DELIVERY_SECONDS late, so the stops come too late),
# no GPU fault: the first two exits are checked, the third is coupled; both checks find
# nothing, so the coupled node is checked too before the job restarts as an application error.
COUPLED_NODE = "node-d"
COUPLED_DELIVERY_SECONDS = 10.0
# two_faults (issue 50): the second fault's node, its GPU failing a second after node-b's; an
# idle fourth node, so that two nodes acted on are within the cordon limit (half the cluster)
# and, with breaker_max_percent 50, the breaker's window: the flow is two faults, not a trip.
SECOND_FAULTY = "node-d"
IDLE = "node-e"
#: the rule whose deliveries lost_verdict fails (its dead letters are the flow's premise)
HEALTH_CHECK_RULE = "health-check-task-stopped"
RANDOM_FAILURE_RATE = 0.01
# validation: level 1 and a short load (the flow's time is the campaign's CPU), one repair not held.
VALIDATION = ValidationPolicy(enabled=True, dcgm_level=1, load_seconds=30, timeout_seconds=600)
LARGE_RANKS = 3  # above the flow's inline fan-out: the gang queue and its worker carry it
LARGE_INLINE_MAX_RANKS = 2
#: each attempt's training, from its gang's rendezvous (every rank RUNNING: a rank whose start a
#: broken call delays holds the others, as NCCL's init does); every simulated minute is a
#: sweep's calls, and every broken run before them goes through them
TRAIN_SECONDS = 4 * MIN
RUN_LIMIT_SECONDS = 90 * MIN
OTHER_WORKLOAD_SECONDS = 5 * MIN  # relocation_wait: node-c frees up this long after the fault
ANOTHER_NODE = "node-z"  # held_*: acted on a minute before, in the breaker's window


@dataclass(kw_only=True)
class RunResult(CampaignResult):
    job_state: str
    attempt: int
    recoveries_used: int
    app_restarts_used: int
    suspects: dict[str, str]
    health_checks: dict[str, int]  # node -> health-check tasks started on it
    reboots: dict[str, int]
    instance_states: dict[str, str]
    scenario: str = "gpu_fault"
    final_nodes: list[str] = field(default_factory=list)  # where the last attempt's ranks ran
    ecs_status: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def recovered_mails(self) -> int:
        return sum(1 for kind, job in self.mails if kind == "recovered" and job == JOB_ID)

    def expectations(self) -> list[str]:
        return expectations(self)


def check(result: RunResult) -> list[str]:
    """Everything that ended wrong (empty: the run ended exactly as it should)."""
    return result.problems()


def expectations(result: RunResult) -> list[str]:
    """What ended wrong for this flow (what every flow owes is ``CampaignResult.problems``)."""
    flow = result.scenario
    problems = []
    got = (result.job_state, result.attempt, result.recoveries_used)
    if flow in RECOVERED:
        want: tuple[Any, ...] = (JobState.COMPLETE.value, 2, 1)
    elif flow in APP_ERROR:
        want = (JobState.COMPLETE.value, 2, 0)
    else:
        want = (JobState.FAILED.value, 1, 0)
    if got != want:
        problems.append(f"job {got} (want {want})")
    if flow in APP_ERROR and result.app_restarts_used != 1:
        problems.append(f"{result.app_restarts_used} application-error restart(s) charged (want 1)")
    want_reboots = {n: (1 if n == FAULTY and flow in REBOOTED else 0) for n in result.reboots}
    if flow == "two_faults":  # both faults caught before the job runs on either again
        want_reboots[SECOND_FAULTY] = 1
    if result.facts.get("placed_on_faulty"):  # every flow: no training on a faulty node
        problems.append(f"training placed on a node whose fault was not judged: "
                        f"{result.facts['placed_on_faulty']}")
    if flow == "validation":  # the repair that did not hold, then the one that did
        want_reboots[FAULTY] = 2
        validations = result.facts.get("validations")
        if validations != {"failed": 1, "passed": 1}:
            problems.append(f"validations of node-b {validations} (want 1 failed, 1 passed)")
        if result.facts.get("placed_on_latent"):
            problems.append("training placed on node-b while its fault was latent: "
                            f"{result.facts['placed_on_latent']}")
    if result.reboots != want_reboots:
        problems.append(f"reboots {result.reboots} (want {want_reboots})")
    for node, count in result.health_checks.items():
        suspect = node in result.suspects
        wanted = 1 if suspect and not (flow == "fast_path" and node == FAULTY) else 0
        if count != wanted:
            problems.append(f"{count} health check(s) on {node} (suspect: {suspect}, want {wanted})")
    for faulty in (FAULTY, SECOND_FAULTY) if flow == "two_faults" else (FAULTY,):
        if faulty not in result.suspects:
            problems.append(f"the faulty node {faulty} was never a suspect")
    want_resets, resets = (1 if flow == "gpu_reset" else 0), result.facts.get("gpu_resets", 0)
    if resets != want_resets:
        problems.append(f"{resets} GPU reset task(s) on node-b (want {want_resets})")
    want_states = {n: InstanceState.AVAILABLE.value for n in result.instance_states}
    if flow in QUARANTINED:
        want_states[FAULTY] = InstanceState.QUARANTINED.value
        if result.ecs_status.get(FAULTY) != "DRAINING":
            problems.append(f"node-b is {result.ecs_status.get(FAULTY)} in ECS (want DRAINING)")
    if flow in RELOCATING and result.final_nodes != [HEALTHY, SPARE]:
        problems.append(f"ranks ended on {result.final_nodes} (want rank 1 moved to {SPARE})")
    # A broken call that delays one rank's stop past the others' changes which exits are
    # handled first: node-b's (the earliest) handled third is still a suspect (none coupled);
    # so is node-a's (3 s before node-d's: one of the two earliest beyond the margin). Whatever
    # the order, node-b is never named coupled, one node at most is, and its check waits for the
    # first checks' answers.
    coupled = result.facts.get("coupled")
    if flow == "coupled_app_error" and (not isinstance(coupled, list) or FAULTY in coupled
                                        or len(coupled) > 1):
        problems.append(f"named coupled: {coupled} (want at most one node, never {FAULTY}, the "
                        f"earliest exit; unbroken: [{COUPLED_NODE!r}])")
    if result.facts.get("coupled_checked_early"):
        problems.append(f"coupled nodes checked before the first checks answered: "
                        f"{result.facts['coupled_checked_early']}")
    # The flow's premise (node-c still busy when the job looks for a node to move to) holds
    # unbroken and with one call broken; calls failing at random can delay the job's checks
    # until node-c freed, and it then moves at once.
    if flow == "relocation_wait" and not result.facts.get("waited_for_a_node") and result.failing is None:
        problems.append("the job never waited for a free node")
    # The HELD flows' premise (node-b's reboot decided while node-z's is in the breaker's window)
    # holds unbroken and with one call broken; calls failing at random can delay node-b's check
    # past the window, and then nothing trips: the flow is gpu_fault's.
    past_window = result.failing is not None and result.facts.get("reboot_past_window")
    if flow in HELD and not past_window:
        if not result.facts.get("held"):
            problems.append("the job was never HELD")
        if result.facts.get("breaker_state") != "closed":
            problems.append(f"the breaker is {result.facts.get('breaker_state')} at the end (want closed)")
        closed_by = result.facts.get("closed_by")
        want_by = "campaign-operator" if flow == "held_reset" else breaker_policy.CLOSED_BY_ITSELF
        if closed_by != want_by:
            problems.append(f"the breaker was closed by {closed_by!r} (want {want_by!r})")
    if result.instance_states != want_states:
        problems.append(f"instances {result.instance_states} (want {want_states})")
    problems += result.mail_problems(expected_mails("gpu_fault" if past_window else flow))
    # The goodput ledger against the training's truth (issue 52): unbroken, with one call
    # broken, and with 1 % of calls failing.
    problems += goodput_truth.problems(result.facts.get("goodput") or {})
    return problems


def expected_mails(flow: str) -> dict[tuple[str, str], tuple[int, int]]:
    """The e-mails a flow owes (at least once; twice when a confirmation was lost)."""
    if flow in RECOVERED or flow in APP_ERROR:
        want = {("recovered", JOB_ID): (1, 2)}
    elif flow == "dead_gpu":
        want = {("quarantined", JOB_ID): (1, 2), ("recovered", JOB_ID): (0, 0)}
    else:
        want = {("application_error", JOB_ID): (1, 2), ("recovered", JOB_ID): (0, 0)}
    if flow == "gpu_reset":  # the reset passed: no fallback e-mail
        want[("gpu_reset_failed", "-")] = (0, 0)
    if flow == "validation":
        want[("validation_failed", "-")] = (1, 2)
    if flow in HELD:
        want.update({("breaker_tripped", "-"): (1, 2), ("job_held", JOB_ID): (1, 2),
                     ("breaker_closed", "-"): (1, 2) if flow == "held_autoclose" else (0, 0),
                     ("breaker_needs_operator", "-"): (0, 0)})
    return want


def _env(flow: str) -> dict[str, str]:
    env = {"POWERTOOLS_LOG_LEVEL": "CRITICAL"}
    if flow == "spare_first":
        env[C.ENV_SPARE_NODES] = "1"
    if flow == "two_faults":
        env[C.ENV_REMEDIATION_SETTINGS] = json.dumps({"breaker_max_percent": "50"})
    if flow == "held_reset":  # the operator's reset is what this flow tries: nothing else closes it
        env[C.ENV_REMEDIATION_SETTINGS] = json.dumps({"breaker_auto_close": "false"})
    if flow == "validation":
        env[C.ENV_POST_REPAIR_VALIDATION] = VALIDATION.to_json()
    if flow == "large":
        env[C.ENV_GANG_INLINE_MAX_RANKS] = str(LARGE_INLINE_MAX_RANKS)
        env[C.ENV_HEALTH_CHECK_ALL_NODES] = "true"
    return env


class RecoveryScenario(Scenario[RunResult]):
    """One job's fault (``flow``): the job started, the fault injected once calls are counted."""

    run_limit_seconds = RUN_LIMIT_SECONDS

    def __init__(self, flow: str) -> None:
        self.flow = known_flow(flow, FLOWS)
        self.facts: dict[str, Any] = {}
        self._on_minute: Callable[[Job | None], None] | None = None
        self.window_ends = 0.0  # held_*: when node-z's reboot leaves the breaker's window

    def world_options(self) -> dict[str, Any]:
        # A large gang's placements need no container-instance events (nothing reads them).
        return {"sim_options": {"instance_events_on_placement": self.flow != "large"},
                "extra_env": _env(self.flow)}

    def validating_nodes(self, world: World) -> list[str]:
        return [world.ecs.node(FAULTY).container_instance_id] if self.flow == "validation" else []

    def set_up(self, world: World) -> list[str]:
        _start_job(world, self.flow)
        goodput_truth.report_start(world.repo, world.ecs, JOB_ID)
        if self.flow in HELD:
            self._on_minute = _operator(world.repo, world.ecs, self.facts, resets=self.flow == "held_reset")
            # When node-z's reboot leaves the breaker's window (the deployment's default one).
            acted = [float(e["at"]) for e in (world.repo.breaker.read() or {}).get("window") or ()]
            self.window_ends = min(acted) + parse_remediation_settings({}).breaker.window_seconds
        return [JOB_ID]

    def start(self, world: World) -> None:
        sim, flow = world.ecs, self.flow
        if flow == "coupled_app_error":
            sim.delivery_delay = _late_training_stops
            # node-a's rank exits 3 s after node-b's, node-d's 6 s after: the third exit.
            sim.inject_gpu_fault(FAULTY, after=MIN, health="healthy", nccl_cascade=True,
                                 cascade_delay_seconds=_cascade_delays())  # type: ignore[arg-type]
            return
        if flow == "two_faults":
            # Both faults and node-a's NCCL exit before the stack's stops can reach a rank (the
            # STOPPED events late, as in coupled_app_error): a fault on a rank the stack has
            # already stopped is a fault of an idle node, the node agent's or the preflight's.
            sim.delivery_delay = _late_training_stops
            sim.inject_gpu_fault(FAULTY, after=MIN, health="reboot_fixable", nccl_cascade=True,
                                 cascade_delay_seconds=3)
            sim.inject_gpu_fault(SECOND_FAULTY, after=MIN + 1, health="reboot_fixable")
            return
        if flow == "fast_path":
            sim.inject_xid(FAULTY, 79, after=MIN, health="reboot_fixable", nccl_cascade=True,
                           crash_delay_seconds=10)
        else:
            if flow == "validation":
                sim.repair_does_not_hold(FAULTY, 1)
            if flow == "lost_verdict":
                _lose_check_events(world)
            health = {"dead_gpu": "replace", "app_error": "healthy", "app_error_fails": "healthy",
                      "lost_verdict": "healthy",
                      "gpu_reset": "reset_fixable",
                      **{f: "replace" for f in RELOCATING}}.get(flow, "reboot_fixable")
            sim.inject_gpu_fault(FAULTY, after=MIN, health=health, nccl_cascade=flow != "large")

    def each_minute(self, world: World, jobs: Mapping[str, Job | None]) -> None:
        job = jobs[JOB_ID]
        if job is not None and job.relocation_wait is not None:
            self.facts["waited_for_a_node"] = True
        if self._on_minute is not None:
            self._on_minute(job)

    def result(self, world: World, common: dict[str, Any]) -> RunResult:
        repo, sim, facts = world.repo, world.ecs, self.facts
        if self.flow == "lost_verdict":  # the flow's premise, not a problem
            common = {**common, "dead_letters": common["dead_letters"] - sum(
                1 for d in world.bus.dead_letters if d.rule == HEALTH_CHECK_RULE)}
        job = repo.jobs.get_job(JOB_ID)
        assert job is not None
        names = nodes_of(self.flow)
        final = sorted(world.node_name(r.container_inst_id) for r in repo.jobs.get_ranks(job)
                       if r.attempt == job.attempt)
        facts["gpu_resets"] = sum(1 for t in sim.tasks.values() if t.gpu_reset and t.node == FAULTY)
        facts["breaker_state"] = (repo.breaker.read() or {}).get("state", "closed")
        if self.flow == "validation":
            ran = [t for t in sim.tasks.values() if t.validation and t.node == FAULTY and t.done]
            facts["validations"] = {"failed": sum(1 for t in ran if t.exit_code not in (0, None)),
                                    "passed": sum(1 for t in ran if t.exit_code == 0)}
            facts["placed_on_latent"] = [p.time for p in sim.placements if p.training and p.latent]
        facts["closed_by"] = (repo.breaker.read() or {}).get("last_reset_by")
        if self.flow in HELD:
            history = (repo.jobs.get_job_item(JOB_ID) or {}).get("history") or []
            decided = [float(h["at"]) for h in history if h.get("to") in ("PENDING_RESTART", "HELD")]
            facts["reboot_past_window"] = bool(decided) and min(decided) >= self.window_ends
        facts["placed_on_faulty"] = [(p.time, p.node) for p in sim.placements
                                     if p.training and p.health != "healthy"]
        facts["goodput"] = goodput_truth.compare(repo, sim, JOB_ID)
        checks = [t for t in sim.tasks.values() if t.health_check and not t.gpu_reset and not t.validation]
        # The nodes the stack named coupled (coupled_app_error): a suspect opened with no rank of
        # its own once the first checks found nothing; and those checked before any of the first
        # checks answered. (Not "checked after another check answered": a suspect's check may
        # come that late when its deliveries meet failing calls.)
        coupled = {world.node_name(s.node) for s in repo.faults.suspects(JOB_ID, 1) if not s.ranks}
        answered = [t.stopped_at for t in checks if t.node not in coupled and t.stopped_at is not None]
        facts["coupled"] = sorted(coupled)
        facts["coupled_checked_early"] = sorted({t.node for t in checks if t.node in coupled and (
            not answered or t.created_at < min(answered))})
        facts["check_started_by"] = {t.node: t.started_by for t in checks}  # grouped checks share one
        return RunResult(
            **common, job_state=job.state.value, attempt=job.attempt, recoveries_used=job.recoveries_used,
            app_restarts_used=job.app_restarts_used,
            suspects={world.node_name(i): v for i, v in repo.faults.labels(job, attempt=1).items()},
            health_checks={n: sum(1 for t in sim.tasks.values()
                                  if t.health_check and not t.gpu_reset and not t.validation and t.node == n)
                           for n in names},
            reboots={n: sim.node(n).reboots for n in names},
            instance_states={n: _state(repo.instances.get_instance(sim.node(n).container_instance_id))
                             for n in names},
            scenario=self.flow, final_nodes=final, ecs_status=ecs_status(world, names), facts=facts,
        )


class _Reordered(RecoveryScenario):
    """``gpu_fault`` with the two ranks' STOPPED events held back, then delivered in ``order``."""

    def __init__(self, order: tuple[str, ...]) -> None:
        super().__init__("gpu_fault")
        self.order = order

    def start(self, world: World) -> None:
        held = world.hold_training_stops()
        world.ecs.inject_gpu_fault(FAULTY, after=MIN, health="reboot_fixable", nccl_cascade=True)
        world.ecs.run_until_true(lambda: len(held.events) == 2, max_seconds=5 * MIN)
        named = {"faulty": FAULTY, "peer": HEALTHY}
        held.deliver(named[which] for which in self.order)


def run(flow: str, fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
        dynamodb: str = DYNAMODB) -> RunResult:
    """The flow, with ``fault`` (n-th call, mode) broken once (None: unbroken)."""
    return run_flow(RecoveryScenario(flow), fault, keep_timeline=keep_timeline, dynamodb=dynamodb)


class _LostVerdictWithFailingCalls(RecoveryScenario):
    """``lost_verdict`` with RANDOM_FAILURE_RATE of every AWS call failing (seeded)."""

    def __init__(self, seed: int) -> None:
        super().__init__("lost_verdict")
        self.seed = seed

    def start(self, world: World) -> None:
        world.aws.call_faults.arm_random(RANDOM_FAILURE_RATE, self.seed)
        super().start(world)


def run_lost_verdict_with_failing_calls(seed: int) -> RunResult:
    return run_flow(_LostVerdictWithFailingCalls(seed))


def _lose_check_events(world: World) -> None:
    """Every delivery of a DCGM check's STOPPED event fails (Lambda's retries too)."""
    rule = next(r for r in world.bus.rules if r.name == HEALTH_CHECK_RULE)

    def lost(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError("the check's STOPPED event lost (campaign lost_verdict)")

    rule.target = lost


def run_recovery(fault: tuple[int, str] | None = None, *, keep_timeline: bool = False,
                 scenario: str = "gpu_fault", dynamodb: str = DYNAMODB) -> RunResult:
    """``run(scenario, fault)`` (the name the benches and older tests call)."""
    return run(scenario, fault, keep_timeline=keep_timeline, dynamodb=dynamodb)


def run_reordered(order: tuple[str, ...], *, keep_timeline: bool = False) -> RunResult:
    """``gpu_fault`` with the two ranks' STOPPED events held back, then delivered in
    ``order`` ("faulty" = rank 1's own GPU-fault exit, "peer" = rank 0's NCCL exit;
    repeat a name to deliver a duplicate)."""
    return run_flow(_Reordered(order), keep_timeline=keep_timeline)


def _start_job(world: World, flow: str) -> None:
    sim = world.ecs
    for node in nodes_of(flow):
        sim.add_node(node, gpus=8)
    td = sim.register_training_task_definition("train", gpus=8)
    sim.plan_family("train", run_seconds=TRAIN_SECONDS, exit_code=0, gang=True)
    tags = {C.TAG_RELOCATABLE: "true"} if flow in RELOCATING else {}
    if flow in APP_ERROR:
        tags[C.TAG_MAX_APP_RESTARTS] = "1"
    if flow == "two_faults":
        sim.add_node(IDLE, gpus=8)  # counted in the cluster, never the job's
    every_node = flow in ("large", "coupled_app_error", "two_faults")
    ranks = list(nodes_of(flow)) if every_node else [HEALTHY, FAULTY]
    sim.start_job(JOB_ID, td, ranks, extra_tags=tags or None)
    if flow == "relocation_wait":
        _other_workload(world)
    if flow in HELD:
        _another_node_acted_on(world, flow)
    sim.run_for(MIN)


def _late_training_stops(event: dict[str, Any]) -> float:
    """coupled_app_error and two_faults: every training task's STOPPED event reaches the stack late (not the
    DCGM checks'), so the ranks exit on their own before the stops reach them."""
    detail = event.get("detail") or {}
    late = event.get("detail-type") == "ECS Task State Change" and detail.get("lastStatus") == "STOPPED" \
        and not str(detail.get("group", "")).startswith(C.HEALTH_CHECK_GROUP)
    return COUPLED_DELIVERY_SECONDS if late else 0.0


def _cascade_delays() -> Callable[[], float]:
    """The NCCL error of each peer of node-b, seconds after its exit: node-a 3, node-d 6 (the
    cascade hits the peers in the order they were placed)."""
    delays = iter([3.0, 6.0])
    return lambda: next(delays, 6.0)


def _other_workload(world: World) -> None:
    """An untagged task of another workload on node-c, ending a while after the fault."""
    from gpu_recovery.adapters import aws

    sim = world.ecs

    td = sim.register_training_task_definition("web", gpus=8)
    sim.plan_family("web", run_seconds=2 * MIN + OTHER_WORKLOAD_SECONDS, exit_code=0)
    aws.client("ecs").start_task(cluster=world.aws.cluster_name, taskDefinition=td, startedBy="other-team",
                                 containerInstances=[sim.node(SPARE).container_instance_arn])


def _another_node_acted_on(world: World, flow: str) -> None:
    """The breaker's window already holds another node's reboot (a minute ago): node-b's
    reboot would be the second node in one window of a 2-node (held_reset) or 3-node
    (held_autoclose) cluster, past its limit of one. In held_autoclose that node is node-z of
    the cluster, rebooted and back (AVAILABLE, its item written as the loop would have)."""
    from gpu_recovery.domain.models import Instance

    repo, sim = world.repo, world.ecs
    node, nodes = ANOTHER_NODE, len(nodes_of(flow))
    if flow == "held_autoclose":
        z = sim.node(ANOTHER_NODE)
        node = z.container_instance_id
        repo.instances.put_instance_if_absent(Instance(node, InstanceState.AVAILABLE,
                                                       z.container_instance_arn, z.instance_id))
    decided = breaker_policy.record_action(None, node=node, action="reboot", now=sim.now() - MIN,
                                           cluster_gpu_nodes=nodes)
    repo.breaker.save({**decided.state, "cluster_gpu_nodes": nodes}, None)


def nodes_of(flow: str) -> tuple[str, ...]:
    if flow == "large":
        return (HEALTHY, FAULTY, *(f"node-x{i:02d}" for i in range(LARGE_RANKS - 2)))
    if flow == "held_autoclose":
        return (HEALTHY, FAULTY, ANOTHER_NODE)
    if flow == "coupled_app_error":
        return (HEALTHY, FAULTY, COUPLED_NODE)
    if flow == "two_faults":
        return (HEALTHY, FAULTY, SECOND_FAULTY)
    return (HEALTHY, FAULTY, SPARE) if flow in RELOCATING else (HEALTHY, FAULTY)


def _operator(repo: Repository, sim: SimulatedEcs, facts: dict[str, Any], *,
              resets: bool) -> Callable[[Any], None]:
    """Notes when the job is HELD; held_reset's operator (``resets``) then, a minute later,
    calls `gpu-recovery-admin breaker reset --resume-backlog` (the operator's own call: not
    the flow's, never broken). held_autoclose has nobody: the breaker closes by itself."""
    from gpu_recovery.recovery.breaker.operations import reset_breaker

    def on_minute(job: Any) -> None:
        if job is None or facts.get("reset_at"):
            return
        if job.state is JobState.HELD:
            facts.setdefault("held", sim.now())
        if resets and facts.get("held") and sim.now() >= facts["held"] + MIN:
            # Through the emulator's own client (``repo``): the operator's call, never broken.
            result = reset_breaker(repo.breaker, now=sim.now(), resume_backlog=True, by="campaign-operator")
            if result.done:
                facts["reset_at"] = sim.now()

    return on_minute


def _state(instance: Any) -> str:
    return instance.state.value if instance is not None else "MISSING"
