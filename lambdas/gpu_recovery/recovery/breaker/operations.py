"""The blast-radius breaker's stored state: metrics, closing by itself, the operator's reset,
its backlog.

The breaker is consulted inside every node decision (``remediation.node_decision.NodeRemediation``),
its state written in the same transaction as the decision. Here: what the sweep does
with it every minute (metrics ``BreakerOpen``, ``BreakerUtilization``, ``BreakerBacklog``;
while tripped, whether it closes by itself (``domain.breaker.assess_auto_close``: one batch
read of the few nodes it had acted on) or stays open until an operator resets it, each
decided once with its one e-mail in the same transaction; carrying out the backlog a reset
released) and what ``gpu-recovery-admin breaker`` calls (``show`` / ``reset``).

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
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain import cordon as cordon_policy
from gpu_recovery.domain.breaker import breaker as rules
from gpu_recovery.domain.escalation import (
    NodeFaultRecord,
    fault_summary,
    stored_history_with,
)
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Action
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.breaker.gate import NodeActionGate, held_back_lines
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.recovery.remediation.node_decision import FOLLOW_UP_SECONDS, NodeRemediation
from gpu_recovery.recovery.stage_data import (
    HasInstances,
    ReadsInstances,
    ReadsNode,
    ReadsNodeItems,
    RecordsNodeDecisions,
)
from gpu_recovery.repository.breaker import BreakerRepository
from gpu_recovery.repository.cordons import Worklist
from gpu_recovery.repository.node_decisions import NodeDecision
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A released entry older than this is dropped, not replayed (stale backlogs are a hazard:
# NVSentinel #450); the operator may pass another age to the reset.
DEFAULT_MAX_BACKLOG_AGE_SECONDS = 24 * 3600


class ReleaseNodes(ReadsInstances, ReadsNodeItems, ReadsNode, Protocol):
    """The nodes the breaker acted on (read in one batch: its auto-close) and held back."""


class ReleaseData(HasInstances[ReleaseNodes], RecordsNodeDecisions, Protocol):
    """The nodes the breaker acted on and held back, and a released action's decision."""


@dataclass(frozen=True)
class ResetResult:
    done: bool
    released: tuple[dict[str, Any], ...]
    dropped: tuple[dict[str, Any], ...]
    state: dict[str, Any]


def reset_breaker(breaker: BreakerRepository, *, now: float, resume_backlog: bool, by: str,
                  max_backlog_age_seconds: float | None = DEFAULT_MAX_BACKLOG_AGE_SECONDS) -> ResetResult:
    """Close the breaker (the operator's reset). With ``resume_backlog`` the held-back
    actions are released: the recovery sweep carries them out, a window's allowance at a
    time. Dropping the backlog also drops what an earlier reset released and the window has
    not let through yet (it is the same held-back work)."""
    for _ in range(3):
        stored = breaker.read()
        read_version = int(stored.get("version") or 0) if stored else None
        result = _reset(stored, now=now, resume_backlog=resume_backlog, by=by,
                        max_backlog_age_seconds=max_backlog_age_seconds)
        if breaker.save(result.state, read_version):
            return result
    return ResetResult(False, (), (), {})


def _reset(stored: dict[str, Any] | None, *, now: float, resume_backlog: bool, by: str,
           max_backlog_age_seconds: float | None) -> ResetResult:
    """The breaker's item once reset (an operator's, or its own close): what to write."""
    result = rules.reset(stored, now=now, resume_backlog=resume_backlog,
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
    return ResetResult(True, result.released, result.dropped + tuple(stale), state)


def acted_on_views(repo: ReadsInstances, stored: dict[str, Any] | None) -> dict[str, rules.ActedOnNode]:
    """What the nodes the tripped breaker had acted on look like now: one batch read of
    their items (at most the breaker's limit of them, never a scan). A fault decided on a
    node after the trip (its fault history) is a failure again."""
    state = rules.normalize(stored)
    nodes = rules.acted_on_nodes(state)
    if not nodes:
        return {}
    tripped_at = float(state["tripped_at"] or 0)
    views = {}
    for node, instance in repo.get_instances(nodes).items():
        again = any(float(r.get("at") or 0) > tripped_at for r in instance.fault_history)
        views[node] = rules.ActedOnNode(instance.state, cordoned=instance.cordoned, failed_again=again)
    return views


def assess(repo: ReadsInstances, stored: dict[str, Any] | None, *, now: float,
           settings: rules.BreakerPolicy) -> rules.AutoCloseAnswer:
    """May the breaker close by itself now, and why (the sweep's question, and ``breaker show``'s)."""
    state = rules.normalize(stored)
    if state["state"] != rules.TRIPPED or not settings.auto_close or state["needs_operator"]:
        views: dict[str, rules.ActedOnNode] = {}  # the answer needs no node
    else:
        views = acted_on_views(repo, stored)
    return rules.assess_auto_close(state, now=now, policy=settings, nodes_now=views,
                                    cluster_gpu_nodes=int((stored or {}).get("cluster_gpu_nodes") or 0))


@dataclass(eq=False, repr=False)
class BreakerOperations:
    data: ReleaseData
    breaker: BreakerRepository
    remediation: NodeRemediation
    gate: NodeActionGate
    notices: Notices  # the outbox
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings

    def worklist_and_state(self) -> tuple[Worklist, dict[str, Any] | None]:
        """The cordon worklist and the breaker's item, in one read: the sweep's first."""
        return self.breaker.worklist_and_state()

    def status(self, now: float, stored: dict[str, Any] | None = None, *,
               count_cluster: bool = True) -> rules.BreakerStatus:
        """The breaker's state (``stored``: the item already read, if any). The cluster is
        counted only while the breaker is busy (an idle one reports no utilisation), and only
        with ``count_cluster``: the sweep's metrics, every minute, use the count its last
        decision was measured against (no ECS listing a minute)."""
        if stored is None:
            stored = self.breaker.read()
        settings = self.settings.remediation.breaker
        nodes = 0
        if rules.is_busy(stored, now=now, policy=settings):
            recorded = (stored or {}).get("cluster_gpu_nodes")
            nodes = self.gate.cluster_gpu_nodes(stored) if count_cluster else int(recorded or 0)
        return rules.status(stored, now=now, cluster_gpu_nodes=nodes, policy=settings)

    def sweep(self, now: float, stored: dict[str, Any] | None = None, *, read: bool = True) -> dict[str, int]:
        """Every minute: the breaker's metrics, then the released backlog (oldest first,
        while the window has room). ``read=False``: ``stored`` is the breaker's item (None:
        there is none) as the caller read it, nothing it did since able to change it."""
        if read:
            stored = self.breaker.read()
        if stored is None:
            self.metrics.add_metric("BreakerOpen", "Count", 0)
            return {}
        status = self.status(now, stored, count_cluster=False)
        metrics = status.metrics()
        self.metrics.add_metric("BreakerOpen", "Count", metrics["BreakerTripped"])
        if stored.get("cluster_gpu_nodes") is not None or not status.nodes_in_window:
            # Against the cluster its last decision counted (none counted yet: a first node
            # action needs no count, and a share of an unknown cluster means nothing).
            self.metrics.add_metric("BreakerUtilization", "Percent", 100 * metrics["BreakerUtilization"])
        self.metrics.add_metric("BreakerBacklog", "Count", metrics["BreakerBacklog"])
        done: dict[str, int] = {}
        if stored.get("state") == rules.TRIPPED:
            outcome = self._auto_close(stored, now)
            if outcome:
                done[outcome] = 1
            if outcome == "breaker_closed_by_itself":
                stored = self.breaker.read() or {}
        entries = sorted(dict(stored.get("released") or {}).items(),
                         key=lambda kv: (float(kv[1].get("at") or 0), kv[0]))
        for node, entry in entries:
            outcome = self._release(node, dict(entry), now)
            done[outcome] = done.get(outcome, 0) + 1
        return done

    def _auto_close(self, stored: dict[str, Any], now: float) -> str:
        """The tripped breaker closes by itself when the nodes it acted on are back healthy
        (``domain.breaker.assess_auto_close``), or records once that it stays open until an
        operator resets it. Either is one transaction conditional on the version read, with
        its one e-mail owed in it: a duplicate sweep finds the version moved and does nothing."""
        settings = self.settings.remediation.breaker
        if not settings.enabled:
            return ""
        answer = assess(self.data.instances, stored, now=now, settings=settings)
        recorded = bool(rules.normalize(stored)["needs_operator"])
        if answer.verdict is not rules.AutoClose.CLOSE and (answer.verdict is not rules.AutoClose.OPERATOR
                                                             or recorded):
            return ""
        read_version = int(stored.get("version") or 0)
        notices = self.notices
        if answer.verdict is rules.AutoClose.CLOSE:
            result = _reset(stored, now=now, resume_backlog=True, by=rules.CLOSED_BY_ITSELF,
                            max_backlog_age_seconds=DEFAULT_MAX_BACKLOG_AGE_SECONDS)
            state = {**result.state, "auto_close": settings.auto_close}
            owed = self._closed_notice(answer, stored, result)
            outcome, level = "breaker_closed_by_itself", logging.WARNING
        else:
            state = {**rules.needs_operator(stored, now=now, reason=answer.reason),
                     "auto_close": settings.auto_close}
            owed = self._needs_operator_notice(answer, stored)
            outcome, level = "breaker_needs_operator", logging.ERROR
        if not self.breaker.save(state, read_version, notices.owe([owed], now)):
            return "breaker_raced"  # written meanwhile: the next sweep decides again
        notices.send([owed])
        logger.log(level, "blast-radius breaker: " + outcome.replace("_", " "), extra={"why": answer.reason})
        return outcome

    def _closed_notice(self, answer: rules.AutoCloseAnswer, stored: dict[str, Any],
                       result: ResetResult) -> Owed:
        released = len(result.state.get("released") or {})
        dropped = f"; {len(result.dropped)} older than a day dropped" if result.dropped else ""
        named = ", ".join(answer.nodes) or "none"
        return Notices.for_node(
            NotificationKind.BREAKER_CLOSED, "Automatic node remediation resumed (breaker closed by itself)",
            container_inst_id="", instance_id="",
            what_happened=(f"breaker closed by itself: nodes {named} back healthy; {released} held-back "
                           f"action(s) released at the window's rate{dropped}. It had tripped at "
                           f"{stored.get('tripped_at')}: {stored.get('trip_reason', '')}"),
            what_was_done=("Automatic reboots, replacements and quarantines are on again; the held-back "
                           "actions are carried out by the recovery sweep, a window's allowance at a time, "
                           "and jobs HELD for those nodes restart once their nodes are back"),
            operator_action=("None needed. `gpu-recovery-admin breaker show` shows what is still being "
                             "released; breaker_auto_close=false makes every trip wait for an operator"),
            details=[f"Released: {e.get('action', '')} of {node}"
                     for node, e in sorted(dict(result.state.get("released") or {}).items())])

    @staticmethod
    def _needs_operator_notice(answer: rules.AutoCloseAnswer, stored: dict[str, Any]) -> Owed:
        backlog = rules.normalize(stored)["backlog"]
        return Notices.for_node(
            NotificationKind.BREAKER_NEEDS_OPERATOR,
            "Breaker stays open until an operator resets it (remediation did not fix the nodes)",
            container_inst_id="", instance_id="",
            what_happened=(f"breaker stays open until an operator resets it: {answer.reason}. It had tripped "
                           f"at {stored.get('tripped_at')}: {stored.get('trip_reason', '')}"),
            what_was_done=(f"It will not close by itself; {len(backlog)} held-back action(s) stay in its "
                           "backlog and jobs HELD for them wait until their deadline"),
            operator_action=("Find why the nodes it acted on were not fixed (driver, power, fabric). Then "
                             "`gpu-recovery-admin breaker show`, and `gpu-recovery-admin breaker reset "
                             "--resume-backlog` or `--drop-backlog`."),
            details=held_back_lines(backlog))

    def _release(self, node: str, entry: dict[str, Any], now: float) -> str:
        repo = self.data
        raw = repo.instances.get_instance_item(node)
        instance = repo.instances.instance_from_item(raw) if raw else None
        action = Action(entry.get("action") or Action.REBOOT.value)
        effect = {Action.REBOOT: Effect.REBOOT, Action.RESET_GPU: Effect.RESET_GPU}.get(action, Effect.DRAIN)
        if instance is None or instance.state is not InstanceState.SUSPECT or not instance.breaker_blocked \
                or not self.policy.modes.executes(effect):
            self.breaker.drop_released(node)
            return "backlog_dropped"
        stored = self.breaker.read()
        if stored is None or node not in dict(stored.get("released") or {}):
            return "backlog_gone"  # carried out or dropped meanwhile
        read_version = int(stored.get("version") or 0)
        gate = self.gate
        nodes = gate.cluster_gpu_nodes(stored)
        admitted = rules.admit_release(stored, node=node, action=action.value, now=now,
                                        cluster_gpu_nodes=nodes,
                                        policy=self.settings.remediation.breaker)
        if not admitted.allowed:
            return "backlog_waiting"
        released = {k: v for k, v in dict(stored.get("released") or {}).items() if k != node}
        update = gate.state_update(stored, read_version, admitted, nodes, released=released)
        blocked = instance.breaker_blocked
        why = f"{action.value} released from the breaker's backlog ({entry.get('reason', '')})"
        record = NodeFaultRecord(at=now, cause=str(blocked.get("rule") or "breaker-backlog"), action=action,
                                 executed=True, evidence=_summary(raw or {}, why))
        history = stored_history_with(instance.fault_history, record, now, self.policy.escalation)
        terminate = (action is Action.REPLACE and self.policy.replace_action == "terminate_in_asg"
                     and self.policy.modes.executes(Effect.TERMINATE)
                     and not instance.is_managed_instance and not blocked.get("quarantine_only"))
        # A held-back reset is carried out as a reset (recovery.gpu_resets), a reboot as a reboot.
        to = (InstanceState.REBOOTING if action in (Action.REBOOT, Action.RESET_GPU)
              else InstanceState.QUARANTINED)
        decision = NodeDecision(
            from_states=(InstanceState.SUSPECT,), to=to, fault_history=history,
            quarantine_reason=why if to is InstanceState.QUARANTINED else "",
            reboot_reason=why if to is InstanceState.REBOOTING else "", terminate=terminate,
            follow_up_at=now + FOLLOW_UP_SECONDS, reset=action is Action.RESET_GPU)
        if not repo.decisions.record(instance, decision, [], now, update):
            return "backlog_raced"  # the node or the breaker changed: the next sweep decides again
        fresh = repo.instances.get_instance(node) or instance
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
