"""A job's attempts: the records the launcher writes, and as the jobs API shows them; pure.

The launcher records an attempt when the scheduler starts it; gang restarts, suspensions and
the end of an attempt are only in the job's history. Every transition into STARTING begins
an attempt (the scheduler's claim and a gang restart both add one), so the history, counted
back from the job's current attempt (it may have been trimmed), completes the records.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_recovery.domain.models import container_instance_id
from gpu_recovery.domain.states import JobState

MAX_ATTEMPT_ENTRIES = 50  # of a job item's ``attempts`` and ``relocations``

# The transition that ends a running attempt, and what the attempt's outcome is then.
_ENDS: dict[str, str] = {
    JobState.PENDING_HEALTHCHECK.value: "FAULT",
    JobState.PENDING_RESTART.value: "FAULT",
    JobState.SUSPENDED.value: "SUSPENDED",
    JobState.QUEUED.value: "REQUEUED",
    JobState.PENDING_RESOURCES.value: "REQUEUED",
    JobState.COMPLETE.value: JobState.COMPLETE.value,
    JobState.FAILED.value: JobState.FAILED.value,
    JobState.CANCELED.value: JobState.CANCELED.value,
    JobState.USER_STOPPED.value: JobState.USER_STOPPED.value,
}
_STARTING = JobState.STARTING.value


def attempt_records(stored: Iterable[Any], history: Iterable[Any],
                    current_attempt: int) -> list[dict[str, Any]]:
    """Every attempt, oldest first: ``attempt, started_at, ended_at, outcome, failure_kind, reason``.
    A launcher record that ended (START_FAILED) is kept as it is; an attempt still running
    has ``ended_at`` None and outcome STARTED."""
    entries = [e for e in history if isinstance(e, Mapping)]
    records = {int(r["attempt"]): dict(r) for r in stored
               if isinstance(r, Mapping) and isinstance(r.get("attempt"), numbers.Number)}
    starts = [i for i, e in enumerate(entries) if e.get("to") == _STARTING]
    for back, index in enumerate(reversed(starts)):
        number = current_attempt - back
        if number < 1:
            break
        launched = records.get(number) or {}
        if launched.get("ended_at") is not None:
            continue
        end = next((e for e in entries[index + 1:] if e.get("to") in _ENDS or e.get("to") == _STARTING), None)
        records[number] = {
            "attempt": number,
            "started_at": launched.get("started_at") or entries[index].get("at"),
            "ended_at": end.get("at") if end else None,
            "outcome": _ENDS.get(str(end.get("to")), "ENDED") if end else "STARTED",
            "failure_kind": launched.get("failure_kind") or "",
            "reason": str(end.get("reason") or "") if end else "",
        }
    return [records[n] for n in sorted(records)]


def relocation_record(item: Mapping[str, Any], plan: Mapping[str, Any], nodes: list[str],
                      now: float) -> tuple[str, list[dict[str, Any]]]:
    """A job the recovery loop relocated off faulty nodes: which nodes it left, where rank
    0 now is and why (history reason, and the job's ``relocations`` list). Nodes, not
    ranks: the record stays small whatever the job's size."""
    relocation = dict(item.get("relocation") or {})
    left = [str(n) for n in relocation.get("from_nodes") or []]
    new_nodes = {container_instance_id(arn) for arn in nodes}
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    why = str(relocation.get("reason") or "node fault")
    entry = {"at": now, "attempt": plan["attempt"], "reason": why[:500], "left": left[:20],
             "nodes": len(new_nodes), "master_addr": plan.get("master_addr", "")}
    relocations = [*(item.get("relocations") or []), entry][-MAX_ATTEMPT_ENTRIES:]
    text = (f"relocated (attempt {plan['attempt']}) off {shown or 'its unusable nodes'} to "
            f"{len(new_nodes)} healthy node(s), rank 0 on {container_instance_id(nodes[0])}")
    return f"{text}; {why}"[:500], relocations


def last_suspend(item: Mapping[str, Any]) -> str:
    suspend = item.get("suspend") or {}
    if suspend.get("kind") == "preempted" and suspend.get("by_job"):
        return f"; it had been preempted by job {suspend['by_job']}"
    if suspend.get("reason"):
        return f"; it had been suspended: {str(suspend['reason'])[:200]}"
    return ""


def with_entry(existing: Any, entry: dict[str, Any]) -> list[dict[str, Any]]:
    attempts = [a for a in (existing or []) if isinstance(a, dict) and a.get("attempt") != entry["attempt"]]
    return [*attempts, entry][-MAX_ATTEMPT_ENTRIES:]
