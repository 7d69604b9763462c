"""The simulated cluster's GPU fabric: what an all-reduce over some of its nodes measures,
and what nccl-tests' ``all_reduce_perf`` prints for it.

Each node has its GPUs' NVLink (a loopback all-reduce over the node's own GPUs runs on it)
and a network path (EFA: an all-reduce over several nodes runs on it). Faults on demand
(``gpu-recovery-admin inject-fault link|slow-node``, the campaigns, the bench):

* ``slow_node(node, factor)``: the node's GPUs are slow under load (thermal throttling, a
  degraded NVLink): its loopback, and every group holding it, run at ``factor``;
* ``slow_network(node, factor)``: the node's own network path (a NIC, its cable): every
  group of two nodes or more holding it;
* ``degrade_link(a, b, factor)``: the path between two nodes: only groups holding both;
* ``hang_node(node)``: the node's all-reduces never finish (a wedged NIC).

Each heals when its node comes back from a reboot, unless it was injected ``persistent``.

**Timing** (:func:`all_reduce_seconds`): an all-reduce of ``s`` bytes takes
``t = 120 us + 804 us * s / (s + 16 MiB) + s / A``; over nodes ``A`` = 184.3 GB/s of
algorithm bandwidth (fitted to the real 2 x 8 H100 capture, tests/preflight/fixtures/real:
it gives its 128 MB..8 GB rows within 6 %, e.g. 6.75 ms at 1 GB against 6.76 ms printed),
falling 2 % per doubling of the node count; on one node's NVLink ``A`` = 274 GB/s (busbw
480 GB/s, NVIDIA's figure for 8 x H100 in one HGX board: an assumption, no capture here).
busbw = algbw * 2(n-1)/n over n GPUs. What a test takes as a whole (:func:`test_seconds`):
torchrun and NCCL's start (5 s + 2 ms per GPU), then 5 warm-up and 20 timed iterations of
each size, out-of-place and in-place. Pure functions of the fabric's state; the training
programs (playground), the campaigns' ranks and the bench all use this one model.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024
NETWORK_ALGBW = 184.29  # GB/s, 2 x 8 H100 over EFA (the real capture's large sizes)
NVLINK_ALGBW = 274.3  # GB/s, 8 x H100 NVLink (busbw 480 GB/s): assumed
LATENCY_US, KNEE_US, KNEE_BYTES = 120.0, 804.0, 16 * MIB
SCALE_LOSS_PER_DOUBLING = 0.02
WARMUP_ITERS, TIMED_ITERS = 5, 20
START_SECONDS, START_SECONDS_PER_GPU = 5.0, 0.002
GPU_NAME = "NVIDIA H100 80GB HBM3"
BUS_IDS = ("0000:04:00", "0000:05:00", "0000:0b:00", "0000:0c:00", "0000:84:00", "0000:85:00",
           "0000:8b:00", "0000:8c:00")
MAX_DEVICE_LINES = 64  # a 1,024-node run lists 8,192 devices; the sim prints the first few


@dataclass
class FabricFault:
    kind: str  # slow_node | slow_network | link | hang
    nodes: tuple[str, ...]
    factor: float = 1.0
    persistent: bool = False


@dataclass
class AllReduceRun:
    """What a simulated all_reduce_perf run measured and printed."""

    output: str
    seconds: float  # the whole test: start, warm-up, every size
    busbw: float  # at the largest size
    hung: bool = False  # never finishes (the caller's time limit ends it)


@dataclass
class Fabric:
    faults: list[FabricFault] = field(default_factory=list)

    # ------------------------------------------------------------ faults on demand
    def slow_node(self, node: str, factor: float = 0.4, persistent: bool = False) -> FabricFault:
        return self._add(FabricFault("slow_node", (node,), _factor(factor), persistent))

    def slow_network(self, node: str, factor: float = 0.4, persistent: bool = False) -> FabricFault:
        return self._add(FabricFault("slow_network", (node,), _factor(factor), persistent))

    def degrade_link(self, a: str, b: str, factor: float = 0.3, persistent: bool = False) -> FabricFault:
        if a == b:
            raise ValueError("a link joins two different nodes")
        return self._add(FabricFault("link", tuple(sorted((a, b))), _factor(factor), persistent))

    def hang_node(self, node: str, persistent: bool = False) -> FabricFault:
        return self._add(FabricFault("hang", (node,), 0.0, persistent))

    def _add(self, fault: FabricFault) -> FabricFault:
        self.faults.append(fault)
        return fault

    def rebooted(self, node: str) -> list[FabricFault]:
        """``node`` is back from a reboot: its faults that a reboot heals are gone."""
        healed = [f for f in self.faults if node in f.nodes and not f.persistent]
        self.faults = [f for f in self.faults if f not in healed]
        return healed

    # ------------------------------------------------------------ what a group measures
    def factor(self, nodes: Sequence[str]) -> float:
        """The share of healthy bandwidth an all-reduce over ``nodes`` gets (0: it hangs)."""
        group = set(nodes)
        factor = 1.0
        for fault in self.faults:
            held = set(fault.nodes) & group
            if fault.kind == "hang" and held:
                return 0.0
            hits = ((fault.kind == "slow_node" and held)
                    or (fault.kind == "slow_network" and held and len(group) >= 2)
                    or (fault.kind == "link" and set(fault.nodes) <= group))
            if hits:
                factor = min(factor, fault.factor)
        return factor

    def run(self, nodes: Sequence[str], gpus_per_node: int, min_bytes: int, max_bytes: int, *,
            pids: Iterable[int] = ()) -> AllReduceRun:
        """``all_reduce_perf -b min -e max -f 2`` over ``nodes`` (one node: its loopback)."""
        factor = self.factor(nodes)
        ranks = max(1, len(nodes) * gpus_per_node)
        start = START_SECONDS + START_SECONDS_PER_GPU * ranks
        if factor <= 0:
            return AllReduceRun(output="", seconds=float("inf"), busbw=0.0, hung=True)
        algbw = factor * (NVLINK_ALGBW if len(nodes) == 1 else network_algbw(len(nodes)))
        sizes = []
        size = min_bytes
        while size <= max_bytes:
            sizes.append(size)
            size *= 2
        seed = zlib.crc32(",".join(nodes).encode())
        rows, busbws, total = [], [], start
        for i, size in enumerate(sizes):
            halves = []
            for half in range(2):
                jitter = 1.0 + ((seed >> (i + half)) % 7 - 3) * 0.002  # +-0.6 %, the same for a group
                seconds = all_reduce_seconds(size, algbw) * jitter
                total += (WARMUP_ITERS + TIMED_ITERS) * seconds
                alg, bus = bandwidths(size, seconds, ranks)
                halves.append((seconds * 1e6, alg, bus, 0))
                busbws.append(bus)
            rows.append(table_row(size, size // 4, halves[0], halves[1]))
        hosts = list(nodes)
        pid_list = list(pids) or [1000 + 100 * i for i in range(len(hosts))]
        devices = [(r, pid_list[r // gpus_per_node % len(pid_list)] + r % gpus_per_node,
                    hosts[r // gpus_per_node], r % gpus_per_node, BUS_IDS[r % gpus_per_node % len(BUS_IDS)])
                   for r in range(min(ranks, MAX_DEVICE_LINES))]
        lines = header(min_bytes, max_bytes, devices) + rows + footer(busbws)
        return AllReduceRun(output="\n".join(lines) + "\n", seconds=total,
                            busbw=(busbws[-2] + busbws[-1]) / 2 if busbws else 0.0)


def _factor(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError("a slowdown factor is in (0, 1]: the share of the healthy bandwidth left")
    return float(value)


def network_algbw(nodes: int) -> float:
    doublings = 0
    n = 2
    while n < nodes:
        n *= 2
        doublings += 1
    return NETWORK_ALGBW * (1 - SCALE_LOSS_PER_DOUBLING) ** doublings


def all_reduce_seconds(size: int, algbw_gbps: float) -> float:
    usec = LATENCY_US + KNEE_US * size / (size + KNEE_BYTES) + size / (algbw_gbps * 1e3)
    return usec / 1e6


def test_seconds(nodes: int, gpus_per_node: int, min_bytes: int, max_bytes: int,
                 factor: float = 1.0) -> float:
    """What one preflight test takes over ``nodes`` nodes (start, warm-up, every size)."""
    algbw = factor * (NVLINK_ALGBW if nodes == 1 else network_algbw(nodes))
    total = START_SECONDS + START_SECONDS_PER_GPU * nodes * gpus_per_node
    size = min_bytes
    while size <= max_bytes:
        total += 2 * (WARMUP_ITERS + TIMED_ITERS) * all_reduce_seconds(size, algbw)
        size *= 2
    return total


def bandwidths(size: int, seconds: float, ranks: int) -> tuple[float, float]:
    algbw = size / 1e9 / seconds
    return algbw, algbw * (2 * (ranks - 1) / ranks if ranks > 1 else 1.0)


# ------------------------------------------------------------ all_reduce_perf's format
def _client() -> Any:
    """The shipped training client: its all-reduce benchmark prints nccl-tests' table, and the
    simulated runs print it with the same functions (one copy of the tool's format)."""
    from local_mode.scripts import load_client_library

    return load_client_library()


def table_row(size: int, count: int, oop: tuple[float, float, float, int],
              ip: tuple[float, float, float, int]) -> str:
    """A row as nccl-tests' common.cu prints it."""
    return str(_client().table_row(size, count, "float", "sum", -1, oop, ip))


def header(min_bytes: int, max_bytes: int, devices: Sequence[tuple[int, int, str, int, str]]) -> list[str]:
    named = [(r, pid, host, dev, bus, GPU_NAME) for r, pid, host, dev, bus in devices]
    return list(_client().table_header(min_bytes, max_bytes, named))


def footer(busbws: Sequence[float]) -> list[str]:
    return list(_client().table_footer(0, busbws))
