"""The batches of a gang fan-out (``recovery.gang``): what a queue message says. Pure.

A stop batch covers 100 consecutive ranks, a start batch 80 (10 nodes of 8 one-GPU ranks, so
identical ranks start 10 per StartTask); a gang of at most ``INLINE_MAX_RANKS`` ranks (the
deployment's ``gang_inline_max_ranks``, at most one start batch) runs its batches in the
invocation that asks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

STOP = "stop"
START = "start"
STOP_BATCH_RANKS = 100
START_BATCH_RANKS = 80  # 10 nodes of 8 one-GPU ranks: grouped StartTasks of 10
INLINE_MAX_RANKS = 16  # the default


class GangQueuePort(Protocol):
    def send(self, bodies: Sequence[Mapping[str, Any]], delay_seconds: int = 0) -> None: ...


@dataclass(frozen=True)
class GangBatch:
    """One batch of a gang fan-out: ranks ``first`` to ``last - 1`` of ``attempt``."""

    op: str
    job_id: str
    attempt: int
    first: int
    last: int
    why: str = ""
    round: int = 0
    remediation: bool = True  # observe mode holds back a remediation's stops only
    # A suspension's stop: its ranks stay in the heartbeat index until STOPPED (a node lost
    # under the stop is decided by the heartbeat sweep, not the stop rounds' backstop).
    watch: bool = False
    world_size: int = 0  # the job's (0: a message of an older release: not known)

    def body(self) -> dict[str, Any]:
        return {"op": self.op, "job_id": self.job_id, "attempt": self.attempt, "first": self.first,
                "last": self.last, "why": self.why[:300], "round": self.round,
                "remediation": self.remediation, "watch": self.watch, "world_size": self.world_size}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> GangBatch:
        """A queue message's body; ValueError names what is wrong with it."""
        try:
            op = str(body["op"])
            job_id = str(body["job_id"])
            attempt, first, last = int(body["attempt"]), int(body["first"]), int(body["last"])
            round_ = int(body.get("round", 0))
            world_size = int(body.get("world_size", 0))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed gang batch {dict(body)!r}: {error}") from error
        if op not in (STOP, START) or not job_id or "#" in job_id or attempt < 1 or not 0 <= first < last \
                or last - first > max(STOP_BATCH_RANKS, START_BATCH_RANKS):
            raise ValueError(f"malformed gang batch {dict(body)!r}")
        return cls(op, job_id, attempt, first, last, str(body.get("why") or ""), max(0, round_),
                   bool(body.get("remediation", True)), bool(body.get("watch", False)), max(0, world_size))


def batches(op: str, job_id: str, attempt: int, world_size: int, *, why: str = "", round_: int = 0,
            remediation: bool = True, watch: bool = False) -> list[GangBatch]:
    size = STOP_BATCH_RANKS if op == STOP else START_BATCH_RANKS
    return [GangBatch(op, job_id, attempt, first, min(world_size, first + size), why, round_, remediation,
                      watch, world_size)
            for first in range(0, world_size, size)]
