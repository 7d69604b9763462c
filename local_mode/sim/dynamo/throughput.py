"""Partition-level throughput: what one partition key value of a table or of a GSI takes.

DynamoDB enforces limits per partition, in both capacity modes, on the table and on each
GSI separately: about 1,000 write units and 3,000 read units a second ("Best practices for
designing and using partition keys effectively", "Key range throughput exceeded (hot
partitions)"). All the items of one partition key value share one partition's limit, and a
key that only grows (a timestamp sort key) keeps its writes on the partition that holds the
end of the range: splitting for heat does not help. A write to the base table that a GSI
partition cannot take is refused too ("GSI back-pressure": "DynamoDB throttles writes to the
base table to maintain data consistency"; "Understanding Global Secondary Index (GSI) write
throttling and back pressure in DynamoDB").

:class:`PartitionThroughput` keeps, per (table, index, partition key value), the units taken
in the current second of the store's clock, and admits a call's writes (every partition it
touches: the table's and each index's) or reads only if each partition has room; otherwise
nothing is done and the call fails with ``ProvisionedThroughputExceededException`` carrying
its ``ThrottlingReasons`` (``TableWriteKeyRangeThroughputExceeded``,
``IndexWriteKeyRangeThroughputExceeded``, ``...Read...``: the ThrottlingReason shape of the
DynamoDB API reference), which the SDKs retry with backoff. It also records the busiest
second of each partition (:meth:`PartitionThroughput.peaks`), for the benches.

Off by default (``MemoryDynamo(partition_throughput=None)``): a whole recovery in the quick
tests runs within one simulated second where a real one would take minutes, so the limits
would throttle what a real cluster never sends at once. The heartbeat bench and its test
turn it on.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: DynamoDB's per-partition limits (units a second).
PARTITION_WRITE_UNITS_PER_SECOND = 1000.0
PARTITION_READ_UNITS_PER_SECOND = 3000.0

#: (table, index ("" for the table itself), partition key value)
Partition = tuple[str, str, Any]


@dataclass
class _Second:
    at: int = -1
    write: float = 0.0
    read: float = 0.0


@dataclass
class PartitionThroughput:
    """Per-partition, per-second admission of read and write units (see the module doc)."""

    write_units_per_second: float = PARTITION_WRITE_UNITS_PER_SECOND
    read_units_per_second: float = PARTITION_READ_UNITS_PER_SECOND
    _seconds: dict[Partition, _Second] = field(default_factory=dict, repr=False)
    _peak_write: dict[Partition, float] = field(default_factory=dict, repr=False)
    _peak_read: dict[Partition, float] = field(default_factory=dict, repr=False)
    _total_write: dict[Partition, float] = field(default_factory=dict, repr=False)
    #: throttled calls by ThrottlingReason ("IndexWriteKeyRangeThroughputExceeded"...)
    throttled: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, now: float, loads: list[tuple[Partition, float]], *, write: bool) -> Partition | None:
        """Take ``loads`` (partition, units) in the second of ``now`` if every partition has
        room (nothing is taken otherwise); returns the first partition over its limit, or
        None when admitted."""
        second = int(now)
        limit = self.write_units_per_second if write else self.read_units_per_second
        with self._lock:
            wanted: dict[Partition, float] = {}
            for partition, units in loads:
                wanted[partition] = wanted.get(partition, 0.0) + units
            for partition, units in wanted.items():
                used = self._used(partition, second)
                if (used.write if write else used.read) + units > limit:
                    kind = "Index" if partition[1] else "Table"
                    self.throttled[f"{kind}{'Write' if write else 'Read'}KeyRangeThroughputExceeded"] += 1
                    return partition
            for partition, units in wanted.items():
                used = self._used(partition, second)
                peaks = self._peak_write if write else self._peak_read
                if write:
                    used.write += units
                    peaks[partition] = max(peaks.get(partition, 0.0), used.write)
                    self._total_write[partition] = self._total_write.get(partition, 0.0) + units
                else:
                    used.read += units
                    peaks[partition] = max(peaks.get(partition, 0.0), used.read)
        return None

    def _used(self, partition: Partition, second: int) -> _Second:
        used = self._seconds.get(partition)
        if used is None or used.at != second:
            used = self._seconds[partition] = _Second(second)
        return used

    def peaks(self, *, write: bool = True) -> dict[Partition, float]:
        """The most units each partition took in one second."""
        with self._lock:
            return dict(self._peak_write if write else self._peak_read)

    def write_units(self) -> dict[Partition, float]:
        """The write units each partition took in all."""
        with self._lock:
            return dict(self._total_write)

    def busiest(self, *, write: bool = True) -> tuple[Partition | None, float]:
        """The partition that took the most units in one second, and how many."""
        peaks = self.peaks(write=write)
        if not peaks:
            return None, 0.0
        partition = max(peaks, key=lambda p: peaks[p])
        return partition, peaks[partition]

    def reset(self) -> None:
        with self._lock:
            self._seconds.clear()
            self._peak_write.clear()
            self._peak_read.clear()
            self._total_write.clear()
            self.throttled.clear()


def throttling_reason(partition: Partition, *, write: bool, arn_prefix: str) -> dict[str, str]:
    """The ThrottlingReason (DynamoDB API reference) of a partition over its limit."""
    table, index, _ = partition
    resource = f"{arn_prefix}:table/{table}" + (f"/index/{index}" if index else "")
    kind = "Index" if index else "Table"
    return {"reason": f"{kind}{'Write' if write else 'Read'}KeyRangeThroughputExceeded", "resource": resource}
