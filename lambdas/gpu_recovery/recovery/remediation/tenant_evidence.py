"""Suspects the stack's own check cleared: counted per evidence source, and per job and user
when the evidence was the tenant's (issue 49).

Called after a health check's decision committed (``NodeRemediation.apply``): a DCGM check
that found the node healthy cleared the suspect its evidence named. Every such clearance is a
``SuspectsCleared`` metric with the dimension ``EvidenceSource`` (the dashboard shows which
source cries wolf). When the evidence was the tenant's alone (its exit code, its preflight,
its progress), the clearance is added to the job's and its user's items
(``repository.tenant_evidence``); at the limit (``cleared_limit`` within
``cleared_window_hours``) an operator is e-mailed, once per window, and the job's (or user's)
gang preflights stop pinning nodes (:meth:`TenantEvidence.limited`, read by the preflight).
A failure here loses a count, never a decision: it runs after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import DIMENSION_EVIDENCE_SOURCE, METRIC_SUSPECTS_CLEARED, NotificationKind
from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.states import InstanceState, SuspectVerdict
from gpu_recovery.domain.tenant_evidence import TenantEvidenceLimit, source_of
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import Deps
from gpu_recovery.repository.tenant_evidence import JOB, USER

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


class TenantEvidence:
    def __init__(self, deps: Deps, notices: Notices) -> None:
        self.deps = deps
        self.notices = notices

    @property
    def limit(self) -> TenantEvidenceLimit:
        return self.deps.settings.preflight.tenant_limit

    def cleared(self, evidence: Evidence, label: SuspectVerdict,
                from_states: Iterable[InstanceState]) -> None:
        """A health check's decision, committed: count the suspect it cleared, if it did."""
        if label is not SuspectVerdict.HEALTHY or InstanceState.HEALTH_CHECKING not in tuple(from_states):
            return
        source = source_of(evidence, self.deps.policy.catalog.evidence_sources)
        if source is None:
            return
        add_metric_by(self.deps.metrics, METRIC, 1, DIMENSION, source.id)
        if not source.tenant or not evidence.job_id:
            return
        repo = self.deps.repo
        now = clock.now()
        window = self.limit.window_seconds
        # One entry per fault (job and attempt): a preflight pinning both ends of a link is
        # one wrong word, not two.
        entry = f"{evidence.job_id}#{evidence.attempt}"
        user = str((repo.get_job_item(evidence.job_id) or {}).get("user") or "")
        subjects = [(JOB, evidence.job_id)] + ([(USER, user)] if user else [])
        reached = []
        for kind, name in subjects:
            count = repo.tenant_evidence.record_cleared(kind, name, entry, now, window)
            if self.limit.reached(count):
                reached.append((kind, name, count))
        if reached:
            self._tell(reached, evidence, source.id, now)

    def _tell(self, reached: list[tuple[str, str, int]], evidence: Evidence, source: str,
              now: float) -> None:
        """One e-mail for the subjects that reached the limit, once per window each."""
        hours = self.limit.window_seconds / 3600
        job = self.deps.repo.get_job(evidence.job_id)
        names = " and ".join(f"the {kind} {name} ({count} faults)" for kind, name, count in reached)
        owed = []
        if job is not None:
            owed = [self.notices.for_job(
                job, None, NotificationKind.TENANT_EVIDENCE_LIMITED,
                f"A tenant's evidence no longer moves nodes: {names}",
                what_happened=(f"the own evidence ({source}) of {names} named nodes within {hours:g} h that "
                               f"the stack's DCGM check then found healthy; the last: {evidence.node_id}"),
                what_was_done=(f"its gang preflights pin no node until {hours:g} h after the last cleared "
                               "one (they conclude inconclusive and the job goes on)"),
                operator_action=(f"Look at the job (`gpujobs show {evidence.job_id}`): a preflight or "
                                 "image that fails on healthy nodes, a tenant's forged reports, or a fault "
                                 "the DCGM diag cannot see (a degraded link)."))]
        told = False
        for kind, name, _ in reached:
            also = self.notices.owe(owed, now) if owed and not told else ()
            if self.deps.repo.tenant_evidence.claim_notice(kind, name, now, self.limit.window_seconds,
                                                           also=also):
                told = told or bool(also)
        if told:
            self.notices.send(owed)
            self.deps.metrics.add_metric("TenantEvidenceLimited", "Count", 1)
            logger.warning("a tenant's evidence no longer moves nodes",
                           extra={"subjects": names, "job_id": evidence.job_id})

    def limited(self, job_id: str, user: str) -> str:
        """Why this job's (or its user's) evidence no longer moves nodes ("": it does)."""
        repo = self.deps.repo
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
