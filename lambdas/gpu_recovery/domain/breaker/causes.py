"""What caused a node action the breaker and the cordon limit count (issue 49: the breaker
counts nodes, not reports).

A cluster-wide hold is for a fleet event: independent evidence about several nodes. Evidence
the stack owns (its DCGM check and validation, the node agent's signals under the node's own
token, ECS and EC2 state) is about its own node: each node it condemns is an independent
cause. Evidence from one job's own program (exit codes, the gang preflight's tables, its
progress) can be wrong about every node that job runs on alike (a broken image): every node
it condemns is one cause, that job's. A window whose nodes have a single cause between them
does not trip the breaker (nor the cordon limit): the node past the limit is only refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.fault_vocabulary import Trigger

TENANT = "tenant"
STACK = "stack"
# Triggers that are the job's own program speaking (its exit, its preflight, its progress).
_TENANT_TRIGGERS = frozenset({Trigger.TASK_EXIT, Trigger.PREFLIGHT, Trigger.HUNG})


def tenant_only(evidence: Evidence | None) -> bool:
    """Nothing but the job's own program says the node is bad (no DCGM verdict, no XID, no
    GPU signal from the node, no node loss): a report about the node, not a finding."""
    if evidence is None or evidence.trigger not in _TENANT_TRIGGERS:
        return False
    return evidence.dcgm is None and not evidence.xids and not evidence.gpu_signals \
        and not evidence.counter_rates


def cause_of(evidence: Evidence | None, job_ids: Iterable[str]) -> dict[str, str]:
    """The window entry's cause: ``{"source": "tenant", "cause": "job:<ids>"}`` for a job's own
    evidence, ``{"source": "stack"}`` otherwise (each node its own cause)."""
    jobs = sorted(set(job_ids))
    if tenant_only(evidence) and jobs:
        return {"source": TENANT, "cause": "job:" + ",".join(jobs)}
    return {"source": STACK}


def independent_causes(window: Iterable[Mapping[str, Any]]) -> int:
    """How many independent causes the window's entries have (a stack-owned entry is its
    node's own; a tenant's entries share their job's)."""
    return len({str(e.get("cause") or f"node:{e['node']}") for e in window})


def one_cause_note(window: Iterable[Mapping[str, Any]]) -> str:
    causes = {str(e.get("cause") or "") for e in window}
    named = ", ".join(sorted(c for c in causes if c)) or "one node's evidence"
    return f"every node in the window was condemned by one cause ({named}): not a fleet event"


def kept(entry: Mapping[str, Any]) -> dict[str, str]:
    """The cause fields of a stored window entry (none on entries written before them)."""
    return {k: str(entry[k]) for k in ("source", "cause") if entry.get(k)}
