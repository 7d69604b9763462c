"""The one SQS queue model both simulated worlds deliver from (``local_mode.sim.sqs_model``):
delay seconds, receive order, visibility from the receive, receive counts and SQS's redrive
rule (moved on the receive attempt that would exceed maxReceiveCount), a visibility changed
by ChangeMessageVisibilityBatch."""

from __future__ import annotations

import pytest

from local_mode.events import receipt_handle
from local_mode.sim.sqs_model import BatchRefused, MessageQueue, change_visibility_batch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delay_seconds_hide_a_message_and_a_receive_takes_the_oldest_visible_first() -> None:
    """Given a queue with a message sent with a delay and two sent after it without one
    When it is received before and after the delay
    Then the delayed one is invisible until its delay ends; the others come in send order."""
    clock = Clock()
    queue = MessageQueue("q", clock=clock)
    queue.send("late", delay_seconds=60)
    clock.now += 1
    queue.send("a")
    queue.send("b")
    received = queue.receive(10)
    assert [m.body for m in received] == ["a", "b"]
    assert queue.receive(10) == []
    for message in received:
        queue.delete(message.message_id)
    assert queue.next_visible() == pytest.approx(1060)
    clock.now = 1060
    (late,) = queue.receive(10)
    assert (late.body, late.receive_count, late.first_received_at) == ("late", 1, 1060)


def test_a_received_message_is_hidden_for_the_visibility_timeout_from_its_receive() -> None:
    """Given a queue with a 30 s visibility timeout and one message
    When it is received and not deleted, then received again once visible
    Then it is invisible for 30 s from the first receive, comes back with receive count 2
    and its first receive time kept; deleted, it is gone."""
    clock = Clock()
    queue = MessageQueue("q", clock=clock, visibility_timeout=30)
    sent = queue.send("m")
    assert [m.message_id for m in queue.receive(1)] == [sent.message_id]
    clock.now += 29
    assert queue.receive(1) == [] and not queue.has_visible()
    clock.now += 1
    (again,) = queue.receive(1)
    assert (again.message_id, again.receive_count, again.first_received_at) == (sent.message_id, 2, 1000)
    assert queue.delete(again.message_id) and not queue.delete(again.message_id)
    assert (len(queue), queue.sent, queue.deleted, queue.next_visible()) == (0, 1, 1, None)


def test_redrive_happens_on_the_receive_after_the_last_allowed_one() -> None:
    """Given a queue with maxReceiveCount 2 and a dead-letter queue
    When a message is received twice without being deleted, then received once more
    Then the third receive moves it to the dead-letter queue (receive count 0 there) and
    returns the other visible messages instead; the listener hears of it."""
    clock = Clock()
    moved: list[str] = []
    dead = MessageQueue("q-dlq", clock=clock)
    queue = MessageQueue("q", clock=clock, visibility_timeout=10, max_receive_count=2, dead_letter=dead,
                         on_dead_letter=lambda m: moved.append(m.body))
    queue.send("poison")
    for _ in range(2):
        assert [m.body for m in queue.receive(10)] == ["poison"]
        assert moved == []
        clock.now += 10
    queue.send("good")
    assert [m.body for m in queue.receive(10)] == ["good"]
    assert moved == ["poison"] and queue.moved_to_dead_letter == 1
    assert [(m.body, m.receive_count) for m in dead.messages.values()] == [("poison", 0)]


def test_a_redrive_policy_needs_its_dead_letter_queue() -> None:
    with pytest.raises(ValueError):
        MessageQueue("q", clock=Clock(), max_receive_count=3)
    with pytest.raises(ValueError):
        MessageQueue("q", clock=Clock(), dead_letter=MessageQueue("d", clock=Clock()))


def test_change_message_visibility_batch_brings_a_message_in_flight_back_when_asked() -> None:
    """Given a queue with a 360 s visibility timeout and two messages, one received
    When ChangeMessageVisibilityBatch asks both back in 60 s (by their receipt handles)
    Then the received one is visible 60 s later, not 360 s; the other, not in flight, is
    answered Failed (MessageNotInflight), as SQS answers; a batch of eleven, repeated ids or
    a timeout past 12 hours are refused whole."""
    clock = Clock()
    queue = MessageQueue("q", clock=clock, visibility_timeout=360)
    received = queue.send("a")
    waiting = queue.send("b", delay_seconds=900)
    assert [m.message_id for m in queue.receive(10)] == [received.message_id]
    clock.now += 5
    answer = change_visibility_batch(queue, [
        {"Id": "0", "ReceiptHandle": receipt_handle(received.message_id), "VisibilityTimeout": 60},
        {"Id": "1", "ReceiptHandle": receipt_handle(waiting.message_id), "VisibilityTimeout": 60},
        {"Id": "2", "ReceiptHandle": "not-ours", "VisibilityTimeout": 60}])
    assert answer["Successful"] == [{"Id": "0"}]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [
        ("1", "AWS.SimpleQueueService.MessageNotInflight"), ("2", "ReceiptHandleIsInvalid")]
    assert queue.next_visible() == pytest.approx(1065)
    clock.now = 1065
    (again,) = queue.receive(10)
    assert (again.message_id, again.receive_count) == (received.message_id, 2)
    entry = {"ReceiptHandle": receipt_handle(again.message_id), "VisibilityTimeout": 60}
    for entries, code in (([{**entry, "Id": str(i)} for i in range(11)], "TooManyEntriesInBatchRequest"),
                          ([{**entry, "Id": "x"}, {**entry, "Id": "x"}], "BatchEntryIdsNotDistinct"),
                          ([{**entry, "Id": "0", "VisibilityTimeout": 43_201}], "InvalidParameterValue"),
                          ([], "EmptyBatchRequest")):
        with pytest.raises(BatchRefused, match=code):
            change_visibility_batch(queue, entries)
    assert queue.next_visible() == pytest.approx(1065 + 360)  # nothing refused changed it
