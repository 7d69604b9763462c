"""DCGM health checks running at once: the cluster's slots and each job's share.

A slot is taken in the transaction that claims a check (HEALTH_CHECK_PENDING ->
HEALTH_CHECKING) and given back in the transaction of every way out of
HEALTH_CHECKING (its verdict, no placement, no verdict, a timeout), so the counts are
exactly the checks running. The cluster's slots are split over
``HEALTH_CHECK_SLOT_SHARDS`` shard items, each with its share of the limit (the shares sum
exactly to it): a claim takes a slot on the shard of its node (a stable hash), or, when that
one is full, on one of the others that the shards' counts (one read) show room on; the
shard is recorded on the instance (``hc_slot_shard``) in the claim's transaction, and the
release gives the slot back to that shard. Each shard's count is checked against its own
share only, so the limit is exact while it stays the same; one lowered while checks run
binds as they end (the shards above their new share refuse, the others may still fill
theirs), and a check claimed on the unsharded item of before (no shard recorded) is
released there and counted by ``running()``, not against a share. A check that finds no
slot waits in its job's own queue (the sparse index ``by-health-check-wait``, oldest
first): it does not time out while it waits, and a slot given back starts the next one
of that job; the sweep looks at the queue of every job in recovery each minute (a check
blocked by the cluster's limit is not forgotten) and at each waiting check every ten
minutes (one whose jobs all moved on is let go).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from gpu_recovery.constants import (
    HC_WAIT_PK,
    HC_WAIT_SK,
    HEALTH_CHECK_SLOT_SHARDS,
    HEALTH_CHECK_SLOTS_KEY,
    INSTANCE_BY_HC_WAIT_INDEX,
    INSTANCE_PK,
    JOB_PK,
    health_check_slot_shard_key,
    health_check_slots_key,
)
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.shards import shard_order, shard_shares
from gpu_recovery.repository.base import Update, cancellation_codes, is_condition_failure

# A check waiting for a slot is looked at by the sweep this often (its jobs may be gone).
WAIT_SWEEP_SECONDS = 600
# A claim whose own shard is full tries at most this many others (those the counts show room on).
MAX_OTHER_SHARDS = 3


class Claim(str, Enum):
    CLAIMED = "claimed"
    RACED = "raced"  # the instance moved on (another delivery claimed it)
    CLUSTER_FULL = "cluster_full"
    JOB_FULL = "job_full"


@dataclass(frozen=True)
class Taken:
    """What a claim took: its outcome and, when CLAIMED, the cluster shard its slot is on."""

    outcome: Claim
    shard: int | None = None


@dataclass(frozen=True)
class HealthCheckClaim:
    """A claim's outcome and, when CLAIMED, the instance as the claim wrote it (the shard
    and the job slot it recorded, which its release gives back): no read after the claim."""

    outcome: Claim
    instance: Instance | None = None


class HealthCheckSlots:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository

    def _cluster(self, shard: int | None, delta: int, limit: int | None = None) -> Update:
        """The count of one shard (None: the unsharded item of before)."""
        condition, values = None, {}
        if limit is not None:
            condition, values = "attribute_not_exists(#r) OR #r < :max", {":max": limit}
        key = HEALTH_CHECK_SLOTS_KEY if shard is None else health_check_slot_shard_key(shard)
        return Update(table=self.base.instance_table_name, key={INSTANCE_PK: key},
                      set_fields={"item_type": "HC_SLOTS"}, increments={"running": delta},
                      condition=condition, condition_values=values,
                      condition_names={"#r": "running"} if condition else {})

    def _job(self, job_id: str, delta: int, limit: int | None = None) -> Update:
        condition, values = None, {}
        if limit is not None:
            condition, values = "attribute_not_exists(#r) OR #r < :max", {":max": limit}
        return Update(table=self.base.job_table_name, key={JOB_PK: health_check_slots_key(job_id)},
                      set_fields={"item_type": "HC_SLOTS", "job_id_of": job_id},
                      increments={"running": delta},
                      condition=condition, condition_values=values,
                      condition_names={"#r": "running"} if condition else {})

    @staticmethod
    def keeps_job_share(*, per_job: int, cluster: int) -> bool:
        """A job's running checks never exceed the cluster's: a share at least that large
        is never the limit, and is not counted."""
        return per_job < cluster

    def claim(self, claim: Update, owner: str, *, per_job: int | None, cluster: int) -> Taken:
        """The instance's claim (``claim``, built by the repository, keyed by the instance)
        with a slot of the cluster's and one of ``owner``'s (None: no share counted), or
        nothing. The cluster's slot is taken on the instance's shard, else on another shard
        with room; CLUSTER_FULL when none has (the shares sum to the cluster's limit). A
        CLAIMED answer names the shard its slot was taken on."""
        shares = shard_shares(cluster, HEALTH_CHECK_SLOT_SHARDS)
        order = shard_order(str(next(iter(claim.key.values()))), len(shares))
        outcome = self._claim_on(order[0], shares, claim, owner, per_job)
        if outcome is not Claim.CLUSTER_FULL:
            return Taken(outcome, order[0] if outcome is Claim.CLAIMED else None)
        running = self.running_by_shard()
        others = [i for i in order[1:] if running.get(i, 0) < shares[i]][:MAX_OTHER_SHARDS]
        for shard in others:
            outcome = self._claim_on(shard, shares, claim, owner, per_job)
            if outcome is not Claim.CLUSTER_FULL:
                return Taken(outcome, shard if outcome is Claim.CLAIMED else None)
        return Taken(Claim.CLUSTER_FULL)

    def _claim_on(self, shard: int, shares: list[int], claim: Update, owner: str,
                  per_job: int | None) -> Claim:
        recorded = replace(claim, set_fields={**claim.set_fields, "hc_slot_shard": shard})
        updates = [recorded, self._cluster(shard, 1, shares[shard])]
        if per_job is not None:
            updates.append(self._job(owner, 1, per_job))
        try:
            self.base.db.transact_or_raise(updates)
            return Claim.CLAIMED
        except Exception as error:
            codes = cancellation_codes(error) if hasattr(error, "response") else []
            if not codes and not (hasattr(error, "response") and is_condition_failure(error)):
                raise
            if len(codes) > 1 and codes[0] != "ConditionalCheckFailed":
                if codes[1] == "ConditionalCheckFailed":
                    return Claim.CLUSTER_FULL
                if len(codes) > 2 and codes[2] == "ConditionalCheckFailed":
                    return Claim.JOB_FULL
            return Claim.RACED

    def release(self, instance: Instance) -> list[Update]:
        """The slot a HEALTH_CHECKING instance holds (none if it took none), on the shard
        its claim recorded."""
        if not instance.hc_owner:
            return []
        cluster = self._cluster(instance.hc_slot_shard, -1)
        if not instance.hc_job_slot:
            return [cluster]
        return [cluster, self._job(instance.hc_owner, -1)]

    def waiting(self, job_id: str, limit: int) -> list[str]:
        """The job's checks waiting for a slot (their instances), oldest first."""
        page = self.base.db.query_page(
            self.base.instance_table_name, IndexName=INSTANCE_BY_HC_WAIT_INDEX, Limit=limit,
            KeyConditionExpression="#w = :w", ExpressionAttributeNames={"#w": HC_WAIT_PK},
            ExpressionAttributeValues={":w": job_id})
        return [str(i[INSTANCE_PK]) for i in page.get("Items", [])]

    def running_by_shard(self) -> dict[int | None, int]:
        """Checks running, per shard (None: the unsharded item), in one BatchGetItem."""
        keys: dict[str, int | None] = {HEALTH_CHECK_SLOTS_KEY: None}
        keys.update({health_check_slot_shard_key(i): i for i in range(HEALTH_CHECK_SLOT_SHARDS)})
        items = self.base.db.batch_get(self.base.instance_table_name, [{INSTANCE_PK: k} for k in keys])
        return {keys[str(i[INSTANCE_PK])]: int(i.get("running") or 0) for i in items}

    def running(self) -> int:
        """Checks running in the cluster (the sum of the shards)."""
        return sum(self.running_by_shard().values())

    @staticmethod
    def wait_fields(job_id: str) -> dict[str, Any]:
        """On a waiting instance (with its ``hc_requested_at``, the index's sort key)."""
        return {HC_WAIT_PK: job_id}

    @staticmethod
    def wait_attributes() -> list[str]:
        return [HC_WAIT_PK]

    @staticmethod
    def held_attributes() -> list[str]:
        """What a claim records of the slots it holds (the owner whose share, whether it took
        one, the cluster shard): removed by every way out of HEALTH_CHECKING, with the release."""
        return ["hc_owner", "hc_job_slot", "hc_slot_shard"]


__all__ = ["HC_WAIT_SK", "Claim", "HealthCheckClaim", "HealthCheckSlots", "Taken"]
