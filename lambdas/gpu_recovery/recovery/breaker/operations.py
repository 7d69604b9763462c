"""The blast-radius breaker's stored state: metrics, the operator's reset, its backlog.

The breaker is consulted inside every node decision (``remediation.node_decision.NodeRemediation``),
its state written in the same transaction as the decision. Here: what the sweep does
with it every minute (metrics ``BreakerOpen``, ``BreakerUtilization``, ``BreakerBacklog``;
carrying out the backlog an operator released) and what ``gpu-recovery-admin breaker``
calls (``show`` / ``reset``).

A released backlog entry is carried out like any node decision, and only while the
breaker's window has room for it (``domain.breaker.admit_release``): after a reset the
backlog comes back at most a window's allowance at a time, oldest first, the rest waits
for later sweeps (a tripped breaker holds it all). One transaction moves the instance
SUSPECT -> REBOOTING / QUARANTINED (conditional on its state), adds the node to the
window and removes the entry (conditional on the breaker's version); the reboot or drain
follows through its own intent (the sweep finishes it). An entry whose node is no longer
held back (an operator fixed it) is dropped.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain import cordon as cordon_policy
from gpu_recovery.domain.breaker import breaker as policy
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    fault_summary,
    history_from_item,
    history_to_item,
    record_fault,
)
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.ports import Deps
from gpu_recovery.recovery.remediation.node_decision import FOLLOW_UP_SECONDS, NodeRemediation
from gpu_recovery.repository import NodeDecision, Repository

logger = logging.getLogger(__name__)

# A released entry older than this is dropped, not replayed (stale backlogs are a hazard:
# NVSentinel #450); the operator may pass another age to the reset.
DEFAULT_MAX_BACKLOG_AGE_SECONDS = 24 * 3600


@dataclass(frozen=True)
class ResetResult:
    done: bool
    released: tuple[dict[str, Any], ...]
    dropped: tuple[dict[str, Any], ...]
    state: dict[str, Any]


def reset_breaker(repo: Repository, *, now: float, resume_backlog: bool, by: str,
                  max_backlog_age_seconds: float | None = DEFAULT_MAX_BACKLOG_AGE_SECONDS) -> ResetResult:
    """Close the breaker (the operator's reset). With ``resume_backlog`` the held-back
    actions are released: the recovery sweep carries them out, a window's allowance at a
    time. Dropping the backlog also drops what an earlier reset released and the window has
    not let through yet (it is the same held-back work)."""
    for _ in range(3):
        stored = repo.get_breaker()
        read_version = int(stored.get("version") or 0) if stored else None
        result = policy.reset(stored, now=now, resume_backlog=resume_backlog,
                              max_backlog_age_seconds=max_backlog_age_seconds, by=by)
        state = dict(result.state)
        waiting = [dict(e) for e in dict((stored or {}).get("released") or {}).values()]
        stale = [e for e in waiting if not resume_backlog or (
            max_backlog_age_seconds is not None and now - float(e.get("at") or 0) > max_backlog_age_seconds)]
        released = {str(e["node"]): e for e in waiting if e not in stale}
        for entry in result.released:
            released[entry["node"]] = dict(entry)
        state["released"] = released
        # The cordon limit closes with it: held cordons are put by the sweep, a window's
        # allowance at a time (domain.cordon).
        state["cordons"] = cordon_policy.reset((stored or {}).get("cordons"))
        if repo.save_breaker(state, read_version):
            return ResetResult(True, result.released, result.dropped + tuple(stale), state)
    return ResetResult(False, (), (), {})


class BreakerOperations:
    def __init__(self, deps: Deps, remediation: NodeRemediation) -> None:
        self.deps = deps
        self.remediation = remediation

    def status(self, now: float, stored: dict[str, Any] | None = None, *,
               count_cluster: bool = True) -> policy.BreakerStatus:
        """The breaker's state (``stored``: the item already read, if any). The cluster is
        counted only while the breaker is busy (an idle one reports no utilisation), and only
        with ``count_cluster``: the sweep's metrics, every minute, use the count its last
        decision was measured against (no ECS listing a minute)."""
        if stored is None:
            stored = self.deps.repo.get_breaker()
        settings = self.deps.settings.remediation.breaker
        nodes = 0
        if policy.is_busy(stored, now=now, policy=settings):
            recorded = (stored or {}).get("cluster_gpu_nodes")
            if not count_cluster:
                nodes = int(recorded or 0)
            else:
                nodes = self.remediation.reboots.gate.cluster_gpu_nodes(stored)
        return policy.status(stored, now=now, cluster_gpu_nodes=nodes, policy=settings)

    def sweep(self, now: float) -> dict[str, int]:
        """Every minute: the breaker's metrics, then the released backlog (oldest first,
        while the window has room)."""
        stored = self.deps.repo.get_breaker()
        if stored is None:
            self.deps.metrics.add_metric("BreakerOpen", "Count", 0)
            return {}
        status = self.status(now, stored, count_cluster=False)
        metrics = status.metrics()
        self.deps.metrics.add_metric("BreakerOpen", "Count", metrics["BreakerTripped"])
        if stored.get("cluster_gpu_nodes") is not None or not status.nodes_in_window:
            # Against the cluster its last decision counted (none counted yet: a first node
            # action needs no count, and a share of an unknown cluster means nothing).
            self.deps.metrics.add_metric("BreakerUtilization", "Percent", 100 * metrics["BreakerUtilization"])
        self.deps.metrics.add_metric("BreakerBacklog", "Count", metrics["BreakerBacklog"])
        done: dict[str, int] = {}
        entries = sorted(dict(stored.get("released") or {}).items(),
                         key=lambda kv: (float(kv[1].get("at") or 0), kv[0]))
        for node, entry in entries:
            outcome = self._release(node, dict(entry), now)
            done[outcome] = done.get(outcome, 0) + 1
        return done

    def _release(self, node: str, entry: dict[str, Any], now: float) -> str:
        repo = self.deps.repo
        raw = repo.get_instance_item(node)
        instance = repo.instance_from_item(raw) if raw else None
        action = Action(entry.get("action") or Action.REBOOT.value)
        effect = Effect.REBOOT if action is Action.REBOOT else Effect.DRAIN
        if instance is None or instance.state is not InstanceState.SUSPECT or not instance.breaker_blocked \
                or not self.deps.policy.modes.executes(effect):
            repo.drop_released(node)
            return "backlog_dropped"
        stored = repo.get_breaker()
        if stored is None or node not in dict(stored.get("released") or {}):
            return "backlog_gone"  # carried out or dropped meanwhile
        read_version = int(stored.get("version") or 0)
        gate = self.remediation.reboots.gate
        nodes = gate.cluster_gpu_nodes(stored)
        admitted = policy.admit_release(stored, node=node, action=action.value, now=now,
                                        cluster_gpu_nodes=nodes,
                                        policy=self.deps.settings.remediation.breaker)
        if not admitted.allowed:
            return "backlog_waiting"
        released = {k: v for k, v in dict(stored.get("released") or {}).items() if k != node}
        update = gate.state_update(stored, read_version, admitted, nodes, released=released)
        blocked = instance.breaker_blocked
        why = f"{action.value} released from the breaker's backlog ({entry.get('reason', '')})"
        record = NodeFaultRecord(at=now, cause=str(blocked.get("rule") or "breaker-backlog"), action=action,
                                 executed=True, evidence=_summary(raw or {}, why))
        history = record_fault(history_from_item(instance.fault_history), record, now,
                               self.deps.policy.escalation)
        terminate = (action is Action.REPLACE and self.deps.policy.replace_action == "terminate_in_asg"
                     and self.deps.policy.modes.executes(Effect.TERMINATE)
                     and not instance.is_managed_instance and not blocked.get("quarantine_only"))
        to = InstanceState.REBOOTING if action is Action.REBOOT else InstanceState.QUARANTINED
        decision = NodeDecision(
            from_states=(InstanceState.SUSPECT,), to=to, fault_history=history_to_item(history),
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "", terminate=terminate,
            follow_up_at=now + FOLLOW_UP_SECONDS)
        if not repo.record_node_decision(instance, decision, [], now, update):
            return "backlog_raced"  # the node or the breaker changed: the next sweep decides again
        fresh = repo.get_instance(node) or instance
        self.remediation.carry_out(fresh)
        logger.warning("breaker backlog entry carried out", extra={"instance": node, "action": action.value})
        return f"backlog_{action.value}"



def _summary(instance_item: dict[str, Any], note: str) -> dict[str, Any]:
    """The held-back fault's evidence (the node's last decision), summarised."""
    evidence = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        stored = (instance_item.get("last_fault") or {}).get("evidence")
        evidence = Evidence.from_dict(stored) if stored else None
    return fault_summary(evidence, note=note)
