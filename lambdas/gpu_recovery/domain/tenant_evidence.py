"""A job or user whose evidence keeps condemning nodes the stack's own check clears (issue 49).

What a tenant's program says (its exit codes, its preflight, its progress) makes a node a
suspect for the stack's DCGM check. When the check then clears the node, the tenant's
evidence was wrong about it: once a job, or a user across their jobs, has been wrong
``limit`` times within ``window_seconds``, its evidence stops moving nodes (its gang
preflights conclude inconclusive: nothing pinned, the job goes on) and an operator is told.
Each subject keeps a small bounded list of the suspects cleared (:data:`MAX_ENTRIES`).
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.evidence_sources import EvidenceSource, EvidenceSources

DEFAULT_LIMIT = 2
DEFAULT_WINDOW_SECONDS = 24 * 3600
MAX_ENTRIES = 16
NODE_FACT_CONDITION = "xid"  # the node agent's own reports back a suspect: not the tenant's alone


@dataclass(frozen=True)
class TenantEvidenceLimit:
    limit: int = DEFAULT_LIMIT
    window_seconds: float = DEFAULT_WINDOW_SECONDS

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_ENTRIES:
            raise ValueError(f"the cleared-suspects limit is 1..{MAX_ENTRIES}")
        if not 3600 <= self.window_seconds <= 30 * 86400:
            raise ValueError("the cleared-suspects window is 1 h..30 days")

    def reached(self, count: int) -> bool:
        return count >= self.limit


def source_of(evidence: Evidence, sources: EvidenceSources) -> EvidenceSource | None:
    """The source a suspect's evidence rests on: the node agent's when the node reported
    something itself (XIDs, GPU signals, rising counters), else its trigger's."""
    if evidence.xids or evidence.gpu_signals or evidence.counter_rates:
        return sources.of_condition(NODE_FACT_CONDITION)
    return sources.of_trigger(evidence.trigger)


def within(entries: Iterable[Sequence[object]], now: float, window_seconds: float) -> list[tuple[str, float]]:
    """The ``(id, at)`` entries still inside the window, newest last, at most :data:`MAX_ENTRIES`."""
    kept = []
    for entry in entries:
        if len(entry) >= 2:
            try:
                at = float(str(entry[1]))
            except ValueError:
                continue
            if at >= now - window_seconds:
                kept.append((str(entry[0]), at))
    return sorted(kept, key=lambda e: e[1])[-MAX_ENTRIES:]
