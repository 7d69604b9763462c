"""The heartbeat sweep's escalation of ranks NODE_LOST longer than ``node_lost_fail_seconds``:
the recovery loop's DCGM check when ECS still reaches the node, else a node decision of the
recovery loop (``recovery.remediation.node_unreachable``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpu_recovery.constants import JobState
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings
from gpu_recovery.domain.models import Instance, Rank
from gpu_recovery.heartbeat.ports import EcsPort, MetricsPort, RecoveryPort
from gpu_recovery.repository.heartbeat import WATCHED_JOB_STATES, HeartbeatRepository

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

    def escalate(self, job_id: str, attempt: int, inst_id: str, lost: list[tuple[Rank, float]],
                 instance: Instance | None, now: float) -> str:
        """NODE_LOST too long: the recovery loop's diag if ECS still reaches the node; else
        a node decision of the recovery loop (quarantine through the breaker and observe
        mode; the job fails)."""
        ranks = [r for r, _ in lost]
        job = self.repo.get_job(job_id)
        if job is None or job.attempt != attempt or job.state not in WATCHED_JOB_STATES:
            if job is not None and job.attempt == attempt and job.state is JobState.FAILED:
                # Perhaps failed by an earlier sweep's unreachable-node decision that died
                # before every StopTask was asked: the decision finishes them (else: moved on).
                return self._unreachable(job_id, attempt, inst_id, lost, "")
            for rank in ranks:
                self._unwatch(rank, "job is " + (job.state.value if job else "missing"))
            return "unwatched"
        lost_for = int(now - min(at for _, at in lost))
        names = ", ".join(str(r.rank) for r in ranks)
        reason = (f"rank(s) {names} NODE_LOST on {inst_id} for {lost_for} s "
                  f"(limit {self.settings.node_lost_fail_seconds} s): suspected node fault")
        arn = (instance.container_instance_arn if instance else "") or inst_id
        try:
            described = self.ecs.describe_container_instance(arn)
        except Exception:
            logger.warning("DescribeContainerInstances failed; retried next sweep", exc_info=True,
                           extra={"instance": inst_id})
            return "retry"
        if described and described.get("agentConnected"):
            # Only a job still NODE_LOST: a heartbeat may have revived it since the read.
            self._recovery().report_suspected_fault(job_id, attempt, inst_id, reason,
                                                    from_states=[JobState.NODE_LOST])
            self.metrics.add_metric("NodeLostEscalated", "Count", 1)
            return "recovery"
        return self._unreachable(job_id, attempt, inst_id, lost, reason + "; ECS agent disconnected")

    def _unreachable(self, job_id: str, attempt: int, inst_id: str, lost: list[tuple[Rank, float]],
                     reason: str) -> str:
        ranks = [r for r, _ in lost]
        try:
            outcome = self._recovery().node_unreachable(
                job_id, attempt, inst_id, ranks, min(at for _, at in lost), reason)
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
