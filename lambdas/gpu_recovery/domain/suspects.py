"""Which exits of a fault are checked: diagnosis by evidence, in order (issue 50).

When a GPU fails under one rank, its NCCL peers on healthy nodes exit too, seconds later,
with the same suspect code. Checking every node whose rank exited costs minutes of every
node of the job and one more chance of a false verdict per healthy peer. So the nodes are
ranked by their own evidence:

1. an exit whose node carries its own GPU evidence (XIDs or GPU signals its agent reported
   in the fault's window, or a catalog rule more specific than the generic suspect exit)
   is always a suspect, checked at once;
2. the **first two exits** of the fault by the task's own stop time (``executionStoppedAt``,
   whatever order their events arrive in) are suspects, checked at once;
3. any later exit without evidence of its own is **coupled**: it died of the fault. Its node
   is not checked unless the checks of the fault find nothing; then every coupled node is
   checked (``FaultTally.escalated``), as every suspect was before.

Why this cannot hide a fault the old rule caught: the node whose GPU failed is the one whose
rank exited first (its peers' NCCL errors follow it) or carries its own XIDs; either way it
is checked. And when the first checks find nothing, every other node is checked too, so the
fault's outcome is never decided on fewer checks than the old rule would have run. What it
can miss: a second, independent fault whose rank exited after two others and left no
evidence of its own: its node is restarted on unchecked; the job's next fault (or its
preflight, the node's validation) finds it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

# The exits of a fault checked whatever their evidence: the first two by stop time (a second
# fault within the NCCL timeout is among them).
FIRST_CHECKED_EXITS = 2


def first_exits(known: Sequence[float], exited_at: float) -> tuple[float, ...]:
    """The fault's first exits (their stop times, earliest first) once a suspect exiting at
    ``exited_at`` is added."""
    return tuple(sorted((*known, exited_at))[:FIRST_CHECKED_EXITS])


def coupled(exited_at: float | None, known: Sequence[float], *, own_evidence: bool) -> bool:
    """Is an exit of a fault already under way coupled (its node left unchecked unless the
    fault's checks find nothing)? Not when it has evidence of its own, when its stop time is
    unknown, or when it is among the first exits. A tie with the last of them is coupled: a
    cascade's peers often stop at one instant (one NCCL timeout), and the first of them to
    be handled stands for them. ``known`` may miss an exit (a write lost): that only makes a
    later exit a suspect too."""
    if own_evidence or exited_at is None or len(known) < FIRST_CHECKED_EXITS:
        return False
    return exited_at >= sorted(known)[FIRST_CHECKED_EXITS - 1]
