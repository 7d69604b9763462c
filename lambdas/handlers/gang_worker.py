"""The gang fan-out's worker (SQS): stop or start one batch of a large job's ranks.

Each SQS message is one batch (``gpu_recovery.domain.gang_batches``). A batch that cannot
finish (the ECS budget, this invocation's time) sends the rest of itself back to the
queue and counts as done; an AWS error fails only its own message (a partial batch
response), which SQS delivers again; a malformed message is logged and dropped.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from gpu_recovery import runtime
from handlers._common import powertools

logger, tracer, metrics = powertools("gang-worker")
processor = BatchProcessor(event_type=EventType.SQS)


def handle_record(record: SQSRecord, lambda_context: LambdaContext | None = None) -> dict[str, Any]:
    try:
        body = json.loads(record.body)
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        service = runtime.recovery_service(runtime.PowertoolsMetrics(metrics))
        context = lambda_context
        time_left = (lambda: context.get_remaining_time_in_millis() / 1000.0) if context else None
        result = service.on_gang_batch(body, receive_count=int(record.attributes.approximate_receive_count),
                                       time_left=time_left)
    except ValueError as error:  # json.JSONDecodeError included: retrying cannot fix it
        logger.warning("malformed gang batch dropped", extra={"message_id": record.message_id,
                                                               "error": str(error)[:1000]})
        return {"action": "dropped"}
    outcome = {"batch": body, **result.as_dict()}
    logger.info("gang batch handled", extra=outcome)
    return outcome


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=handle_record, processor=processor,
                                    context=context)
