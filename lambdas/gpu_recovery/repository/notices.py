"""The notice outbox: e-mails owed, one item each in the job table.

An e-mail that reports a decision (a job failed, a node quarantined, the breaker tripped) is
written here in the decision's own transaction, with a deadline in the ``by-deadline``
index. The invocation that made the decision publishes it and deletes the item; if it dies
first (a throttled read, a timeout), the sweep finds the item due and publishes it. So an
e-mail is never lost; at worst (published, then the delete lost) it is sent twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_recovery.constants import JOB_PK, NotificationKind, notice_item_key
from gpu_recovery.domain.notifications import Notification
from gpu_recovery.repository.base import Update

NOTICE_ITEM_TYPE = "NOTICE"


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
                        "owed_at": now, **self.base.job_deadline_fields(due_at)})

    def sent(self, notification: Notification, owner: str) -> None:
        self.base.db.delete(self.table, {JOB_PK: self.key_of(notification, owner)})

    @staticmethod
    def from_item(item: Mapping[str, Any]) -> tuple[Notification, str]:
        """A stored notice and its owner (to delete it once sent)."""
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
