"""The gang preflight's rounds: what each rank runs, its reports judged, the next round.

The training client's wrapper (``python gpu_recovery_client.py preflight -- <command>``)
asks the control API what to do (:meth:`Preflights.step`) and reports each all-reduce it
ran (:meth:`Preflights.report`). The first rank to ask decides whether the attempt runs a
preflight at all (``domain.preflight.mode``) and starts it; nothing is written for an
attempt that runs none, and nothing happens for a job whose command does not ask (no
wrapper: no preflight, nothing waits).

* **Round 1**: every rank runs its node's loopback (an all-reduce over its own GPUs) as
  soon as it starts (the other ranks may still be starting) and reports it; its arrival at
  the attempt's latch is counted. The report that completes the latch opens **the gang**
  (``gang_ready``, the round's bound re-armed: ``round_seconds``): every rank then joins
  the all-reduce over all of them, which rank 0 reports. A failed loopback ends the round
  there (its node is pinned; no gang on top). The loopbacks' bound is
  ``first_round_seconds`` from the first step, extended while the job is still STARTING
  (a rank ECS has not started yet is the launch's business, not a hung node's) and, once it
  runs, to ``round_seconds`` after its last missing rank's start (a rank whose start was held
  up, by a failed StartTask tried again, gets a round of its own); past it, the ranks that
  never reported are pinned.
* **Later rounds** (the gang failed): the search's groups (``domain.preflight.pinning``),
  disjoint, at once; each group's first rank reports. A group that has not reported by the
  round's bound hung: it failed.

A round's reports are judged where they arrive (``domain.preflight.judge``, against the
thresholds the preflight read when the round began, ``domain.preflight.baseline``); the
report that completes a round moves the preflight on, by a write conditional on the round
(a duplicate or a concurrent completion changes nothing). A report whose answer was lost is
sent again by the client and finds its result recorded; one that never comes is the
round's bound, which the sweep reaches through the preflight item's deadline.

The end: **passed** (every rank goes on to its command; the runs' busbw is learned, in the
same transaction, as its job's user's runs: one vote of the fleet's, never more), **pinned**
(the nodes go to the recovery loop: ``handover``; every rank is told to stop and waits for
ECS to stop it), or **inconclusive** (too many places at fault, or a failure that went
away: nothing is pinned, every rank goes on, the summary says why). The state machine holds
nothing per rank: a rank finds its group from the round's spans of node numbers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain import goodput
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.models import Rank
from gpu_recovery.domain.preflight import pinning
from gpu_recovery.domain.preflight.baseline import (
    Baseline,
    Threshold,
    learn,
    node_class,
    refusal,
    with_floor,
)
from gpu_recovery.domain.preflight.judge import Verdict, alike_everywhere, hung, judge
from gpu_recovery.domain.preflight.mode import PreflightMode, required
from gpu_recovery.domain.preflight.nccl_output import table_lines
from gpu_recovery.domain.preflight.settings import SWEEP_MAX_BYTES, SWEEP_MIN_BYTES
from gpu_recovery.domain.states import JobState
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort, after_commit
from gpu_recovery.recovery.preflight.handover import PreflightHandover
from gpu_recovery.recovery.preflight.job_fault import JobFaultData, PreflightJobFault
from gpu_recovery.recovery.remediation.tenant_evidence import TenantEvidence
from gpu_recovery.recovery.stage_data import HasJobs
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.preflight import (
    ABANDONED,
    INCONCLUSIVE,
    JOB_FAULT,
    PASSED,
    PINNED,
    RUNNING,
    PreflightRepository,
)
from gpu_recovery.repository.rank_events import RankEventRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

GANG, LOOPBACK = "gang", "loopback"
MARGIN_SECONDS = 15  # a test's own time limit ends this long before its round's bound
STARTED_STATES = (JobState.STARTING.value, JobState.RUNNING.value)
MAX_OUTPUT_LINES = 64
_CONCLUDE_ROUNDS = 3  # a baseline another job learned meanwhile: read it again and retry
# The sizes whose baselines a size without enough runs of its own may borrow (one read).
BORROWED_SIZES = tuple(2 ** k for k in range(1, 11))
# Missing ranks read for their starts when the loopbacks' bound passes (one BatchGetItem).
LATE_RANKS_READ = 100
# One poll per interval per rank: keep a large job's polls near this many a second.
POLLS_PER_SECOND = 256


class PreflightError(Exception):
    """A report the API refuses (a 4xx): ``status``, ``code``, ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class PreflightJobs(JobFaultData, Protocol):
    def get_ranks_numbered(self, job_id: str, numbers: Iterable[int]) -> list[Rank]: ...


class PreflightData(HasJobs[PreflightJobs], Protocol):
    """The preflight's items (``repository/preflight.py``), its ranks' arrivals on the latch, the
    job's ledger mark of its preflight time; and what a job's own fault ends (``JobFaultData``)."""

    latches: LatchRepository
    preflight: PreflightRepository
    rank_events: RankEventRepository  # the job's ledger mark of its preflight time


class Preflights:
    def __init__(self, data: PreflightData, handover: PreflightHandover, notices: Notices,
                 tenant_evidence: TenantEvidence, *, metrics: MetricsPort, settings: Settings) -> None:
        self.data = data
        self.handover = handover
        self.tenant_evidence = tenant_evidence
        self.metrics = metrics  # the service's relay: the invocation's metrics
        self.settings = settings
        self.job_fault = PreflightJobFault(data.jobs, notices, metrics)

    @property
    def policy(self) -> Any:
        return self.settings.preflight

    # ================================================================= the rank's step
    def step(self, job_id: str, rank: int, attempt: int) -> dict[str, Any]:
        """What rank ``rank`` of ``attempt`` does now (starting the preflight if it is the
        first to ask)."""
        now = clock.now()
        repo = self.data
        item = repo.preflight.get(job_id, attempt)
        if item is None:
            item, answer = self._start(job_id, attempt, now)
            if item is None:
                return {**answer, "job_id": job_id, "rank": rank, "attempt": attempt}
        if item["status"] == RUNNING and int(item["round"]) > 1 and self._complete(item):
            item = self._finish_round(item, now)  # a dead delivery's round
        return self._instruction(item, rank, now)

    def _start(self, job_id: str, attempt: int, now: float) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        repo = self.data
        job = repo.jobs.get_job_item(job_id) or {}
        current = int(job.get("attempt") or 0)
        if current != attempt:
            return None, {"action": "stop", "reason": f"attempt {attempt} is over (the job is at {current})"}
        if job.get("job_state") not in STARTED_STATES:
            return None, {"action": "stop", "reason": f"the job is {job.get('job_state')}"}
        nodes = int(job.get("world_size") or 1)
        try:
            mode = PreflightMode(str(job.get("preflight") or PreflightMode.AUTO.value))
        except ValueError:
            mode = PreflightMode.AUTO
        relocations = [r for r in job.get("relocations") or () if isinstance(r, Mapping)]
        recovery = int(job.get("restarted_attempt") or 0) == attempt or \
            bool(relocations and int(relocations[-1].get("attempt") or 0) == attempt)
        first = not recovery and not int(job.get("resume_count") or 0)
        runs, why = required(mode, nodes=nodes, min_nodes=self.policy.min_nodes, first_start=first,
                             recovery_restart=recovery)
        if not runs:
            return None, {"action": "skip", "reason": why, "round": 0, "status": "skipped",
                          "poll_seconds": self._poll(nodes)}
        gpus = int(job.get("gpus_per_node") or 0)
        klass = node_class(str((job.get("launch") or {}).get("instance_type") or ""), gpus)
        user = subject_of(job)
        baselines = repo.preflight.baselines(klass, {1, nodes, *BORROWED_SIZES})
        thresholds = {str(n): with_floor(self.policy.baseline, klass, n, baselines, user).to_dict()
                      for n in sorted({1, nodes})}
        deadline = now + self.policy.first_round_seconds
        fields = {"nodes": nodes, "node_class": klass, "gpus_per_node": gpus, "why": why, "created_at": now,
                  "round_started_at": now, "thresholds": thresholds, "summary": [], "baseline_user": user}
        if repo.preflight.start(job_id, attempt, fields, deadline):
            self.metrics.add_metric("PreflightsStarted", "Count", 1)
            logger.info("gang preflight started", extra={"job_id": job_id, "attempt": attempt, "why": why})
        return repo.preflight.get(job_id, attempt), {}

    def _instruction(self, item: Mapping[str, Any], rank: int, now: float) -> dict[str, Any]:
        nodes, round_ = int(item["nodes"]), int(item["round"])
        status = str(item["status"])
        answer: dict[str, Any] = {
            "job_id": item["pf_job_id"], "rank": rank, "attempt": int(item["attempt"]), "status": status,
            "round": round_, "poll_seconds": self._poll(nodes),
            "reason": str(item.get("verdict") or item.get("why") or "")[:500]}
        if status in (PASSED, INCONCLUSIVE):
            return {**answer, "action": "train"}
        if status in (PINNED, ABANDONED, JOB_FAULT):
            return {**answer, "action": "stop"}
        deadline = float(item.get("deadline_at") or now)
        # A test may take the round's bound whole, however late in the round it starts.
        least = float(self.policy.round_seconds) - MARGIN_SECONDS
        common = {"min_bytes": SWEEP_MIN_BYTES, "max_bytes": SWEEP_MAX_BYTES,
                  "timeout_seconds": round(max(least, deadline - now - MARGIN_SECONDS), 1)}
        if round_ == 1:
            tests = [{"id": LOOPBACK, "kind": "loopback", "nodes": 1, "group_rank": 0, "group_size": 1,
                      "leader": rank, "members": [[rank, rank + 1]], "master_addr": "", "port_offset": 0,
                      "report": True, **common}]
            if nodes > 1 and item.get("gang_ready"):
                tests.append({"id": GANG, "kind": "group", "nodes": nodes, "group_rank": rank,
                              "group_size": nodes, "leader": 0, "members": [[0, nodes]], "master_addr": "",
                              "port_offset": 1, "report": rank == 0, **common})
            return {**answer, "action": "run", "tests": tests}
        for index, raw in enumerate(item.get("tests") or ()):
            test = pinning.GroupTest.from_dict(raw)
            if pinning.contains(test.nodes, rank):
                ranks = pinning.members(test.nodes)
                return {**answer, "action": "run", "tests": [{
                    "id": test.test_id, "kind": "group", "nodes": test.size, "group_rank": ranks.index(rank),
                    "group_size": test.size, "leader": ranks[0], "members": raw["nodes"],
                    "master_addr": str(raw.get("master_addr") or ""),
                    "port_offset": 2 + index + 16 * (round_ % 2), "report": rank == ranks[0], **common}]}
        return {**answer, "action": "wait", "reason": f"round {round_}: this node takes no part in it"}

    def _poll(self, nodes: int) -> int:
        return max(self.settings.control_poll_seconds, math.ceil(nodes / POLLS_PER_SECOND))

    # ================================================================= a report
    def report(self, job_id: str, rank: int, attempt: int, *, round_: int, test_id: str,
               exit_code: int | None, output: str, seconds: float | None = None,
               address: str = "") -> dict[str, Any]:
        """One all-reduce's report, judged where it lands; the answer is the rank's next step."""
        repo = self.data
        now = clock.now()
        item = repo.preflight.get(job_id, attempt)
        if item is None:
            raise PreflightError(409, "no_preflight", f"attempt {attempt} of job {job_id} runs no preflight")
        if item["status"] != RUNNING or int(item["round"]) != round_:
            why = f"round {round_} is over (the preflight is {item['status']}, round {item['round']})"
            return {**self._instruction(item, rank, now), "accepted": False, "why": why}
        text = table_lines(output, MAX_OUTPUT_LINES)
        nodes = int(item["nodes"])
        loopbacks_in: bool | None = None
        if round_ == 1 and test_id == LOOPBACK:
            verdict = judge(text, exit_code, self._threshold(item, 1), seconds=seconds)
            repo.preflight.record_loopback(job_id, attempt, rank, verdict.to_dict(),
                                           failed=not verdict.passed)
            arrival = repo.latches.arrive(job_id, attempt, nodes, rank, [Latch.PREFLIGHT], address=address)
            loopbacks_in = Latch.PREFLIGHT in arrival
        else:
            test = self._test(item, round_, test_id, rank)
            verdict = judge(text, exit_code, self._threshold(item, test.size), seconds=seconds)
            repo.preflight.record_result(job_id, attempt, round_, test_id, verdict.to_dict())
        if not verdict.passed:
            logger.info("preflight test failed", extra={"job_id": job_id, "round": round_, "test": test_id,
                                                       "rank": rank, "verdict": verdict.line()})
        fresh = repo.preflight.get(job_id, attempt) or item
        if loopbacks_in and fresh["status"] == RUNNING and int(fresh["round"]) == 1:
            fresh = self._loopbacks_in(fresh, now)
        elif fresh["status"] == RUNNING and int(fresh["round"]) == round_ and self._complete(fresh):
            fresh = self._finish_round(fresh, now)
        return {**self._instruction(fresh, rank, now), "accepted": True, "verdict": verdict.to_dict()}

    def _test(self, item: Mapping[str, Any], round_: int, test_id: str, rank: int) -> pinning.GroupTest:
        if round_ == 1:
            if test_id != GANG:
                raise PreflightError(400, "unknown_test",
                                     f"round 1 has tests {LOOPBACK} and {GANG}, not {test_id}")
            if rank != 0:
                raise PreflightError(409, "not_the_leader", "rank 0 reports the gang all-reduce")
            return pinning.GroupTest(GANG, pinning.span_set(0, int(item["nodes"])), 0, GANG)
        for raw in item.get("tests") or ():
            if raw.get("id") == test_id:
                test = pinning.GroupTest.from_dict(raw)
                if pinning.members(test.nodes)[0] != rank:
                    raise PreflightError(409, "not_the_leader",
                                         f"rank {pinning.members(test.nodes)[0]} reports test {test_id}")
                return test
        raise PreflightError(400, "unknown_test", f"round {round_} has no test {test_id}")

    @staticmethod
    def _complete(item: Mapping[str, Any]) -> bool:
        """Every result of the round in (round 1: the gang's, once it was opened)."""
        results = item.get("results") or {}
        if int(item["round"]) > 1:
            return set(results) >= {t["id"] for t in item.get("tests") or ()}
        return bool(item.get("gang_ready")) and GANG in results

    def _loopbacks_in(self, item: dict[str, Any], now: float) -> dict[str, Any]:
        """Every rank's loopback arrived: a failed one ends the round (its node pinned);
        else the gang opens, with a round's bound of its own. Idempotent (the latch says
        complete again to a retried report, and the sweep asks too)."""
        if _listed_ranks(item.get("loopback_failed")) or int(item["nodes"]) == 1:
            return self._finish_round(item, now)
        if not item.get("gang_ready"):
            self.data.preflight.open_gang(str(item["pf_job_id"]), int(item["attempt"]),
                                               now + self.policy.round_seconds, now)
        return self.data.preflight.get(str(item["pf_job_id"]), int(item["attempt"])) or item

    def _user(self, item: Mapping[str, Any]) -> str:
        """Whose runs the preflight's are (its job's quota subject), as recorded at its start; a
        preflight started before it was recorded reads its job."""
        if "baseline_user" in item:  # not "user": a key of the job table's user index
            return str(item["baseline_user"])
        return subject_of(self.data.jobs.get_job_item(str(item["pf_job_id"])) or {})

    @staticmethod
    def _threshold(item: Mapping[str, Any], size: int) -> Threshold:
        return Threshold.from_dict((item.get("thresholds") or {}).get(str(size)))

    # ================================================================= a round judged
    def _finish_round(self, item: dict[str, Any], now: float) -> dict[str, Any]:
        """The round's results (missing ones hung) to the search's next state: another round,
        or the end. Returns the item as it is afterwards."""
        repo = self.data
        job_id, attempt, round_ = str(item["pf_job_id"]), int(item["attempt"]), int(item["round"])
        nodes = int(item["nodes"])
        waited = now - float(item.get("round_started_at") or now)
        results = {k: Verdict.from_dict(v) for k, v in (item.get("results") or {}).items()}
        summary = list(item.get("summary") or ())
        if round_ == 1:
            failed = _listed_ranks(item.get("loopback_failed"))
            missing: list[int] = []
            gang: Verdict | None = None
            if not item.get("gang_ready") and not failed and nodes > 1:
                # The loopbacks' bound passed with ranks missing: never reported (hung, or
                # never started while the job was RUNNING).
                arrived = repo.latches.arrived(job_id, attempt, range(nodes), Latch.PREFLIGHT)
                missing = [r for r in range(nodes) if r not in arrived]
            elif item.get("gang_ready"):
                gang = results.get(GANG) or hung(self._threshold(item, nodes), waited)
            summary.append(_round_one_line(gang, failed, missing, nodes))
            own = alike_everywhere(item.get("loopback_failed") or (), nodes) if failed else ""
            if own:  # alike on every node: the job's own image or code, no node pinned
                return self._own_fault(item, own, summary, now)
            if nodes > 1 and len(missing) >= nodes:  # missing evidence is not bad evidence
                why = f"no node reported its loopback (all {nodes})"
                state = pinning.PinState(nodes=nodes, widespread=why)
                return self._conclude(item, state, results, summary, now)
            state = pinning.after_first_round(nodes, gang_passed=gang is not None and gang.passed,
                                              loopback_failed=failed, missing=missing)
            tests: list[pinning.GroupTest] = []
        else:
            state = pinning.PinState.from_dict(item["pin"])
            tests = [pinning.GroupTest.from_dict(t) for t in item.get("tests") or ()]
            verdicts = {t.test_id: results.get(t.test_id) or hung(self._threshold(item, t.size), waited)
                        for t in tests}
            state = pinning.advance(state, tests, {k: v.passed for k, v in verdicts.items()})
            summary.append(f"round {round_}: " + "; ".join(
                f"nodes {pinning.describe(t.nodes)} {verdicts[t.test_id].line()}" for t in tests))
        if state.done:
            return self._conclude(item, state, results, summary, now)
        return self._next_round(item, state, summary, now)

    def _next_round(self, item: dict[str, Any], state: pinning.PinState, summary: list[str],
                    now: float) -> dict[str, Any]:
        repo = self.data
        job_id, attempt, round_ = str(item["pf_job_id"]), int(item["attempt"]), int(item["round"])
        tests = pinning.plan_round(state)
        leaders = {pinning.members(t.nodes)[0] for t in tests}
        addresses = repo.latches.addresses(job_id, attempt, leaders)
        sizes = {t.size for t in tests}
        baselines = repo.preflight.baselines(str(item["node_class"]),
                                             sizes | {int(item["nodes"]), *BORROWED_SIZES})
        klass, user = str(item["node_class"]), self._user(item)
        thresholds = {str(n): with_floor(self.policy.baseline, klass, n, baselines, user).to_dict()
                      for n in sorted(sizes)}
        raw_tests = [{**t.to_dict(), "master_addr": addresses.get(pinning.members(t.nodes)[0], "")}
                     for t in tests]
        repo.preflight.next_round(job_id, attempt, round_, tests=raw_tests, thresholds=thresholds,
                                  pin=state.to_dict(), summary=summary, now=now,
                                  deadline_at=now + self.policy.round_seconds)
        return repo.preflight.get(job_id, attempt) or item

    def _conclude(self, item: dict[str, Any], state: pinning.PinState, results: Mapping[str, Verdict],
                  summary: list[str], now: float) -> dict[str, Any]:
        repo = self.data
        job_id, attempt, round_ = str(item["pf_job_id"]), int(item["attempt"]), int(item["round"])
        limited = self._evidence_limited(job_id) if state.pinned and not state.widespread else ""
        if state.widespread or limited or (not state.pinned and round_ > 1):
            why = state.widespread or limited or ("; ".join(state.notes) or "the failure did not show again")
            verdict = f"inconclusive after {state.round} round(s): {why}; nothing pinned, the job goes on"
            repo.preflight.conclude(job_id, attempt, round_, INCONCLUSIVE, verdict=verdict, summary=summary,
                                    now=now, pin=state.to_dict())
            self.metrics.add_metric("PreflightsInconclusive", "Count", 1)
        elif state.pinned:
            pinned = self._pinned(item, state)
            nodes = ", ".join(f"rank {p['rank']} on {p['node']}" for p in pinned)
            verdict = f"pinned after {state.round} round(s): {nodes}"
            if repo.preflight.conclude(job_id, attempt, round_, PINNED, verdict=verdict, summary=summary,
                                       now=now, pin=state.to_dict(), pinned=pinned, handover_at=now + 60):
                self.metrics.add_metric("PreflightNodesPinned", "Count", len(pinned))
                logger.warning("gang preflight pinned nodes", extra={"job_id": job_id, "nodes": nodes})
            fresh = repo.preflight.get(job_id, attempt)
            if fresh is not None and fresh["status"] == PINNED and not fresh.get("handed_over"):
                self.handover.hand_over(fresh)
        else:
            self._passed(item, results, summary, now)
        concluded = repo.preflight.get(job_id, attempt) or item
        if concluded.get("status") in (PASSED, INCONCLUSIVE):
            # The job trains from now: its RUNNING time so far was the preflight's (issue 52). A
            # lost mark leaves that time in productive; the preflight's outcome stands.
            after_commit("preflight in the goodput ledger", partial(
                repo.rank_events.mark_running_interval, job_id, attempt, cause=goodput.PREFLIGHT, until=now,
                reason="gang preflight concluded"))
        return concluded

    def _evidence_limited(self, job_id: str) -> str:
        """Why this job's (or its user's) preflight no longer moves nodes ("": it does): its
        evidence named too many nodes the stack's own check then cleared (issue 49)."""
        user = str((self.data.jobs.get_job_item(job_id) or {}).get("user") or "")
        return self.tenant_evidence.limited(job_id, user)

    def _own_fault(self, item: dict[str, Any], why: str, summary: list[str], now: float) -> dict[str, Any]:
        """Concluded as the job's own failure, due at once: the sweep ends the job, told why
        (``job_fault``)."""
        repo = self.data
        job_id, attempt = str(item["pf_job_id"]), int(item["attempt"])
        verdict = f"{why}; the job's own image or code, not a node: nothing pinned"
        if repo.preflight.conclude(job_id, attempt, 1, JOB_FAULT, verdict=verdict, summary=summary, now=now,
                                   handover_at=now):
            logger.warning("gang preflight failed alike on every node", extra={"job_id": job_id, "why": why})
        return repo.preflight.get(job_id, attempt) or item

    def _passed(self, item: dict[str, Any], results: Mapping[str, Verdict], summary: list[str],
                now: float) -> None:
        """Passed: concluded, and the gang's and rank 0's loopback busbw learned, at once."""
        repo = self.data
        job_id, attempt, round_ = str(item["pf_job_id"]), int(item["attempt"]), int(item["round"])
        nodes, klass = int(item["nodes"]), str(item["node_class"])
        samples = {1: Verdict.from_dict(item.get("rank0_loopback")).busbw}
        if nodes > 1 and GANG in results:
            samples[nodes] = results[GANG].busbw
        gang = results.get(GANG)
        verdict = "passed" + (f": gang {gang.line()}" if gang is not None else "")
        user = self._user(item)  # its runs are its user's one vote (domain.preflight.baseline)
        for _ in range(_CONCLUDE_ROUNDS):
            current = repo.preflight.baselines(klass, samples)
            learned: list[Baseline] = []
            for size, busbw in samples.items():
                if busbw is not None:
                    taught = learn(current[size], busbw, f"{job_id}#{attempt}", self.policy.baseline, user)
                    if taught is not None:
                        learned.append(taught)
                    elif why := refusal(current[size], busbw, self.policy.baseline, user):
                        logger.warning("preflight run not learned", extra={"job_id": job_id, "nodes": size,
                                                                           "why": why})
                        self.metrics.add_metric("PreflightSamplesRefused", "Count", 1)
            if repo.preflight.conclude(job_id, attempt, round_, PASSED, verdict=verdict, summary=summary,
                                       now=now, learned=learned):
                self.metrics.add_metric("PreflightsPassed", "Count", 1)
                return
            fresh = repo.preflight.get(job_id, attempt)
            if fresh is None or fresh["status"] != RUNNING or int(fresh["round"]) != round_:
                return  # concluded by another delivery
        logger.warning("preflight baseline contended: concluded without learning", extra={"job_id": job_id})
        repo.preflight.conclude(job_id, attempt, round_, PASSED, verdict=verdict, summary=summary, now=now)

    def _pinned(self, item: Mapping[str, Any], state: pinning.PinState) -> list[dict[str, Any]]:
        """The pinned ranks with their nodes (their rank items) and why."""
        job_id = str(item["pf_job_id"])
        ranks = {p.node for p in state.pinned} | {p.peer for p in state.pinned if p.peer is not None}
        items = self.data.preflight.rank_items(job_id, ranks)

        def node_of(rank: int | None) -> str:
            return str((items.get(rank) or {}).get("container_inst_id") or "") if rank is not None else ""

        last = (item.get("summary") or [""])[-1:]
        return [{"rank": p.node, "node": node_of(p.node), "reason": p.reason, "round": state.round,
                 "at": clock.now(),
                 **({"peer": p.peer, "peer_node": node_of(p.peer)} if p.peer is not None else {}),
                 "result": str(last[0] if last else "")[:300]}
                for p in state.pinned if node_of(p.node)]

    # ================================================================= the sweep
    def sweep(self, item: dict[str, Any], now: float) -> str:
        """A preflight item due: a round past its bound, a pin not handed over yet."""
        repo = self.data
        job_id, attempt = str(item["pf_job_id"]), int(item["attempt"])
        status = item.get("status")
        if status == PINNED and not item.get("handed_over"):
            return self.handover.hand_over(item)
        if status == JOB_FAULT and not item.get("handed_over"):
            return self.job_fault.end(item)
        if status != RUNNING:
            repo.preflight.settle(job_id, attempt)  # concluded: nothing is due
            return "preflight_settled"
        job = repo.jobs.get_job_item(job_id) or {}
        if int(job.get("attempt") or 0) != attempt or job.get("job_state") not in STARTED_STATES:
            repo.preflight.abandon(job_id, attempt, f"the job moved on ({job.get('job_state')}, attempt "
                                                    f"{job.get('attempt')})", now)
            return "preflight_abandoned"
        if float(item.get("deadline_at") or 0) > now:
            return "preflight_not_due"
        if int(item["round"]) == 1 and not item.get("gang_ready"):
            latches = repo.latches.complete(job_id, attempt, int(item["nodes"]))
            if Latch.PREFLIGHT in latches:  # the report that completed the latch died before this
                self._loopbacks_in(item, now)
                return "preflight_gang_opened"
            if job.get("job_state") == JobState.STARTING.value:
                # Ranks ECS has not started yet (the restart's launch): not a hung node.
                repo.preflight.rearm(job_id, attempt, now + self.policy.round_seconds)
                return "preflight_waiting_for_the_start"
            started = self._late_start(job_id, attempt, int(item["nodes"]), now)
            if started is not None:
                repo.preflight.rearm(job_id, attempt, started + self.policy.round_seconds)
                return "preflight_waiting_for_a_late_rank"
        self._finish_round(item, now)
        return "preflight_round_timed_out"

    def _late_start(self, job_id: str, attempt: int, nodes: int, now: float) -> float | None:
        """The latest start of a rank missing from the loopbacks that started less than a round
        ago (its StartTask held up: it had no time to report yet), else None."""
        arrived = self.data.latches.arrived(job_id, attempt, range(nodes), Latch.PREFLIGHT)
        missing = [r for r in range(nodes) if r not in arrived][:LATE_RANKS_READ]
        starts = [float(r.running_at or r.registered_at or 0.0)
                  for r in self.data.jobs.get_ranks_numbered(job_id, missing) if r.attempt == attempt]
        latest = max(starts, default=0.0)
        return latest if latest > now - self.policy.round_seconds else None


def subject_of(job: Mapping[str, Any]) -> str:
    """The user a job's preflight runs are kept for: its quota subject (the identity its node
    quota is charged to: ``queue.access.quota_subject``), else its user."""
    return str(job.get("quota_subject") or job.get("user") or "")


def _listed_ranks(raw: Any) -> list[int]:
    ranks = []
    for entry in raw or ():
        head = str(entry).split("|", 1)[0]
        if head.isdigit():
            ranks.append(int(head))
    return sorted(set(ranks))


def _round_one_line(gang: Verdict | None, failed: list[int], missing: list[int], nodes: int) -> str:
    parts = [f"gang of {nodes} {gang.line()}" if gang is not None else
             "one node: no gang" if nodes == 1 else "gang not run"]
    parts.append(f"loopbacks failed on rank(s) {', '.join(map(str, failed))}" if failed
                 else "loopbacks passed")
    if missing:
        parts.append(f"no report from rank(s) {', '.join(map(str, missing[:16]))}"
                     + (f" and {len(missing) - 16} more" if len(missing) > 16 else ""))
    return "round 1: " + "; ".join(parts)
