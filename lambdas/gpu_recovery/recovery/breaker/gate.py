"""The blast-radius breaker's gate: every automatic reboot, replacement and quarantine
asks it first (node decisions, timed-out reboots and health checks, nodes lost with
their agent disconnected), and for a node found bad that will not be drained, the cordon
limit too. Its answer is a new state of the breaker's item, written in the caller's own
transaction (conditional on the version read): a crash never counts an action that was not
recorded, nor records one not counted. The trip e-mail is built here too
(:meth:`NodeActionGate.tripped_notice`, :func:`held_back_lines`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsActionFailed
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain import cordon as cordon_policy
from gpu_recovery.domain.breaker import breaker as breaker_policy
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.placement import PLACEMENT_EXPRESSION
from gpu_recovery.domain.relocation import gpu_count
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import ListsContainerInstances, MetricsPort
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.breaker import BreakerRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

CLUSTER_COUNT_TTL_SECONDS = 60.0


@dataclass(frozen=True)
class GateAnswer:
    breaker: breaker_policy.BreakerDecision | None  # None: no node action was asked
    cordon: cordon_policy.CordonDecision | None  # None: no cordon needed (or drained instead)
    update: Update | None  # the breaker item to write in the caller's transaction

    @property
    def tripped(self) -> breaker_policy.BreakerDecision | None:
        return self.breaker if self.breaker is not None and self.breaker.tripped_now else None

    def cordon_record(self, *, cause: str, reason: str, now: float) -> dict[str, Any] | None:
        """The instance's cordon (None: not cordoned by this decision)."""
        if self.cordon is None:
            return None
        return cordon_policy.cordon_record(cause=cause, reason=reason, now=now,
                                           ecs=cordon_policy.ECS_PENDING if self.cordon.allowed
                                           else cordon_policy.ECS_HELD)


class ClusterCountUnavailable(RuntimeError):
    """The breaker needs the cluster's size, ECS cannot be listed and no count was ever
    recorded: the decision is retried, never taken against an empty cluster."""


@dataclass(frozen=True)
class _CachedCount:
    at: float
    count: int


@dataclass(eq=False, repr=False)
class NodeActionGate:
    """The blast-radius breaker in front of every automatic reboot, replacement and
    quarantine: a node decision, a timed-out reboot or health check, a node lost with
    its agent disconnected. :meth:`ask` returns the breaker's answer and its new state,
    to be written in the caller's own transaction (conditional on the version read), so a
    crash never counts an action that was not recorded, nor records one not counted."""

    breaker: BreakerRepository
    ecs: ListsContainerInstances
    notices: Notices
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    _cluster_count: _CachedCount | None = field(default=None, init=False)

    def cluster_gpu_nodes(self, stored: dict[str, Any] | None = None) -> int:
        """GPU container instances of the cluster (ACTIVE or DRAINING), cached a minute.
        When ECS cannot be listed (throttled, or a function without the permission) the
        count the breaker last measured against is used. With no count at all the decision
        is not taken now (:class:`ClusterCountUnavailable`: nothing is committed, and the
        event's retry or the sweep counts again): an AWS error must never make the cluster
        look empty, which would trip the breaker on the second node of any window."""
        now = clock.now()
        if self._cluster_count and 0 <= now - self._cluster_count.at < CLUSTER_COUNT_TTL_SECONDS:
            return self._cluster_count.count
        try:
            # An instance listed but answered MISSING is not counted as gone: a short count
            # could trip the breaker, so the count is unavailable then (issue 40: failures).
            count = sum(1 for ci in self.ecs.container_instances(missing_ok=False)
                        if gpu_count(ci.get("registeredResources")) > 0)
        except (ClientError, BotoCoreError, EcsActionFailed) as error:
            item = stored if stored is not None else self.breaker.read()
            last = (item or {}).get("cluster_gpu_nodes")
            if last is None:
                raise ClusterCountUnavailable(
                    f"cannot count the cluster's GPU nodes and never could ({error}); the breaker's "
                    "decision waits for a count (the retry or the sweep counts again)") from error
            logger.warning("cannot count the cluster's GPU nodes; the breaker uses its last count",
                           extra={"error": str(error), "last_count": last})
            return int(last)
        self._cluster_count = _CachedCount(now, count)
        return count

    def decide(self, *, node: str, action: str | None, job_ids: Iterable[str], reason: str, now: float,
               cordon_unless_drained: bool = False, drains_if_allowed: bool = False,
               cause: Mapping[str, str] | None = None) -> GateAnswer:
        """The breaker's answer to a node action (``action``; None: none asked) and, for a
        node known bad (``cordon_unless_drained``) that will not be drained, the cordon
        limit's answer to its ECS attribute: both in one update of the breaker's item."""
        stored = self.breaker.read()
        read_version = int(stored.get("version") or 0) if stored else None
        policy = self.settings.remediation.breaker
        last_count = int((stored or {}).get("cluster_gpu_nodes") or 0)
        nodes = last_count
        counted = False
        decided = None
        if action is not None:
            if breaker_policy.needs_cluster_count(stored, node=node, now=now, policy=policy):
                nodes, counted = self.cluster_gpu_nodes(stored), True
            decided = breaker_policy.record_action(
                stored, node=node, action=action, now=now, cluster_gpu_nodes=nodes, policy=policy,
                job_id=",".join(job_ids), reason=reason[:300], cause=cause)
        cordoned = None
        if cordon_unless_drained and not (decided is not None and decided.allowed and drains_if_allowed):
            limits = self.settings.remediation.cordon
            current = cordon_policy.normalize((stored or {}).get("cordons"))
            in_window = {e["node"] for e in current["window"] if now - limits.window_seconds < e["at"] <= now}
            if current["state"] == cordon_policy.CLOSED and node not in in_window \
                    and len(in_window) + 1 > limits.allowed_nodes(0):
                nodes, counted = self.cluster_gpu_nodes(stored), True
            cordoned = cordon_policy.admit((stored or {}).get("cordons"), node=node, now=now,
                                           cluster_gpu_nodes=nodes, policy=limits, cause=cause)
        return GateAnswer(decided, cordoned, self.state_update(stored, read_version, decided, nodes,
                                                               cordons=cordoned, counted=counted))

    def state_update(self, stored: dict[str, Any] | None, read_version: int | None,
                     decided: breaker_policy.BreakerDecision | None, nodes: int,
                     released: dict[str, Any] | None = None,
                     cordons: cordon_policy.CordonDecision | None = None,
                     counted: bool = True) -> Update | None:
        """The breaker item to write with the decision (None: nothing changed). The released
        backlog is kept (or replaced by ``released``); the cordon limit's state is written
        when ``cordons`` decided (else left as stored). ``counted``: ``nodes`` is the cluster
        just counted, not the stored count (0 when never counted) a decision the cluster's size
        could not change was taken with."""
        unchanged = decided is None or decided.state == breaker_policy.normalize(stored)
        if cordons is not None and cordons.state != cordon_policy.normalize((stored or {}).get("cordons")):
            unchanged = False
        if unchanged and released is None:
            return None
        if decided is None:
            state = breaker_policy.normalize(stored)
            state["version"] += 1
        else:
            state = dict(decided.state)
        if cordons is not None:
            state["cordons"] = cordons.state
        if released is not None:
            state["released"] = released
        elif stored and stored.get("released"):
            state["released"] = stored["released"]
        # What the decision was measured against, for `gpu-recovery-admin breaker show`.
        settings = self.settings.remediation.breaker
        state.update(limit=decided.limit if decided is not None else settings.allowed_nodes(nodes),
                     window_seconds=settings.window_seconds, auto_close=settings.auto_close)
        # Only a real count is recorded: a first node action needs none, and "0 GPU nodes"
        # in `breaker show` would read as a measurement.
        if counted:
            state["cluster_gpu_nodes"] = nodes
        elif stored and stored.get("cluster_gpu_nodes") is not None:
            state["cluster_gpu_nodes"] = stored["cluster_gpu_nodes"]
        return self.breaker.update(state, read_version)

    def tripped_notice(self, decided: breaker_policy.BreakerDecision, inst_id: str,
                       fates: Mapping[str, str] | None = None) -> Owed:
        """The trip e-mail, owed by whoever tripped it (with the write that tripped it).
        ``fates``: job id -> what the decision did to each job on the node (waits HELD,
        moves, fails)."""
        until = "an operator resets the breaker"
        if self.settings.remediation.breaker.auto_close:
            until = ("the breaker closes by itself (a window after this trip, once the nodes it acted on are "
                     "back healthy; it e-mails either way) or an operator resets it")
        return self.notices.for_node(
            NotificationKind.BREAKER_TRIPPED, "Automatic node remediation stopped (blast-radius breaker)",
            container_inst_id=inst_id, instance_id="",
            what_happened=str(decided.state.get("trip_reason") or decided.reason),
            what_was_done=(f"No node is rebooted, replaced or quarantined automatically until {until}; "
                           "every held-back action is kept in its backlog (this one included), and its node "
                           "is cordoned: no new work from the queue, nor from ECS placement for tasks with "
                           f"the constraint {PLACEMENT_EXPRESSION}"),
            operator_action=("Find the common cause (driver rollout, power, fabric). Then "
                             "`gpu-recovery-admin breaker show`, and `gpu-recovery-admin breaker reset "
                             "--resume-backlog` (carry the held-back actions out) or `--drop-backlog`."),
            details=held_back_lines(decided.state.get("backlog") or (), fates,
                                    self.settings.held_job_deadline_seconds))

    def tripped(self, decided: breaker_policy.BreakerDecision) -> None:
        """After the commit that tripped it: the metric and the log line."""
        self.metrics.add_metric("BreakerTripped", "Count", 1)
        logger.error("blast-radius breaker tripped", extra={"why": decided.state.get("trip_reason")})


def held_back_lines(backlog: Iterable[dict[str, Any]], fates: Mapping[str, str] | None = None,
                    held_seconds: int = 0) -> list[str]:
    """The trip e-mail's details: each held node, the jobs on it and what each does now,
    what a reset does to the node and to the jobs waiting for it."""
    lines = []
    fates = fates or {}
    for entry in backlog:
        node, action = str(entry.get("node", "")), str(entry.get("action", ""))
        job_ids = [j for j in str(entry.get("job_id") or "").split(",") if j]
        jobs = ", ".join(f"{j} ({fates[j]})" if j in fates else j for j in job_ids) or "none"
        waiting = [j for j in job_ids if fates.get(j, "").startswith("waits")]
        if action in (Action.REBOOT.value, Action.RESET_GPU.value):
            resume = ("reboots it" if action == Action.REBOOT.value
                      else "resets its GPUs (reboots it if the reset fails)")
            resume += "; it is uncordoned and takes work again once back"
            if waiting:
                resume += f", and {', '.join(waiting)} restart(s) on their nodes then"
        else:
            resume = "drains it (DRAINING) for a person; never terminated from the backlog"
        drop = "--drop-backlog leaves it SUSPECT and cordoned until you act (`gpu-recovery-admin uncordon` " \
            "once repaired)"
        if waiting:
            drop += f" and fails {', '.join(waiting)}"
        lines.append(f"Held: {node} needs {action} (jobs on it: {jobs}); --resume-backlog {resume}; {drop}")
        if waiting and held_seconds:
            lines.append(f"  Without a reset (or the breaker closing by itself, when breaker_auto_close is "
                         f"on) the waiting job(s) fail {held_seconds} s after they were held "
                         "(held_job_deadline_seconds)")
    return lines
