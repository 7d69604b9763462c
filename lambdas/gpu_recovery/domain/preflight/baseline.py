"""The bandwidth a preflight is held to: learned from the fleet's own passing runs.

Published floors do not transfer between fleets (a healthy 2 x p5 pair measures 289 GB/s
at 128 MB against a "p5: 800 GB/s" floor; the real 2 x 8 H100 capture: 339 GB/s at 8 GB),
so the stack keeps, per **node class** (the instance type, or ``<n>gpu`` when ECS does not
say) **and node count**, the busbw of the last :data:`MAX_SAMPLES` passing runs: one small
item each, whatever the fleet's size. An operator may set a floor per node class.

A preflight's table is the tenant's word (issue 49): what one job reports must not teach
what another is judged by. So the rule (:func:`threshold`) is **robust**:

* from ``min_samples`` passing runs on, a run is **slow** below ``slow_fraction`` of the
  median of the kept samples (the median: one odd sample, fast or slow, moves nothing);
* **the first runs** of a class and size (fewer than ``min_samples``) are judged against
  the hardware, not against one another: slow only below ``first_runs_fraction`` of the
  class's physical bound (``bounds.max_busbw``: NVLink for one node, EFA for several; an
  unknown class has no floor, only failed runs fail). A single forged first sample cannot
  raise what the next honest job is held to;
* a run is **learned** (:func:`learn`) only when it passed, its busbw is within the physical
  bound, and, once ``min_samples`` are kept, it is not more than :data:`OUTLIER_FACTOR` x
  their median (a table x1000, or x2, is refused); a slow run is never learned, so a degraded
  fabric cannot teach the baseline its own slowness; samples above the bound (kept before
  the bound existed) are left out of the median;
* the operator's floor, when set, is a lower bound of the threshold at every stage;
* a size with too few samples of its own borrows the nearest size's learned reference
  (:func:`reference_for`), a larger node count first: busbw is built to be comparable
  across rank counts (nccl-tests PERFORMANCE.md), and a larger job's busbw is the lower, so
  the borrowed threshold errs on the side of passing; in a young fleet where no size has
  ``min_samples`` yet, its own first runs, else another size's. A single node's loopback (NVLink
  only) never borrows from a multi-node size, nor they from it.

Pure: the repository reads and writes the items (``repository.preflight``).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_recovery.domain.preflight.bounds import max_busbw

MAX_SAMPLES = 8
DEFAULT_SLOW_FRACTION = 0.8
DEFAULT_MIN_SAMPLES = 3
DEFAULT_FIRST_RUNS_FRACTION = 0.2  # of the physical bound: a socket fallback, a dead link
OUTLIER_FACTOR = 1.5  # a run this far above the kept median is not learned
_CLASS_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def node_class(instance_type: str, gpus_per_node: int) -> str:
    """The class a baseline is kept for: the instance type ECS reports (``p5.48xlarge``), or
    ``<n>gpu`` (ECS Anywhere hosts have none)."""
    cleaned = _CLASS_UNSAFE.sub("-", instance_type.strip())[:64]
    return cleaned or f"{max(0, int(gpus_per_node))}gpu"


@dataclass(frozen=True)
class BaselinePolicy:
    slow_fraction: float = DEFAULT_SLOW_FRACTION
    min_samples: int = DEFAULT_MIN_SAMPLES
    first_runs_fraction: float = DEFAULT_FIRST_RUNS_FRACTION
    #: operator floors (GB/s) per node class: a threshold never below it
    floors: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.slow_fraction <= 1 or not 0 < self.first_runs_fraction <= 1:
            raise ValueError("the slow fractions are in (0, 1]")
        if not 1 <= self.min_samples <= MAX_SAMPLES:
            raise ValueError(f"min_samples is 1..{MAX_SAMPLES}")
        for name, floor in self.floors.items():
            if floor <= 0:
                raise ValueError(f"the floor of {name} must be > 0 GB/s")


@dataclass(frozen=True)
class Baseline:
    """The learned busbw of one (node class, node count): newest sample last."""

    node_class: str
    nodes: int
    samples: tuple[float, ...] = ()
    sample_ids: tuple[str, ...] = ()  # which run each sample is (a run is learned once)
    version: int = 0

    @property
    def median(self) -> float | None:
        usable = self.usable
        return statistics.median(usable) if usable else None

    @property
    def usable(self) -> tuple[float, ...]:
        """The samples within the class's physical bound (one kept from before the bound
        existed, or forged, counts for nothing)."""
        ceiling = max_busbw(self.node_class, self.nodes).gbps
        return tuple(s for s in self.samples if 0 < s <= ceiling)

    def to_item(self) -> dict[str, Any]:
        return {"node_class": self.node_class, "nodes": self.nodes, "samples": list(self.samples),
                "sample_ids": list(self.sample_ids), "version": self.version}

    @classmethod
    def from_item(cls, raw: Mapping[str, Any] | None, node_class_: str, nodes: int) -> Baseline:
        raw = raw or {}
        samples = tuple(float(s) for s in raw.get("samples") or ())[-MAX_SAMPLES:]
        ids = tuple(str(s) for s in raw.get("sample_ids") or ())[-MAX_SAMPLES:]
        return cls(node_class_, nodes, samples, ids, int(raw.get("version") or 0))


@dataclass(frozen=True)
class Threshold:
    """What a run of one size is held to: ``gbps`` None = nothing yet (only failures fail)."""

    gbps: float | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"gbps": None if self.gbps is None else round(self.gbps, 2), "source": self.source}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Threshold:
        raw = raw or {}
        value = raw.get("gbps")
        return cls(None if value is None else float(value), str(raw.get("source") or ""))

    def slow(self, busbw: float) -> bool:
        return self.gbps is not None and busbw < self.gbps


def reference_for(baselines: Mapping[int, Baseline], nodes: int, policy: BaselinePolicy) -> Baseline | None:
    """The baseline judging a run of ``nodes`` nodes: its own once it has ``min_samples``
    samples, else the nearest multi-node size that has (larger first), else its own first
    runs, else the nearest multi-node size's first runs. ``baselines``: what was read, by
    node count (the job's sizes and the powers of two)."""
    own = baselines.get(nodes)
    if own is not None and len(own.usable) >= policy.min_samples:
        return own
    others = [b for n, b in baselines.items() if nodes >= 2 and n >= 2 and n != nodes and b.usable]
    learned = [b for b in others if len(b.usable) >= policy.min_samples]
    if learned:
        return min(learned, key=lambda b: (abs(b.nodes - nodes), b.nodes < nodes))
    if own is not None and own.usable:
        return own
    if others:  # a young fleet: another size's first runs (their own, looser rule)
        return min(others, key=lambda b: (abs(b.nodes - nodes), b.nodes < nodes))
    return own


def threshold(policy: BaselinePolicy, baseline: Baseline | None, nodes: int) -> Threshold:
    """The rule above, for a run of ``nodes`` nodes judged against ``baseline``."""
    floor = policy.floors.get(baseline.node_class) if baseline is not None else None
    learned: float | None = None
    source = "no passing run of this size yet: only failures fail"
    usable = baseline.usable if baseline is not None else ()
    if baseline is not None and len(usable) >= policy.min_samples:
        borrowed = "" if baseline.nodes == nodes else f" (borrowed from {baseline.nodes} nodes)"
        learned = policy.slow_fraction * float(baseline.median or 0.0)
        source = (f"{policy.slow_fraction:g} x median {baseline.median:.1f} GB/s of the last "
                  f"{len(usable)} passing runs{borrowed}")
    elif baseline is not None:
        bound = max_busbw(baseline.node_class, nodes)
        if bound.known:
            learned = policy.first_runs_fraction * bound.gbps
            source = (f"first runs ({len(usable)} of {policy.min_samples} passing runs): "
                      f"{policy.first_runs_fraction:g} x the physical bound {bound.gbps:.0f} GB/s, "
                      f"{bound.source}")
        else:
            source = (f"first runs ({len(usable)} of {policy.min_samples} passing runs) of an unknown "
                      "class: only failures fail")
    if floor is not None and (learned is None or floor > learned):
        owner = baseline.node_class if baseline is not None else "?"
        return Threshold(floor, f"operator floor {floor:g} GB/s for {owner}")
    return Threshold(learned, source)


def with_floor(policy: BaselinePolicy, node_class_: str, nodes: int,
               baselines: Mapping[int, Baseline]) -> Threshold:
    """The threshold of a run of ``nodes`` nodes of ``node_class_`` (floors apply even when
    nothing was ever learned)."""
    baseline = reference_for(baselines, nodes, policy) or Baseline(node_class_, nodes)
    return threshold(policy, baseline, nodes)


def learn(baseline: Baseline, busbw: float, sample_id: str,
          policy: BaselinePolicy | None = None) -> Baseline | None:
    """``baseline`` with a passing run's busbw. None: this run is learned already, the figure is
    not a bandwidth, it is above the class's physical bound, or far above the kept median
    (``policy.min_samples`` of them on). Only passing runs are given to it."""
    policy = policy or BaselinePolicy()
    if sample_id in baseline.sample_ids or not busbw > 0:
        return None
    if busbw > max_busbw(baseline.node_class, baseline.nodes).gbps:
        return None
    if len(baseline.usable) >= policy.min_samples and busbw > OUTLIER_FACTOR * float(baseline.median or 0.0):
        return None
    samples = (*baseline.samples, round(float(busbw), 2))[-MAX_SAMPLES:]
    ids = (*baseline.sample_ids, sample_id)[-MAX_SAMPLES:]
    return replace(baseline, samples=samples, sample_ids=ids, version=baseline.version + 1)


def refusal(baseline: Baseline, busbw: float, policy: BaselinePolicy) -> str:
    """Why a passing run's busbw is not learned ("" when it is)."""
    bound = max_busbw(baseline.node_class, baseline.nodes)
    if busbw > bound.gbps:
        return f"busbw {busbw:.1f} GB/s above the physical bound {bound.gbps:.0f} GB/s ({bound.source})"
    median = baseline.median
    if len(baseline.usable) >= policy.min_samples and median and busbw > OUTLIER_FACTOR * median:
        return f"busbw {busbw:.1f} GB/s over {OUTLIER_FACTOR:g} x the median {median:.1f} GB/s"
    return ""


def sizes_of(node_counts: Iterable[int]) -> list[int]:
    """The node counts whose baselines a judgement reads (distinct, sorted)."""
    return sorted({int(n) for n in node_counts if int(n) >= 1})
