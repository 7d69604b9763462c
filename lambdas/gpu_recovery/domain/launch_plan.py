"""Which StartTask calls start a gang's ranks: one per rank, or one for up to 10 identical
ranks on distinct nodes (StartTask takes up to 10 container instances and one set of
overrides and tags for all of them). Pure and deterministic: the same ranks (registered
or not) always give the same calls, so a retried batch looks its tasks up under the same
``startedBy``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_INSTANCES_PER_START = 10


@dataclass(frozen=True)
class PlannedRank:
    rank: int
    node: str  # container instance id it starts on
    spec: str  # what makes two ranks identical (task definition, overrides, group, tags but the rank)


@dataclass(frozen=True)
class StartCall:
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]

    @property
    def grouped(self) -> bool:
        return len(self.ranks) > 1

    @property
    def key(self) -> int:
        """The call's name in its ``startedBy``: its lowest rank."""
        return min(self.ranks)


def spec_key(task_definition_arn: str, overrides: Mapping[str, Any], group: str, gpus: int,
             tags: Iterable[Mapping[str, str]], per_rank_tags: Iterable[str]) -> str:
    """Ranks with equal keys may share one StartTask (their tags but the rank's are equal)."""
    skip = set(per_rank_tags)
    common = sorted((str(t.get("key")), str(t.get("value", ""))) for t in tags if t.get("key") not in skip)
    return json.dumps([task_definition_arn, overrides, group, gpus, common], sort_keys=True, default=str)


def plan_calls(ranks: Sequence[PlannedRank], *, batching: bool = True) -> list[StartCall]:
    """Greedy and deterministic: in rank order, a rank joins the first call of its spec
    that is not full and starts nothing on its node yet, or opens a new one (so 8 ranks a
    node, one per GPU, give calls of one rank per node)."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    if not batching:
        return [StartCall((r.rank,), (r.node,)) for r in ordered]
    open_calls: dict[str, list[list[PlannedRank]]] = {}
    for rank in ordered:
        calls = open_calls.setdefault(rank.spec, [])
        call = next((c for c in calls if len(c) < MAX_INSTANCES_PER_START
                     and all(m.node != rank.node for m in c)), None)
        if call is None:
            calls.append([rank])
        else:
            call.append(rank)
    planned = [StartCall(tuple(m.rank for m in c), tuple(m.node for m in c))
               for calls in open_calls.values() for c in calls]
    return sorted(planned, key=lambda c: c.key)


#: ECS tag values: at most 256 characters of letters, digits, spaces and ``_ . : / = + - @``
#: (ECS API Reference, Tag): no comma. Ranks are written as space-separated runs, "0-3 5 9".
MAX_TAG_VALUE_CHARS = 256
# A run wider than any job the loop protects is not a rank list (a user's tag, a typo).
_MAX_RUN = 65_536


def ranks_tag_value(ranks: Sequence[int]) -> str:
    """The ``gpu-recovery:ranks`` tag of a grouped StartTask: its ranks, sorted, runs of
    consecutive ranks as ``first-last``, separated by spaces ("0-3 5 9"). A call carries at
    most 10 ranks (``MAX_INSTANCES_PER_START``): 10 ranks below 10,000 take at most 49
    characters. A value past 256 characters is refused here, not by ECS."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            runs.append(str(first) if first == last else f"{first}-{last}")
            start = i
    value = " ".join(runs)
    if len(value) > MAX_TAG_VALUE_CHARS:
        raise ValueError(f"{len(ordered)} ranks do not fit an ECS tag value ({len(value)} > "
                         f"{MAX_TAG_VALUE_CHARS} characters)")
    return value


def parse_ranks_tag(value: str) -> list[int]:
    """The ranks of a ``gpu-recovery:ranks`` tag, sorted: space-separated ranks and
    ``first-last`` runs (commas read as spaces too); a malformed part is skipped."""
    out: set[int] = set()
    for part in (value or "").replace(",", " ").split():
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            continue
        low, high = int(first), int(last or first)
        if low <= high and high - low < _MAX_RUN:
            out.update(range(low, high + 1))
    return sorted(out)
