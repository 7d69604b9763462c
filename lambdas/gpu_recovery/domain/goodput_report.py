"""The cluster's goodput over a period, from its jobs' ledgers (``domain.goodput``): ETTR,
GPU-hours lost per cause per day, and the nodes that cost the most (the lemon list).

A job's ledger is not split by day: its GPU-hours count on the day it was submitted (a
period of whole days; jobs longer than a day are shown on their first). Pure."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_recovery.domain import goodput

LEMONS = 10


def gpus_of(item: Mapping[str, Any]) -> int:
    return max(1, int(item.get("world_size") or 1)) * max(1, int(item.get("gpus_per_node") or 1))


def report(items: Iterable[Mapping[str, Any]], now: float) -> dict[str, Any]:
    """``items``: job items (their history and folded ledger)."""
    per_day: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = dict.fromkeys(goodput.CAUSES, 0.0)
    nodes: dict[str, float] = {}
    unknown = jobs = 0
    for item in items:
        ledger = goodput.ledger_of(item, now)
        if ledger.wall <= 0:
            continue
        jobs += 1
        gpus = gpus_of(item)
        day = time.strftime("%Y-%m-%d", time.gmtime(float(item.get("submitted_at") or item.get("created_at")
                                                         or now)))
        bucket = per_day.setdefault(day, {})
        for cause, seconds in ledger.seconds.items():
            hours = seconds * gpus / 3600
            totals[cause] += hours
            if cause != goodput.PRODUCTIVE and hours:
                bucket[cause] = bucket.get(cause, 0.0) + hours
        for node, seconds in ledger.nodes.items():
            nodes[node] = nodes.get(node, 0.0) + seconds * gpus / 3600
        unknown += ledger.lost_work_unknown
    wall = sum(totals.values())
    own = sum(totals[c] for c in goodput.OWN_CAUSES)
    stack = sum(totals[c] for c in goodput.STACK_CAUSES if c not in goodput.OUTSIDE_STACK_SHARE)
    return {
        "jobs": jobs, "wall_gpu_hours": round(wall, 3), "own_gpu_hours": round(own, 3),
        "ettr": round(totals[goodput.PRODUCTIVE] / (wall - own), 4) if wall - own > 0 else None,
        "stack_share_gpu_hours": round(stack, 3),
        "gpu_hours": {c: round(v, 3) for c, v in totals.items() if v},
        "lost_per_day": {day: {c: round(v, 3) for c, v in sorted(causes.items())}
                         for day, causes in sorted(per_day.items())},
        "lemons": [{"node": n, "gpu_hours": round(h, 3)}
                   for n, h in sorted(nodes.items(), key=lambda kv: -kv[1])[:LEMONS]],
        "lost_work_unknown_faults": unknown,
    }


def job_end_figures(item: Mapping[str, Any], now: float) -> tuple[dict[str, float], float | None]:
    """A finished job's figures for its metrics: GPU-hours per badput cause (the causes with
    any time; the job's own ones included, apart in the docs), and its ETTR in percent (None
    when the job never had time the stack could count)."""
    ledger = goodput.ledger_of(item, now)
    gpus = gpus_of(item)
    lost = {cause: seconds * gpus / 3600 for cause, seconds in ledger.seconds.items()
            if cause != goodput.PRODUCTIVE and seconds > 0}
    ettr = ledger.ettr
    return lost, (round(ettr * 100, 3) if ettr is not None else None)
