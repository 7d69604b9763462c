"""Suspects the stack's own check cleared: counted per evidence source, and per job and user
when the evidence was the tenant's (issue 49).

Built before a health check's decision commits and committed with it
(``NodeRemediation.apply``): a DCGM check that found the node healthy cleared the suspect its
evidence named. Every such clearance is a
``SuspectsCleared`` metric with the dimension ``EvidenceSource`` (the dashboard shows which
source cries wolf). When the evidence was the tenant's alone (its exit code, its preflight,
its progress), the clearance is added to the job's and its user's items
(``repository.tenant_evidence``), in the decision's transaction; at the limit
(``cleared_limit`` within ``cleared_window_hours``) an operator's e-mail is owed in it too,
once per window, and the job's (or user's) gang preflights stop pinning nodes
(:meth:`TenantEvidence.limited`, read by the preflight). A lost response or a crash after the
commit loses no count: the count is the commit's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.evidence_sources import EvidenceSources
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import InstanceState, SuspectVerdict
from gpu_recovery.domain.tenant_evidence import MAX_ENTRIES, TenantEvidenceLimit, source_of, within
from gpu_recovery.metric_names import DIMENSION_EVIDENCE_SOURCE, METRIC_SUSPECTS_CLEARED
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.tenant_evidence import JOB, USER, TenantEvidenceRepository

logger = logging.getLogger(__name__)

METRIC = METRIC_SUSPECTS_CLEARED
DIMENSION = DIMENSION_EVIDENCE_SOURCE


def add_metric_by(metrics: Any, name: str, value: float, dimension: str, label: str) -> None:
    """A count with one dimension of its own, where the metrics adapter has them (Powertools'
    single metric); else the plain count."""
    by = getattr(metrics, "add_dimensioned_metric", None)
    if by is not None:
        by(name, "Count", value, {dimension: label})
    else:
        metrics.add_metric(name, "Count", value)


@dataclass(frozen=True)
class Clearance:
    """A suspect a decision clears: its evidence source (the metric's dimension), the subject
    items' writes and the e-mail owed, committed with the decision."""

    source: str
    updates: list[Update] = field(default_factory=list)
    notice: Owed | None = None
    subjects: str = ""


class ClearanceData(Protocol):
    """The clearances counted per tenant (``repository/tenant_evidence.py``) and the job they name."""

    tenant_evidence: TenantEvidenceRepository

    def get_job(self, job_id: str) -> Job | None: ...
    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...


@dataclass(eq=False, repr=False)
class TenantEvidence:
    """``limit``: how many of a tenant's suspects the stack's check may clear (the preflight's
    settings); ``sources``: what evidence is the tenant's (the catalog's)."""

    data: ClearanceData
    notices: Notices
    _: KW_ONLY
    limit: TenantEvidenceLimit
    sources: EvidenceSources
    metrics: MetricsPort  # the service's relay: the invocation's metrics

    def clearance(self, evidence: Evidence, label: SuspectVerdict,
                  from_states: Iterable[InstanceState]) -> Clearance | None:
        """A health check's decision about to commit: if it clears a suspect, the count to
        commit with it (``Clearance.updates``, in the decision's transaction: a clearance is
        counted exactly when its decision commits, whatever fails after) and the operator's
        e-mail owed when this clearance reaches the limit (once per window). None: it clears
        nothing (not healthy, not from a check, a source the catalog does not know)."""
        if label is not SuspectVerdict.HEALTHY or InstanceState.HEALTH_CHECKING not in tuple(from_states):
            return None
        source = source_of(evidence, self.sources)
        if source is None:
            return None
        if not source.tenant or not evidence.job_id:
            return Clearance(source.id)
        repo = self.data
        now = clock.now()
        window = self.limit.window_seconds
        # One entry per fault (job and attempt): a preflight pinning both ends of a link is
        # one wrong word, not two.
        entry = f"{evidence.job_id}#{evidence.attempt}"
        user = str((repo.get_job_item(evidence.job_id) or {}).get("user") or "")
        updates, reached, claims = [], [], []
        for kind, name in [(JOB, evidence.job_id)] + ([(USER, user)] if user else []):
            item = repo.tenant_evidence.read(kind, name)
            entries = within(item.get("cleared") or (), now, window)
            if any(e[0] == entry for e in entries):
                continue  # counted by an earlier decision about the same fault
            entries = [*entries, (entry, now)][-MAX_ENTRIES:]
            count = len(entries)
            tell = self.limit.reached(count) and float(item.get("notified_at") or 0) < now - window
            if self.limit.reached(count):
                reached.append((kind, name, count))
            if tell:
                claims.append(name)
            updates.append(repo.tenant_evidence.clearance_update(kind, name, item, entries,
                                                                 notified_at=now if tell else None))
        notice = self._notice(reached, evidence, source.id) if claims else None
        return Clearance(source.id, updates=updates, notice=notice,
                         subjects=" and ".join(f"the {k} {n} ({c} faults)" for k, n, c in reached))

    def counted(self, clearance: Clearance | None, job_id: str) -> None:
        """After the decision committed: its metric, and the operator's e-mail (owed with it)."""
        if clearance is None:
            return
        add_metric_by(self.metrics, METRIC, 1, DIMENSION, clearance.source)
        if clearance.notice is not None:
            self.notices.send([clearance.notice])
            self.metrics.add_metric("TenantEvidenceLimited", "Count", 1)
            logger.warning("a tenant's evidence no longer moves nodes",
                           extra={"subjects": clearance.subjects, "job_id": job_id})

    def _notice(self, reached: list[tuple[str, str, int]], evidence: Evidence, source: str) -> Owed | None:
        hours = self.limit.window_seconds / 3600
        job = self.data.get_job(evidence.job_id)
        if job is None:
            return None
        names = " and ".join(f"the {kind} {name} ({count} faults)" for kind, name, count in reached)
        return self.notices.for_job(
            job, None, NotificationKind.TENANT_EVIDENCE_LIMITED,
            f"A tenant's evidence no longer moves nodes: {names}",
            what_happened=(f"the own evidence ({source}) of {names} named nodes within {hours:g} h that "
                           f"the stack's DCGM check then found healthy; the last: {evidence.node_id}"),
            what_was_done=(f"its gang preflights pin no node until {hours:g} h after the last cleared "
                           "one (they conclude inconclusive and the job goes on)"),
            operator_action=(f"Look at the job (`gpujobs show {evidence.job_id}`): a preflight or "
                             "image that fails on healthy nodes, a tenant's forged reports, or a fault "
                             "the DCGM diag cannot see (a degraded link)."))

    def limited(self, job_id: str, user: str) -> str:
        """Why this job's (or its user's) evidence no longer moves nodes ("": it does)."""
        repo = self.data
        now = clock.now()
        window = self.limit.window_seconds
        subjects = [(JOB, job_id)] + ([(USER, user)] if user else [])
        for kind, name in subjects:
            count = repo.tenant_evidence.cleared(kind, name, now, window)
            if self.limit.reached(count):
                who = "job" if kind == JOB else f"user {name}"
                return (f"the {who}'s evidence named nodes the stack's DCGM check cleared, in {count} "
                        f"faults within {window / 3600:g} h (cleared_limit {self.limit.limit}): its pins are "
                        "not handed over")
        return ""
