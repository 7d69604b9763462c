"""The ECS control-plane budget's item (``domain.rate_limit``): one GCRA per account.

A reservation reads the bucket's theoretical arrival time and moves it with a conditional
write on the value read; a concurrent reservation makes the write fail and this one read
again. The item lives in the container-instance table (beside the breaker).
"""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import ECS_DESCRIBE_RATE_ITEM_KEY, ECS_RATE_ITEM_KEY, INSTANCE_PK
from gpu_recovery.domain.rate_limit import Reservation, TokenBucket, reserve
from gpu_recovery.repository.base import Update, from_ddb

_ROUNDS = 6


class RateLimitRepository:
    def __init__(self, base: Any, key: str = ECS_RATE_ITEM_KEY) -> None:
        self.base = base  # Repository
        self.table = base.instance_table_name
        self.key = key

    @classmethod
    def describe_budget(cls, base: Any) -> RateLimitRepository:
        """The stack's DescribeTasks budget's item (the tag lookups')."""
        return cls(base, ECS_DESCRIBE_RATE_ITEM_KEY)

    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation:
        for _ in range(_ROUNDS):
            item = from_ddb(self.base.db.get(self.table, {INSTANCE_PK: self.key}) or {})
            tat = item.get("tat")
            decided = reserve(None if tat is None else float(tat), now, tokens, bucket, ahead)
            if not decided.granted:
                return decided
            if tat is None:
                condition, values = "attribute_not_exists(#tat)", {}
            else:
                condition, values = "#tat = :read", {":read": tat}
            if self.base.db.apply(Update(
                    table=self.table, key={INSTANCE_PK: self.key},
                    set_fields={"tat": decided.tat, "item_type": "RATE_LIMIT", "rate": bucket.rate,
                                "burst": bucket.burst},
                    condition=condition, condition_values=values, condition_names={"#tat": "tat"})):
                return decided
        # Lost every race: as busy as it gets; the caller waits a token's time and asks again.
        return Reservation(False, 0.0, tokens / bucket.rate)
