"""CloudWatch Logs reads: the health check's JSON verdict line (recovery loop) and a
training rank's container log, page by page (jobs API)."""

from __future__ import annotations

import json
import logging
from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery.constants import HEALTH_CHECK_CONTAINER_NAME, HEALTH_CHECK_LOG_STREAM_PREFIX
from gpu_recovery.domain.models import task_id

logger = logging.getLogger(__name__)

# GetLogEvents may answer a partial or an empty page while more events exist; the end is the
# token coming back as it was passed (GetLogEvents API reference). A read follows the tokens
# for at most this many pages (a verdict: 50 lines a page, the check prints its verdict last).
VERDICT_PAGES = 10
VERDICT_PAGE_EVENTS = 50


class VerdictLogReader:
    def __init__(self, logs_client: Any, log_group: str) -> None:
        self._logs = logs_client
        self._group = log_group

    def read_verdict(self, task_arn: str) -> dict[str, Any] | None:
        """The last JSON verdict line the health check printed, the stream read from its end
        backwards, page by page (``nextBackwardToken`` until it comes back unchanged, at most
        VERDICT_PAGES pages); None when no such line is readable: not written, or not yet
        (CloudWatch Logs makes a line readable some seconds after it was written)."""
        if not self._group:
            return None
        stream = f"{HEALTH_CHECK_LOG_STREAM_PREFIX}/{HEALTH_CHECK_CONTAINER_NAME}/{task_id(task_arn)}"
        params: dict[str, Any] = {"logGroupName": self._group, "logStreamName": stream,
                                  "startFromHead": False, "limit": VERDICT_PAGE_EVENTS}
        token: str | None = None
        for _ in range(VERDICT_PAGES):
            try:
                response = self._logs.get_log_events(**params)
            except self._logs.exceptions.ResourceNotFoundException:
                return None  # the awslogs driver creates the stream with its first line
            found = _verdict_in(response.get("events", []))
            if found is not None:
                return found
            backward = response.get("nextBackwardToken")
            if not backward or backward == token:
                return None  # the stream's start: no verdict line (yet)
            token = params["nextToken"] = backward
        logger.warning("no verdict line in the health check's last pages", extra={"task": task_arn})
        return None


def _verdict_in(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest JSON object line with a ``verdict`` in a page (events oldest first)."""
    for event in reversed(events):
        message = event.get("message", "").strip()
        if message.startswith("{"):
            try:
                parsed = json.loads(message)
            except ValueError:
                continue
            if isinstance(parsed, dict) and "verdict" in parsed:
                return parsed
    return None


class LogStreamNotFound(LookupError):
    """The log group or stream does not exist (yet: awslogs creates it at the first line)."""


class InvalidLogToken(ValueError):
    """CloudWatch Logs refused the ``nextToken`` for this stream."""


class TrainingLogReader:
    """GetLogEvents of one stream, oldest first (the jobs API's logs route)."""

    def __init__(self, logs_client: Any) -> None:
        self._logs = logs_client

    def read_stream(self, group: str, stream: str, *, limit: int,
                    next_token: str | None = None) -> dict[str, Any]:
        """One page: ``events`` ({timestamp, message}) and ``next_token`` (the forward token;
        equal to the one given at the end of the stream).

        Raises :class:`LogStreamNotFound` (ResourceNotFoundException) and, for a token the
        service refuses (InvalidParameterException with ``next_token``), :class:`InvalidLogToken`.
        """
        params: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True,
                                  "limit": limit}
        if next_token:
            params["nextToken"] = next_token
        try:
            response = self._logs.get_log_events(**params)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise LogStreamNotFound(f"log stream {stream} not found in {group}") from error
            if code == "InvalidParameterException" and next_token:
                raise InvalidLogToken(str(error)) from error
            raise
        return {
            "events": [{"timestamp": e.get("timestamp"), "message": e.get("message", "")}
                       for e in response.get("events", [])],
            "next_token": response.get("nextForwardToken"),
        }
