"""The suspects a job's or a user's own evidence named that the stack's check cleared (issue 49).

One small item per job (``<job_id>#TE``) and per user (``TENANT_EVIDENCE#<user>``) in the job
table: the cleared suspects within the window (``domain.tenant_evidence``: at most 16, each
``[id, at]``), a version, and when an operator was last told. Each write is conditional on
the version read and made in the transaction of the node decision that cleared the suspect
(``recovery.remediation.tenant_evidence``): a clearance is counted exactly when its decision
commits, an entry is added once (both ends of a pinned link are one fault), and two decisions
at once never lose an entry (the later one re-reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.constants import JOB_PK, tenant_evidence_job_key, tenant_evidence_user_key
from gpu_recovery.domain.tenant_evidence import within
from gpu_recovery.repository.base import Update, from_ddb

ITEM_TYPE = "TENANT_EVIDENCE"


JOB, USER = "job", "user"


def subject_key(kind: str, name: str) -> str:
    """The item of a job's (``kind`` job) or a user's (``kind`` user) cleared suspects."""
    return tenant_evidence_job_key(name) if kind == JOB else tenant_evidence_user_key(name)


class TenantEvidenceRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.job_table_name

    def _get(self, key: str) -> dict[str, Any]:
        item = self.base.db.get(self.table, {JOB_PK: key})
        return from_ddb(item) if item else {}

    def cleared(self, kind: str, name: str, now: float, window_seconds: float) -> int:
        """How many faults this subject's evidence named were cleared within the window."""
        return len(within(self._get(subject_key(kind, name)).get("cleared") or (), now, window_seconds))

    def read(self, kind: str, name: str) -> dict[str, Any]:
        """The subject's item as stored ({} when it has none)."""
        return self._get(subject_key(kind, name))

    def clearance_update(self, kind: str, name: str, item: Mapping[str, Any],
                         entries: Sequence[tuple[str, float]], *, notified_at: float | None = None) -> Update:
        """The subject's cleared faults (``entries``, read from ``item``), for the node decision's
        transaction: conditional on the version read (a concurrent decision re-reads);
        ``notified_at``: an operator told now (once per window)."""
        return self._write(subject_key(kind, name), entries, int(item.get("version") or 0), notified_at)

    def _write(self, key: str, entries: Sequence[tuple[str, float]], version: int,
               notified_at: float | None = None) -> Update:
        cond = "attribute_not_exists(#v)" if version == 0 else "#v = :v"
        fields: dict[str, Any] = {"item_type": ITEM_TYPE, "cleared": [[e, a] for e, a in entries],
                                  "version": version + 1}
        if notified_at is not None:
            fields["notified_at"] = notified_at
        return Update(table=self.table, key={JOB_PK: key}, set_fields=fields,
                      condition=cond, condition_values={} if version == 0 else {":v": version},
                      condition_names={"#v": "version"})
