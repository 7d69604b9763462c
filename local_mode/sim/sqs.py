"""SQS in the scale world, on the engine: a standard queue (:class:`SqsQueue`: the shared
queue model, :class:`~local_mode.sim.sqs_model.MessageQueue`, with seeded ids), its client
(:class:`SqsClient`: ``SendMessageBatch`` of 10 entries, 256 KB a message, ``DelaySeconds``;
``ChangeMessageVisibilityBatch``),
the fan-out queue port the recovery code sends through (:class:`SimQueuePort`), and Lambda's
poller, the engine-timed delivery (:meth:`SqsQueue.attach`, :class:`SqsEventSource`: batch
size, batching window, maximum concurrency, ``ReportBatchItemFailures``). Visibility, receive
counts and the redrive to the dead-letter queue are the model's (the moto world's queues use
the same one, delivered in process by the bus).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from .. import events as ev
from .aws_calls import Account, SimClient
from .bus import failed_message_ids
from .engine import Simulation
from .lambdas import Invocation, LambdaService
from .sqs_model import (
    MAX_BATCH_ENTRIES,
    BatchRefused,
    Message,
    MessageQueue,
    change_visibility_batch,
    check_batch,
)

SQS_MAX_MESSAGE_BYTES = 256 * 1024  # the long-standing limit (stricter than today's 1 MiB)
SQS_MAX_DELAY_SECONDS = 900
POLL_DELAY_SECONDS = 0.2  # Lambda's poller: a message is picked up this long after it is visible


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
            message = queue.send(body, int(p.get("DelaySeconds") or 0))
            return {"MessageId": message.message_id}

        return self._call("SendMessage", params, one)

    def change_message_visibility_batch(self, **params: Any) -> dict[str, Any]:
        def change(p: dict[str, Any]) -> dict[str, Any]:
            queue = self._queue("ChangeMessageVisibilityBatch", p["QueueUrl"])
            try:
                return change_visibility_batch(queue, list(p.get("Entries") or []))
            except BatchRefused as refused:
                raise self.error("ChangeMessageVisibilityBatch", refused.code, refused.message) from None

        return self._call("ChangeMessageVisibilityBatch", params, change)

    def _send_batch(self, p: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue("SendMessageBatch", p["QueueUrl"])
        entries = p["Entries"]
        try:
            check_batch("SendMessageBatch", entries)
        except BatchRefused as refused:
            raise self.error("SendMessageBatch", refused.code, refused.message) from None
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
            message = queue.send(entry["MessageBody"], delay)
            successful.append({"Id": entry["Id"], "MessageId": message.message_id})
        return {"Successful": successful, "Failed": []}


class SimQueuePort:
    """The fan-out queue port (``send(bodies, delay_seconds)``): JSON bodies, sent 10 per
    SendMessageBatch through a :class:`SqsClient`."""

    def __init__(self, client: SqsClient, queue_url: str) -> None:
        self._client = client
        self.queue_url = queue_url

    def send(self, bodies: list[dict[str, Any]], delay_seconds: int = 0) -> None:
        for start in range(0, len(bodies), MAX_BATCH_ENTRIES):
            chunk = bodies[start:start + MAX_BATCH_ENTRIES]
            response = self._client.send_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "MessageBody": json.dumps(body, sort_keys=True),
                          "DelaySeconds": delay_seconds} for i, body in enumerate(chunk)])
            if response.get("Failed"):
                raise RuntimeError(f"SendMessageBatch failed for {response['Failed']}")


class SqsQueue(MessageQueue):
    """A standard queue (:class:`~local_mode.sim.sqs_model.MessageQueue`, the model both worlds
    share) on the engine's clock, with seeded message ids, its SQS client and its Lambda
    event source (:meth:`attach`)."""

    def __init__(self, sim: Simulation, account: Account, name: str, *, visibility_timeout: float = 30.0,
                 max_receive_count: int | None = None, dead_letter: SqsQueue | None = None) -> None:
        if (max_receive_count is None) != (dead_letter is None):
            raise ValueError("a redrive policy needs both max_receive_count and dead_letter")
        super().__init__(name, clock=lambda: sim.now, visibility_timeout=visibility_timeout,
                         max_receive_count=max_receive_count, dead_letter=dead_letter,
                         new_id=lambda: f"{sim.token(4)}-{sim.token(2)}-{sim.token(2)}-{sim.token(6)}")
        self.sim = sim
        self.account = account
        self._source: SqsEventSource | None = None

    def reset_stats(self) -> None:
        super().reset_stats()
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

    def send(self, body: str, delay_seconds: float = 0.0) -> Message:
        message = super().send(body, delay_seconds)
        if self._source is not None:
            self._source.wake(message.visible_at)
        return message

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
            batch = queue.receive(self.batch_size, sim.now)
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
        pending = queue.next_visible()
        if pending is not None and pending > sim.now and self.active < self.max_concurrency:
            self.wake(pending)

    def _done(self, invocation: Invocation, ids: list[str]) -> None:
        self.active -= 1
        queue = self.queue
        failed = failed_message_ids(invocation.ok, invocation.result, ids,
                                    report_batch_item_failures=self.report_batch_item_failures)
        if not invocation.ok:
            self.failed_batches += 1
        self.failed_items += len(failed & set(ids))
        for message_id in ids:
            if message_id not in failed:
                queue.delete(message_id)
        # Failed messages come back when their visibility timeout ends.
        again = queue.visible_again_at(failed) if failed else None
        self.wake(queue.sim.now if again is None else again)
        if queue.has_visible(queue.sim.now):
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

