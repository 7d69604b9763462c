"""``LambdaContext``: the Lambda context object every simulated invocation gets, in both worlds.

The moto world's bus (:class:`~local_mode.sim.bus.EventBus`), the local API server
(``local_mode.server``), the campaigns and the scale world's functions
(``local_mode.scale_recovery``) hand their handlers this one class: the fields Powertools
reads (function name, ARN, memory, request id, log group and stream) and the invocation's
time left. In the moto world the time left runs on the wall clock from the context's
creation (``timeout_seconds``); both worlds' function invocations get theirs from
:func:`simulated_context`: the time left runs on the simulated clock, and a retry of a failed
asynchronous invocation keeps the first attempt's ``aws_request_id``, as Lambda does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..events import ACCOUNT_ID, REGION


@dataclass
class LambdaContext:
    """The parts of the Lambda context object handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int = 256
    function_version: str = "$LATEST"
    timeout_seconds: float = 300
    aws_request_id: str = field(default_factory=lambda: new_request_id())
    region: str = REGION
    account: str = ACCOUNT_ID
    log_group_name: str = ""
    log_stream_name: str = "local"
    #: seconds left in the invocation (None: ``timeout_seconds`` from now, on the wall clock)
    seconds_left: Callable[[], float] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.invoked_function_arn = (
            f"arn:aws:lambda:{self.region}:{self.account}:function:{self.function_name}"
        )
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self._deadline = time.monotonic() + self.timeout_seconds

    def time_left(self) -> float:
        """Seconds left in the invocation."""
        if self.seconds_left is not None:
            return self.seconds_left()
        return self._deadline - time.monotonic()

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self.time_left() * 1000))


def new_request_id() -> str:
    """A new invocation's request id (not from a simulation's seeded generator: drawing it
    leaves a seeded run's other draws as they were)."""
    return str(uuid.uuid4())


def simulated_context(function_name: str, *, timeout_seconds: float, clock: Callable[[], float],
                      request_id: str | None = None) -> LambdaContext:
    """One invocation's context in simulated time: its time left counts down on ``clock`` from
    ``timeout_seconds``; ``request_id``: the invocation's (a retry of a failed asynchronous
    invocation passes the first attempt's; None: a new one)."""
    deadline = clock() + timeout_seconds
    return LambdaContext(function_name, timeout_seconds=timeout_seconds,
                         aws_request_id=request_id or new_request_id(),
                         seconds_left=lambda: deadline - clock())
