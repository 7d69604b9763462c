"""Wall clock, replaceable so local mode can run the same code in simulated time."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

_clock: Callable[[], float] = time.time
_sleep: Callable[[float], object] = time.sleep  # its result, if any, unused


def now() -> float:
    """Seconds since the epoch, from the installed clock."""
    return _clock()


def now_iso() -> str:
    return datetime.fromtimestamp(now(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def sleep(seconds: float) -> None:
    """Wait (a retry's back-off, a rate limiter's pacing) on the installed clock: real time
    in Lambda, simulated time in local mode and the benchmarks."""
    if seconds > 0:
        _sleep(seconds)


def set_clock(clock: Callable[[], float], sleeper: Callable[[float], object] | None = None) -> None:
    """Install a clock (local mode's simulated time) and, optionally, how to wait on it;
    ``reset_clock`` restores real time."""
    global _clock, _sleep
    _clock = clock
    _sleep = sleeper or time.sleep


def reset_clock() -> None:
    set_clock(time.time, time.sleep)
