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
    """Greedy and deterministic: in rank order, a rank joins the open call of its spec unless
    that call is full or already starts a task on its node."""
    if not batching:
        return [StartCall((r.rank,), (r.node,)) for r in sorted(ranks, key=lambda r: r.rank)]
    open_calls: dict[str, list[PlannedRank]] = {}
    calls: list[StartCall] = []

    def close(spec: str) -> None:
        members = open_calls.pop(spec)
        calls.append(StartCall(tuple(m.rank for m in members), tuple(m.node for m in members)))

    for rank in sorted(ranks, key=lambda r: r.rank):
        members = open_calls.get(rank.spec)
        if members is not None and (len(members) >= MAX_INSTANCES_PER_START
                                    or any(m.node == rank.node for m in members)):
            close(rank.spec)
            members = None
        if members is None:
            open_calls[rank.spec] = [rank]
        else:
            members.append(rank)
    for spec in list(open_calls):
        close(spec)
    return sorted(calls, key=lambda c: c.key)


def ranks_tag_value(ranks: Sequence[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def parse_ranks_tag(value: str) -> list[int]:
    out = []
    for part in (value or "").split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out
