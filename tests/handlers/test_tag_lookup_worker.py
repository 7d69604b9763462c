"""The tag lookup worker's handler: its partial batch response (SQS event shape)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_recovery.recovery.ports import Outcome

EVENTS = Path(__file__).resolve().parents[1] / "events"
FIXTURE = json.loads((EVENTS / "convention_task_running.json").read_text())


def _sqs(*bodies: str) -> dict[str, Any]:
    return {"Records": [{"messageId": f"m{i}", "receiptHandle": f"r{i}", "body": body,
                         "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
                         "eventSource": "aws:sqs", "awsRegion": "us-east-1",
                         "eventSourceARN": "arn:aws:sqs:us-east-1:111122223333:tag-lookups"}
                        for i, body in enumerate(bodies)]}


class Service:
    def __init__(self, result: Any) -> None:
        self.result = result
        self.seen: list[Any] = []
        self.brought_forward: list[list[str]] = []  # the message ids of each redeliver_soon

    def redeliver_soon(self, records: list[dict[str, Any]]) -> int:
        self.brought_forward.append([record["messageId"] for record in records])
        return len(records)

    def on_tag_lookups(self, details: list[Any]) -> list[Any]:
        self.seen = details
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_partial_batch_response() -> None:
    from handlers.tag_lookup_worker import handle

    good = json.dumps({"detail": FIXTURE["detail"]})
    service = Service([Outcome("running"), RuntimeError("TransactionConflict")])
    out = handle(_sqs(good, "not json", good), service)
    assert len(service.seen) == 2  # the malformed message is dropped
    assert out == {"batchItemFailures": [{"itemIdentifier": "m2"}]}
    assert service.brought_forward == [["m2"]]  # the failed one, asked back sooner
    failing = Service(RuntimeError("ECS Describe budget exhausted"))
    assert handle(_sqs(good, good), failing) == {
        "batchItemFailures": [{"itemIdentifier": "m0"}, {"itemIdentifier": "m1"}]}
    assert failing.brought_forward == [["m0", "m1"]]
