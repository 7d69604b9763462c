"""The nodes a gang preflight pinned, handed to the recovery loop's existing paths.

Each pinned node becomes a **suspect of the attempt's fault** whose evidence says what the
preflight found (``Trigger.PREFLIGHT``: its loopback, its groups, the link to its peer, with
the busbw and the threshold) and whose plan the fault catalog made (default rule
``preflight-pinned``: **the stack's own DCGM check**, never a reboot, reset or replacement on
the preflight's word, which is the tenant's: issue 49). The job enters recovery as for any
fault (PENDING_HEALTHCHECK, every rank to be stopped), its pinned nodes named suspects at its
latch, so the fault counts them once every rank ended. From there nothing is new:

* the node decision (``remediation.node_decision``) runs the check on each node and its
  verdict decides as for any fault: a failed diag cordons and reboots or replaces the node,
  through the breaker and observe mode, recorded in the node's fault history (escalation);
  a passed diag **clears** it (``dcgm-healthy-after-preflight``: back to work). A
  single-node diag does not see a degraded NVLink/EFA path, so such a node is cleared and
  the job's next preflight may pin it again, until the job's (or its user's) limit of
  cleared suspects (``remediation.tenant_evidence``) stops its preflights from pinning;
* the job restarts without them: a spare or a relocation when it may move (queue jobs go
  back to the queue at the head of their priority), otherwise it waits for the nodes'
  check and any repair (PENDING_RESTART, its reason in its history). A fault the preflight found spends no
  budget (``job_settlement``): the attempt had not trained, so the job never fails for it.

Intent first: the preflight's ``pinned`` conclusion (with a deadline) is committed before
this runs, and every step here is idempotent (the suspect items keep their first record,
the job's transition is conditional on its attempt and state, latch arrivals are set
additions, StopTask asked again is harmless). The control API runs it on the report that
concludes the preflight; the sweep runs it again until the conclusion is marked handed
over. The node decisions are the sweep's, through each suspect item's deadline (set due at
once).

As on the task-event path (``TaskEvents``: the stop's fence, then ``PlacementHolds.on_fault``),
the pinned nodes are kept out of new placement in the same invocation, whatever their plan:
each is **fenced** as a suspect (out of the stack's own placements until its decision or
check answers) before the job enters recovery, and once it has, every node of the job is
**reserved** for it (the ``gpu-recovery.unavailable`` attribute: other schedulers keep off)
before its ranks are stopped and their nodes free. A pinned node is a suspect for the
stack's own check, never condemned by the preflight's word: the reservation and the fence
hold it only until it is judged. Its calls: DynamoDB, PutAttributes (and, with a spare
pool, the container-instance reads of the refresh), StopTask (the control API's role).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain import goodput
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.models import Job, Suspect
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, RECOVERING_JOB_STATES, JobState
from gpu_recovery.recovery.gang import GangOps
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.recovery.reactions import Reactions, reserved_first
from gpu_recovery.recovery.remediation.node_decision import NodeRemediation
from gpu_recovery.recovery.stage_data import HasJobs, ReadsJob
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.repository.preflight import PreflightRepository
from gpu_recovery.repository.rank_events import RankEventRepository

logger = logging.getLogger(__name__)


class HandoverData(HasJobs[ReadsJob], Protocol):
    """The job entering recovery, its pinned nodes' suspect items and latch arrivals, the
    preflight's conclusion handed over."""

    faults: FaultRepository
    latches: LatchRepository
    preflight: PreflightRepository
    rank_events: RankEventRepository  # the fault entered, as a rank's end enters it


@dataclass(eq=False, repr=False)
class PreflightHandover:
    data: HandoverData
    remediation: NodeRemediation
    gang: GangOps
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    reactions: Reactions = field(default_factory=Reactions)  # told: a fault seen (the job's nodes reserved)

    def hand_over(self, item: Mapping[str, Any]) -> str:
        """The pinned nodes of a concluded preflight (its item) to the recovery loop."""
        repo = self.data
        job_id, attempt = str(item["pf_job_id"]), int(item["attempt"])
        pinned = [p for p in item.get("pinned") or () if isinstance(p, Mapping) and p.get("node")]
        now = clock.now()
        job = repo.jobs.get_job(job_id)
        if job is None or job.attempt != attempt or not pinned:
            repo.preflight.handed_over(job_id, attempt, now)
            return "preflight_moved_on"
        joining = job.state is JobState.PENDING_HEALTHCHECK and job.tally.attempt == attempt
        if job.state not in ACTIVE_JOB_STATES and not joining:
            repo.preflight.handed_over(job_id, attempt, now)  # another fault, a cancel: theirs now
            return "preflight_moved_on"
        suspects = [self._open_suspect(job_id, attempt, pin, now, job) for pin in pinned]
        nodes = ", ".join(f"{p['node']} (rank {p['rank']})" for p in pinned)
        reason = f"gang preflight pinned {nodes}: {str(pinned[0].get('reason') or '')[:200]}"
        in_recovery = joining
        named = [(int(p["rank"]), str(p["node"])) for p in pinned]
        entered = False
        if job.state in ACTIVE_JOB_STATES:
            entered = repo.rank_events.enter_recovery(
                job_id, attempt, from_states=ACTIVE_JOB_STATES, reason=reason,
                now=now, deadline_at=now + RETRY_INTERVAL_SECONDS, opened_by=Trigger.PREFLIGHT.value,
                # The attempt ran its preflight, not training (issue 52).
                ledger=goodput.interval_marks(goodput.PREFLIGHT, now),
                # Its pinned nodes named suspects at the latch by the same write: the sweep sends
                # the stop once it commits, and ranks all ended before a naming that came later
                # (this call died after the commit) would count a fault with no suspect and
                # restart on the pinned nodes unchecked (preflight_pin at 5 %, seed 9).
                also=repo.latches.suspect_arrivals(job_id, attempt, named))
            in_recovery = entered
            if entered:
                self.metrics.add_metric("FaultsDetected", "Count", 1)
                logger.warning("gang preflight pinned nodes: recovery",
                               extra={"job_id": job_id, "why": reason})
        if in_recovery:
            # Each pinned node not judged yet is out of the stack's placements until it is (as a
            # rank's stop that names its node a suspect fences it), whatever its plan. Only once
            # the job is in recovery for it: a fence on a job that never entered would have the
            # sweep check the node alone, for nothing.
            for suspect in suspects:
                if suspect.pending:
                    repo.faults.fence_suspect(suspect.node, {"job": job_id, "attempt": attempt, "at": now,
                                                             "why": "preflight"})
        if not entered:  # joining a fault (or entered by an earlier try): named at its latch now
            for rank, node in named:
                repo.latches.arrive(job_id, attempt, job.world_size, rank, [], suspect_node=node)
        fresh = repo.jobs.get_job(job_id)
        # First the job's nodes reserved for it (before its ranks stop and free them).
        reserved = fresh is None or fresh.attempt != attempt or fresh.state not in RECOVERING_JOB_STATES \
            or reserved_first(self.reactions, fresh)
        if reserved and fresh is not None and fresh.attempt == attempt and fresh.stop_fanout \
                and not fresh.stop_fanout.get("sent_at"):
            try:
                # Its role lists no tasks: a rank never registered leaves the stop to the sweep.
                self.gang.stop(fresh, look_up_missing=False)
            except Exception:  # the job's deadline: the sweep sends the stops
                logger.warning("gang stop not sent; the sweep sends it", exc_info=True,
                               extra={"job_id": job_id})
        repo.preflight.handed_over(job_id, attempt, now)
        return "preflight_handed_over"

    def _open_suspect(self, job_id: str, attempt: int, pin: Mapping[str, Any], now: float,
                      job: Job) -> Suspect:
        """The node's suspect item with the preflight's evidence and the catalog's plan, due at
        once: the sweep's next step decides the node (the fast path, for a definitive plan)."""
        repo = self.data
        node, rank = str(pin["node"]), int(pin["rank"])
        # No instance read here (the control API reads no instance item): the node decision
        # rebuilds this evidence with the node's reports (XIDs, GPU signals) and history.
        raw = None
        finding = {"round": pin.get("round"), "reason": str(pin.get("reason") or ""),
                   "result": str(pin.get("result") or ""), "attempt": attempt}
        if pin.get("peer_node"):
            finding["peer"] = str(pin["peer_node"])
        evidence = self.remediation.evidence(inst_id=node, instance_item=raw, trigger=Trigger.PREFLIGHT,
                                             fault_at=float(pin.get("at") or now), job=job, rank=rank)
        evidence = replace(evidence, preflight=finding)
        plan = self.remediation.plan(evidence, raw, now=now)
        return repo.faults.open_suspect(job_id, attempt, node, rank=rank,
                                        record={"at": now, "evidence": evidence.to_dict(),
                                                "plan": plan.to_dict()},
                                        now=now, retry_at=now)
