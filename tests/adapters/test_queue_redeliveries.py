"""A worker's failed messages brought back sooner (``adapters.queue.Redeliveries``), held to
the API's model by botocore's Stubber: ChangeMessageVisibilityBatch takes at most 10 entries
a call, on the queue the records name; only a message on its first receive is brought
forward (later failures keep the queue's visibility timeout, so the time before the
dead-letter queue hardly changes); a refused or failed change is logged, never raised."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gpu_recovery.adapters import queue
from gpu_recovery.adapters.queue import Redeliveries, queue_url_of

QUEUE_ARN = "arn:aws:sqs:us-east-1:111122223333:gpu-recovery-tag-lookups"
QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/111122223333/gpu-recovery-tag-lookups"


def _client() -> Any:
    return boto3.client("sqs", region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _record(i: int, receive_count: int = 1, queue_arn: str = QUEUE_ARN) -> dict[str, Any]:
    return {"messageId": f"m{i}", "receiptHandle": f"handle-{i}", "body": "{}",
            "attributes": {"ApproximateReceiveCount": str(receive_count)}, "eventSourceARN": queue_arn}


def test_a_queue_url_from_its_arn() -> None:
    assert queue_url_of(QUEUE_ARN) == QUEUE_URL
    assert queue_url_of("arn:aws-cn:sqs:cn-north-1:111122223333:q") == \
        "https://sqs.cn-north-1.amazonaws.com.cn/111122223333/q"
    with pytest.raises(ValueError, match="not an SQS queue ARN"):
        queue_url_of("arn:aws:sns:us-east-1:111122223333:topic")


def test_first_receives_are_brought_forward_ten_a_call_and_later_ones_left() -> None:
    client = _client()
    records = [_record(i) for i in range(12)] + [_record(12, receive_count=2)]
    with Stubber(client) as stub:
        for chunk in (range(0, 10), range(10, 12)):
            entries = [{"Id": str(n), "ReceiptHandle": f"handle-{i}", "VisibilityTimeout": 60}
                       for n, i in enumerate(chunk)]
            stub.add_response("change_message_visibility_batch",
                              {"Successful": [{"Id": e["Id"]} for e in entries], "Failed": []},
                              {"QueueUrl": QUEUE_URL, "Entries": entries})
        assert Redeliveries(client, 60).bring_forward(records) == 12
        stub.assert_no_pending_responses()


def test_a_refused_entry_or_a_failed_call_is_logged_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    warned: list[str] = []  # the module's logger, read directly (other tests may silence logging)
    monkeypatch.setattr(queue.logger, "warning", lambda message, *_, **__: warned.append(message))
    client = _client()
    entries = [{"Id": str(n), "ReceiptHandle": f"handle-{n}", "VisibilityTimeout": 60} for n in range(2)]
    with Stubber(client) as stub:
        stub.add_response("change_message_visibility_batch", {
            "Successful": [{"Id": "0"}],
            "Failed": [{"Id": "1", "SenderFault": True, "Code": "AWS.SimpleQueueService.MessageNotInflight",
                        "Message": "not in flight"}]}, {"QueueUrl": QUEUE_URL, "Entries": entries})
        stub.add_client_error("change_message_visibility_batch", "ThrottlingException")
        assert Redeliveries(client, 60).bring_forward([_record(0), _record(1)]) == 1
        assert Redeliveries(client, 60).bring_forward([_record(2)]) == 0
        stub.assert_no_pending_responses()
    assert warned == ["failed messages not brought forward"] * 2
