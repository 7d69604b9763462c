"""Waking the queue scheduler up: an asynchronous Lambda Invoke of its function."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class LambdaInvoker:
    """``Invoke`` with InvocationType=Event: returns once Lambda queued the event (the
    function's reserved concurrency of 1 and its lease serialise the ticks)."""

    def __init__(self, lambda_client: Any, function_name: str) -> None:
        self._lambda = lambda_client
        self.function_name = function_name

    def invoke_async(self, payload: Mapping[str, Any]) -> None:
        self._lambda.invoke(
            FunctionName=self.function_name,
            InvocationType="Event",
            Payload=json.dumps(payload).encode(),
        )
