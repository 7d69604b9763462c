"""AWS's notices on a node (``recovery.aws_notices``, docs/aws-notices.md), in intents.

The node item's ``notice`` (``domain.aws_notices.Notice.as_record``, plus the jobs asked) is the
intent: written with the node's cordon (value ``aws-notice``) and its e-mail in one transaction,
on the condition that the node carries no notice or the one read (a duplicate delivery of the
same notice finds it written and does nothing). Every later step is conditioned on that
notice's ``key``, due for the sweep at the node's deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.domain.aws_notices import NOTICE_FAULT
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.gpu_warnings import job_key
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import JobState, SuspectVerdict
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.jobs_and_ranks import JobsAndRanks


class AwsNoticeRepository:
    """Intents of the notice stage (the node's notice and cordon, the jobs asked, its end):
    ``repo.aws_notices``."""

    def __init__(self, jobs: JobsAndRanks) -> None:
        self.jobs = jobs
        self.db, self.cordons, self.faults, self.latches = jobs.db, jobs.cordons, jobs.faults, jobs.latches

    def _notice_update(self, node: str, key: str, *, set_fields: Mapping[str, Any] | None = None,
                       remove: Sequence[str] = (), deadline_at: float | None = None,
                       clear_deadline: bool = False) -> Update:
        """An update of the node, only while it carries the notice ``key``."""
        return self.jobs.instance_update(
            node, set_fields=dict(set_fields or {}), remove_fields=list(remove), deadline_at=deadline_at,
            clear_deadline=clear_deadline, extra_condition="#n.#nk = :nk", extra_values={":nk": key},
            extra_names={"#n": "notice", "#nk": "key"})

    def record_notice(self, node: str, record: Mapping[str, Any], *, replaces: str, deadline_at: float,
                      cordon: Mapping[str, Any] | None, version: float, also: Sequence[Update] = ()) -> bool:
        """The notice on the node (the intent), with its cordon unless the node is cordoned
        already (``cordon`` None) and the attribute's worklist member: only if the node carries
        no notice (``replaces`` "") or still the one read (``replaces``: its key)."""
        fields: dict[str, Any] = {"notice": dict(record)}
        updates: list[Update] = []
        if cordon is not None:
            fields.update(self.cordons.cordon_fields(cordon, version))
            updates.append(self.cordons.sync_update(node, version))
        condition = "attribute_not_exists(#n)" if not replaces else "#n.#nk = :old"
        update = self.jobs.instance_update(
            node, set_fields=fields, deadline_at=deadline_at, extra_condition=condition,
            extra_values={":old": replaces} if replaces else {},
            extra_names={"#n": "notice", **({"#nk": "key"} if replaces else {})})
        return self.db.transact([update, *updates, *also])

    def ask_job_to_leave(self, node: str, key: str, job_id: str, attempt: int, entry: Mapping[str, Any],
                         suspend: Mapping[str, Any], deadline_at: float, reason: str,
                         also: Sequence[Update] = ()) -> bool:
        """One transaction: the job asked on the node's notice (once per attempt) and the job
        RUNNING -> SUSPENDING with the move (rank 0 has until ``deadline_at`` to checkpoint and
        call go_suspend(); past it, a notice with a deadline stops its ranks: ``recovery.suspension``)."""
        node_update = self._notice_update(node, key,
                                          set_fields={f"notice.jobs.{job_key(job_id)}": dict(entry)})
        job_update = self.jobs.job_transition(
            job_id, JobState.SUSPENDING, from_states=[JobState.RUNNING], attempt=attempt, reason=reason,
            actor="recovery",
            set_fields={"suspend": dict(suspend), **self.jobs.job_deadline_fields(deadline_at)})
        return self.db.transact([node_update, job_update, *also])

    def move_job_off_notice(self, node: str, key: str, job: Job, rank: int, entry: Mapping[str, Any], *,
                            reason: str, now: float, deadline_at: float, ledger: Mapping[str, Any],
                            also: Sequence[Update] = ()) -> bool:
        """A job with no control channel (tag-registered, relocatable) leaves the announced node
        shortly before its deadline, in one transaction: the job noted on the node's notice;
        RUNNING -> PENDING_RESTART to relocate, a fault of its own (opened by the notice, the
        node decided UNAVAILABLE: no check, no node action, no budget) with the intent to stop
        every rank; the node's suspect item decided; the node named a suspect at the attempt's
        latch on ``rank``'s shard (so the fault counts it once every rank ended)."""
        node_update = self._notice_update(node, key,
                                          set_fields={f"notice.jobs.{job_key(job.job_id)}": dict(entry)})
        tally = FaultTally(attempt=job.attempt, decided=1, fatal=1, opened_by=NOTICE_FAULT)
        job_update = self.jobs.job_transition(
            job.job_id, JobState.PENDING_RESTART, from_states=[JobState.RUNNING], attempt=job.attempt,
            reason=reason, actor="recovery",
            set_fields={"fault": tally.to_item(), "fault_started_at": now, "relocate": True,
                        "restart_reason": reason[:500],
                        **self.jobs.stop_fanout_fields(job.attempt, reason, now),
                        **self.jobs.job_deadline_fields(deadline_at)},
            ledger=ledger)
        suspect = self.faults.decide_suspect(
            job, node, SuspectVerdict.UNAVAILABLE, findings={"source": "aws notice", "why": reason[:300]},
            record=None, rebooting=False, now=now)
        arrival = self.latches.suspect_arrival(job.job_id, job.attempt, rank, node)
        return self.db.transact([node_update, job_update, suspect, arrival, *also])

    def note_notice_job(self, node: str, key: str, job_id: str, entry: Mapping[str, Any],
                        also: Sequence[Update] = ()) -> bool:
        """A job on the node that is not asked to move (no control channel, not running): noted
        once per attempt, with its e-mail."""
        update = self._notice_update(node, key, set_fields={f"notice.jobs.{job_key(job_id)}": dict(entry)})
        return self.db.transact([update, *also])

    def record_notice_drained(self, node: str, key: str, at: float) -> bool:
        """ECS answered the node's drain (DRAINING): recorded on the notice, after the call."""
        return self.db.apply(self._notice_update(node, key, set_fields={"notice.drained_at": at}))

    def rearm_notice(self, node: str, key: str, deadline_at: float) -> bool:
        return self.db.apply(self._notice_update(node, key, deadline_at=deadline_at))

    def settle_notice(self, node: str, key: str, fields: Mapping[str, Any] | None = None) -> bool:
        """The capacity is gone (or the window over for a node that stays gone): off the sweep's
        index; the node keeps its notice and cordon (a later event of the same id is a duplicate)."""
        return self.db.apply(self._notice_update(node, key, set_fields=fields, clear_deadline=True))

    def end_notice(self, node: str, key: str, now: float, *, uncordon: bool) -> bool:
        """A maintenance window is over and the node is back: the notice goes, and the cordon it
        put (only that one) with it."""
        if not uncordon:
            return self.db.apply(self._notice_update(node, key, remove=["notice"], clear_deadline=True))
        return self.cordons.end_with_its_cordon(node, now, lambda fields, gone: self._notice_update(
            node, key, set_fields=fields, remove=["notice", *gone], clear_deadline=True), ("notice", True))
