"""The cluster's GPU capacity a submit is checked against: what could never run is refused."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from gpu_recovery.queue.jobs_api.ports import JobsEcs

CAPACITY_CACHE_SECONDS = 60.0


@dataclass
class _CapacityCache:
    value: Capacity | None = None
    at: float = float("-inf")


@dataclass(frozen=True)
class Capacity:
    """GPU counts of the cluster's container instances (registered, any state)."""

    gpus_per_node: tuple[int, ...]

    @property
    def largest(self) -> int:
        return max(self.gpus_per_node, default=0)

    def nodes_with(self, gpus: int) -> int:
        return sum(1 for n in self.gpus_per_node if n >= gpus)


class ClusterCapacity:
    """GPU counts of the cluster's container instances, cached briefly."""

    def __init__(self, ecs: JobsEcs, ttl: float = CAPACITY_CACHE_SECONDS) -> None:
        self._ecs = ecs
        self.cluster = ecs.cluster
        self.ttl = ttl
        self._cache = _CapacityCache()
        self._lock = threading.Lock()

    def capacity(self) -> Capacity | None:
        """None when the cluster has no container instances (it may scale out later)."""
        with self._lock:
            if time.monotonic() - self._cache.at < self.ttl:
                return self._cache.value
        value = self._read()
        with self._lock:
            self._cache = _CapacityCache(value, time.monotonic())
        return value

    def _read(self) -> Capacity | None:
        # No status filter: every registered instance but INACTIVE ones (a DRAINING node
        # comes back; the check refuses only what could never run).
        described = self._ecs.container_instances((None,))
        if not described:
            return None
        return Capacity(tuple(gpu_count(i.get("registeredResources", [])) for i in described))


def gpu_count(resources: list[dict[str, Any]]) -> int:
    for resource in resources:
        if resource.get("name") == "GPU" and resource.get("type") == "STRINGSET":
            return len(resource.get("stringSetValue") or [])
    return 0
