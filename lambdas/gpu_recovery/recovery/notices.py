"""Operator e-mails, owed with the decision they report and sent after it (the outbox).

A stage builds its notices *before* it commits a decision (every read they need is made
then: a failed read fails nothing), passes :meth:`Notices.owe` of them into the decision's
transaction, and calls :meth:`Notices.send` once it committed. A delivery that dies in
between leaves the notices in the outbox, with a deadline: the sweep publishes them
(:meth:`Notices.sweep`). Publishing never raises into the stage: the decision is committed
and its e-mail is owed either way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain.models import Instance, Job
from gpu_recovery.domain.notifications import Notification, NotificationFacts, build
from gpu_recovery.recovery.ports import NotifierPort
from gpu_recovery.repository import Update
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.notices import NoticeRepository

logger = logging.getLogger(__name__)

# An owed notice is the sweep's once this old: its sender had time to publish it (a recovery
# function runs at most a few tens of seconds) and evidently died.
SEND_GRACE_SECONDS = 120
RETRY_SECONDS = 300
# Ranks named in one e-mail (a node runs at most 8; a job's own list is summarised).
MAX_RANKS_LISTED = 16


@dataclass(frozen=True)
class Owed:
    """A notice to send, and who owns its outbox item (a job id, or ``node:<id>``)."""

    notification: Notification
    owner: str


def budget_lines(job: Job) -> list[str]:
    return [f"Job budgets: infrastructure recoveries {job.recoveries_used} of {job.max_recovery_attempts} "
            f"used, application-error restarts {job.app_restarts_used} of {job.max_app_restarts} used"]


@dataclass(eq=False, repr=False)
class Notices:
    """The e-mails: built, owed in the decision's transaction (the outbox), sent after it."""

    outbox: NoticeRepository
    faults: FaultRepository  # a job's e-mail names the ranks of its suspect node
    notifier: NotifierPort

    # ------------------------------------------------------------------ build
    def for_job(self, job: Job, instance: Instance | None, kind: NotificationKind, headline: str, *,
                what_happened: str, what_was_done: str, operator_action: str,
                details: list[str] | None = None) -> Owed:
        """A job's e-mail. Reads the suspect item of ``instance`` (its ranks): call it before
        the decision's commit."""
        ranks: list[int] = []
        if instance is not None:
            suspect = self.faults.get_suspect(job.job_id, job.tally.attempt or job.attempt,
                                                        instance.container_inst_id)
            ranks = sorted(suspect.ranks)[:MAX_RANKS_LISTED] if suspect is not None else []
        facts = NotificationFacts(
            job_id=job.job_id, ranks=ranks,
            container_inst_id=instance.container_inst_id if instance else "",
            instance_id=instance.ec2_instance_id if instance else "",
            what_happened=what_happened, what_was_done=what_was_done,
            attempt=job.recoveries_used, max_attempts=job.max_recovery_attempts,
            operator_action=operator_action, details=[*(details or ()), *budget_lines(job)])
        return Owed(build(kind, headline, facts), job.job_id)

    @staticmethod
    def for_node(kind: NotificationKind, headline: str, *, container_inst_id: str, instance_id: str,
                 what_happened: str, what_was_done: str, operator_action: str,
                 details: list[str] | None = None) -> Owed:
        """A node-level e-mail (breaker tripped, a node that needs a person)."""
        facts = NotificationFacts(job_id="", container_inst_id=container_inst_id, instance_id=instance_id,
                                  what_happened=what_happened, what_was_done=what_was_done,
                                  operator_action=operator_action, details=list(details or ()))
        return Owed(build(kind, headline, facts), f"node:{container_inst_id or '-'}")

    @staticmethod
    def for_facts(kind: NotificationKind, headline: str, facts: NotificationFacts) -> Owed:
        owner = facts.job_id or f"node:{facts.container_inst_id or '-'}"
        return Owed(build(kind, headline, facts), owner)

    # ------------------------------------------------------------- the outbox
    def owe(self, owed: Iterable[Owed | None], now: float | None = None) -> list[Update]:
        """The outbox items of ``owed``, for the decision's transaction."""
        now = clock.now() if now is None else now
        return [self.outbox.owe(o.notification, owner=o.owner, due_at=now + SEND_GRACE_SECONDS,
                                           now=now) for o in owed if o is not None]

    def send(self, owed: Iterable[Owed | None]) -> None:
        """After the commit: publish each, then mark it sent in the outbox. Never raises: what
        is not confirmed stays owed and the sweep sends it."""
        for item in owed:
            if item is not None:
                self._publish(item.notification, item.owner)

    def _publish(self, notification: Notification, owner: str) -> bool:
        try:
            self.notifier.publish(notification)
        except Exception:
            logger.warning("notification not published; the sweep sends it", exc_info=True,
                           extra={"job_id": notification.job_id, "kind": notification.kind.value})
            return False
        try:
            self.outbox.sent(notification, owner, clock.now())
        except Exception:  # published: at worst the sweep sends it once more
            logger.warning("sent notice not cleared", exc_info=True, extra={"job_id": notification.job_id})
        return True

    # ------------------------------------------------------------------- sweep
    def sweep(self, item: Mapping[str, Any], now: float) -> str:
        """A notice owed past its grace: its sender died. Publish it now."""
        notification, owner = self.outbox.from_item(item)
        if self._publish(notification, owner):
            return "notice_sent"
        self.outbox.rearm(item, now + RETRY_SECONDS)
        return "notice_retry"
