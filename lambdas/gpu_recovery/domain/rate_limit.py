"""The account's ECS control-plane budget, shared by every function of the stack.

ECS throttles RunTask, StartTask, StopTask and UpdateContainerInstancesState together,
per account and Region, with a token bucket (burst 100, refilled at 40 per second). One
large gang restart (thousands of StartTask) and the queue scheduler must share it without
a throttling storm, so every such call first takes a token from a bucket of our own, kept
as one DynamoDB item and run as a GCRA ("generic cell rate algorithm"): the item holds the
theoretical arrival time (TAT) of the next token; taking ``n`` tokens moves it ``n / rate``
seconds later, allowed while it stays within ``burst / rate`` of now. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

# What AWS documents for the shared bucket (Amazon ECS API request throttling).
ECS_ACCOUNT_BURST = 100
ECS_ACCOUNT_RATE = 40.0
# The stack's own share by default: 90 % of the account's, leaving room for other callers.
DEFAULT_RATE = 36.0
DEFAULT_BURST = 90


@dataclass(frozen=True)
class TokenBucket:
    rate: float = DEFAULT_RATE  # tokens per second
    burst: int = DEFAULT_BURST  # tokens available at once

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")


@dataclass(frozen=True)
class Reservation:
    granted: bool
    tat: float  # the bucket's new theoretical arrival time (unchanged when not granted)
    wait_seconds: float  # 0 when granted; else how long until ``tokens`` would be granted


def reserve(tat: float | None, now: float, tokens: int, bucket: TokenBucket,
            ahead: float = 0.0) -> Reservation:
    """Take ``tokens`` (at most ``bucket.burst``) at ``now`` from a bucket whose TAT is ``tat``.

    ``ahead``: tokens due within that many seconds may be reserved now (granted, with the
    ``wait_seconds`` to let pass before the call): callers who take their turn this way are
    served in the order they reserved, none woken to find its token taken by another."""
    tokens = max(1, min(tokens, bucket.burst))
    base = max(tat if tat is not None else now, now)
    new_tat = base + tokens / bucket.rate
    wait = new_tat - now - bucket.burst / bucket.rate
    if wait <= 1e-9:
        return Reservation(True, new_tat, 0.0)
    if wait <= ahead + 1e-9:
        return Reservation(True, new_tat, wait)
    return Reservation(False, base if tat is not None else now, wait)


def latest_tat_to_reserve(now: float, tokens: int, bucket: TokenBucket, ahead: float) -> float:
    """The latest TAT from which ``tokens`` can still be reserved at ``now`` within ``ahead``
    (``reserve`` grants exactly when ``max(tat, now)`` is at most this): a condition a
    store can check while it moves the TAT in one atomic write."""
    tokens = max(1, min(tokens, bucket.burst))
    return now + bucket.burst / bucket.rate + ahead - tokens / bucket.rate + 1e-9


def reserved_at(new_tat: float, now: float, bucket: TokenBucket) -> Reservation:
    """The reservation whose write moved the TAT to ``new_tat``: granted, due after the wait."""
    return Reservation(True, new_tat, max(0.0, new_tat - now - bucket.burst / bucket.rate))


def floor_seconds(calls: int, *, burst: int = ECS_ACCOUNT_BURST, rate: float = ECS_ACCOUNT_RATE) -> float:
    """The least time the account bucket alone needs for ``calls`` control-plane calls."""
    return max(0.0, (calls - burst) / rate)
