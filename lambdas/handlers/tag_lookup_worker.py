"""The tag lookup worker (SQS, up to 100 messages a batch): registers the tasks whose tags
decide, one DescribeTasks per batch under the stack's Describe budget, then handles each
task's event with its rank (``RecoveryService.on_tag_lookups``).

Each message is ``{"detail": <ECS task state-change detail>}``, sent by the task handler
for a task it found neither registered, nor following the registration convention, nor
known to be unprotected. The Describe failing (the budget, throttling) fails the whole
batch; a task's own lookup or a handling error fails its own message (a partial batch
response); a failed message comes back 75 s later the first time
(``RecoveryService.redeliver_soon``), after the queue's visibility timeout later; a
malformed message is logged and dropped.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gpu_recovery import runtime
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, entry_point, powertools

logger, tracer, metrics = powertools("tag-lookup-worker")


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``): the batch's partial response, the message ids to
    deliver again. Not Powertools' ``BatchProcessor``: the batch's tasks are described
    together, so one call covers every message (and its failure fails them all)."""
    records = event.get("Records") or []
    parsed: list[tuple[str, EcsTaskDetail]] = []
    by_id = {record.get("messageId"): record for record in records}
    for record in records:
        try:
            body = json.loads(record["body"])
            parsed.append((record["messageId"], EcsTaskDetail.model_validate(body["detail"])))
        except (ValueError, KeyError, TypeError, ValidationError) as error:
            logger.warning("malformed tag lookup dropped", extra={"message_id": record.get("messageId"),
                                                                  "error": str(error)[:1000]})
    if not parsed:
        return {"batchItemFailures": []}
    try:
        outcomes = service.on_tag_lookups([detail for _, detail in parsed])
    except Exception as error:
        logger.warning("tag lookup batch failed: delivered again", extra={
            "messages": len(parsed), "error": f"{type(error).__name__}: {error}"[:1000]})
        service.redeliver_soon([by_id[message_id] for message_id, _ in parsed])
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id, _ in parsed]}
    failures = []
    for (message_id, detail), outcome in zip(parsed, outcomes, strict=True):
        if isinstance(outcome, Exception):
            logger.warning("task event failed after its lookup: delivered again", extra={
                "task": detail.taskArn, "error": f"{type(outcome).__name__}: {outcome}"[:1000]})
            failures.append({"itemIdentifier": message_id})
    service.redeliver_soon([by_id[failure["itemIdentifier"]] for failure in failures])
    return {"batchItemFailures": failures}


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port),
                             correlation_id_path=None)
