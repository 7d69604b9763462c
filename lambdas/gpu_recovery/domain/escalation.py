"""Per-node fault history and escalation: reset or reboot first, replace a node that keeps failing.

* Reset -> reboot: a GPU reset on a node already reset ``resets_before_reboot`` times within
  ``reset_window_seconds`` (for any cause) becomes a reboot: the resets do not hold. The reboot
  then counts toward reboot -> replace like any other (so: reset, reset, reboot, reboot, replace).

* Reboot -> replace: a reboot for a cause that already got ``reboots_before_replace`` reboots
  on this node within ``reboot_window_seconds`` becomes a replacement (GPUd: 2 reboots for the
  same XID within 3 days -> hardware inspection).
* Quarantine + page: a node already remediated ``max_remediations`` times within
  ``remediation_window_seconds`` is quarantined (never terminated) and an operator is paged
  (NVSentinel: 5 remediations on a node in 7 days -> contact support).
* A flapping node never eats a job's budget twice: a fault whose cause was already charged
  to the same job on this node within ``flap_window_seconds`` is not charged again.

"Cause" is the catalog rule that decided the action (``Decision.cause``). Only remediations
that were executed count: observe mode and breaker-blocked actions are recorded with
``executed=False`` and do not move a node toward replacement.

Each record carries a bounded summary of its fault's evidence (:func:`fault_summary`: exit
and stop code, the DCGM verdict's error ids and severities, the GPU signals), so the node's
history says why without the job items it came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.domain.evidence import Evidence, XidEvent
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action

HOUR = 3600.0
DAY = 24 * HOUR
# The summary is on the node's item, up to max_records times: keep each one small.
SUMMARY_ITEMS = 8
SUMMARY_TEXT = 160


def fault_summary(evidence: Evidence | None, *, note: str = "") -> dict[str, Any]:
    """A bounded summary of a fault's evidence for the node's history: how it was noticed,
    exit / stop code and reason, the DCGM verdict (failed tests, error ids with severity)
    and the GPU signals; at most ``SUMMARY_ITEMS`` of each list, texts cut short."""
    out: dict[str, Any] = {}
    if note:
        out["note"] = note[:SUMMARY_TEXT]
    if evidence is None:
        return out
    out["trigger"] = evidence.trigger.value
    if evidence.rank is not None:
        out["rank"] = evidence.rank
    if evidence.exit_code is not None:
        out["exit_code"] = evidence.exit_code
    if evidence.stop_code:
        out["stop_code"] = evidence.stop_code[:64]
    if evidence.stopped_reason:
        out["stopped_reason"] = evidence.stopped_reason[:SUMMARY_TEXT]
    if evidence.gpu_signals:
        signals = sorted({f"{s.kind.value}@{s.gpu}" for s in evidence.gpu_signals})
        out["signals"] = signals[:SUMMARY_ITEMS]
    dcgm = evidence.dcgm
    if dcgm is not None:
        verdict: dict[str, Any] = {"verdict": dcgm.verdict}
        if dcgm.exit_code is not None:
            verdict["exit_code"] = dcgm.exit_code
        if dcgm.failed_tests:
            verdict["failed_tests"] = [t[:64] for t in dcgm.failed_tests[:SUMMARY_ITEMS]]
        if dcgm.errors:
            verdict["errors"] = [{"id": e.error_id, "severity": e.severity_name, "test": e.test[:64]}
                                 for e in dcgm.errors[:SUMMARY_ITEMS]]
        out["dcgm"] = verdict
    return out


@dataclass(frozen=True)
class EscalationPolicy:
    reboots_before_replace: int = 2
    reboot_window_seconds: float = 72 * HOUR
    # No source prescribes a count for GPU resets: one rung below GPUd's reboot threshold
    # (2 within 3 days), the same numbers.
    resets_before_reboot: int = 2
    reset_window_seconds: float = 72 * HOUR
    max_remediations: int = 5
    remediation_window_seconds: float = 7 * DAY
    flap_window_seconds: float = 72 * HOUR
    max_records: int = 50  # the history lives on the node's item: keep it small

    def __post_init__(self) -> None:
        problems = []
        if self.reboots_before_replace < 1:
            problems.append(f"reboots_before_replace must be >= 1, got {self.reboots_before_replace}")
        if self.resets_before_reboot < 1:
            problems.append(f"resets_before_reboot must be >= 1, got {self.resets_before_reboot}")
        if self.max_remediations < 1:
            problems.append(f"max_remediations must be >= 1, got {self.max_remediations}")
        for name in ("reboot_window_seconds", "reset_window_seconds", "remediation_window_seconds",
                     "flap_window_seconds"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_records < self.max_remediations + self.reboots_before_replace:
            problems.append(f"max_records ({self.max_records}) must keep at least max_remediations + "
                            "reboots_before_replace records")
        if problems:
            raise ValueError("escalation policy: " + "; ".join(problems))

    @property
    def retention_seconds(self) -> float:
        return max(self.reboot_window_seconds, self.reset_window_seconds, self.remediation_window_seconds,
                   self.flap_window_seconds)


@dataclass(frozen=True)
class NodeFaultRecord:
    """One decided fault on a node, as kept in the node's history."""

    at: float
    cause: str
    action: Action
    executed: bool = True
    job_id: str = ""
    charged_job: bool = False
    xids: tuple[XidEvent, ...] = ()
    # fault_summary(...) of the fault's evidence (a dict: not hashed, compared as data)
    evidence: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": self.at, "cause": self.cause, "action": self.action.value,
                               "executed": self.executed, "job_id": self.job_id,
                               "charged_job": self.charged_job}
        if self.xids:
            out["xids"] = [x.to_dict() for x in self.xids]
        if self.evidence:
            out["evidence"] = dict(self.evidence)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> NodeFaultRecord:
        summary = raw.get("evidence")
        return cls(at=float(raw["at"]), cause=str(raw["cause"]), action=Action(raw["action"]),
                   executed=bool(raw.get("executed", True)), job_id=str(raw.get("job_id", "")),
                   charged_job=bool(raw.get("charged_job", False)),
                   xids=tuple(XidEvent.from_dict(x) for x in raw.get("xids") or ()),
                   evidence=dict(summary) if isinstance(summary, Mapping) else None)


def history_from_item(raw: Iterable[Mapping[str, Any]] | None) -> tuple[NodeFaultRecord, ...]:
    return tuple(sorted((NodeFaultRecord.from_dict(r) for r in raw or ()), key=lambda r: r.at))


def history_to_item(history: Iterable[NodeFaultRecord]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in history]


@dataclass(frozen=True)
class Escalation:
    action: Action  # what the node gets
    escalated: bool  # differs from the catalog's action
    page_operator: bool  # page a person (the node exhausted its remediations)
    quarantine_only: bool  # replace by quarantining (drain + notify); never terminate it
    reason: str
    same_cause_reboots: int  # earlier reboots for this cause within the reboot window
    remediations: int  # earlier remediations within the remediation window
    resets: int = 0  # earlier GPU resets of the node within the reset window

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "escalated": self.escalated,
                "page_operator": self.page_operator, "quarantine_only": self.quarantine_only,
                "reason": self.reason, "same_cause_reboots": self.same_cause_reboots,
                "remediations": self.remediations, "resets": self.resets}


def _within(record: NodeFaultRecord, now: float, window: float) -> bool:
    return now - window < record.at <= now


def same_cause_reboots(history: Iterable[NodeFaultRecord], cause: str, now: float,
                       policy: EscalationPolicy) -> int:
    return sum(1 for r in history if r.executed and r.action is Action.REBOOT and r.cause == cause
               and _within(r, now, policy.reboot_window_seconds))


def resets(history: Iterable[NodeFaultRecord], now: float, policy: EscalationPolicy) -> int:
    """Executed GPU resets of the node (any cause) within the reset window."""
    return sum(1 for r in history if r.executed and r.action is Action.RESET_GPU
               and _within(r, now, policy.reset_window_seconds))


def remediations(history: Iterable[NodeFaultRecord], now: float, policy: EscalationPolicy) -> int:
    return sum(1 for r in history if r.executed and r.action in NODE_ACTIONS
               and _within(r, now, policy.remediation_window_seconds))


def escalate(action: Action, cause: str, history: Iterable[NodeFaultRecord], now: float,
             policy: EscalationPolicy | None = None) -> Escalation:
    """The node action after looking at the node's history (pure; ``now`` passed in)."""
    policy = policy or EscalationPolicy()
    history = tuple(history)
    reboots = same_cause_reboots(history, cause, now, policy)
    done = remediations(history, now, policy)
    reset_count = resets(history, now, policy)
    if action not in NODE_ACTIONS:
        return Escalation(action, False, False, False, f"{action.value}: no node action",
                          reboots, done, reset_count)
    if done >= policy.max_remediations:
        return Escalation(
            Action.REPLACE, action is not Action.REPLACE, True, True,
            f"node already remediated {done} times within "
            f"{policy.remediation_window_seconds / DAY:g} days (limit {policy.max_remediations}): "
            f"quarantine it and page an operator instead of {action.value}", reboots, done, reset_count)
    why = ""
    if action is Action.RESET_GPU and reset_count >= policy.resets_before_reboot:
        why = (f"GPUs reset {reset_count} times within {policy.reset_window_seconds / HOUR:g} h "
               f"(limit {policy.resets_before_reboot}): a reset does not hold, reboot the node")
        action = Action.REBOOT
    if action is Action.REBOOT and reboots >= policy.reboots_before_replace:
        return Escalation(
            Action.REPLACE, True, False, False, (f"{why}; " if why else "")
            + f"rebooted {reboots} times for {cause!r} within "
            f"{policy.reboot_window_seconds / HOUR:g} h (limit {policy.reboots_before_replace}): "
            "a reboot does not fix it, replace the node", reboots, done, reset_count)
    if why:
        return Escalation(action, True, False, False, why, reboots, done, reset_count)
    return Escalation(action, False, False, False,
                      f"{action.value} ({reboots} earlier reboots for {cause!r}, {done} remediations "
                      "in the window)", reboots, done, reset_count)


def charges_job(history: Iterable[NodeFaultRecord], job_id: str, cause: str, now: float,
                policy: EscalationPolicy | None = None) -> bool:
    """False when this node's fault of this cause was already charged to ``job_id`` within
    the flap window: the node flaps, the job does not pay again."""
    policy = policy or EscalationPolicy()
    return not any(r.charged_job and r.job_id == job_id and r.cause == cause
                   and _within(r, now, policy.flap_window_seconds) for r in history)


def record_fault(history: Iterable[NodeFaultRecord], record: NodeFaultRecord, now: float,
                 policy: EscalationPolicy | None = None) -> tuple[NodeFaultRecord, ...]:
    """The history with ``record`` added, without what no window can see any more, newest
    ``max_records`` kept."""
    policy = policy or EscalationPolicy()
    kept = [r for r in history if now - r.at < policy.retention_seconds and r != record]
    kept.append(record)
    kept.sort(key=lambda r: r.at)
    return tuple(kept[-policy.max_records:])


def stored_history_with(raw: Iterable[Mapping[str, Any]] | None, record: NodeFaultRecord, now: float,
                        policy: EscalationPolicy | None = None) -> list[dict[str, Any]]:
    """A node's stored fault history (its item's ``fault_history``) with ``record`` added
    (:func:`record_fault`), as it is stored again."""
    return history_to_item(record_fault(history_from_item(raw), record, now, policy))
