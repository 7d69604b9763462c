"""Shard arithmetic (domain.shards): shares that sum to the limit, a stable shard per key."""

from __future__ import annotations

from itertools import pairwise

import pytest

from gpu_recovery.domain.shards import shard_count_for, shard_order, shard_shares, stable_shard


@pytest.mark.parametrize("limit", [1, 2, 5, 15, 16, 17, 100, 2048, 2049])
def test_the_shares_sum_exactly_to_the_limit_and_differ_by_at_most_one(limit: int) -> None:
    shares = shard_shares(limit, 16)
    assert sum(shares) == limit
    assert len(shares) == shard_count_for(limit, 16) == min(16, limit)
    assert min(shares) >= 1 and max(shares) - min(shares) <= 1


def test_a_limit_below_the_shard_count_uses_one_shard_per_slot() -> None:
    assert shard_shares(3, 16) == [1, 1, 1]
    assert shard_shares(0, 16) == [0]  # no slot at all: one shard that is always full


def test_a_key_keeps_its_shard_and_tries_every_other_one_after_it() -> None:
    assert stable_shard("ci-0042", 16) == stable_shard("ci-0042", 16)
    order = shard_order("ci-0042", 16)
    assert order[0] == stable_shard("ci-0042", 16)
    assert sorted(order) == list(range(16))
    assert [(b - a) % 16 for a, b in pairwise(order)] == [1] * 15


def test_keys_spread_over_the_shards() -> None:
    counts = [0] * 16
    for i in range(1600):
        counts[stable_shard(f"node-{i}", 16)] += 1
    assert min(counts) > 50  # ~100 each; none empty or starved
