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

So are a suspension's ranks asked to stop (STOP_REQUESTED): its stop keeps them in the
heartbeat index until STOPPED (``JobsAndRanks.request_rank_stop(watched=True)``), so a node
lost just before or under the stop (a go_suspend(), or a grace ending, soon after the node was
lost) is decided the same way and as soon: lost since it was NODE_LOST, or since its last
heartbeat was stale (``heartbeat_policy.stop_unconfirmed_since``: its heartbeats are no longer
recorded), escalated past ``node_lost_fail_seconds``, decided by the same two readings. A rank
stopping normally leaves the index with its STOPPED event; one slower than that limit finds its
ECS agent connected (nothing done: the stop's paced rounds go on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery.constants import HB_AT, JOB_PK, JobState, RankState
from gpu_recovery.domain import heartbeat_policy as policy
from gpu_recovery.domain.heartbeat_policy import HeartbeatSettings
from gpu_recovery.domain.models import Rank
from gpu_recovery.heartbeat.ports import EcsPort, MetricsPort, RecoveryPort
from gpu_recovery.repository.heartbeat import DISCONNECTED_SEEN, WATCHED_JOB_STATES, HeartbeatRepository

logger = logging.getLogger(__name__)


def lost_since(item: dict[str, Any], stale_seconds: float) -> float | None:
    """When a watched rank was lost, the one rule the sweep escalates by and the escalation
    reports: NODE_LOST, its ``node_lost_at``; a suspension's rank asked to stop,
    ``heartbeat_policy.stop_unconfirmed_since``. None: not known (never escalated)."""
    if item.get("rank_state") == RankState.NODE_LOST.value:
        lost_at = item.get("node_lost_at")
        return None if lost_at is None else float(lost_at)
    return policy.stop_unconfirmed_since(item.get("node_lost_at"), item.get(HB_AT), stale_seconds)


def _escalated_since(item: dict[str, Any], stale_seconds: float) -> float:
    since = lost_since(item, stale_seconds)
    if since is None:
        raise ValueError(f"rank {item.get(JOB_PK)} escalated has no time it was lost since")
    return since


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
        Returns recovery | confirming | failed | unwatched | retry | suspending | ended."""
        stale = self.settings.stale_seconds
        lost = [(self.repo.rank_from_item(i), _escalated_since(i, stale)) for i in items]
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
        suspending = job.state is JobState.SUSPENDING
        stray = [r for r in ranks if r.state is RankState.STOP_REQUESTED and not suspending]
        if stray:
            # Only a suspension's stop keeps its ranks watched (its job never runs again once it
            # asked them to stop): unwatched; the node's lost ranks, if any, at the next sweep.
            for rank in stray:
                self._unwatch(rank, f"rank asked to stop, job is {job.state.value}")
            return "unwatched"
        lost_for = int(now - min(at for _, at in lost))
        names = ", ".join(str(r.rank) for r in ranks)
        how = "NODE_LOST" if all(r.state is RankState.NODE_LOST for r in ranks) else \
            "silent and not confirmed stopped"
        reason = (f"rank(s) {names} {how} on {inst_id} for {lost_for} s "
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
            # A rank missing from its node's reports may have ended with its STOPPED event lost:
            # ECS's record of its task settles it before the node is checked for it.
            try:
                live = self._recovery().live_after_lost_stops(ranks)
            except (ClientError, BotoCoreError):
                logger.warning("lost ranks' tasks not described or handled; retried next sweep",
                               exc_info=True, extra={"job_id": job_id, "instance": inst_id})
                return "retry"
            if not live:
                return "ended"
            if len(live) < len(ranks):
                return "retry"  # the job moved on with the ended ones: the next sweep reads it again
            # Only a job still NODE_LOST: a heartbeat may have revived it since the read.
            self._recovery().report_suspected_fault(job_id, attempt, inst_id, reason,
                                                    from_states=[JobState.NODE_LOST])
            self.metrics.add_metric("NodeLostEscalated", "Count", 1)
            return "recovery"
        first = policy.first_disconnected_reading((i.get(DISCONNECTED_SEEN), at)
                                                  for i, (_, at) in zip(items, lost, strict=True))
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
        if outcome in ("failed", "converged"):
            # A suspension's ranks were asked to stop already, and the decision's stops are the
            # failed job's (its intent): nothing is left to watch them for.
            for rank in ranks:
                if rank.state is RankState.STOP_REQUESTED:
                    self._unwatch(rank, f"node lost: {outcome}")
        if outcome in ("failed", "observed"):
            self.metrics.add_metric("NodeLostFailed", "Count", 1)
            return "failed"
        return "unwatched" if outcome in ("moved_on", "converged") else "retry"
