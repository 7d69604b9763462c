"""The rate of a GPU's error counters over the node agent's successive reports. Pure.

The agent reports counters as the tools print them (corrected volatile ECC since the last
driver load or reset, NVLink replay / recovery / CRC errors since boot) and keeps no state.
The heartbeat service keeps, on the node's item, two anchors per (GPU, counter): a *base*
and a *mid* (value, time). A rate is the increase from the base to the latest report over
that time, once the base is at least ``window_seconds`` old; when the mid is that old, it
becomes the base and the latest report the mid. So a rate always spans one to two windows
(never two reports 30 s apart, where one error reads as 120 an hour), and the item holds
four numbers per counter whatever the node's age: bounded by the GPUs a report may list.

Errors arrive at random, so a rate measured over a window scatters around the true one: a
counter whose true rate is just below a limit reads above it now and then. A rate is
therefore held to a limit by its lower bound, :data:`CONFIDENCE_SIGMAS` standard deviations
below the measured increase (counts are Poisson: the deviation of n is sqrt(n)): a counter
rising below the limit (0.8 of it, bench) practically never matches, one at twice the limit
matches within about two windows.

A counter that went down (a reboot, a GPU reset, a driver reload cleared it) starts again
from its new value: no rate until a window has passed. A counter at 0 keeps no anchors (the
usual case adds nothing to the item every report rewrites): its first error starts them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The counters the node agent reports (agent/README.md), as the catalog's ``counter_rate``
# condition names them.
ECC_CORRECTED = "ecc_corrected_volatile"
NVLINK_CRC = "nvlink_crc_errors"
NVLINK_REPLAY = "nvlink_replay_errors"
NVLINK_RECOVERY = "nvlink_recovery_errors"
COUNTERS = (ECC_CORRECTED, NVLINK_CRC, NVLINK_REPLAY, NVLINK_RECOVERY)
COUNTER_WORDS = {
    ECC_CORRECTED: "corrected ECC errors",
    NVLINK_CRC: "NVLink CRC errors",
    NVLINK_REPLAY: "NVLink replay errors",
    NVLINK_RECOVERY: "NVLink recovery errors",
}
DEFAULT_WINDOW_SECONDS = 600.0
# How far below the measured increase a rate's lower bound lies, in Poisson standard deviations.
CONFIDENCE_SIGMAS = 3.0
# What the node's item keeps at most (a report lists at most 64 GPUs: the node API's limit).
MAX_GPUS = 64
MAX_COUNTER_VALUE = 2**63 - 1


@dataclass(frozen=True)
class CounterRate:
    """One counter's rise on one GPU over the window that ends at the latest report."""

    counter: str
    gpu: str
    per_hour: float
    increase: int
    seconds: float

    @property
    def lower_per_hour(self) -> float:
        """The rate this increase shows with CONFIDENCE_SIGMAS to spare (0: none to speak of)."""
        if self.seconds <= 0:
            return 0.0
        spare = max(0.0, self.increase - CONFIDENCE_SIGMAS * math.sqrt(max(0, self.increase)))
        return spare * 3600.0 / self.seconds

    def describe(self) -> str:
        return (f"{COUNTER_WORDS.get(self.counter, self.counter)} on {self.gpu} rising "
                f"{self.per_hour:.0f}/h (+{self.increase} in {self.seconds / 60:.0f} min; at least "
                f"{self.lower_per_hour:.0f}/h)")

    def to_dict(self) -> dict[str, Any]:
        return {"counter": self.counter, "gpu": self.gpu, "per_hour": round(self.per_hour, 2),
                "increase": self.increase, "seconds": round(self.seconds, 1)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CounterRate:
        return cls(str(raw["counter"]), str(raw.get("gpu", "")), float(raw["per_hour"]),
                   int(raw.get("increase") or 0), float(raw.get("seconds") or 0))


def _value(raw: Any) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    value = int(raw)
    return value if 0 <= value <= MAX_COUNTER_VALUE else None


def _anchors(raw: Any) -> tuple[int, float, int, float] | None:
    if not isinstance(raw, list | tuple) or len(raw) != 4:
        return None
    try:
        base_v, base_t, mid_v, mid_t = int(raw[0]), float(raw[1]), int(raw[2]), float(raw[3])
    except (TypeError, ValueError):
        return None
    return base_v, base_t, mid_v, mid_t


def advance(stored: Mapping[str, Any] | None, gpus: Iterable[tuple[str, Mapping[str, Any]]], now: float,
            window_seconds: float = DEFAULT_WINDOW_SECONDS
            ) -> tuple[dict[str, dict[str, list[float]]], list[CounterRate]]:
    """The anchors after a report at ``now`` (``gpus``: (GPU name, its report row)) and the
    rates it shows. GPUs the report does not list are forgotten (bounded); a counter the
    report leaves null keeps its anchors."""
    kept: dict[str, dict[str, list[float]]] = {}
    rates: list[CounterRate] = []
    old = stored if isinstance(stored, Mapping) else {}
    for name, row in list(gpus)[:MAX_GPUS]:
        previous = old.get(name) if isinstance(old.get(name), Mapping) else {}
        counters: dict[str, list[float]] = {}
        for counter in COUNTERS:
            value = _value(row.get(counter))
            anchors = _anchors(previous.get(counter)) if previous else None
            if value is None:
                if anchors is not None:
                    counters[counter] = list(anchors)
                continue
            if value == 0:
                continue  # nothing counted (or cleared): nothing kept, the usual case costs nothing
            if anchors is None or value < anchors[2] or value < anchors[0] or now < anchors[3]:
                counters[counter] = [value, now, value, now]  # first seen, or cleared: start again
                continue
            base_v, base_t, mid_v, mid_t = anchors
            span = now - base_t
            if span >= window_seconds and span > 0:
                increase = value - base_v
                rates.append(CounterRate(counter, name, increase * 3600.0 / span, increase, span))
            if now - mid_t >= window_seconds:
                base_v, base_t, mid_v, mid_t = mid_v, mid_t, value, now
            counters[counter] = [base_v, base_t, mid_v, mid_t]
        if counters:
            kept[name] = counters
    return kept, rates


def rates_from_item(raw: Any) -> list[CounterRate]:
    """The rates the node's latest report showed (kept beside its telemetry)."""
    out = []
    for entry in raw or ():
        if isinstance(entry, Mapping):
            try:
                out.append(CounterRate.from_dict(entry))
            except (KeyError, TypeError, ValueError):
                continue
    return out
