"""The suspects a job's or a user's own evidence named that the stack's check cleared (issue 49).

One small item per job (``<job_id>#TE``) and per user (``TENANT_EVIDENCE#<user>``) in the job
table: the cleared suspects within the window (``domain.tenant_evidence``: at most 16, each
``[id, at]``), a version, and when an operator was last told. Each write is conditional on
the version read (two verdicts at once never lose an entry), and an entry is added once (a
redelivered verdict finds it there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_recovery.constants import JOB_PK, tenant_evidence_job_key, tenant_evidence_user_key
from gpu_recovery.domain.tenant_evidence import MAX_ENTRIES, within
from gpu_recovery.repository.base import Update, from_ddb

ITEM_TYPE = "TENANT_EVIDENCE"
WRITE_ROUNDS = 3


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

    def record_cleared(self, kind: str, name: str, entry_id: str, now: float,
                       window_seconds: float) -> int:
        """Add a cleared fault (once); the count within the window after it (-1: contended)."""
        key = subject_key(kind, name)
        for _ in range(WRITE_ROUNDS):
            item = self._get(key)
            entries = within(item.get("cleared") or (), now, window_seconds)
            if any(e[0] == entry_id for e in entries):
                return len(entries)
            entries = [*entries, (entry_id, now)][-MAX_ENTRIES:]
            version = int(item.get("version") or 0)
            if self.base.db.apply(self._write(key, entries, version)):
                return len(within(entries, now, window_seconds))
        return -1

    def _write(self, key: str, entries: Sequence[tuple[str, float]], version: int) -> Update:
        cond = "attribute_not_exists(#v)" if version == 0 else "#v = :v"
        return Update(table=self.table, key={JOB_PK: key},
                      set_fields={"item_type": ITEM_TYPE, "cleared": [[e, a] for e, a in entries],
                                  "version": version + 1},
                      condition=cond, condition_values={} if version == 0 else {":v": version},
                      condition_names={"#v": "version"})

    def claim_notice(self, kind: str, name: str, now: float, window_seconds: float,
                     also: Sequence[Update] = ()) -> bool:
        """Once per window per subject: the operator's e-mail owed with it (``also``)."""
        claim = Update(table=self.table, key={JOB_PK: subject_key(kind, name)},
                       set_fields={"notified_at": now},
                       condition="attribute_exists(#k) AND (attribute_not_exists(#n) OR #n < :since)",
                       condition_values={":since": now - window_seconds},
                       condition_names={"#n": "notified_at", "#k": JOB_PK})
        return self.base.db.transact([claim, *also]) if also else self.base.db.apply(claim)
