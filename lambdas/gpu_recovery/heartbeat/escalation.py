"""The heartbeat sweep's escalation of ranks NODE_LOST longer than ``node_lost_fail_seconds``:
the recovery loop's DCGM check when ECS still reaches the node, else a decision of the
recovery loop (``recovery.remediation.node_unreachable``).

A missing answer never condemns a node alone. ECS's ``agentConnected`` false counts only
when a later visit, long enough after, reads it again (``domain.heartbeat_policy``: the first
reading is stored on the job's first lost rank there, the second decides); and a host whose
node agent still reports is alive: its ECS agent (or the container runtime it drives) stopped
answering, so the job fails (its rank there cannot be confirmed stopped) but the node is
only flagged SUSPECT. Only a node whose ECS agent and node agent were both silent at both
readings is unreachable: quarantined for a person.

A SUSPENDING job's lost ranks are escalated too, but only to that decision: while ECS reaches
the node, its suspension's StopTask does (nothing is handed to the diag); a node lost for good
leaves a rank no stop can confirm, so the job fails as a RUNNING one would (its suspension
could not be completed) instead of staying SUSPENDING, holding its quota, forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpu_recovery.constants import JobState
from gpu_recovery.domain import heartbeat_policy as policy
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings
from gpu_recovery.domain.models import Rank
from gpu_recovery.heartbeat.ports import EcsPort, MetricsPort, RecoveryPort
from gpu_recovery.repository.heartbeat import DISCONNECTED_SEEN, WATCHED_JOB_STATES, HeartbeatRepository

logger = logging.getLogger(__name__)


class NodeLostEscalation:
    """One job's ranks lost on one node, too long: what the sweep does about them."""

    def __init__(self, repo: HeartbeatRepository, settings: HeartbeatSettings, ecs: EcsPort,
                 recovery: Callable[[], RecoveryPort], metrics: MetricsPort,
                 unwatch: Callable[[Rank, str], bool]) -> None:
        self.repo = repo
        self.settings = settings
        self.ecs = ecs
        self._recovery = recovery
        self.metrics = metrics
        self._unwatch = unwatch  # the service's: drop a rank from the heartbeat index

    def escalate(self, job_id: str, attempt: int, inst_id: str, items: list[dict[str, Any]],
                 node: dict[str, Any] | None, now: float) -> str:
        """NODE_LOST too long (``items``: the job's lost rank items on the node; ``node``: its
        item as the sweep read it): the recovery loop's diag if ECS still reaches the node;
        ECS's agent disconnected at two readings: the job fails, and the node is quarantined
        (through the breaker and observe mode) only if its node agent was silent too.
        A SUSPENDING job whose node ECS still reaches is left to its suspension's stop.
        Returns recovery | confirming | failed | unwatched | retry | suspending."""
        lost = [(self.repo.rank_from_item(i), float(i["node_lost_at"])) for i in items]
        ranks = [r for r, _ in lost]
        job = self.repo.get_job(job_id)
        if job is None or job.attempt != attempt or job.state not in WATCHED_JOB_STATES:
            if job is not None and job.attempt == attempt and job.state is JobState.FAILED:
                # Perhaps failed by an earlier sweep's node-lost decision that died before
                # every StopTask was asked: the decision finishes them (else: moved on).
                return self._unreachable(job_id, attempt, inst_id, lost, "")
            for rank in ranks:
                self._unwatch(rank, "job is " + (job.state.value if job else "missing"))
            return "unwatched"
        lost_for = int(now - min(at for _, at in lost))
        names = ", ".join(str(r.rank) for r in ranks)
        reason = (f"rank(s) {names} NODE_LOST on {inst_id} for {lost_for} s "
                  f"(limit {self.settings.node_lost_fail_seconds} s): suspected node fault")
        instance = self.repo.instance_from_item(node) if node else None
        arn = (instance.container_instance_arn if instance else "") or inst_id
        try:
            described = self.ecs.describe_container_instance(arn)
        except Exception:
            logger.warning("DescribeContainerInstances failed; retried next sweep", exc_info=True,
                           extra={"instance": inst_id})
            return "retry"
        if described and described.get("agentConnected"):
            for rank, item in zip(ranks, items, strict=True):
                if item.get(DISCONNECTED_SEEN) is not None:
                    self.repo.forget_disconnected(rank)  # not sustained: a later one starts over
            if job.state is JobState.SUSPENDING:
                return "suspending"  # ECS reaches the node: the suspension's StopTask does too
            # Only a job still NODE_LOST: a heartbeat may have revived it since the read.
            self._recovery().report_suspected_fault(job_id, attempt, inst_id, reason,
                                                    from_states=[JobState.NODE_LOST])
            self.metrics.add_metric("NodeLostEscalated", "Count", 1)
            return "recovery"
        stale = self.settings.stale_seconds
        first = policy.first_disconnected_reading((i.get(DISCONNECTED_SEEN), i.get("node_lost_at"))
                                                  for i in items)
        if first is None:
            # One reading proves nothing: store it, and let the recovery sweep's backstop wait
            # for the visit that confirms it.
            wait = policy.disconnect_confirm_seconds(stale)
            if self.repo.record_disconnected(min(ranks, key=lambda r: r.rank), now, now + wait, job.state):
                logger.info("ECS agent of a lost node read disconnected; confirmed at a visit %s s later or "
                            "more", wait, extra={"job_id": job_id, "instance": inst_id})
            return "confirming"
        if not policy.disconnect_confirmed(first, now, stale):
            return "confirming"
        readings = f"ECS agent disconnected at two readings {int(now - first)} s apart"
        if policy.host_reporting((node or {}).get("last_report_at"), first, stale):
            return self._unreachable(
                job_id, attempt, inst_id, lost,
                f"{reason}; {readings}, while the node agent on the host still reports: the host is "
                "alive, its ECS agent (or the container runtime) is not answering", host_reporting=True)
        return self._unreachable(job_id, attempt, inst_id, lost,
                                 f"{reason}; {readings}, and the node agent silent too: node unreachable")

    def _unreachable(self, job_id: str, attempt: int, inst_id: str, lost: list[tuple[Rank, float]],
                     reason: str, *, host_reporting: bool = False) -> str:
        ranks = [r for r, _ in lost]
        try:
            outcome = self._recovery().node_unreachable(
                job_id, attempt, inst_id, ranks, min(at for _, at in lost), reason,
                host_reporting=host_reporting)
        except Exception:
            # The decision (if committed) is on the job: the next sweep finishes its stops.
            logger.warning("node-lost decision failed; retried next sweep", exc_info=True,
                           extra={"job_id": job_id, "instance": inst_id})
            return "retry"
        if outcome in ("observed", "observed_before", "moved_on"):
            # Nothing will stop these ranks (observe mode) or they are another decision's now.
            for rank in ranks:
                self._unwatch(rank, f"node lost: {outcome}")
        if outcome in ("failed", "observed"):
            self.metrics.add_metric("NodeLostFailed", "Count", 1)
            return "failed"
        return "unwatched" if outcome in ("moved_on", "converged") else "retry"
