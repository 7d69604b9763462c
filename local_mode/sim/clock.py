"""Simulated time for both worlds: ``SimClock`` (the simulated wall clock) and
``TimedActions`` (the discrete-event core: actions due at simulated times).

Time never passes by itself: a driver moves the clock to the next due action. The moto
world's driver is the data plane's (``SimulatedEcs.run_for`` and its siblings, in
``ecs_core``); the scale world's is ``engine.Simulation.run``. Both keep their actions in a
``TimedActions`` over a ``SimClock``, so ties are broken the same way everywhere (the order
in which actions were scheduled). The product code reads the clock through
``gpu_recovery.clock`` (installed by the driver), so its sleeps advance it too.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

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


class TimedActions:
    """Actions due at simulated times, taken earliest first and, at the same time, in the
    order they were scheduled; an action is never due before the clock's present. Not
    locked: a driver shared between threads holds its own lock around it."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, str, Callable[[], Any]]] = []
        self._order = itertools.count()

    def push(self, when: float, action: Callable[[], Any], label: str = "") -> None:
        """Schedule ``action`` at ``when`` (the present if ``when`` has passed)."""
        heapq.heappush(self._heap, (max(when, self.clock.now()), next(self._order), label, action))

    def next_time(self) -> float | None:
        """When the earliest action is due (None: nothing scheduled)."""
        return self._heap[0][0] if self._heap else None

    def due_by(self, when: float) -> bool:
        """Whether an action is due at or before ``when``."""
        return bool(self._heap) and self._heap[0][0] <= when

    def pop(self) -> tuple[float, Callable[[], Any]]:
        """The earliest action and its due time, taken off the schedule."""
        when, _, _, action = heapq.heappop(self._heap)
        return when, action

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)
