"""Amazon SQS adapter: the gang fan-out queue (batches of StopTask / StartTask work), and the
workers' failed messages brought back sooner (:class:`Redeliveries`)."""

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


CHANGE_BATCH_LIMIT = 10  # ChangeMessageVisibilityBatch entries per call


def queue_url_of(queue_arn: str) -> str:
    """The URL of the queue ``arn:<partition>:sqs:<region>:<account>:<name>`` (the queue an
    event source mapping's record names: its ``eventSourceARN``)."""
    parts = queue_arn.split(":", 5)
    if len(parts) != 6 or parts[2] != "sqs":
        raise ValueError(f"not an SQS queue ARN: {queue_arn!r}")
    _, partition, _, region, account, name = parts
    domain = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    return f"https://sqs.{region}.{domain}/{account}/{name}"


class Redeliveries:
    """A worker's failed messages brought back sooner than the queue's visibility timeout.

    An event source mapping leaves a failed message in flight until its visibility timeout
    ends, and a worker queue's is six times its function's timeout (AWS's advice): a rank's
    STOPPED event whose handling died on one lost answer waited six minutes for its second
    try, while Lambda retries a failed EventBridge event after one. So a message failed on
    its first receive is made visible again ``first_retry_seconds`` from now (the runtime
    gives the claims' lease: every claim the failed delivery made has ended by then, so the
    next takes it over and finishes the work); later failures keep the queue's timeout, so
    the time before the dead-letter queue hardly changes. Best effort: a change refused or
    lost leaves the message to its visibility timeout."""

    def __init__(self, sqs_client: Any, first_retry_seconds: int) -> None:
        self._sqs = sqs_client
        self.first_retry_seconds = first_retry_seconds

    def bring_forward(self, records: Sequence[Mapping[str, Any]]) -> int:
        """The records (an SQS event's) whose messages failed: how many were brought forward."""
        by_queue: dict[str, list[str]] = {}
        for record in records:
            if str((record.get("attributes") or {}).get("ApproximateReceiveCount") or "1") != "1":
                continue
            queue_arn = str(record.get("eventSourceARN") or "")
            by_queue.setdefault(queue_arn, []).append(str(record["receiptHandle"]))
        changed = 0
        for queue_arn, handles in by_queue.items():
            for start in range(0, len(handles), CHANGE_BATCH_LIMIT):
                changed += self._change(queue_arn, handles[start:start + CHANGE_BATCH_LIMIT])
        return changed

    def _change(self, queue_arn: str, handles: Sequence[str]) -> int:
        seconds = self.first_retry_seconds
        try:
            response = self._sqs.change_message_visibility_batch(
                QueueUrl=queue_url_of(queue_arn),
                Entries=[{"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                         for i, handle in enumerate(handles)])
        except Exception as error:  # ValueError, ClientError, BotoCoreError: the timeout stands
            logger.warning("failed messages not brought forward", extra={
                "queue": queue_arn, "messages": len(handles),
                "error": f"{type(error).__name__}: {error}"[:500]})
            return 0
        failed = response.get("Failed") or []
        if failed:
            logger.warning("failed messages not brought forward", extra={
                "queue": queue_arn, "messages": len(failed),
                "error": f"{failed[0].get('Code')}: {failed[0].get('Message')}"[:500]})
        return len(response.get("Successful") or [])
