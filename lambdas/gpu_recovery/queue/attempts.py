"""A job's attempts as the jobs API shows them, pure.

The launcher records an attempt when the scheduler starts it; gang restarts, suspensions and
the end of an attempt are only in the job's history. Every transition into STARTING begins
an attempt (the scheduler's claim and a gang restart both add one), so the history, counted
back from the job's current attempt (it may have been trimmed), completes the records.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_recovery.domain.states import JobState

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
