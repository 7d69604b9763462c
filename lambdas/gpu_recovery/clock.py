"""Wall clock, replaceable so local mode can run the same code in simulated time."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

_clock: Callable[[], float] = time.time


def now() -> float:
    """Seconds since the epoch, from the installed clock."""
    return _clock()


def now_iso() -> str:
    return datetime.fromtimestamp(now(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def set_clock(clock: Callable[[], float]) -> None:
    """Install a clock (local mode's simulated time); ``reset_clock`` restores real time."""
    global _clock
    _clock = clock


def reset_clock() -> None:
    set_clock(time.time)
