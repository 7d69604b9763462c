"""Sending a large gang's stop fan-out to its queue once: the one way the recovery
(``recovery.gang``) and the jobs API's cancel send it.

The sending is claimed on the committed intent first (``claimed_at``: the events that read it
unsent at once, a fault's first stopped ranks, or a cancel and the sweep, would each send every
batch: 4 sends of 82 batches at 8,192 ranks), then confirmed (``sent_at``). A claimer that died
before it sent leaves its claim to go stale (``SEND_CLAIM_SECONDS``: within the minute after
which Lambda retries a failed event, so the retry finishes what its dead delivery claimed; the
sweep too). A start intent's batches not all registered are sent again by the sweep
(``resend_due``: batches skip what is done)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain.gang_batches import GangBatch, GangQueuePort
from gpu_recovery.domain.models import Job
from gpu_recovery.repository.gang_fanouts import GangFanoutRepository

# Stale after this: less than Lambda's minute before it retries a failed event (a sender
# slower than this, alive, makes a harmless second send).
SEND_CLAIM_SECONDS = 30.0
# A start intent (a gang restart's, a queue launch's) sent this long ago and not complete is sent again.
RESEND_AFTER_SECONDS = 120


def by_the_nearest_sweep(at: float, now: float) -> bool:
    """Whether ``now``'s sweep is the one nearest ``at`` (or a later one): sweeps come every
    RETRY_INTERVAL_SECONDS at a second of their own, and a time recorded seconds into an
    invocation is met by no sweep exactly; waiting for the first sweep past it loses a minute."""
    return now >= at - RETRY_INTERVAL_SECONDS / 2


def resend_due(intent: Mapping[str, Any], now: float) -> bool:
    """A start intent never sent, or sent about RESEND_AFTER_SECONDS ago: the sweep nearest that
    age sends it again. Sweeps come every RETRY_INTERVAL_SECONDS at a second of their own, and a
    send is recorded seconds into its invocation: the sweep two minutes on is a little short of
    the full interval, and waiting for it made every resend three minutes apart (s430 at 8 %: a
    launch given up after two resends in its eight minutes, not three)."""
    sent_at = float(intent.get("sent_at") or 0.0)
    return not sent_at or by_the_nearest_sweep(sent_at + RESEND_AFTER_SECONDS, now)


def send_once(fanouts: GangFanoutRepository, queue: GangQueuePort, job: Job, kind: str, attempt: int,
              work: list[GangBatch]) -> bool:
    """Claim, send and confirm ``attempt``'s fan-out ``kind``; False when another sender holds
    its claim (or it was sent)."""
    if not fanouts.claim_send(job, kind, attempt, clock.now(), SEND_CLAIM_SECONDS):
        return False
    queue.send([batch.body() for batch in work])
    fanouts.record_sent(job, kind, attempt, clock.now())
    return True
