"""The bandwidth a preflight is held to: learned from the fleet's passing runs, one vote per user.

Published floors do not transfer between fleets (a healthy 2 x p5 pair measures 289 GB/s
at 128 MB against a "p5: 800 GB/s" floor; the real 2 x 8 H100 capture: 339 GB/s at 8 GB),
so the stack keeps, per **node class** (the instance type, or ``<n>gpu`` when ECS does not
say) **and node count**, the busbw of each user's last :data:`MAX_SAMPLES` passing runs, for
the :data:`MAX_USERS` users who taught it last: one small item each, whatever the fleet's
size or its number of users. An operator may set a floor per node class.

A preflight's table is the tenant's word (issue 49): a tenant can be wrong or hostile about
every node its job runs on, and what one tenant reports must not teach what another is
judged by. The runs are therefore kept **per user** (the job's quota subject, the identity
its node quota is charged to; keyed by a hash, :func:`user_key`) and the rule
(:func:`threshold`, for a run of a given user) is:

* **the fleet**: once ``min_users`` distinct users have taught a class and size, a run is
  **slow** below ``slow_fraction`` of the **median of the users' medians** (each user's
  median of its own kept runs). Each user is one vote whatever its number of runs, so one
  user, honest or not, moves the threshold at most within the other users' spread: a
  thousand forged runs are still one vote;
* **its own history**: before that, a user with ``min_samples`` passing runs of its own is
  judged by ``slow_fraction`` of its own median: what it taught judges itself alone;
* **the first runs** (a user with fewer runs of a class and size that fewer than
  ``min_users`` users taught) are judged against the hardware, not against anyone's report:
  slow only below ``first_runs_fraction`` of the class's physical bound
  (``bounds.max_busbw``: NVLink for one node, EFA for several; an unknown class has no floor,
  only failed runs fail);
* a run is **learned** (:func:`learn`) only when it passed, its busbw is within the physical
  bound, and it is not more than :data:`OUTLIER_FACTOR` x the median that judged it (the
  fleet's or the user's own; a table x1000, or x2, is refused); a slow run is never learned,
  so a degraded fabric cannot teach the baseline its own slowness; a run is learned once
  (its id is kept);
* the operator's floor, when set, is a lower bound of the threshold at every stage;
* a size with no reference of its own for the user borrows the nearest size's
  (:func:`reference_for`), a larger node count first: busbw is built to be comparable
  across rank counts (nccl-tests PERFORMANCE.md), and a larger job's busbw is the lower, so
  the borrowed threshold errs on the side of passing; in a young fleet where no size has a
  reference, its own first runs, else another size's. A single node's loopback (NVLink
  only) never borrows from a multi-node size, nor they from it.

An item of the old shape (``samples`` with no user, before issue 49's per-user learning) is
read as nothing learned: whose runs they were is unknown (they may be the forgery this
rule prevents); its version is kept, and the next run learned rewrites it in this shape.

Pure: the repository reads and writes the items (``repository.preflight``).
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_recovery.domain.preflight.bounds import max_busbw

MAX_SAMPLES = 8  # kept per user
MAX_USERS = 16  # users kept per class and size (the least recent to teach is dropped)
DEFAULT_SLOW_FRACTION = 0.8
DEFAULT_MIN_SAMPLES = 3
DEFAULT_MIN_USERS = 3
DEFAULT_FIRST_RUNS_FRACTION = 0.2  # of the physical bound: a socket fallback, a dead link
OUTLIER_FACTOR = 1.5  # a run this far above the median that judged it is not learned
_CLASS_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_ID = 200


def node_class(instance_type: str, gpus_per_node: int) -> str:
    """The class a baseline is kept for: the instance type ECS reports (``p5.48xlarge``), or
    ``<n>gpu`` (ECS Anywhere hosts have none)."""
    cleaned = _CLASS_UNSAFE.sub("-", instance_type.strip())[:64]
    return cleaned or f"{max(0, int(gpus_per_node))}gpu"


def user_key(user: str) -> str:
    """The key a user's runs are kept under: short and the same length whatever the subject."""
    return hashlib.sha256(user.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class BaselinePolicy:
    slow_fraction: float = DEFAULT_SLOW_FRACTION
    min_samples: int = DEFAULT_MIN_SAMPLES
    first_runs_fraction: float = DEFAULT_FIRST_RUNS_FRACTION
    #: distinct users whose runs judge everyone (fewer: each user its own runs, or the hardware)
    min_users: int = DEFAULT_MIN_USERS
    #: operator floors (GB/s) per node class: a threshold never below it
    floors: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.slow_fraction <= 1 or not 0 < self.first_runs_fraction <= 1:
            raise ValueError("the slow fractions are in (0, 1]")
        if not 1 <= self.min_samples <= MAX_SAMPLES:
            raise ValueError(f"min_samples is 1..{MAX_SAMPLES}")
        if not 1 <= self.min_users <= MAX_USERS:
            raise ValueError(f"min_users is 1..{MAX_USERS}")
        for name, floor in self.floors.items():
            if floor <= 0:
                raise ValueError(f"the floor of {name} must be > 0 GB/s")


@dataclass(frozen=True)
class UserRuns:
    """One user's passing runs of a class and size, newest last; ``at``: the baseline's version
    when it last taught (the least recent user is the one dropped)."""

    samples: tuple[float, ...] = ()
    sample_ids: tuple[str, ...] = ()
    at: int = 0

    def to_item(self) -> dict[str, Any]:
        return {"samples": list(self.samples), "ids": list(self.sample_ids), "at": self.at}

    @classmethod
    def from_item(cls, raw: Any) -> UserRuns:
        raw = raw if isinstance(raw, Mapping) else {}
        samples = tuple(float(s) for s in raw.get("samples") or ())[-MAX_SAMPLES:]
        ids = tuple(str(s) for s in raw.get("ids") or ())[-MAX_SAMPLES:]
        return cls(samples, ids, int(raw.get("at") or 0))


@dataclass(frozen=True)
class Reference:
    """The median a run is held to, and whose it is (for the threshold's source)."""

    median: float
    whose: str


@dataclass(frozen=True)
class Baseline:
    """The learned busbw of one (node class, node count): each user's runs, by :func:`user_key`."""

    node_class: str
    nodes: int
    users: Mapping[str, UserRuns] = field(default_factory=dict)
    version: int = 0

    @property
    def ceiling(self) -> float:
        return max_busbw(self.node_class, self.nodes).gbps

    def usable(self, runs: UserRuns) -> tuple[float, ...]:
        """A user's samples within the class's physical bound (one above it counts for nothing)."""
        return tuple(s for s in runs.samples if 0 < s <= self.ceiling)

    @property
    def medians(self) -> dict[str, float]:
        """Each user's median of its own usable runs (users with none left out)."""
        return {k: statistics.median(u) for k, r in self.users.items() if (u := self.usable(r))}

    @property
    def taught(self) -> bool:
        return bool(self.medians)

    @property
    def samples(self) -> tuple[float, ...]:
        """Every kept sample, the least recent user's first (for reading, not judging)."""
        return tuple(s for r in self._by_age() for s in r.samples)

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(i for r in self._by_age() for i in r.sample_ids)

    def _by_age(self) -> list[UserRuns]:
        return sorted(self.users.values(), key=lambda r: r.at)

    def reference(self, user: str, policy: BaselinePolicy) -> Reference | None:
        """What a run of ``user`` is held to here: the fleet's median of users' medians once
        ``min_users`` users taught; else the user's own median once it has ``min_samples``
        runs; else None (the first runs: the hardware judges)."""
        medians = self.medians
        if len(medians) >= policy.min_users:
            return Reference(float(statistics.median(medians.values())),
                             f"the median of {len(medians)} users' medians")
        own = self.usable(self.users.get(user_key(user), UserRuns()))
        if len(own) >= policy.min_samples:
            return Reference(float(statistics.median(own)),
                             f"this user's own last {len(own)} passing runs "
                             f"({len(medians)} of {policy.min_users} users taught this size)")
        return None

    def to_item(self) -> dict[str, Any]:
        return {"node_class": self.node_class, "nodes": self.nodes, "version": self.version,
                "users": {k: r.to_item() for k, r in self.users.items()}}

    @classmethod
    def from_item(cls, raw: Mapping[str, Any] | None, node_class_: str, nodes: int) -> Baseline:
        """The item as stored; the old shape's user-less ``samples`` are not read (see above)."""
        raw = raw or {}
        stored = raw.get("users")
        stored = stored if isinstance(stored, Mapping) else {}
        users = {str(k): UserRuns.from_item(v) for k, v in stored.items()}
        kept = sorted(users, key=lambda k: users[k].at)[-MAX_USERS:]
        return cls(node_class_, nodes, {k: users[k] for k in kept}, int(raw.get("version") or 0))


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


def reference_for(baselines: Mapping[int, Baseline], nodes: int, policy: BaselinePolicy,
                  user: str = "") -> Baseline | None:
    """The baseline judging a run of ``nodes`` nodes of ``user``: its own size's once it has a
    reference for the user, else the nearest multi-node size that has (larger first), else its
    own first runs, else the nearest multi-node size's first runs. ``baselines``: what was
    read, by node count (the job's sizes and the powers of two)."""
    own = baselines.get(nodes)
    if own is not None and own.reference(user, policy) is not None:
        return own
    others = [b for n, b in baselines.items() if nodes >= 2 and n >= 2 and n != nodes and b.taught]
    learned = [b for b in others if b.reference(user, policy) is not None]
    if learned:
        return min(learned, key=lambda b: (abs(b.nodes - nodes), b.nodes < nodes))
    if own is not None and own.taught:
        return own
    if others:  # a young fleet: another size's first runs (their own, looser rule)
        return min(others, key=lambda b: (abs(b.nodes - nodes), b.nodes < nodes))
    return own


def threshold(policy: BaselinePolicy, baseline: Baseline | None, nodes: int, user: str = "") -> Threshold:
    """The rule above, for a run of ``nodes`` nodes of ``user`` judged against ``baseline``."""
    floor = policy.floors.get(baseline.node_class) if baseline is not None else None
    learned: float | None = None
    source = "no passing run of this size yet: only failures fail"
    reference = baseline.reference(user, policy) if baseline is not None else None
    if baseline is not None and reference is not None:
        borrowed = "" if baseline.nodes == nodes else f" (borrowed from {baseline.nodes} nodes)"
        learned = policy.slow_fraction * reference.median
        source = f"{policy.slow_fraction:g} x median {reference.median:.1f} GB/s, {reference.whose}{borrowed}"
    elif baseline is not None:
        bound = max_busbw(baseline.node_class, nodes)
        taught = f"{len(baseline.medians)} of {policy.min_users} users"
        if bound.known:
            learned = policy.first_runs_fraction * bound.gbps
            source = (f"first runs ({taught}): {policy.first_runs_fraction:g} x the physical bound "
                      f"{bound.gbps:.0f} GB/s, {bound.source}")
        else:
            source = f"first runs ({taught}) of an unknown class: only failures fail"
    if floor is not None and (learned is None or floor > learned):
        owner = baseline.node_class if baseline is not None else "?"
        return Threshold(floor, f"operator floor {floor:g} GB/s for {owner}")
    return Threshold(learned, source)


def with_floor(policy: BaselinePolicy, node_class_: str, nodes: int,
               baselines: Mapping[int, Baseline], user: str = "") -> Threshold:
    """The threshold of a run of ``nodes`` nodes of ``node_class_`` by ``user`` (floors apply
    even when nothing was ever learned)."""
    baseline = reference_for(baselines, nodes, policy, user) or Baseline(node_class_, nodes)
    return threshold(policy, baseline, nodes, user)


def learn(baseline: Baseline, busbw: float, sample_id: str, policy: BaselinePolicy | None = None,
          user: str = "") -> Baseline | None:
    """``baseline`` with a passing run of ``user``. None: this run is learned already, the
    figure is not a bandwidth, it is above the class's physical bound, or far above the
    median that judged it. Only passing runs are given to it. The user's runs keep their
    last :data:`MAX_SAMPLES`; a new user past :data:`MAX_USERS` drops the least recent."""
    policy = policy or BaselinePolicy()
    sample_id = sample_id[:_MAX_ID]
    if sample_id in baseline.sample_ids or not busbw > 0 or refusal(baseline, busbw, policy, user):
        return None
    key, version = user_key(user), baseline.version + 1
    runs = baseline.users.get(key, UserRuns())
    users = dict(baseline.users)
    users[key] = UserRuns((*runs.samples, round(float(busbw), 2))[-MAX_SAMPLES:],
                          (*runs.sample_ids, sample_id)[-MAX_SAMPLES:], version)
    while len(users) > MAX_USERS:
        del users[min((k for k in users if k != key), key=lambda k: users[k].at)]
    return replace(baseline, users=users, version=version)


def refusal(baseline: Baseline, busbw: float, policy: BaselinePolicy, user: str = "") -> str:
    """Why a passing run of ``user`` is not learned ("" when it is)."""
    bound = max_busbw(baseline.node_class, baseline.nodes)
    if busbw > bound.gbps:
        return f"busbw {busbw:.1f} GB/s above the physical bound {bound.gbps:.0f} GB/s ({bound.source})"
    reference = baseline.reference(user, policy)
    if reference is not None and busbw > OUTLIER_FACTOR * reference.median:
        return (f"busbw {busbw:.1f} GB/s over {OUTLIER_FACTOR:g} x the median {reference.median:.1f} GB/s "
                f"({reference.whose})")
    return ""


def sizes_of(node_counts: Iterable[int]) -> list[int]:
    """The node counts whose baselines a judgement reads (distinct, sorted)."""
    return sorted({int(n) for n in node_counts if int(n) >= 1})
