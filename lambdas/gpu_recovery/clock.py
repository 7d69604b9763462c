"""Wall clock, replaceable so local mode can run the same code in simulated time."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_clock: Callable[[], float] = time.time
_sleep: Callable[[float], object] = time.sleep  # its result, if any, unused
# The running invocation's deadline on the installed clock (None: not known), for the waits
# deep below the services that must end inside it (a retry's back-off in the repository).
_deadline: ContextVar[float | None] = ContextVar("gpu_recovery_deadline", default=None)


def now() -> float:
    """Seconds since the epoch, from the installed clock."""
    return _clock()


def sleep(seconds: float) -> None:
    """Wait (a retry's back-off, a rate limiter's pacing) on the installed clock: real time
    in Lambda, simulated time in local mode and the benchmarks."""
    if seconds > 0:
        _sleep(seconds)


def deadline() -> float | None:
    """When the running invocation ends (on the installed clock), if its entry point said so."""
    return _deadline.get()


@contextlib.contextmanager
def invocation_ends(time_left: Callable[[], float] | None) -> Iterator[None]:
    """Within this block :func:`deadline` is ``now() + time_left()`` (unchanged without one:
    a nested entry point keeps its caller's)."""
    if time_left is None:
        yield
        return
    token = _deadline.set(now() + time_left())
    try:
        yield
    finally:
        _deadline.reset(token)


def set_clock(clock: Callable[[], float], sleeper: Callable[[float], object] | None = None) -> None:
    """Install a clock (local mode's simulated time) and, optionally, how to wait on it;
    ``reset_clock`` restores real time."""
    global _clock, _sleep
    _clock = clock
    _sleep = sleeper or time.sleep


def reset_clock() -> None:
    set_clock(time.time, time.sleep)
