"""The lease on a health-check task's verdict (``recovery.health_checks``).

EventBridge delivers at least once: two copies of the DCGM task's STOPPED event, in two
invocations, would both build the verdict's transaction, and the second would conflict with
the first. The copy that takes the lease works the verdict; another waits until the check is
no longer its instance's or the lease has expired. One conditional PutItem on an item of its
own (never in a transaction: taking the lease cannot conflict); the job table's TTL deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_recovery.constants import JOB_PK, JOB_TABLE_TTL_ATTRIBUTE, verdict_lease_key
from gpu_recovery.repository.base import to_ddb
from gpu_recovery.repository.tables import RecoveryTables

# A lease outlives its holder's invocation (60 s at most) by far: a day on, the TTL deletes it.
VERDICT_LEASE_TTL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class VerdictLease:
    """``taken``: the lease is the caller's until ``until``; else another holder's until then."""

    taken: bool
    until: float


class VerdictLeaseRepository:
    """Intents of the verdict lease (``repo.verdict_leases``)."""

    def __init__(self, tables: RecoveryTables) -> None:
        self.db, self.table = tables.db, tables.job_table_name

    def claim(self, task_arn: str, holder: str, until: float, now: float) -> VerdictLease:
        """Take (or keep) the lease on ``task_arn``'s verdict for ``holder`` (an invocation's
        request id) until ``until`` (its deadline: after it the holder cannot be running).
        Free, already the holder's (botocore's retry of a PutItem whose answer was lost,
        Lambda's retry of a failed invocation: the same request id), or expired: taken.
        Otherwise the holder's lease, read back (consistently) to tell when it expires."""
        key = verdict_lease_key(task_arn)
        item = {JOB_PK: key, "item_type": "VERDICT_LEASE", "task_arn": task_arn, "holder": holder,
                "lease_until": until, JOB_TABLE_TTL_ATTRIBUTE: int(now + VERDICT_LEASE_TTL_SECONDS)}
        if self.db.put_conditional(
                self.table, to_ddb(item),
                "attribute_not_exists(#k) OR #h = :me OR #u < :now",
                {"#k": JOB_PK, "#h": "holder", "#u": "lease_until"},
                {":me": holder, ":now": to_ddb(now)}):
            return VerdictLease(taken=True, until=until)
        held = self.db.get(self.table, {JOB_PK: key})
        # Gone since (the TTL, a day on): free now; the caller's next try takes it.
        return VerdictLease(taken=False, until=float(held["lease_until"]) if held else now)
