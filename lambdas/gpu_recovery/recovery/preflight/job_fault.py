"""A preflight whose loopbacks failed alike on every node: the job's own, not a node's.

Evidence alike on every node is about the job (issue 49): an image without
``all_reduce_perf`` or torch (the client's fallback exits 1 everywhere), a wrapper that never
reports, every node slow the same way. Pinning the nodes would take healthy nodes out of
service, relocate the job onto more of them and trip the breaker; none of that happens. The
job ends FAILED, told in its state and reason (``gpujobs show``, its failure e-mail) that its
own image or code failed the preflight; no node is suspected or cordoned, no budget is spent.

Intent first: the preflight's ``job_fault`` conclusion (with a deadline, due at once) is
committed by the report that found it; the sweep (the functions that e-mail) ends the job
here, once: the job's transition to FAILED is conditional on its attempt and state, and
commits the intent to stop every rank and the e-mail owed; the conclusion is then marked
handed over.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import ACTIVE_JOB_STATES, JobState
from gpu_recovery.recovery.goodput_metrics import ended
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.recovery.stage_data import EndsJobs
from gpu_recovery.repository.preflight import PreflightRepository

logger = logging.getLogger(__name__)

OWN_FAULT_ACTION = (
    "Check the job's image and command: the preflight's all-reduce (`all_reduce_perf`, or the client's "
    "torch fallback) failed the same way on every node it ran on, so the nodes are not at fault. "
    "`gpujobs logs <id> --rank 0 | grep -A4 'preflight round 1'` shows what it printed. No node was taken "
    "out of service and no recovery was spent; fix the image (or submit with `preflight: off`) and "
    "submit again.")


def own_fault_reason(why: str) -> str:
    return f"the job's own image or code failed the gang preflight: {why}"[:1000]


class JobFaultData(EndsJobs, Protocol):
    """The job read and ended (with its ranks' stop and its e-mail), its preflight handed over."""

    preflight: PreflightRepository

    def get_job(self, job_id: str) -> Job | None: ...


@dataclass(eq=False, repr=False)
class PreflightJobFault:
    data: JobFaultData
    notices: Notices
    metrics: MetricsPort  # the service's relay: the invocation's metrics

    def end(self, item: Mapping[str, Any]) -> str:
        """The job of a ``job_fault`` preflight (its item) to FAILED, told why."""
        repo = self.data
        job_id, attempt = str(item["pf_job_id"]), int(item["attempt"])
        now = clock.now()
        job = repo.get_job(job_id)
        if job is None or job.attempt != attempt or job.state not in ACTIVE_JOB_STATES:
            repo.preflight.handed_over(job_id, attempt, now)  # another fault, a cancel: theirs now
            return "preflight_moved_on"
        reason = own_fault_reason(str(item.get("verdict") or "every node's loopback failed alike"))
        notice = self.notices.for_job(
            replace(job, state=JobState.FAILED, last_error=reason), None, NotificationKind.FAILED,
            "Job failed: its own image or code failed the gang preflight",
            what_happened=(f"{reason}. The failure was alike on every node: it is the job's, so no node was "
                           "suspected, checked, cordoned or repaired, and no recovery was spent"),
            what_was_done="Job marked FAILED",
            operator_action=OWN_FAULT_ACTION)
        if ended(self.metrics, repo, job_id, repo.finish_job(
                job_id, attempt, JobState.FAILED, reason, fields={"last_error": reason},
                from_states=ACTIVE_JOB_STATES, stop_ranks_of=attempt, stop_why=reason,
                also=self.notices.owe([notice], now))):
            self.notices.send([notice])
            self.metrics.add_metric("PreflightJobFaults", "Count", 1)
            self.metrics.add_metric("Failures", "Count", 1)
            logger.warning("gang preflight: the job's own failure", extra={"job_id": job_id, "why": reason})
        repo.preflight.handed_over(job_id, attempt, now)
        return "preflight_job_failed"
