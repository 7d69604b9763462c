"""Fixtures of the handler tests: the simulated cluster of tests/handlers/cluster.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.handlers.cluster import Cluster, make_cluster


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A simulated cluster, every event delivered twice (at-least-once)."""
    yield from make_cluster()
