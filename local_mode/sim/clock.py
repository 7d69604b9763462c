"""``SimClock``: the simulated wall clock every part of the local world reads.

Time never passes by itself: the data plane's driver (``SimulatedEcs.run_for`` and its
siblings) moves it to the next due action or schedule; the product code reads it through
``gpu_recovery.clock`` (installed by the data plane), so its sleeps advance it too.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

DEFAULT_START = datetime(2026, 11, 20, 14, 0, 0, tzinfo=UTC).timestamp()


class SimClock:
    """Simulated wall clock (epoch seconds); only moves when the driver moves it."""

    def __init__(self, start: float = DEFAULT_START) -> None:
        self.start = float(start)
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += max(0.0, float(seconds))
            return self._now

    def set(self, t: float) -> None:
        """Move to ``t`` (never backwards)."""
        with self._lock:
            self._now = max(self._now, float(t))

    def offset(self, seconds: float) -> float:
        """Absolute time ``seconds`` after the simulation start."""
        return self.start + seconds

    def hms(self, t: float | None = None) -> str:
        t = self.now() if t is None else t
        return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")
