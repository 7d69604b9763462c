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


def ranks_tag_value(ranks: Sequence[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def parse_ranks_tag(value: str) -> list[int]:
    out = []
    for part in (value or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out
