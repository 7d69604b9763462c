"""Sending a large gang's stop fan-out to its queue once: the one way the recovery
(``recovery.gang``) and the jobs API's cancel send it.

The sending is claimed on the committed intent first (``claimed_at``: the events that read it
unsent at once, a fault's first stopped ranks, or a cancel and the sweep, would each send every
batch: 4 sends of 82 batches at 8,192 ranks), then confirmed (``sent_at``). A claimer that died
before it sent leaves its claim to go stale (``SEND_CLAIM_SECONDS``: within the minute after
which Lambda retries a failed event, so the retry finishes what its dead delivery claimed; the
sweep too)."""

from __future__ import annotations

from gpu_recovery import clock
from gpu_recovery.domain.gang_batches import GangBatch, GangQueuePort
from gpu_recovery.domain.models import Job
from gpu_recovery.repository.gang_fanouts import GangFanoutRepository

# Stale after this: less than Lambda's minute before it retries a failed event (a sender
# slower than this, alive, makes a harmless second send).
SEND_CLAIM_SECONDS = 30.0


def send_once(fanouts: GangFanoutRepository, queue: GangQueuePort, job: Job, kind: str, attempt: int,
              work: list[GangBatch]) -> bool:
    """Claim, send and confirm ``attempt``'s fan-out ``kind``; False when another sender holds
    its claim (or it was sent)."""
    if not fanouts.claim_send(job, kind, attempt, clock.now(), SEND_CLAIM_SECONDS):
        return False
    queue.send([batch.body() for batch in work])
    fanouts.record_sent(job, kind, attempt, clock.now())
    return True
