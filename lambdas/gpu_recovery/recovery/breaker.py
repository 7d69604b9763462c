"""The blast-radius breaker's stored state: metrics, the operator's reset, its backlog.

The breaker is consulted inside every node decision (``remediation.NodeRemediation``),
its state written in the same transaction as the decision. Here: what the sweep does
with it every minute (metrics ``BreakerOpen``, ``BreakerUtilization``, ``BreakerBacklog``;
carrying out the backlog an operator released) and what ``gpu-recovery-admin breaker``
calls (``show`` / ``reset``).

A released backlog entry is carried out like any node decision: the instance moves
SUSPECT -> REBOOTING / QUARANTINED (conditional on the breaker's mark on it), the reboot
or drain follows through its own intent, and only then is the entry removed. An entry
whose node is no longer held back (an operator fixed it) is dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain import breaker as policy
from gpu_recovery.domain.escalation import NodeFaultRecord, history_from_item, history_to_item, record_fault
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.ports import Deps
from gpu_recovery.recovery.remediation import FOLLOW_UP_SECONDS, NodeRemediation
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
    actions are released: the recovery sweep carries them out within a minute."""
    for _ in range(3):
        stored = repo.get_breaker()
        read_version = int(stored.get("version") or 0) if stored else None
        result = policy.reset(stored, now=now, resume_backlog=resume_backlog,
                              max_backlog_age_seconds=max_backlog_age_seconds, by=by)
        state = dict(result.state)
        released = dict((stored or {}).get("released") or {})
        for entry in result.released:
            released[entry["node"]] = dict(entry)
        state["released"] = released
        if repo.save_breaker(state, read_version):
            return ResetResult(True, result.released, result.dropped, state)
    return ResetResult(False, (), (), {})


class BreakerOperations:
    def __init__(self, deps: Deps, remediation: NodeRemediation) -> None:
        self.deps = deps
        self.remediation = remediation

    def status(self, now: float) -> policy.BreakerStatus:
        stored = self.deps.repo.get_breaker()
        state = policy.normalize(stored)
        busy = state["state"] == policy.TRIPPED or state["window"] or state["backlog"]
        nodes = self.remediation.cluster_gpu_nodes() if busy else 0
        return policy.status(stored, now=now, cluster_gpu_nodes=nodes,
                             policy=self.deps.settings.remediation.breaker)

    def sweep(self, now: float) -> dict[str, int]:
        """Every minute: the breaker's metrics, then the released backlog."""
        stored = self.deps.repo.get_breaker()
        if stored is None:
            self.deps.metrics.add_metric("BreakerOpen", "Count", 0)
            return {}
        status = self.status(now)
        metrics = status.metrics()
        self.deps.metrics.add_metric("BreakerOpen", "Count", metrics["BreakerTripped"])
        self.deps.metrics.add_metric("BreakerUtilization", "Percent", 100 * metrics["BreakerUtilization"])
        self.deps.metrics.add_metric("BreakerBacklog", "Count", metrics["BreakerBacklog"])
        done: dict[str, int] = {}
        for node, entry in sorted(dict(stored.get("released") or {}).items()):
            outcome = self._release(node, dict(entry), now)
            done[outcome] = done.get(outcome, 0) + 1
        return done

    def _release(self, node: str, entry: dict[str, Any], now: float) -> str:
        repo = self.deps.repo
        instance = repo.get_instance(node)
        action = Action(entry.get("action") or Action.REBOOT.value)
        effect = Effect.REBOOT if action is Action.REBOOT else Effect.DRAIN
        if instance is None or instance.state is not InstanceState.SUSPECT or not instance.breaker_blocked \
                or not self.deps.policy.modes.executes(effect):
            repo.drop_released(node)
            return "backlog_dropped"
        why = f"{action.value} released from the breaker's backlog ({entry.get('reason', '')})"
        record = NodeFaultRecord(at=now, cause=str(instance.breaker_blocked.get("rule") or "breaker-backlog"),
                                 action=action, executed=True)
        history = record_fault(history_from_item(instance.fault_history), record, now,
                               self.deps.policy.escalation)
        terminate = (action is Action.REPLACE and self.deps.policy.replace_action == "terminate_in_asg"
                     and not instance.is_managed_instance)
        to = InstanceState.REBOOTING if action is Action.REBOOT else InstanceState.QUARANTINED
        decision = NodeDecision(
            from_states=(InstanceState.SUSPECT,), to=to, fault_history=history_to_item(history),
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "", terminate=terminate,
            follow_up_at=now + FOLLOW_UP_SECONDS)
        if repo.record_node_decision(instance, decision, [], now):
            fresh = repo.get_instance(node) or instance
            self.remediation.carry_out(fresh)
            logger.warning("breaker backlog entry carried out",
                           extra={"instance": node, "action": action.value})
        repo.drop_released(node)
        return f"backlog_{action.value}"
