"""Which exits of a fault are checked: diagnosis by evidence, in order (issue 50).

When a GPU fails under one rank, its NCCL peers on healthy nodes exit too, seconds later,
with the same suspect code. Checking every node whose rank exited costs minutes of every
node of the job and one more chance of a false verdict per healthy peer. So the nodes are
ranked by their own evidence:

1. an exit whose node carries its own GPU evidence (XIDs or GPU signals its agent reported
   in the fault's window, or a catalog rule more specific than the generic suspect exit)
   is always a suspect, checked at once;
2. the fault's **first two exits handled** are suspects, checked at once, and so is any exit
   that is **one of the two earliest, by the task's own stop time** (``executionStoppedAt``):
   earlier than every suspect's so far, or earlier than the second suspect's by more than
   ``REORDER_MARGIN_SECONDS`` (its event arrived late: Lambda retried it, EventBridge
   reordered it). Within the margin the handled order stands: events a few hundred
   milliseconds apart arrive in either order, and the peers of a large job exit that close
   together, so taking their order from the stop times would check a peer for each;
3. any other exit without evidence of its own is **coupled**: it died of the fault. Its node
   is not checked unless the checks of the fault find nothing; then every coupled node is
   checked (``FaultTally.escalated``), as every suspect was before.

So the earliest exit of the fault is always checked, and the second earliest too unless it
stopped within the margin of the second handled, whatever order the events arrive in; a
single fault whose exit is handled first costs two checks at most, however many peers exit
after it. Why this cannot hide a fault the old rule caught: the node whose GPU failed is the
one whose rank exited first (its peers' NCCL errors follow it) or carries its own XIDs;
either way it is checked. And when the first checks find nothing, every other node is
checked too, so the fault's outcome is never decided on fewer checks than the old rule would
have run. What it can miss: a second, independent fault within seconds whose exit was
neither among the two earliest (beyond the margin) nor handled among the first two, and
left no evidence of its own: its node is restarted on unchecked; the job's next fault (or
its preflight, the node's validation) finds it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

# The exits of a fault checked whatever their evidence: the first two handled (a second fault
# within the NCCL timeout is usually the second), then only one of the two earliest by stop
# time (beyond the margin below).
FIRST_CHECKED_EXITS = 2
# How much earlier than the second suspect's an exit must have stopped to count as one of
# the two earliest. Events less than this apart arrive in either order (EventBridge keeps
# none), and a large job's peers exit that close together: within it the handled order stands.
REORDER_MARGIN_SECONDS = 1.0


def first_exits(known: Sequence[float], exited_at: float) -> tuple[float, ...]:
    """The stop times kept of the fault's suspects (the earliest two, earliest first: how
    many there are, and the earliest) once a suspect exiting at ``exited_at`` is added."""
    return tuple(sorted((*known, exited_at))[:FIRST_CHECKED_EXITS])


def coupled(exited_at: float | None, known: Sequence[float], *, own_evidence: bool) -> bool:
    """Is an exit of a fault already under way coupled (its node left unchecked unless the
    fault's checks find nothing)? Not when it has evidence of its own, when its stop time is
    unknown, when fewer than two suspects are known, when it stopped no later than the
    earliest of them (a tie with the earliest counts as before it), or more than the margin
    before the second earliest (a second fault whose event came late). ``known`` may miss an
    exit (a write lost): that only makes a later exit a suspect too."""
    if own_evidence or exited_at is None or len(known) < FIRST_CHECKED_EXITS:
        return False
    earliest, second = sorted(known)[:FIRST_CHECKED_EXITS]
    return exited_at > earliest and exited_at >= second - REORDER_MARGIN_SECONDS
