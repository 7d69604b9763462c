"""Overdue jobs: a job the recovery loop owns, long past the deadline of its next step. Pure.

Every job item the recovery loop must move on carries the deadline of its next step in
the sparse deadline index. The sweep runs every minute, handles what is due and re-arms
it (a minute later) or clears it, so a deadline stays in the past only while nothing
moves the job on: its step fails at every sweep, the sweep itself does not run or never
reaches it, or no step is armed for its state. A job whose deadline passed at least
``OVERDUE_AFTER_SECONDS`` ago is *overdue*: the sweep counts them (metric ``OverdueJobs``,
alarmed) and ``gpu-recovery-admin doctor`` lists them (docs/operations.md, "Overdue jobs").

The margin is many sweeps long: a job that is merely waiting (for its health checks, a
reboot, a free node, the breaker's reset, a suspend's grace) has its deadline moved on by
every sweep that handles it, so it is never overdue; a single failed sweep or a throttled
step is not either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

OVERDUE_AFTER_SECONDS = 15 * 60


def overdue_cutoff(now: float, margin: float = OVERDUE_AFTER_SECONDS) -> float:
    """Deadlines at or before this are overdue (the deadline index is queried up to it)."""
    return now - margin


def is_overdue(deadline_at: float, now: float, margin: float = OVERDUE_AFTER_SECONDS) -> bool:
    return deadline_at <= overdue_cutoff(now, margin)


@dataclass
class OverdueTally:
    """Overdue jobs among the due job deadlines one sweep reads, page by page, oldest first.

    ``overdue`` counts the overdue deadlines read; the due query is oldest first, so they
    come before every other and the count is complete unless the sweep's budget ended
    within them (it is then a lower bound, never 0 while one is overdue: the first page
    holds the oldest). ``oldest_due_seconds``: how long ago the oldest due deadline passed
    (0 when nothing is due), the lateness that crosses the margin first.
    """

    now: float
    margin: float = OVERDUE_AFTER_SECONDS
    pages: int = 0
    overdue: int = 0
    oldest_due_seconds: float = 0.0

    def add_page(self, deadlines: Iterable[float]) -> None:
        self.pages += 1
        for deadline in deadlines:
            self.oldest_due_seconds = max(self.oldest_due_seconds, self.now - float(deadline))
            if is_overdue(float(deadline), self.now, self.margin):
                self.overdue += 1

    @property
    def read(self) -> bool:
        """At least one page was read (a sweep out of time before any reads nothing)."""
        return self.pages > 0
