"""The ECS control-plane budget's item (``domain.rate_limit``): one GCRA per account.

A reservation (every caller of ``adapters.ecs_budget``) moves the bucket's theoretical arrival
time with one atomic ADD, conditioned on the turn being within the caller's reach; the item is
read only when that write does not apply. The item lives in the container-instance table
(beside the breaker).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_recovery.constants import ECS_DESCRIBE_RATE_ITEM_KEY, ECS_RATE_ITEM_KEY, INSTANCE_PK
from gpu_recovery.domain.rate_limit import (
    Reservation,
    TokenBucket,
    latest_tat_to_reserve,
    reserve,
    reserved_at,
)
from gpu_recovery.repository.base import Update, from_ddb

if TYPE_CHECKING:
    from gpu_recovery.repository.tables import RecoveryTables

_ROUNDS = 6


class RateLimitRepository:
    def __init__(self, base: RecoveryTables, key: str = ECS_RATE_ITEM_KEY) -> None:
        self.base = base  # the recovery loop's tables (``Repository.tables``)
        self.table = base.instance_table_name
        self.key = key

    @classmethod
    def describe_budget(cls, base: RecoveryTables) -> RateLimitRepository:
        """The stack's DescribeTasks budget's item (the tag lookups')."""
        return cls(base, ECS_DESCRIBE_RATE_ITEM_KEY)

    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation:
        """A reservation in turn (due within ``ahead`` seconds; 0: now), without reading first:
        the TAT is moved by an atomic ADD while it is within reach (``latest_tat_to_reserve``),
        or set from now when the bucket has caught up; callers bursting at once are served one
        after another by DynamoDB (no read-modify-write race, no lost rounds). Read only when
        neither write applies."""
        tokens = max(1, min(tokens, bucket.burst))
        step = tokens / bucket.rate
        meta = {"item_type": "RATE_LIMIT", "rate": bucket.rate, "burst": bucket.burst}
        for _ in range(_ROUNDS):
            moved = self.base.db.apply_returning(Update(
                table=self.table, key={INSTANCE_PK: self.key}, set_fields=meta, increments={"tat": step},
                condition="#tat >= :now AND #tat <= :latest", condition_names={"#tat": "tat"},
                condition_values={":now": now, ":latest": latest_tat_to_reserve(now, tokens, bucket, ahead)}),
                returning="UPDATED_NEW")
            if moved is not None:
                return reserved_at(float(moved["tat"]), now, bucket)
            if self.base.db.apply(Update(
                    table=self.table, key={INSTANCE_PK: self.key}, set_fields={"tat": now + step, **meta},
                    condition="attribute_not_exists(#tat) OR #tat < :now", condition_names={"#tat": "tat"},
                    condition_values={":now": now})):
                return reserved_at(now + step, now, bucket)
            item = from_ddb(self.base.db.get(self.table, {INSTANCE_PK: self.key}) or {})
            tat = item.get("tat")
            decided = reserve(None if tat is None else float(tat), now, tokens, bucket, ahead)
            if not decided.granted:
                return decided  # its turn is further off than ``ahead``
        return Reservation(False, 0.0, step)
