"""The lease on a health check's verdict, held by one delivery of its STOPPED event.

EventBridge delivers at least once: the copy that takes the lease works the verdict; another
looks a few times and leaves. The lease is short (VERDICT_LEASE_SECONDS) and its holder renews
it while it works (before each pause), so a holder that died frees the verdict seconds later,
not at its invocation's deadline. A copy that finds the lease held reads the instance at most
LEASE_READS times (every read is one more call that can fail), pausing until the lease would
expire; still held, it leaves the verdict to its holder and, should the holder die, to the
sweep, whose poll of the check it brings forward to the lease's end. The lease only keeps
copies from racing: the verdict's transaction conditions are what make it land once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_recovery import clock
from gpu_recovery.recovery.ports import Invocation, MetricsPort
from gpu_recovery.repository.verdict_leases import VerdictLeaseRepository

#: how long a lease lasts unless renewed: a dead holder blocks the verdict this long at most
VERDICT_LEASE_SECONDS = 10.0
#: the holder renews once less than this is left
RENEW_BELOW_SECONDS = 5.0
#: a copy finding the lease held reads the instance at most this many times
LEASE_READS = 3
#: ...pausing at least this long between reads (at most until the lease would expire)
MIN_PAUSE_SECONDS = 0.5
#: the sweep's poll comes this long after the held lease would expire
SWEEP_AFTER_LEASE_SECONDS = 5.0
#: what a copy keeps of its invocation for the verdict itself, should it take the lease over
MARGIN_SECONDS = 10.0


@dataclass
class HeldLease:
    """The lease this invocation holds; ``keep`` renews it before a pause."""

    leases: VerdictLeaseRepository
    task_arn: str
    invocation: Invocation
    until: float

    def keep(self) -> bool:
        """Renew when little is left; False: another copy took it over (this one stops)."""
        now = clock.now()
        if self.until - now >= RENEW_BELOW_SECONDS:
            return True
        until = lease_end(self.invocation, now)
        lease = self.leases.claim(self.task_arn, self.invocation.request_id, until, now)
        if lease.taken:
            self.until = until
        return lease.taken

    def give_up(self) -> None:
        now = clock.now()
        self.leases.claim(self.task_arn, self.invocation.request_id, now, now)


def lease_end(invocation: Invocation, now: float) -> float:
    return min(invocation.deadline, now + VERDICT_LEASE_SECONDS)


@dataclass(frozen=True)
class LeaseHeld:
    """Another copy holds the lease: until when (the sweep's poll is due after it)."""

    until: float


def take(leases: VerdictLeaseRepository, metrics: MetricsPort, task_arn: str, invocation: Invocation,
         reread: Any, still_ours: Any) -> HeldLease | LeaseHeld | None:
    """Take the lease, or look LEASE_READS times for it to be free. ``reread()``: the
    instance item read again (None: gone); ``still_ours(item)``: the check is still to be
    decided. Returns the held lease, the other holder's (left to it), or None when the check
    is no longer to be decided (the holder recorded it) or its instance is gone."""
    reads = 0
    while True:
        now = clock.now()
        until = lease_end(invocation, now)
        lease = leases.claim(task_arn, invocation.request_id, until, now)
        if lease.taken:
            return HeldLease(leases, task_arn, invocation, until)
        pause = max(MIN_PAUSE_SECONDS, lease.until - now + 0.1)
        if reads >= LEASE_READS or now + pause + MARGIN_SECONDS > invocation.deadline:
            metrics.add_metric("VerdictLeaseLeftToHolder", "Count", 1)
            return LeaseHeld(lease.until)
        clock.sleep(pause)
        reads += 1
        item = reread()
        if item is None or not still_ours(item):
            return None
