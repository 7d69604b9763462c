"""Reads the health check's JSON verdict line from its CloudWatch Logs stream."""

from __future__ import annotations

import json
import logging
from typing import Any

from gpu_recovery.constants import HEALTH_CHECK_CONTAINER_NAME, HEALTH_CHECK_LOG_STREAM_PREFIX
from gpu_recovery.domain.models import task_id

logger = logging.getLogger(__name__)


class VerdictLogReader:
    def __init__(self, logs_client: Any, log_group: str) -> None:
        self._logs = logs_client
        self._group = log_group

    def read_verdict(self, task_arn: str) -> dict[str, Any] | None:
        """The last JSON object line the health check printed, or None."""
        if not self._group:
            return None
        stream = f"{HEALTH_CHECK_LOG_STREAM_PREFIX}/{HEALTH_CHECK_CONTAINER_NAME}/{task_id(task_arn)}"
        try:
            response = self._logs.get_log_events(
                logGroupName=self._group, logStreamName=stream, startFromHead=False, limit=50
            )
        except self._logs.exceptions.ResourceNotFoundException:
            return None
        for event in reversed(response.get("events", [])):
            message = event.get("message", "").strip()
            if message.startswith("{"):
                try:
                    parsed = json.loads(message)
                except ValueError:
                    continue
                if isinstance(parsed, dict) and "verdict" in parsed:
                    return parsed
        return None
