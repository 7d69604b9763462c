"""SQS in the scale simulator, in simulated time: a standard queue (:class:`SqsQueue`) with
an optional dead-letter queue, its client (:class:`SqsClient`: ``SendMessageBatch`` of 10
entries, 256 KB a message, ``DelaySeconds``), the fan-out queue port the recovery code sends
through (:class:`SimQueuePort`), and a Lambda event source (:meth:`SqsQueue.attach`,
:class:`SqsEventSource`: batch size, maximum concurrency, visibility timeout,
``ReportBatchItemFailures``, ``ApproximateReceiveCount``, redrive to the dead-letter queue
after ``maxReceiveCount`` receives).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from .. import events as ev
from ..events import ACCOUNT_ID, REGION
from .aws_calls import Account, SimClient
from .bus import failed_message_ids
from .engine import Simulation
from .lambdas import Invocation, LambdaService

SQS_MAX_MESSAGE_BYTES = 256 * 1024  # the long-standing limit (stricter than today's 1 MiB)
SQS_MAX_BATCH = 10
SQS_MAX_DELAY_SECONDS = 900
POLL_DELAY_SECONDS = 0.2  # Lambda's poller: a message is picked up this long after it is visible


@dataclass
class _Message:
    message_id: str
    body: str
    sent_at: float
    visible_at: float
    receive_count: int = 0
    first_received_at: float | None = None


class SqsClient(SimClient):
    """``send_message_batch`` / ``send_message`` to the simulated queues of an account."""

    service = "sqs"

    def __init__(self, account: Account, queues: Mapping[str, SqsQueue]) -> None:
        super().__init__(account)
        self._queues = queues

    def _queue(self, operation: str, url: str) -> SqsQueue:
        queue = self._queues.get(url)
        if queue is None:
            raise self.error(operation, "AWS.SimpleQueueService.NonExistentQueue",
                             "The specified queue does not exist.")
        return queue

    def send_message_batch(self, **params: Any) -> dict[str, Any]:
        return self._call("SendMessageBatch", params, self._send_batch)

    def send_message(self, **params: Any) -> dict[str, Any]:
        def one(p: dict[str, Any]) -> dict[str, Any]:
            queue = self._queue("SendMessage", p["QueueUrl"])
            body = p["MessageBody"]
            if len(body.encode()) > SQS_MAX_MESSAGE_BYTES:
                raise self.error("SendMessage", "InvalidParameterValue",
                                 f"One or more parameters are invalid. Reason: Message must be shorter than "
                                 f"{SQS_MAX_MESSAGE_BYTES} bytes.")
            message = queue._enqueue(body, int(p.get("DelaySeconds") or 0))
            return {"MessageId": message.message_id}

        return self._call("SendMessage", params, one)

    def _send_batch(self, p: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue("SendMessageBatch", p["QueueUrl"])
        entries = p["Entries"]
        if not entries:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.EmptyBatchRequest",
                             "There should be at least one SendMessageBatchRequestEntry in the request.")
        if len(entries) > SQS_MAX_BATCH:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                             f"Maximum number of entries per request are {SQS_MAX_BATCH}. You have sent "
                             f"{len(entries)}.")
        ids = [e["Id"] for e in entries]
        if len(set(ids)) != len(ids):
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                             "Id must be distinct among batch entries.")
        if sum(len(e["MessageBody"].encode()) for e in entries) > SQS_MAX_MESSAGE_BYTES:
            raise self.error("SendMessageBatch", "AWS.SimpleQueueService.BatchRequestTooLong",
                             f"Batch requests cannot be longer than {SQS_MAX_MESSAGE_BYTES} bytes.")
        successful = []
        for entry in entries:
            delay = int(entry.get("DelaySeconds") or 0)
            if not 0 <= delay <= SQS_MAX_DELAY_SECONDS:
                raise self.error("SendMessageBatch", "InvalidParameterValue",
                                 f"Value {delay} for parameter DelaySeconds is invalid. Reason: must be "
                                 f"between 0 and {SQS_MAX_DELAY_SECONDS}, if provided.")
            message = queue._enqueue(entry["MessageBody"], delay)
            successful.append({"Id": entry["Id"], "MessageId": message.message_id})
        return {"Successful": successful, "Failed": []}


class SimQueuePort:
    """The fan-out queue port (``send(bodies, delay_seconds)``): JSON bodies, sent 10 per
    SendMessageBatch through a :class:`SqsClient`."""

    def __init__(self, client: SqsClient, queue_url: str) -> None:
        self._client = client
        self.queue_url = queue_url

    def send(self, bodies: list[dict[str, Any]], delay_seconds: int = 0) -> None:
        for start in range(0, len(bodies), SQS_MAX_BATCH):
            chunk = bodies[start:start + SQS_MAX_BATCH]
            response = self._client.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "MessageBody": json.dumps(body, sort_keys=True),
                          "DelaySeconds": delay_seconds} for i, body in enumerate(chunk)])
            if response.get("Failed"):
                raise RuntimeError(f"SendMessageBatch failed for {response['Failed']}")


class SqsQueue:
    """A standard queue with an optional dead-letter queue (see the module docstring)."""

    def __init__(self, sim: Simulation, account: Account, name: str, *, visibility_timeout: float = 30.0,
                 max_receive_count: int | None = None, dead_letter: SqsQueue | None = None) -> None:
        if (max_receive_count is None) != (dead_letter is None):
            raise ValueError("a redrive policy needs both max_receive_count and dead_letter")
        self.sim = sim
        self.account = account
        self.name = name
        self.url = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{name}"
        self.arn = f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{name}"
        self.visibility_timeout = visibility_timeout
        self.max_receive_count = max_receive_count
        self.dead_letter = dead_letter
        self.messages: dict[str, _Message] = {}
        self.sent = 0
        self.deleted = 0
        self.moved_to_dead_letter = 0
        self._source: SqsEventSource | None = None

    def reset_stats(self) -> None:
        self.sent = self.deleted = self.moved_to_dead_letter = 0
        if self._source is not None:
            self._source.reset_stats()
        if self.dead_letter is not None:
            self.dead_letter.reset_stats()

    def stats(self) -> dict[str, Any]:
        """Sent, deleted, redriven; the event source's batches and failures; what is left
        (and of it, how much was received more than once: failing again and again)."""
        source = self._source
        left = list(self.messages.values())
        return {"sent": self.sent, "deleted": self.deleted, "moved_to_dead_letter": self.moved_to_dead_letter,
                "in_queue": len(left),
                "in_queue_received_twice_or_more": sum(1 for m in left if m.receive_count > 1),
                "max_receive_count": max((m.receive_count for m in left), default=0),
                "batches": source.batches if source else 0,
                "failed_items": source.failed_items if source else 0,
                "failed_batches": source.failed_batches if source else 0,
                "max_concurrency": source.max_active if source else 0,
                "dead_letter_queue": len(self.dead_letter.messages) if self.dead_letter else 0}

    def client(self, queues: Mapping[str, SqsQueue] | None = None) -> SqsClient:
        return SqsClient(self.account, queues or {self.url: self})

    def port(self) -> SimQueuePort:
        return SimQueuePort(self.client(), self.url)

    def _enqueue(self, body: str, delay: int) -> _Message:
        now = self.sim.now
        message = _Message(f"{self.sim.token(4)}-{self.sim.token(2)}-{self.sim.token(2)}-{self.sim.token(6)}",
                           body, now, now + delay)
        self.messages[message.message_id] = message
        self.sent += 1
        if self._source is not None:
            self._source.wake(message.visible_at)
        return message

    def visible(self) -> list[_Message]:
        now = self.sim.now
        return [m for m in self.messages.values() if m.visible_at <= now]

    def attach(self, lambdas: LambdaService, function: str, *, batch_size: int = 10,
               max_concurrency: int | None = None, report_batch_item_failures: bool = True,
               poll_delay: float = POLL_DELAY_SECONDS) -> SqsEventSource:
        """A Lambda event source mapping from this queue to ``function``."""
        timeout = lambdas.functions[function].timeout
        if self.visibility_timeout < timeout:
            raise ValueError(f"queue {self.name}: visibility timeout {self.visibility_timeout} s is shorter "
                             f"than the function timeout {timeout} s (Lambda refuses the mapping)")
        if max_concurrency is not None and not 2 <= max_concurrency <= 1000:
            raise ValueError("maximum concurrency is 2..1000")
        self._source = SqsEventSource(self, lambdas, function, batch_size, max_concurrency,
                                      report_batch_item_failures, poll_delay)
        self._source.wake(self.sim.now)
        return self._source


class SqsEventSource:
    """Lambda's poller for one queue: batches of visible messages to the function."""

    def __init__(self, queue: SqsQueue, lambdas: LambdaService, function: str, batch_size: int,
                 max_concurrency: int | None, report_batch_item_failures: bool, poll_delay: float) -> None:
        if not 1 <= batch_size <= 10_000:
            raise ValueError("batch size is 1..10,000")
        self.queue = queue
        self.lambdas = lambdas
        self.function = function
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency or lambdas.concurrency
        self.report_batch_item_failures = report_batch_item_failures
        self.poll_delay = poll_delay
        self.active = 0
        self.max_active = 0
        self.batches = 0
        self.failed_items = 0
        self.failed_batches = 0
        self._wake_at: float | None = None

    def reset_stats(self) -> None:
        self.batches = self.failed_items = self.failed_batches = 0
        self.max_active = self.active

    def wake(self, when: float) -> None:
        """Poll at ``when`` (plus the poller's delay) unless a poll is due earlier."""
        due = max(when, self.queue.sim.now) + self.poll_delay
        if self._wake_at is not None and self._wake_at <= due:
            return
        self._wake_at = due
        self.queue.sim.at(due, partial(self._poll, due), f"poll {self.queue.name}")

    def _poll(self, due: float) -> None:
        if self._wake_at != due:
            return  # superseded by an earlier poll
        self._wake_at = None
        queue, sim = self.queue, self.queue.sim
        while self.active < self.max_concurrency:
            batch = self._receive()
            if not batch:
                break
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.batches += 1
            records = [ev.sqs_record(m.message_id, m.body, queue.arn, receive_count=m.receive_count,
                                     sent_at=m.sent_at, first_received_at=m.first_received_at or sim.now)
                       for m in batch]
            self.lambdas.invoke(self.function, {"Records": records},
                                partial(self._done, ids=[m.message_id for m in batch]))
        pending = [m.visible_at for m in queue.messages.values() if m.visible_at > sim.now]
        if pending and self.active < self.max_concurrency:
            self.wake(min(pending))

    def _receive(self) -> list[_Message]:
        queue, now = self.queue, self.queue.sim.now
        batch: list[_Message] = []
        for message in sorted(queue.visible(), key=lambda m: (m.visible_at, m.sent_at)):
            if len(batch) >= self.batch_size:
                break
            if queue.max_receive_count is not None and message.receive_count >= queue.max_receive_count:
                # Received maxReceiveCount times already: SQS redrives it instead.
                del queue.messages[message.message_id]
                queue.moved_to_dead_letter += 1
                assert queue.dead_letter is not None
                moved = queue.dead_letter._enqueue(message.body, 0)
                moved.receive_count = 0
                continue
            message.receive_count += 1
            message.first_received_at = message.first_received_at or now
            message.visible_at = now + queue.visibility_timeout
            batch.append(message)
        return batch

    def _done(self, invocation: Invocation, ids: list[str]) -> None:
        self.active -= 1
        queue = self.queue
        failed = failed_message_ids(invocation.ok, invocation.result, ids,
                                    report_batch_item_failures=self.report_batch_item_failures)
        if not invocation.ok:
            self.failed_batches += 1
        self.failed_items += len(failed & set(ids))
        for message_id in ids:
            if message_id not in failed and message_id in queue.messages:
                del queue.messages[message_id]
                queue.deleted += 1
        # Failed messages come back when their visibility timeout ends.
        self.wake(queue.sim.now if not failed else min(
            (queue.messages[i].visible_at for i in failed if i in queue.messages), default=queue.sim.now))
        if queue.visible():
            self.wake(queue.sim.now)


def sqs_batch_handler(handle: Callable[[dict[str, Any], int], Any]) -> Callable[[Any, Any], dict[str, Any]]:
    """A worker function's handler for an SQS event source with ReportBatchItemFailures:
    ``handle(body, receive_count)`` per record, in order; a record whose ``handle`` raises is
    reported as failed (it comes back after the visibility timeout), the others are deleted.
    The container argument is ignored (per-container state lives in ``handle``'s closure)."""

    def handler(_container: Any, event: dict[str, Any]) -> dict[str, Any]:
        failures = []
        for record in event.get("Records", []):
            try:
                handle(json.loads(record["body"]), int(record["attributes"]["ApproximateReceiveCount"]))
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    return handler

