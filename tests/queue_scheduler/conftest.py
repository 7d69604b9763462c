"""Fixtures of the scheduler tests: the simulated GPU cluster of tests/fixtures/queue_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.queue_cluster import QueueCluster, make_queue_cluster


@pytest.fixture
def qc() -> Iterator[QueueCluster]:
    """Four EC2 nodes with 8 GPUs each."""
    yield from make_queue_cluster(nodes=[8, 8, 8, 8])
