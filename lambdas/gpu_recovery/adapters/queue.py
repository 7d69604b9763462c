"""Amazon SQS adapter: the gang fan-out queue (batches of StopTask / StartTask work)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)

SEND_BATCH_LIMIT = 10  # SendMessageBatch entries per call
MAX_DELAY_SECONDS = 900  # SQS DelaySeconds limit


class GangQueue:
    def __init__(self, sqs_client: Any, queue_url: str) -> None:
        self._sqs = sqs_client
        self.queue_url = queue_url

    def send(self, bodies: Sequence[Mapping[str, Any]], delay_seconds: int = 0) -> None:
        """Every body on the queue, or an exception (a retry sends duplicates: consumers
        are idempotent)."""
        delay = max(0, min(MAX_DELAY_SECONDS, int(delay_seconds)))
        for start in range(0, len(bodies), SEND_BATCH_LIMIT):
            chunk = bodies[start:start + SEND_BATCH_LIMIT]
            entries = [{"Id": str(i), "MessageBody": json.dumps(body, sort_keys=True), "DelaySeconds": delay}
                       for i, body in enumerate(chunk)]
            response = self._sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            failed = response.get("Failed") or []
            if failed:
                # Sent ones stay sent; the caller's retry sends all again (idempotent batches).
                raise RuntimeError(f"SendMessageBatch refused {len(failed)} message(s): "
                                   f"{failed[0].get('Code')}: {failed[0].get('Message')}")
