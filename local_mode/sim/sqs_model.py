"""The one SQS queue model of both simulated worlds: a standard queue's messages, their
visibility, receive counts, delay seconds and redrive to a dead-letter queue.

:class:`MessageQueue` holds what SQS holds and applies SQS's rules; it knows nothing of how
its messages reach a function. The delivery is the worlds' own part, as the bus's timing is:

* the moto world: :class:`~local_mode.sim.bus.InProcessEventSource`, received synchronously
  by ``EventBus.fire_due`` in simulated time;
* the scale world: :class:`~local_mode.sim.sqs.SqsEventSource`, Lambda's poller on the
  engine (batching window, maximum concurrency), with :class:`~local_mode.sim.sqs.SqsQueue`
  (this model plus its SQS client) underneath.

The rules, as SQS documents them:

* a message sent with ``DelaySeconds`` is invisible until the delay ends;
* a receive takes the visible messages oldest first (visible since, then sent; the order of
  a standard queue is best effort, this one is deterministic), counts the receive
  (``ApproximateReceiveCount``) and hides each message for the visibility timeout, counted
  from the receive; a message not deleted by then is visible again;
* with a redrive policy, a message whose receive count would exceed ``maxReceiveCount`` is
  moved to the dead-letter queue *on that receive attempt* (not when its last receive
  failed): it is not delivered again, and it leaves the queue only once it is due again.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..events import ACCOUNT_ID, REGION, message_id_of
from .contract.authorization import queue_arn


@dataclass
class Message:
    """One message in a queue."""

    message_id: str
    body: str
    sent_at: float
    visible_at: float
    seq: int  # the send order (ties of visible_at and sent_at)
    receive_count: int = 0
    first_received_at: float | None = None


def _new_message_id() -> str:
    return str(uuid.uuid4())


class MessageQueue:
    """A standard queue with an optional redrive policy (see the module docstring).

    ``clock`` gives the simulated time; ``new_id`` draws message ids (the scale world's are
    seeded); ``dead_letter`` with ``max_receive_count`` is the redrive policy; the messages it
    moves are also told to ``on_dead_letter`` (the moto world's bus records them)."""

    def __init__(self, name: str, *, clock: Callable[[], float], visibility_timeout: float = 30.0,
                 max_receive_count: int | None = None, dead_letter: MessageQueue | None = None,
                 new_id: Callable[[], str] = _new_message_id,
                 on_dead_letter: Callable[[Message], None] | None = None) -> None:
        if max_receive_count is not None and dead_letter is None and on_dead_letter is None:
            raise ValueError("a redrive policy needs a dead-letter queue")
        if dead_letter is not None and max_receive_count is None:
            raise ValueError("a redrive policy needs max_receive_count")
        self.name = name
        self.url = ""
        self.arn = ""
        self.known_as(f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT_ID}/{name}")
        self.clock = clock
        self.visibility_timeout = visibility_timeout
        self.max_receive_count = max_receive_count
        self.dead_letter = dead_letter
        self.on_dead_letter = on_dead_letter
        self.new_id = new_id
        #: every message in the queue, in flight or not, by id (in send order)
        self.messages: dict[str, Message] = {}
        self.sent = 0
        self.deleted = 0
        self.moved_to_dead_letter = 0
        self._seq = 0
        # (visible_at, sent_at, seq, id) of each message's current visibility; older entries
        # of a message (received, its visibility changed) or of a deleted one are skipped
        self._due: list[tuple[float, float, int, str]] = []

    def known_as(self, url: str) -> None:
        """The queue at ``url``, and the ARN its event source's records name: the URL the
        functions are told, as in AWS."""
        self.url, self.arn = url, queue_arn(url)

    # --- sending ----------------------------------------------------------------------
    def send(self, body: str, delay_seconds: float = 0.0) -> Message:
        """SendMessage: visible ``delay_seconds`` from now."""
        now = self.clock()
        self._seq += 1
        message = Message(self.new_id(), body, now, now + max(0.0, delay_seconds), self._seq)
        self.messages[message.message_id] = message
        self.sent += 1
        self._push(message)
        return message

    def _push(self, message: Message) -> None:
        heapq.heappush(self._due, (message.visible_at, message.sent_at, message.seq, message.message_id))

    # --- receiving --------------------------------------------------------------------
    def _live_top(self) -> Message | None:
        while self._due:
            visible_at, _, _, message_id = self._due[0]
            message = self.messages.get(message_id)
            if message is not None and message.visible_at == visible_at:
                return message
            heapq.heappop(self._due)  # deleted, or its visibility changed since
        return None

    def next_visible(self) -> float | None:
        """When the earliest message is (or was) visible; None: the queue is empty."""
        message = self._live_top()
        return message.visible_at if message is not None else None

    def has_visible(self, now: float | None = None) -> bool:
        due = self.next_visible()
        return due is not None and due <= (self.clock() if now is None else now)

    def receive(self, max_messages: int, now: float | None = None) -> list[Message]:
        """ReceiveMessage: up to ``max_messages`` visible messages, oldest first, each receive
        counted and each hidden for the visibility timeout; on the way, every visible message
        already received ``max_receive_count`` times is moved to the dead-letter queue."""
        now = self.clock() if now is None else now
        batch: list[Message] = []
        while len(batch) < max_messages:
            message = self._live_top()
            if message is None or message.visible_at > now:
                break
            heapq.heappop(self._due)
            if self.max_receive_count is not None and message.receive_count >= self.max_receive_count:
                self._redrive(message)
                continue
            message.receive_count += 1
            if message.first_received_at is None:
                message.first_received_at = now
            message.visible_at = now + self.visibility_timeout
            self._push(message)
            batch.append(message)
        return batch

    def _redrive(self, message: Message) -> None:
        del self.messages[message.message_id]
        self.moved_to_dead_letter += 1
        if self.dead_letter is not None:
            self.dead_letter.send(message.body)
        if self.on_dead_letter is not None:
            self.on_dead_letter(message)

    # --- after a receive --------------------------------------------------------------
    def delete(self, message_id: str) -> bool:
        """DeleteMessage (False: not in the queue any more)."""
        if self.messages.pop(message_id, None) is None:
            return False
        self.deleted += 1
        return True

    def change_visibility(self, message_id: str, seconds: float) -> str | None:
        """ChangeMessageVisibility of a received message: visible ``seconds`` from now; the
        error code SQS answers when it is not in flight (deleted, or visible already)."""
        message = self.messages.get(message_id)
        now = self.clock()
        if message is None or message.receive_count == 0 or message.visible_at <= now:
            return "AWS.SimpleQueueService.MessageNotInflight"
        message.visible_at = now + max(0.0, seconds)
        self._push(message)
        return None

    def visible_again_at(self, message_ids: set[str] | list[str]) -> float | None:
        """When the earliest of these messages (received, not deleted) is visible again."""
        return min((self.messages[i].visible_at for i in message_ids if i in self.messages), default=None)

    # --- inspection -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.messages)

    def reset_stats(self) -> None:
        self.sent = self.deleted = self.moved_to_dead_letter = 0


MAX_BATCH_ENTRIES = 10  # entries of a ...Batch request
MAX_VISIBILITY_TIMEOUT_SECONDS = 43_200  # 12 hours


class BatchRefused(Exception):
    """A batch request SQS refuses whole: its error code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def check_batch(operation: str, entries: list[dict[str, Any]]) -> None:
    """What SQS refuses of any ...Batch request whole: no entry, more than 10, an Id twice."""
    if not entries:
        raise BatchRefused("AWS.SimpleQueueService.EmptyBatchRequest",
                           f"There should be at least one {operation}RequestEntry in the request.")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise BatchRefused("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                           f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. "
                           f"You have sent {len(entries)}.")
    ids = [entry["Id"] for entry in entries]
    if len(set(ids)) != len(ids):
        raise BatchRefused("AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                           "Id must be distinct among batch entries.")


def change_visibility_batch(queue: MessageQueue, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """ChangeMessageVisibilityBatch on ``queue``, answered as SQS answers it: each entry
    ``Successful`` or ``Failed`` (a receipt handle not ours, a message not in flight); a
    batch empty, too long or with ids repeated, or a timeout out of range, refused whole."""
    check_batch("ChangeMessageVisibilityBatch", entries)
    successful: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for entry in entries:
        seconds = int(entry.get("VisibilityTimeout") or 0)
        if not 0 <= seconds <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise BatchRefused("InvalidParameterValue",
                               f"Value {seconds} for parameter VisibilityTimeout is invalid. Reason: Must be "
                               f"between 0 and {MAX_VISIBILITY_TIMEOUT_SECONDS}, if provided.")
        message_id = message_id_of(str(entry["ReceiptHandle"]))
        code = ("ReceiptHandleIsInvalid" if message_id is None
                else queue.change_visibility(message_id, seconds))
        if code is None:
            successful.append({"Id": entry["Id"]})
        else:
            failed.append({"Id": entry["Id"], "SenderFault": True, "Code": code,
                           "Message": "The receipt handle names no message in flight."})
    return {"Successful": successful, "Failed": failed}
