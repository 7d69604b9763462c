"""The gang fan-out's worker (SQS): stop or start one batch of a large job's ranks.

Each SQS message is one batch (``gpu_recovery.domain.gang_batches``). A batch that cannot
finish (the ECS budget, this invocation's time) sends the rest of itself back to the
queue and counts as done; an AWS error fails only its own message (a partial batch
response, Powertools' ``BatchProcessor``), which SQS delivers again (75 s later the first
time, ``RecoveryService.redeliver_soon``); a malformed message is logged and dropped.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from gpu_recovery import runtime
from gpu_recovery.recovery import RecoveryService
from handlers._common import TimeLeft, entry_point, powertools

logger, tracer, metrics = powertools("gang-worker")


def handle_record(record: SQSRecord, service: RecoveryService,
                  time_left: TimeLeft | None = None) -> dict[str, Any]:
    """One message: its batch to the service (raises on an error the message retries)."""
    try:
        body = json.loads(record.body)
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        result = service.on_gang_batch(body, receive_count=int(record.attributes.approximate_receive_count),
                                       time_left=time_left)
    except ValueError as error:  # json.JSONDecodeError included: retrying cannot fix it
        logger.warning("malformed gang batch dropped", extra={"message_id": record.message_id,
                                                               "error": str(error)[:1000]})
        return {"action": "dropped"}
    outcome = {"batch": body, **result.as_dict()}
    logger.info("gang batch handled", extra=outcome)
    return outcome


def handle(event: dict[str, Any], service: RecoveryService, *,
           time_left: TimeLeft | None = None, request_id: str | None = None) -> dict[str, Any]:
    """The body (``handlers._common``): the SQS batch's partial batch response. A processor
    per call: concurrent invocations (the simulators run them in one process) never share
    one's record state."""
    records = event.get("Records") or []
    try:
        response: dict[str, Any] = dict(process_partial_response(
            event=event, record_handler=lambda record: handle_record(record, service, time_left),
            processor=BatchProcessor(event_type=EventType.SQS)))
    except BatchProcessingError:  # every record failed: the invocation fails, each comes back
        service.redeliver_soon(records)
        raise
    failed = {failure["itemIdentifier"] for failure in response.get("batchItemFailures") or []}
    service.redeliver_soon([record for record in records if record.get("messageId") in failed])
    return response


lambda_handler = entry_point(logger, tracer, metrics, lambda: handle,
                             lambda port: runtime.recovery_service(port),
                             correlation_id_path=None)
