"""Waking the scheduler up after the queue changed (submit, cancel, resume, a quota):
asynchronously, never blocking the API on it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpu_recovery import clock

logger = logging.getLogger(__name__)


class SchedulerTrigger(Protocol):
    """Wakes the scheduler up after the queue changed; never blocks the API on it."""

    def trigger(self, reason: str, job_id: str) -> None: ...


class NoSchedulerTrigger:
    """No scheduler configured: its periodic schedule picks the job up."""

    def trigger(self, reason: str, job_id: str) -> None:
        logger.debug("no scheduler to trigger", extra={"reason": reason, "job_id": job_id})


class AsyncInvoker(Protocol):
    """``adapters.scheduler_trigger.LambdaInvoker``: an asynchronous Lambda Invoke."""

    function_name: str

    def invoke_async(self, payload: Mapping[str, Any]) -> None: ...


class LambdaSchedulerTrigger:
    """Asynchronous ``Invoke`` (InvocationType=Event) of the scheduler function."""

    def __init__(self, invoker: AsyncInvoker) -> None:
        self._invoker = invoker
        self.function_name = invoker.function_name

    def trigger(self, reason: str, job_id: str) -> None:
        self._invoker.invoke_async(scheduler_payload(reason, job_id))


class CallbackSchedulerTrigger:
    """In-process trigger (local mode): calls ``callback(payload)`` directly."""

    def __init__(self, callback: Callable[[dict[str, Any]], Any]) -> None:
        self._callback = callback

    def trigger(self, reason: str, job_id: str) -> None:
        self._callback(scheduler_payload(reason, job_id))


def scheduler_payload(reason: str, job_id: str) -> dict[str, Any]:
    """The event the scheduler function receives from the API."""
    return {"source": "gpu-recovery.jobs-api", "reason": reason, "job_id": job_id, "at": clock.now()}
