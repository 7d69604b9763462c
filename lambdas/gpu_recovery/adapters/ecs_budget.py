"""Every ECS control-plane call of the stack takes a token first (``domain.rate_limit``).

StartTask, StopTask, RunTask and UpdateContainerInstancesState share one request bucket
per account and Region (burst 100, 40 per second). The recovery loop's fan-out workers,
its handlers and the queue scheduler all take their tokens from one bucket of the stack's
own, so a 1,024-rank restart and the scheduler's launches never throttle each other into
a retry storm. A call that would wait longer than ``max_wait_seconds`` raises
:class:`RateLimited` with the wait: a fan-out batch goes back on its queue for that long.
A caller that bursts with many others (the DCGM starts of a cascade's suspects) reserves
its token ahead instead and waits its turn (``in_turn_within``).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from gpu_recovery import clock
from gpu_recovery.domain.rate_limit import Reservation, TokenBucket

logger = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_SECONDS = 5.0


class RateLimited(Exception):
    """No token within the caller's patience; nothing was called."""

    call_not_sent = True  # ``adapters.errors.not_sent``

    def __init__(self, wait_seconds: float) -> None:
        super().__init__(f"ECS control-plane budget exhausted: next token in {wait_seconds:.1f} s")
        self.wait_seconds = wait_seconds


class BucketStore(Protocol):
    def reserve(self, tokens: int, bucket: TokenBucket, now: float, ahead: float = 0.0) -> Reservation: ...


class CallBudget(Protocol):
    def acquire(self, tokens: int = 1, *, in_turn_within: float | None = None) -> None: ...


class Unlimited:
    """No shared budget (tests of single calls; functions without the table)."""

    def acquire(self, tokens: int = 1, *, in_turn_within: float | None = None) -> None:
        return None


class EcsCallBudget:
    def __init__(self, store: BucketStore, bucket: TokenBucket,
                 max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS) -> None:
        self.store = store
        self.bucket = bucket
        self.max_wait_seconds = max_wait_seconds
        self._lock = threading.Lock()
        self.waited_seconds = 0.0  # what this container spent waiting (logs, benchmarks)

    def acquire(self, tokens: int = 1, *, in_turn_within: float | None = None) -> None:
        """Take ``tokens`` (at most the bucket's burst), waiting up to ``max_wait_seconds``.

        ``in_turn_within``: reserve them now if they are due within that many seconds, and
        wait for their turn (callers bursting at once are served in order, at the bucket's
        rate, each with one write to the budget); RateLimited when they are not due in time."""
        tokens = max(1, min(tokens, self.bucket.burst))
        if in_turn_within is not None:
            with self._lock:
                decided = self.store.reserve(tokens, self.bucket, clock.now(), in_turn_within)
                if not decided.granted:
                    raise RateLimited(max(decided.wait_seconds - in_turn_within, tokens / self.bucket.rate))
                if decided.wait_seconds > 0:
                    clock.sleep(decided.wait_seconds)
                    self.waited_seconds += decided.wait_seconds
            return
        waited = 0.0
        with self._lock:
            while True:
                decided = self.store.reserve(tokens, self.bucket, clock.now())
                if decided.granted:
                    self.waited_seconds += waited
                    return
                if waited + decided.wait_seconds > self.max_wait_seconds:
                    raise RateLimited(decided.wait_seconds)
                clock.sleep(decided.wait_seconds)
                waited += decided.wait_seconds
