"""Every ECS control-plane call of the stack takes a token first (``domain.rate_limit``).

StartTask, StopTask, RunTask and UpdateContainerInstancesState share one request bucket
per account and Region (burst 100, 40 per second). The recovery loop's fan-out workers,
its handlers and the queue scheduler all take their tokens from one bucket of the stack's
own, so a 1,024-rank restart and the scheduler's launches never throttle each other into
a retry storm. Every caller reserves its tokens ahead and waits its turn; one whose turn
is further off than its patience (``max_wait_seconds``, or ``in_turn_within``: the DCGM
starts of a cascade's suspects wait longer) raises :class:`RateLimited` with the wait: a
fan-out batch goes back on its queue for that long.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from gpu_recovery import clock
from gpu_recovery.domain.rate_limit import Reservation, TokenBucket

logger = logging.getLogger(__name__)

DEFAULT_MAX_WAIT_SECONDS = 5.0
# A turn is waited for only if it comes this long before the invocation ends: the call, and
# what the caller writes after it, still fit (Lambda's timeout would kill it mid-step).
CALL_MARGIN_SECONDS = 10.0


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
        """Take ``tokens`` (at most the bucket's burst): reserved now if they are due within
        ``in_turn_within`` seconds (default ``max_wait_seconds``), then waited for; callers
        bursting at once are served in order, at the bucket's rate, each with one write to the
        budget. RateLimited when they are not due in time (nothing reserved, nothing waited);
        the patience never reaches past the running invocation's end less CALL_MARGIN_SECONDS
        (``clock.deadline``: a large cascade's attribute puts, each waiting its turn, ran
        handlers into their timeout, 179 at 2,048 tasks).

        Never read-then-write and poll: a thousand-rank stop's workers all polling one item
        made ~700 reads and conditional writes of it per rank, most of them lost races."""
        tokens = max(1, min(tokens, self.bucket.burst))
        patience = self.max_wait_seconds if in_turn_within is None else in_turn_within
        with self._lock:
            now = clock.now()
            ends = clock.deadline()
            if ends is not None:
                patience = max(0.0, min(patience, ends - now - CALL_MARGIN_SECONDS))
            decided = self.store.reserve(tokens, self.bucket, now, patience)
            if not decided.granted:
                raise RateLimited(max(decided.wait_seconds - patience, tokens / self.bucket.rate))
            if decided.wait_seconds > 0:
                clock.sleep(decided.wait_seconds)
                self.waited_seconds += decided.wait_seconds
