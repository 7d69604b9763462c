"""Counters split over shard items, so that no single item is written by every event.

A count that every claim or verdict of a large job updates (the cluster's running health
checks, a fault's tally) would be one hot item: DynamoDB cancels a transaction that
touches an item another transaction is writing, so the writers of one item conflict more
the more of them there are. Split over ``shards`` items, picked by a stable hash of the
writer's own key (a node), writers of different shards never meet. A limit split over
the shards gives each its share, the shares summing exactly to the limit. Pure: no I/O.
"""

from __future__ import annotations

import zlib


def stable_shard(key: str, shards: int) -> int:
    """The shard of ``key`` among ``shards`` (the same in every process and release)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")
    return zlib.crc32(key.encode()) % shards


def shard_count_for(limit: int, shards: int) -> int:
    """Shards a limit of ``limit`` is split over: at most ``shards``, each with a share of
    at least 1 (a limit below the shard count uses fewer shards)."""
    return max(1, min(shards, limit))


def shard_shares(limit: int, shards: int) -> list[int]:
    """Each shard's share of ``limit`` (the first ``limit % n`` one larger), summing exactly
    to ``limit``; ``shard_count_for(limit, shards)`` of them."""
    n = shard_count_for(limit, shards)
    base, extra = divmod(max(0, limit), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def shard_order(key: str, shards: int) -> list[int]:
    """The shards ``key`` tries, its own first, then the following ones round the ring."""
    first = stable_shard(key, shards)
    return [(first + i) % shards for i in range(shards)]
