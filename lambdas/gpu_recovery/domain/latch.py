"""Rank latches: how a job's ranks are counted without reading every rank.

Three facts about one attempt of a job are needed at scale: every rank registered (the
launch is complete), every rank ended (its GPUs are free: a suspension, a cancel or a
restart may go on), every rank exited 0 (the job is complete); a fourth when the attempt
runs the gang preflight: every rank's loopback reported. Each rank *arrives* at a
latch once; arrivals are idempotent set additions on a **shard** item of 64 ranks, and a
shard that fills up adds itself to the latch's **head** item, which completes when every
shard has. No item holds more than 64 ranks (or, for the head, ``ceil(n / 64)`` shard
numbers), no event reads more than two items, and a redelivered arrival changes nothing.
Pure: no I/O.
"""

from __future__ import annotations

from enum import Enum

RANKS_PER_SHARD = 64


class Latch(str, Enum):
    """Attribute names of the rank sets on a shard item (and ``<name>_s`` on the head)."""

    REGISTERED = "reg"
    ENDED = "end"
    DONE = "done"
    PREFLIGHT = "pf"  # the rank's loopback reported in its attempt's gang preflight (round 1)

    @property
    def head_attribute(self) -> str:
        return f"{self.value}_s"


def shard_of(rank: int) -> int:
    return rank // RANKS_PER_SHARD


def shard_count(world_size: int) -> int:
    return max(1, -(-world_size // RANKS_PER_SHARD))


def shard_size(world_size: int, shard: int) -> int:
    """Ranks a shard holds when complete (the last one may be partial)."""
    return max(0, min(RANKS_PER_SHARD, world_size - shard * RANKS_PER_SHARD))


def shard_complete(world_size: int, shard: int, arrived: int) -> bool:
    return arrived >= shard_size(world_size, shard) > 0


def latch_complete(world_size: int, complete_shards: int) -> bool:
    return complete_shards >= shard_count(world_size)
