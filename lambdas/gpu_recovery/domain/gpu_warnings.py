"""The driver's warnings: what a node's reports say it will need while it still runs. Pure.

A catalog rule with a ``warning`` (docs/driver-warnings.md) decides on telemetry alone: the
driver's recovery action, a pending row remap, a counter rising faster than the rule's rate.
:func:`driver_warning` finds the strongest such rule the node's latest evidence matches (the
highest priority, then the most severe action, then the earlier rule); the repair itself is
the whole catalog's decision on the same evidence (a reboot asked for by another rule still
beats a warning's reset). :func:`warning_record` is what the node's item keeps meanwhile,
:func:`move_record` what a moved job's item keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_recovery.domain.classify import matching_rules
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_catalog import FaultCatalog
from gpu_recovery.domain.fault_vocabulary import ACTION_SEVERITY, ANNOUNCED, MOVE_JOB, PREDICTED, Action
from gpu_recovery.domain.gpu_counters import CounterRate, rates_from_item

# A job's item keeps its last moves (the newest last).
MAX_MOVES_KEPT = 8
# A predicted warning's record keeps at most this many of the rates that raised it.
MAX_KEPT_RATES = 16


@dataclass(frozen=True)
class DriverWarning:
    rule_id: str
    action: Action  # what the warning rule says the node needs
    confidence: str  # announced | predicted
    busy_node: str  # move | cordon
    reason: str

    @property
    def announced(self) -> bool:
        return self.confidence == ANNOUNCED

    @property
    def moves_jobs(self) -> bool:
        return self.busy_node == MOVE_JOB

    def describe(self) -> str:
        how = "announced by the driver" if self.announced else "predicted from a rising counter"
        return f"{self.action.value} {how} ({self.reason})"


def driver_warning(evidence: Evidence, catalog: FaultCatalog) -> DriverWarning | None:
    """The strongest warning rule ``evidence`` matches, or None."""
    found = matching_rules(evidence, catalog, catalog.warning_rules)
    if not found:
        return None
    _, rule, facts = max(found, key=lambda m: (m[1].priority, ACTION_SEVERITY[m[1].action], -m[0]))
    assert rule.warning is not None
    return DriverWarning(rule.id, rule.action, rule.warning.confidence, rule.warning.busy_node,
                         f"catalog rule {rule.id!r}: {rule.description} [{'; '.join(facts)}]")


def warning_record(warning: DriverWarning, *, since: float, jobs: Mapping[str, Any] | None = None,
                   rates: Iterable[CounterRate] = ()) -> dict[str, Any]:
    """The node item's ``warning``: the rule, since when, and the jobs asked to move (``jobs``:
    :func:`job_key` -> :func:`job_entry`: asked once per attempt, whatever the job answers).
    A predicted warning keeps the counter rates that raised it (``rates``): a rate that dips
    under its limit in a later report (noise, a shorter span) does not withdraw it; the node's
    repair (which clears the counters) does."""
    record: dict[str, Any] = {
        "rule": warning.rule_id, "action": warning.action.value, "confidence": warning.confidence,
        "busy_node": warning.busy_node, "reason": warning.reason[:500], "since": since,
        "jobs": dict(jobs or {})}
    if warning.confidence == PREDICTED:
        record["rates"] = [r.to_dict() for r in list(rates)[:MAX_KEPT_RATES]]
    return record


def kept_rates(record: Mapping[str, Any] | None) -> list[CounterRate]:
    """The counter rates a predicted warning was raised on (its record's)."""
    return rates_from_item((record or {}).get("rates"))


def job_key(job_id: str) -> str:
    """The key of a job in the record's ``jobs`` map (a job id may hold any character a
    document path cannot: the entry names the job itself)."""
    return "j" + hashlib.sha256(job_id.encode()).hexdigest()[:16]


def job_entry(job_id: str, attempt: int, at: float, how: str) -> dict[str, Any]:
    """What the record keeps of a job on the node: asked to ``move``, or noted (``stays``)."""
    return {"job": job_id, "attempt": attempt, "at": at, "how": how}


def asked(record: Mapping[str, Any] | None, job_id: str, attempt: int) -> bool:
    """The job's attempt was asked to move (or noted as staying) for this warning already."""
    entry = ((record or {}).get("jobs") or {}).get(job_key(job_id))
    return isinstance(entry, Mapping) and int(entry.get("attempt") or 0) == attempt


def move_record(*, node: str, warning: Mapping[str, Any], at: float, outcome: str, detail: str = "",
                checkpoint_seconds: float | None = None) -> dict[str, Any]:
    """One entry of a job's ``moves``: which node it left (or would have), why, how it ended
    (``moved`` at its checkpoint, ``declined``: no checkpoint within the bound)."""
    entry: dict[str, Any] = {"at": at, "node": node, "rule": str(warning.get("rule") or ""),
                             "action": str(warning.get("action") or ""),
                             "confidence": str(warning.get("confidence") or ""),
                             "reason": str(warning.get("reason") or "")[:300], "outcome": outcome}
    if detail:
        entry["detail"] = detail[:300]
    if checkpoint_seconds is not None:
        entry["checkpoint_seconds"] = round(checkpoint_seconds, 1)
    return entry


def avoided(warning: Mapping[str, Any]) -> str:
    """What a move off the node avoided, in words (for the job's history, e-mail, watch)."""
    action = str(warning.get("action") or "a repair")
    if warning.get("confidence") == ANNOUNCED:
        return (f"the driver asked for {action.replace('_', ' ')}: a crash there would have lost the work "
                "since the last checkpoint plus a whole recovery")
    return (f"a failure the rising counters predict ({action.replace('_', ' ')} needed): a crash would have "
            "lost the work since the last checkpoint plus a whole recovery")


def repaired_at(node: Mapping[str, Any]) -> float | None:
    """When the node (its instance item) was last repaired: its boot after a reboot, or its
    return to service. Signals and warnings from before then are stale (a reboot resets
    volatile ECC counts)."""
    times = [float(v) for v in (node.get("boot_time"), node.get("returned_at"))
             if isinstance(v, int | float) and not isinstance(v, bool)]
    return max(times) if times else None
