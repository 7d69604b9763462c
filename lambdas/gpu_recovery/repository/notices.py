"""The notice outbox: e-mails owed, one item each in the job table.

An e-mail that reports a decision (a job failed, a node quarantined, the breaker tripped) is
written here in the decision's own transaction, with a deadline in the ``by-deadline``
index. The invocation that made the decision publishes it and marks the item sent (one
conditional UpdateItem: the deadline removed, so the item leaves the sparse index, and the
table's TTL set, so it expires a week later); if it dies first (a throttled read, a timeout),
the sweep finds the item due and publishes it. So an e-mail is never lost; at worst
(published, then the update lost) it is sent twice.

Nothing deletes an item (no function's role is granted ``dynamodb:DeleteItem`` on the job
table, infra/tables.py): a sent notice is kept until DynamoDB's TTL removes it. Owed again
(the same content: the same key), it is due again and no longer expires.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_recovery.constants import (
    JOB_PK,
    JOB_TABLE_TTL_ATTRIBUTE,
    NotificationKind,
    notice_item_key,
)
from gpu_recovery.domain.notifications import Notification
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update

NOTICE_ITEM_TYPE = "NOTICE"
#: a sent notice stays this long (what was mailed, for an operator), then DynamoDB's TTL removes it
SENT_NOTICE_TTL_SECONDS = 7 * 24 * 3600


class NoticeRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.job_table_name

    @staticmethod
    def key_of(notification: Notification, owner: str) -> str:
        return notice_item_key(owner, notification.digest())

    def owe(self, notification: Notification, *, owner: str, due_at: float, now: float) -> Update:
        """The intent to send ``notification``, for the decision's transaction. The same
        notice owed twice is one item (its key is its content's digest)."""
        return Update(
            table=self.table, key={JOB_PK: self.key_of(notification, owner)},
            set_fields={"item_type": NOTICE_ITEM_TYPE, "kind": notification.kind.value,
                        "subject": notification.subject, "body": notification.body,
                        "notice_job_id": notification.job_id, "attributes": dict(notification.attributes),
                        "owed_at": now, **self.base.job_deadline_fields(due_at)},
            remove_fields=["sent_at", JOB_TABLE_TTL_ATTRIBUTE])

    def sent(self, notification: Notification, owner: str, now: float) -> bool:
        """The notice was published: out of the deadline index, expiring in a week. False when
        there was no such item (never owed, or expired)."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: self.key_of(notification, owner)},
            set_fields={"sent_at": now, JOB_TABLE_TTL_ATTRIBUTE: int(now + SENT_NOTICE_TTL_SECONDS)},
            remove_fields=list(DEADLINE_ATTRIBUTES),
            condition="attribute_exists(#k)", condition_names={"#k": JOB_PK}))

    @staticmethod
    def from_item(item: Mapping[str, Any]) -> tuple[Notification, str]:
        """A stored notice and its owner (to mark it sent)."""
        notification = Notification(
            kind=NotificationKind(str(item["kind"])), subject=str(item.get("subject") or ""),
            body=str(item.get("body") or ""), job_id=str(item.get("notice_job_id") or ""),
            attributes={str(k): str(v) for k, v in (item.get("attributes") or {}).items()})
        owner = str(item[JOB_PK]).split("#N#", 1)[0]
        return notification, owner

    def rearm(self, item: Mapping[str, Any], due_at: float) -> bool:
        """A notice the sweep could not publish: tried again later."""
        return self.base.db.apply(Update(
            table=self.table, key={JOB_PK: str(item[JOB_PK])},
            set_fields=self.base.job_deadline_fields(due_at),
            condition="attribute_exists(#k)", condition_names={"#k": JOB_PK}))
