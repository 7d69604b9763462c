"""The most bus bandwidth an all-reduce can reach, per instance family (issue 49).

A preflight's table is the tenant's word: a run claiming more than the hardware can carry is
not learned (``baseline.learn``), and the first runs of a class are held to a small fraction
of this bound instead of to one another (``baseline.threshold``).

One node's all-reduce runs on NVLink: its busbw cannot exceed a GPU's NVLink bandwidth (both
directions; NVLS's in-switch reduction is what brings 8 x H100 to ~480 GB/s of 450 one way).
Several nodes' runs cross EFA: each node's share of the ring leaves through its EFA devices, so
busbw is held by the node's aggregate EFA bandwidth; :data:`MULTI_NODE_HEADROOM` leaves room for
NCCL's tree algorithms, whose busbw is reported with the ring's 2(n-1)/n factor. A class this
table does not know (an ECS Anywhere host, ``<n>gpu``) gets :data:`GENERIC`: the fastest
hardware known, so nothing honest is refused; it has no floor (``known`` False).

Sources: NVIDIA's data sheets (A100: NVLink 3, 600 GB/s per GPU; H100/H200 SXM: NVLink 4,
900 GB/s; B200: NVLink 5, 1.8 TB/s) and the EC2 accelerated-computing instance pages
(p4d/p4de: 400 Gbps EFA; p5/p5e/p5en: 3,200 Gbps; p6-b200: 3,200 Gbps). Measured against them:
2 x p5.48xlarge, 339 GB/s busbw at 8 GB (docs/preflight.md), under the 400 GB/s line rate.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

MULTI_NODE_HEADROOM = 1.25


@dataclass(frozen=True)
class FamilyBound:
    family: str
    gpus: str
    nvlink_gbps: float  # one GPU's NVLink bandwidth, both directions (GB/s)
    efa_gbps: float  # one node's aggregate EFA bandwidth (GB/s)
    source: str
    known: bool = True


FAMILIES: dict[str, FamilyBound] = {b.family: b for b in (
    FamilyBound("p4d", "8 x A100 40GB", 600.0, 50.0, "NVLink 3 600 GB/s; 400 Gbps EFA"),
    FamilyBound("p4de", "8 x A100 80GB", 600.0, 50.0, "NVLink 3 600 GB/s; 400 Gbps EFA"),
    FamilyBound("p5", "8 x H100", 900.0, 400.0, "NVLink 4 900 GB/s; 3,200 Gbps EFA"),
    FamilyBound("p5e", "8 x H200", 900.0, 400.0, "NVLink 4 900 GB/s; 3,200 Gbps EFA"),
    FamilyBound("p5en", "8 x H200", 900.0, 400.0, "NVLink 4 900 GB/s; 3,200 Gbps EFAv3"),
    FamilyBound("p6-b200", "8 x B200", 1800.0, 400.0, "NVLink 5 1.8 TB/s; 3,200 Gbps EFAv4"),
)}
GENERIC = FamilyBound("generic", "any", 1800.0, 1800.0,
                      "an unknown class: the fastest link known (NVLink 5, 1.8 TB/s), no floor", known=False)


@dataclass(frozen=True)
class Bound:
    gbps: float
    source: str
    known: bool


def family_of(node_class: str) -> FamilyBound:
    """``p5.48xlarge`` -> p5; ``p6-b200.48xlarge`` -> p6-b200; anything else: :data:`GENERIC`."""
    return FAMILIES.get(node_class.split(".", 1)[0].lower(), GENERIC)


def max_busbw(node_class: str, nodes: int) -> Bound:
    """The most busbw a run of ``nodes`` nodes of ``node_class`` can honestly report."""
    family = family_of(node_class)
    if nodes <= 1:
        return Bound(family.nvlink_gbps, f"{family.family} NVLink ({family.source})", family.known)
    gbps = family.efa_gbps * MULTI_NODE_HEADROOM
    return Bound(gbps, f"{family.family} EFA x {MULTI_NODE_HEADROOM:g} ({family.source})", family.known)
