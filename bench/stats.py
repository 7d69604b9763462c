"""Summaries of measured values shared by the benches."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """min / p50 / p95 / max (nearest rank), None for an empty list."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "p95": None, "max": None, "mean": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return {"n": len(ordered), "min": ordered[0], "p50": rank(0.5), "p95": rank(0.95), "max": ordered[-1],
            "mean": statistics.fmean(ordered)}
